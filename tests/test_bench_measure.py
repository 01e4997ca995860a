"""``ope bench``'s timing of trials (ope_cli/bench/measure.py); the trials themselves run in
test_bench.py."""

from __future__ import annotations

from ope_cli.bench.measure import Trial, time_interleaved


def test_every_trial_runs_once_untimed_before_its_timed_rounds():
    """A trial prepared before another cleared JAX's caches recompiles at its next call:
    that call is the untimed one, whatever the rounds (with one round it was the timing)."""
    order: list[str] = []

    def trial(name: str) -> Trial:
        def run():
            order.append(name)

        return Trial(run, 10, {"kind": name})

    measured = time_interleaved({"a": trial("a"), "b": trial("b")}, rounds=1)
    assert order == ["a", "b", "a", "b"]  # the untimed pass, then the round, interleaved
    assert measured["a"]["runs"] == 1 and measured["b"]["kind"] == "b"
    assert measured["a"]["seconds"] >= 0 and measured["a"]["steps_per_second"] > 0
