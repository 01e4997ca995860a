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


def test_the_loop_run_on_every_episode_is_not_called_extrapolated(tmp_path):
    """Run on every episode, the loop's JSON said "extrapolated": true beside the note "run
    on every episode", and the table showed its time as "(extrapolated)"."""
    import pyarrow.parquet as pq

    from ope_cli.bench.batches import open_source
    from ope_cli.bench.data import behavior_params, generate_data, write_checkpoints
    from ope_cli.bench.measure import measure_loop
    from ope_cli.config import BatchingConfig

    path = str(tmp_path / "bench.parquet")
    generate_data(path, 40, 0)
    source, steps = open_source(path), pq.read_metadata(path).num_rows
    (checkpoint,) = write_checkpoints(tmp_path, 1, 0, behavior_params(0))
    every = measure_loop(source, checkpoint, 40, BatchingConfig(), steps)
    assert every["steps"] == steps and every["note"] == "run on every episode"
    assert every["extrapolated"] is False and every["extrapolated_seconds"] is None
    head = measure_loop(source, checkpoint, 10, BatchingConfig(), steps)
    assert head["extrapolated"] is True and head["extrapolated_seconds"] > head["seconds"]
