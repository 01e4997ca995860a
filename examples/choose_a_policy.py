"""Choosing among candidate checkpoints from a notebook, with the public API only.

    python examples/choose_a_policy.py [OUT_DIR]

``ope_cli.generate`` writes a ``chain`` log with five candidate policies and their exact
values (``truth.json``); ``ope_cli.evaluate`` estimates every candidate in one pass, pairs
each with the behavior policy (``baseline="behavior"``), says which could be the best, and,
given the truth, how well each estimator ranks them. The same run on the command line:

    ope evaluate OUT/logs.parquet -p 'OUT/policies/*.npz' --baseline behavior \\
        --truth OUT/truth.json
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import ope_cli


def choose(out: Path, episodes: int = 2000) -> tuple[dict, dict[str, float]]:
    """Generates the data in ``out`` and evaluates the candidates: (the JSON document, ranked
    by WPDIS, and each candidate's true value by file name)."""
    truth = ope_cli.generate("chain", out, episodes=episodes, policies=5, seed=7)
    run = ope_cli.evaluate(
        str(out / "logs.parquet"),
        policies=[str(out / entry["policy"]) for entry in truth["policies"]],
        baseline="behavior",
        truth=str(out / "truth.json"),
    )
    values = {Path(entry["policy"]).name: entry["value"] for entry in truth["policies"]}
    return run.to_dict(rank_by="wpdis"), values


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="choose-"))
    document, values = choose(out)
    print(f"{'rank':>4} {'policy':<12} {'wpdis':>8} {'vs behavior':>12} {'true':>8}  could be best")
    for result in document["results"]:
        wpdis, paired = result["estimates"]["wpdis"], result["comparison"]["wpdis"]
        print(
            f"{result['rank']:>4} {result['label']:<12} {wpdis['value']:8.3f} "
            f"{paired['delta']:+12.3f} {values[result['label']]:8.3f}  "
            f"{result['could_be_best']['wpdis']}"
        )
    regret = document["selection"]["wpdis"]["regret@1"]
    print(f"picking the top WPDIS estimate loses {regret:.3f} of value against the best policy")


if __name__ == "__main__":
    main()
