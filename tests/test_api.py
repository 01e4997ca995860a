"""The public API of ``ope_cli`` (``__all__``), loaded lazily."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ope_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PACKAGE = Path(ope_cli.__file__).parent


def test_all_lists_the_api_and_every_name_resolves():
    for name in ("evaluate", "inspect", "generate", "EvaluationConfig", "EvaluationResult"):
        assert name in ope_cli.__all__
    for name in ("InspectConfig", "InspectReport", "PolicyResult", "OpeError"):
        assert name in ope_cli.__all__
    for name in ope_cli.__all__:
        assert getattr(ope_cli, name) is not None, name
    assert set(ope_cli.__all__) <= set(dir(ope_cli))


def test_names_are_the_core_objects():
    from ope_cli import api, config, errors, results

    assert ope_cli.evaluate is api.evaluate
    assert ope_cli.inspect is api.inspect
    assert ope_cli.EvaluationConfig is config.EvaluationConfig
    assert ope_cli.EvaluationResult is results.EvaluationResult
    assert ope_cli.DataError is errors.DataError


def test_public_functions_stay_functions_after_their_modules_are_imported():
    """ope_cli.inspect and ope_cli.generate are the functions, however their modules
    (ope_cli.inspection, ope_cli.envs.generate) were imported; no top-level submodule
    shares a public name."""
    import ope_cli.envs.generate
    import ope_cli.inspection
    from ope_cli import generate, inspect

    assert callable(inspect) and inspect.__module__ == "ope_cli.api"
    assert callable(generate) and generate.__module__ == "ope_cli.envs.generate"
    assert ope_cli.inspect is inspect and ope_cli.generate is generate
    assert ope_cli.inspection.inspect is not inspect  # the module's own, wrapped by the API
    assert ope_cli.envs.generate.generate is generate
    assert not set(ope_cli.__all__) & {path.stem for path in PACKAGE.iterdir()}


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        ope_cli.no_such_name  # noqa: B018


def test_evaluate_through_the_public_api():
    config = ope_cli.EvaluationConfig(
        data=str(EXAMPLES / "data" / "logs.parquet"),
        policies=(str(EXAMPLES / "policies" / "ckpt.npz"),),
    )
    result = ope_cli.evaluate(config)
    assert isinstance(result, ope_cli.EvaluationResult)
    assert result.runtime.precision == "float64"  # the runtime is configured without the CLI
    assert set(result.results[0].estimates) == {"is", "wis", "pdis", "wpdis"}


def _modules_after(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout


def test_importing_the_package_and_the_cli_does_not_import_jax():
    code = "import sys, ope_cli, ope_cli.cli; print(sorted(m for m in sys.modules if 'jax' in m))"
    assert _modules_after(code).strip() == "[]"


def test_help_does_not_import_jax():
    code = (
        "import contextlib, io, sys\n"
        "from ope_cli.cli import run\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    for argv in (['--help'], ['evaluate', '--help'], ['--version']):\n"
        "        assert run(argv) == 0\n"
        "print('jax' in sys.modules)\n"
    )
    assert _modules_after(code).strip() == "False"


def test_data_and_checkpoint_errors_end_before_jax_starts(tmp_path):
    """A missing column, an unreadable checkpoint and a tabular checkpoint beside vector
    observations are found without JAX: exit 3, 4 and 3, and JAX never imported."""
    import pyarrow.parquet as pq

    logs = pq.read_table(EXAMPLES / "data" / "logs.parquet")
    pq.write_table(logs.drop_columns(["reward"]), tmp_path / "no_reward.parquet")
    (tmp_path / "text.npz").write_text("not a checkpoint")
    np.savez(tmp_path / "tabular.npz", kind="tabular", logits=np.zeros((5, 4)))
    data, policy = EXAMPLES / "data" / "logs.parquet", EXAMPLES / "policies" / "ckpt.npz"
    runs = [
        ["evaluate", str(tmp_path / "no_reward.parquet"), "-p", str(policy)],
        ["evaluate", str(data), "-p", str(tmp_path / "text.npz")],
        ["evaluate", str(data), "-p", str(tmp_path / "tabular.npz")],
    ]
    code = (
        "import contextlib, io, sys\n"
        "from ope_cli.cli import run\n"
        f"for argv in {runs!r}:\n"
        "    with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "        print(run(argv), err.getvalue().count('\\n'))\n"
        "print('jax' in sys.modules)\n"
    )
    assert _modules_after(code).split() == ["3", "1", "4", "1", "3", "1", "False"]


def test_evaluate_takes_the_command_line_options_as_keywords(tmp_path):
    data, policy = EXAMPLES / "data" / "logs.parquet", EXAMPLES / "policies" / "ckpt.npz"
    by_keywords = ope_cli.evaluate(
        str(data), policy=str(policy), gamma=0.9, ci="normal", estimator="wis", batch_steps=4096
    )
    by_config = ope_cli.evaluate(
        ope_cli.EvaluationConfig(
            data=str(data),
            policies=(str(policy),),
            gamma=0.9,
            estimators=("wis",),
            batching=ope_cli.BatchingConfig(batch_steps=4096),
            intervals=ope_cli.IntervalConfig(method="normal"),
        )
    )
    document = by_keywords.to_dict()
    assert document == by_config.to_dict() | {"runtime": document["runtime"]}
    assert document["results"][0]["estimates"]["wis"]["value"] == pytest.approx(
        by_keywords.results[0].estimates["wis"].value
    )
    assert document["confidence"]["interval"] == "normal" and document["gamma"] == 0.9


def test_to_pandas_is_the_csv_as_a_table():
    pandas = pytest.importorskip("pandas")
    run = ope_cli.evaluate(
        str(EXAMPLES / "data" / "logs.parquet"), policies=[str(EXAMPLES / "policies" / "ckpt.npz")]
    )
    frame = run.to_pandas()
    from ope_cli.report import to_csv

    expected = pandas.read_csv(io.StringIO(to_csv(run)))
    assert list(frame.columns) == list(expected.columns)
    assert len(frame) == 4 and list(frame["estimator"]) == ["is", "wis", "pdis", "wpdis"]
    assert frame["value"].tolist() == pytest.approx(expected["value"].tolist(), rel=1e-15)
    # a column empty on every row (no --baseline: delta) is float64 NaN, as read_csv reads
    # it (it was object None: delta.sum() gave 0)
    assert frame["delta"].isna().all() and frame["delta"].dtype == expected["delta"].dtype
    assert dict(frame.dtypes) == dict(expected.dtypes)


def test_to_dict_gives_a_document_of_its_own(tmp_path):
    """Editing the dict ``to_dict`` returned changed the result's next documents (its
    ``dropped`` block was the result's own), the drop warning's numbers with it."""
    import pyarrow.parquet as pq

    table = pq.read_table(EXAMPLES / "data" / "logs.parquet")
    rewards = table.column("reward").to_pylist()
    rewards[3] = float("nan")
    table = table.set_column(table.schema.get_field_index("reward"), "reward", [rewards])
    pq.write_table(table, tmp_path / "logs.parquet")
    run = ope_cli.evaluate(
        str(tmp_path / "logs.parquet"),
        policies=[str(EXAMPLES / "policies" / "ckpt.npz")],
        on_invalid="drop",
    )
    first = run.to_dict()
    assert first["dataset"]["dropped"]
    for counts in first["dataset"]["dropped"].values():
        counts["steps"] = -999
    assert run.to_dict() == run.to_dict() != first
    assert all(c["steps"] > 0 for c in run.to_dict()["dataset"]["dropped"].values())


def test_unknown_keywords_are_refused_by_name():
    with pytest.raises(ope_cli.UsageError, match="unknown option 'gama'") as error:
        ope_cli.evaluate("logs.parquet", gama=0.9)
    assert ", rank_by, " in str(error.value)  # evaluate's own keywords are options too
    with pytest.raises(ope_cli.UsageError, match="unknown option 'rank_by'") as error:
        ope_cli.api.evaluation_config("logs.parquet", rank_by="wis")  # not the record's
    assert "rank_by" not in str(error.value).split("the options are ")[1].split(", ")
    with pytest.raises(ope_cli.UsageError, match="unknown option 'batch_steps'"):
        ope_cli.inspect("logs.parquet", batch_steps=4096)
    # the fit-q model is named in the source (q=["fit:mlp"]); a keyword that nothing read
    # would have fitted the default model without a word
    with pytest.raises(ope_cli.UsageError, match="unknown option 'q_model'"):
        ope_cli.evaluate("logs.parquet", q=["fit"], q_model="mlp")


@pytest.mark.parametrize(
    "options, words",
    [
        # each evaluated the last one given, without a word (reward="step" read the step
        # numbers as rewards: WIS 637.1 against -5.28)
        (dict(policies=["a.npz"], policy=["b.npz"]), "policies and policy are one option"),
        (dict(ci="normal", interval="percentile"), "ci and interval are one option"),
        (dict(estimator="wis", estimators=["is"]), "estimator and estimators are one option"),
        (dict(reward_col="reward", reward="step"), "reward_col and reward are one option"),
    ],
)
def test_two_spellings_of_one_option_are_refused(options, words):
    with pytest.raises(ope_cli.UsageError, match=words):
        ope_cli.evaluate("logs.parquet", **options)


def test_inspect_takes_keywords_and_gives_the_json_document():
    data = str(EXAMPLES / "data" / "logs.parquet")
    report = ope_cli.inspect(data, read_rows=1000, obs_col="observation")
    assert isinstance(report, ope_cli.InspectReport)
    document = report.to_dict()
    assert document["command"] == "inspect" and document["dataset"]["source"] == data
    config = ope_cli.InspectConfig(
        data, columns=ope_cli.ColumnMapping(observation="observation"), read_rows=1000
    )
    assert ope_cli.inspect(config).to_dict() == document


def test_keywords_are_gathered_into_the_config_records():
    from ope_cli.api import evaluation_config

    config = evaluation_config(
        "logs.parquet",
        policy="a.npz",
        behavior="estimate",
        behavior_cross_fit=3,
        q="fit",
        cross_fit=4,
        ci="percentile",
        seed=7,
        precision="float32",
        baseline="behavior",
        top_k=[1, 2],
        read_rows=100,
        obs_col="state",
    )
    assert config.policies == ("a.npz",)
    assert config.behavior == ope_cli.BehaviorConfig(policy="estimate", cross_fit=3)
    assert config.q == ope_cli.QConfig(sources=("fit",), cross_fit=4)
    assert config.intervals == ope_cli.IntervalConfig(method="percentile", seed=7)
    assert config.runtime == ope_cli.RuntimeConfig(precision="float32")
    assert config.choosing == ope_cli.ChoosingConfig(baseline="behavior", top_k=(1, 2))
    assert config.batching.read_rows == 100 and config.columns.observation == "state"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(seed=1.9), "seed must be an integer, got 1.9"),
        (dict(horizon=80.5), "horizon must be an integer, got 80.5"),
        (dict(read_rows=1000.5), "read_rows must be an integer, got 1000.5"),
        (dict(bootstrap_samples="20"), "bootstrap_samples must be an integer, got '20'"),
        (dict(gamma="0.9"), "gamma must be a number, got '0.9'"),
        (dict(reward_range=(0, 1, 2)), "reward_range must be two numbers (low, high)"),
        (dict(top_k=[1.5]), "top_k must be integers, got (1.5,)"),
        # one number alone, not in a list, was Python's TypeError (not iterable)
        (dict(top_k=2.0), "top_k must be integers, got (2.0,)"),
        (dict(q=1.5), "q must be a sequence of strings or paths, got (1.5,)"),
        (dict(top_k=np.array(1.5)), "top_k must be integers, got (1.5,)"),  # a 0-d array
        # named as typed, not by the record's field (behavior's is "policy", ci's "method")
        (dict(behavior=3), "behavior must be a string, got 3"),
        (dict(ci=2), "ci must be a string, got 2"),
    ],
)
def test_keywords_of_the_wrong_type_are_usage_errors(options, message):
    """What the command line's types refuse, keywords do too, as UsageErrors before any
    reading (a seed of 1.9 ran with seed 1 and reported 1.9)."""
    from ope_cli.api import evaluation_config

    with pytest.raises(ope_cli.UsageError) as error:
        evaluation_config("logs.parquet", **options)
    assert message in str(error.value)


def test_paths_are_taken_where_the_command_line_takes_paths(tmp_path):
    from ope_cli.api import evaluation_config

    config = evaluation_config(
        tmp_path / "logs.parquet",
        policies=[tmp_path / "a.npz"],
        behavior=tmp_path / "b.npz",
        truth=tmp_path / "truth.json",
        q=tmp_path / "q.npz",
    )
    assert (config.data, config.policies) == (
        str(tmp_path / "logs.parquet"),
        (str(tmp_path / "a.npz"),),
    )
    assert config.behavior.policy == str(tmp_path / "b.npz")
    assert config.choosing.truth == str(tmp_path / "truth.json")
    assert config.q.sources == (str(tmp_path / "q.npz"),)


def test_rank_by_is_checked_as_the_command_line_checks_it():
    """evaluate(rank_by=...) is --rank-by: checked before the data is read, lower case, the
    default of to_dict and to_pandas; to_dict(rank_by=...) is checked the same way (an
    unknown name ranked nothing and warned of every policy)."""
    data, policy = EXAMPLES / "data" / "logs.parquet", EXAMPLES / "policies" / "ckpt.npz"
    with pytest.raises(ope_cli.UsageError, match="--rank-by must be one of .* got 'wiss'"):
        ope_cli.evaluate(str(data), policies=[str(policy)], rank_by="wiss")
    run = ope_cli.evaluate(str(data), policies=[str(policy)], rank_by="PDIS")
    assert run.to_dict()["rank_by"] == "pdis" and run.to_dict()["results"][0]["rank"] == 1
    assert run.to_dict(rank_by="WIS")["rank_by"] == "wis"
    with pytest.raises(ope_cli.UsageError, match="got 'wiss'"):
        run.to_dict(rank_by="wiss")


def test_inspect_lists_only_its_own_keywords():
    with pytest.raises(ope_cli.UsageError) as error:
        ope_cli.inspect("logs.parquet", ci="normal")
    known = str(error.value).split("the options are ")[1].split(", ")
    assert "ci" not in known and "estimator" not in known and "obs_col" in known


def test_numbers_and_names_are_read_as_the_command_line_reads_them():
    """A NumPy float32 --confidence left the JSON document unwritable, and "WIS" was an
    unknown estimator to the API alone (the command line lower-cases and drops repeats)."""
    import numpy as np

    from ope_cli.api import evaluation_config

    config = evaluation_config(
        "logs.parquet",
        confidence=np.float32(0.9),
        bootstrap_samples=np.int64(400),
        estimator=["WIS", "wis", "Is"],
    )
    assert type(config.intervals.confidence) is float
    assert type(config.intervals.bootstrap_samples) is int
    assert config.estimators == ("wis", "is")
    ranged = evaluation_config(
        "logs.parquet", reward_range=(np.float32(0), np.float32(1)), top_k=np.int64(1)
    )
    assert [type(x) for x in ranged.intervals.reward_range] == [float, float]
    assert ranged.choosing.top_k == (1,) and type(ranged.choosing.top_k[0]) is int
    array = evaluation_config("logs.parquet", top_k=np.array([1, 3]))
    assert [type(k) for k in array.choosing.top_k] == [int, int]
    # an array of two numbers was "reward_range must be two numbers (low, high)"
    bounded = evaluation_config("logs.parquet", reward_range=np.array([0.0, 1.0]))
    assert bounded.intervals.reward_range == (0.0, 1.0)
    assert [type(x) for x in bounded.intervals.reward_range] == [float, float]
    listed = evaluation_config("logs.parquet", policies=np.array(["a.npz", "b.npz"]))
    assert listed.policies == ("a.npz", "b.npz") and type(listed.policies[0]) is str


def test_a_config_record_and_the_data_are_checked_as_keywords_are():
    """evaluate(123) and an EvaluationConfig's gamma="0.9" were Python's TypeErrors, and its
    policies="x.npz" was read letter by letter ("p: expected an .npz checkpoint")."""
    from ope_cli.config import EvaluationConfig

    data = str(EXAMPLES / "data" / "logs.parquet")
    with pytest.raises(ope_cli.UsageError, match="data must be a path"):
        ope_cli.evaluate(123)
    with pytest.raises(ope_cli.UsageError, match="gamma must be a number, got '0.9'"):
        ope_cli.evaluate(EvaluationConfig(data=data, gamma="0.9"))
    with pytest.raises(ope_cli.UsageError, match="policies must be a sequence of strings"):
        ope_cli.evaluate(EvaluationConfig(data=data, policies="x.npz"))
    # estimators as the keyword reads them: EvaluationConfig's "WIS" was an unknown estimator
    policy = (str(EXAMPLES / "policies" / "ckpt.npz"),)
    record = EvaluationConfig(data=data, policies=policy, gamma=0.9, estimators=("WIS", "wis"))
    run = ope_cli.evaluate(record)
    assert list(run.results[0].estimates) == ["wis"]
    assert run.to_dict() == {
        **ope_cli.evaluate(data, policies=policy, gamma=0.9, estimators="wis").to_dict(),
        "runtime": run.to_dict()["runtime"],
    }


def test_numpy_numbers_in_a_config_record_make_a_json_document():
    """A float32 confidence in an IntervalConfig passed the checks, and the document could
    not be written (float32 is not JSON serializable)."""
    import json

    import numpy as np

    from ope_cli.config import EvaluationConfig, IntervalConfig

    config = EvaluationConfig(
        data=str(EXAMPLES / "data" / "logs.parquet"),
        policies=(str(EXAMPLES / "policies" / "ckpt.npz"),),
        gamma=np.float64(0.9),
        intervals=IntervalConfig(confidence=np.float32(0.9)),
    )
    document = json.loads(json.dumps(ope_cli.evaluate(config).to_dict()))
    assert document["confidence"]["level"] == pytest.approx(0.9, rel=1e-7)


def test_none_is_an_option_s_default_and_an_inspect_config_is_checked():
    """read_rows=None and policies=None (the command line's default) were Python's
    TypeErrors; an InspectConfig given whole skipped the checks evaluate's record gets (a
    Path as its data was an AttributeError, gamma="0.5" a TypeError)."""
    from pathlib import Path

    from ope_cli.api import evaluation_config

    data = str(EXAMPLES / "data" / "logs.parquet")
    config = evaluation_config(data, read_rows=None, policies=None, gamma=0.9)
    assert config.batching.read_rows == 65_536 and config.policies == ()
    report = ope_cli.inspect(ope_cli.InspectConfig(data=Path(data)))
    assert report.to_dict()["dataset"]["source"] == data
    with pytest.raises(ope_cli.UsageError, match="gamma must be a number, got '0.5'"):
        ope_cli.inspect(ope_cli.InspectConfig(data=data, gamma="0.5"))


def test_paths_in_a_config_given_whole_are_read_as_strings():
    """An EvaluationConfig built by hand with Paths in its policies (and as --behavior) was
    refused with "policies must be a sequence of strings or paths", a Path being one; the
    keyword API took them. Now both do, with the same numbers."""
    from ope_cli.config import BehaviorConfig, EvaluationConfig

    data, policy = EXAMPLES / "data" / "logs.parquet", EXAMPLES / "policies" / "ckpt.npz"
    behavior = EXAMPLES / "policies" / "other.npz"
    config = EvaluationConfig(data=data, policies=(policy,), behavior=BehaviorConfig(behavior))
    whole = ope_cli.evaluate(config).to_dict()
    as_list = dataclasses.replace(config, policies=[policy])  # a list, as keywords take
    assert ope_cli.evaluate(as_list).to_dict()["results"] == whole["results"]
    keywords = ope_cli.evaluate(str(data), policies=[str(policy)], behavior=str(behavior))
    assert whole["results"] == keywords.to_dict()["results"]
    assert whole["results"][0]["policy"] == str(policy)


def test_a_value_of_the_wrong_kind_for_a_record_or_rank_by_is_a_usage_error():
    """rank_by=3 was an AttributeError, and a config given a string where its record of
    options belongs (behavior="b.npz", as the keyword takes it) a TypeError."""
    from ope_cli.config import EvaluationConfig

    data, policy = str(EXAMPLES / "data" / "logs.parquet"), str(EXAMPLES / "policies" / "ckpt.npz")
    with pytest.raises(ope_cli.UsageError, match="--rank-by must be one of .*, got 3"):
        ope_cli.evaluate(data, policies=[policy], rank_by=3)
    whole = EvaluationConfig(data=data, policies=(policy,), behavior="b.npz")
    with pytest.raises(
        ope_cli.UsageError,
        match="EvaluationConfig's behavior must be a BehaviorConfig, got 'b.npz'",
    ):
        ope_cli.evaluate(whole)
