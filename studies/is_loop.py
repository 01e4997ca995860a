"""The per-episode Python loop that importance-sampling code usually starts as.

One episode at a time, one step at a time: pi_e(a|s) from a ``tabular`` or
``linear_softmax`` .npz checkpoint, ratio = pi_e / pi_b, weight = product of ratios,
then IS, WIS, PDIS and WPDIS. This is the readable baseline ``ope bench`` compares
against; its code ships inside the package (``ope_cli/bench/loop.py``, read it there) so
that an installed ``ope bench`` measures it too. It multiplies ratios naively, so very
long episodes can over/underflow.

    python studies/is_loop.py DATA.parquet CKPT.npz [--gamma G]
"""

from __future__ import annotations

import argparse
import json

from ope_cli.bench.loop import load_policy, loop_estimates, read_episodes

__all__ = ["load_policy", "loop_estimates", "read_episodes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="step-layout Parquet file")
    parser.add_argument("checkpoint", help="tabular or linear_softmax .npz checkpoint")
    parser.add_argument("--gamma", type=float, default=1.0)
    args = parser.parse_args()
    print(json.dumps(loop_estimates(args.data, args.checkpoint, args.gamma), indent=2))


if __name__ == "__main__":
    main()
