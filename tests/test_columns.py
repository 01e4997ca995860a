"""Column roles, aliases, layout detection and type checks (ope_cli/data/columns.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ope_cli.config import ColumnMapping
from ope_cli.data.columns import resolve_schema
from ope_cli.errors import DataError

F64 = pa.float64()
I64 = pa.int64()


def schema_of(**columns: pa.DataType) -> pa.Schema:
    return pa.schema([pa.field(name, dtype) for name, dtype in columns.items()])


def step_schema(**overrides: pa.DataType | None) -> pa.Schema:
    """The default step layout; an override of None drops the column."""
    columns = {
        "episode_id": I64,
        "step": I64,
        "observation": pa.list_(F64),
        "action": I64,
        "reward": F64,
        "behavior_prob": F64,
    }
    columns.update(overrides)
    return schema_of(**{k: v for k, v in columns.items() if v is not None})


def resolve(schema: pa.Schema, logged_target: bool = False, **mapping: str):
    return resolve_schema(schema, ColumnMapping(**mapping), logged_target=logged_target)


# ------------------------------------------------------------------------------ names


def test_default_names():
    s = resolve(step_schema())
    assert s.layout == "step"
    assert s.columns == {
        "episode": "episode_id",
        "step": "step",
        "observation": "observation",
        "action": "action",
        "reward": "reward",
        "behavior_prob": "behavior_prob",
    }
    assert s.behavior_is_log is False
    assert s.target is None
    assert s.read_columns == [
        "episode_id",
        "step",
        "observation",
        "action",
        "reward",
        "behavior_prob",
    ]


def test_step_column_is_optional():
    s = resolve(step_schema(step=None))
    assert "step" not in s.columns


@pytest.mark.parametrize("obs_name", ["obs", "state", "observations"])
def test_observation_aliases(obs_name):
    schema = schema_of(
        episode_id=I64, **{obs_name: pa.list_(F64)}, action=I64, reward=F64, behavior_prob=F64
    )
    assert resolve(schema).columns["observation"] == obs_name


def test_action_and_reward_plural_aliases():
    schema = schema_of(episode_id=I64, observation=F64, actions=I64, rewards=F64, behavior_prob=F64)
    s = resolve(schema)
    assert s.columns["action"] == "actions"
    assert s.columns["reward"] == "rewards"
    assert s.layout == "step"  # plural names alone do not make the episode layout


@pytest.mark.parametrize("prob_name", ["action_prob", "action_probs", "propensity", "pscore"])
def test_behavior_prob_aliases(prob_name):
    schema = schema_of(episode_id=I64, observation=F64, action=I64, reward=F64, **{prob_name: F64})
    s = resolve(schema)
    assert s.columns["behavior_prob"] == prob_name
    assert s.behavior_is_log is False


def test_column_options_override_defaults_and_aliases():
    schema = step_schema(
        my_obs=pa.list_(F64),
        my_action=I64,
        my_reward=F64,
        my_prob=F64,
        ep=I64,
        t_index=I64,
        obs=pa.list_(F64),
    )
    s = resolve(
        schema,
        observation="my_obs",
        action="my_action",
        reward="my_reward",
        behavior_prob="my_prob",
        episode="ep",
        step="t_index",
    )
    assert s.columns == {
        "episode": "ep",
        "step": "t_index",
        "observation": "my_obs",
        "action": "my_action",
        "reward": "my_reward",
        "behavior_prob": "my_prob",
    }


@pytest.mark.parametrize(
    ("role", "option"),
    [
        ("reward", "--reward-col"),
        ("action", "--action-col"),
        ("observation", "--obs-col"),
        ("episode", "--episode-col"),
        ("step", "--step-col"),
        ("behavior_prob", "--behavior-prob-col"),
        ("behavior_log_prob", "--behavior-log-prob-col"),
    ],
)
def test_option_naming_a_missing_column_is_a_data_error(role, option):
    with pytest.raises(DataError) as info:
        resolve(step_schema(), **{role: "no_such_column"})
    message = str(info.value)
    assert "no_such_column" in message
    assert option in message


@pytest.mark.parametrize(
    ("drop", "option"),
    [
        ("reward", "--reward-col"),
        ("action", "--action-col"),
        ("observation", "--obs-col"),
        ("behavior_prob", "--behavior-prob-col"),
        ("episode_id", "--episode-col"),
    ],
)
def test_missing_required_column_names_the_option(drop, option):
    with pytest.raises(DataError, match=option):
        resolve(step_schema(**{drop: None}))


def test_alias_match_is_case_insensitive():
    schema = schema_of(Episode_ID=I64, Observation=F64, Action=I64, Reward=F64, Propensity=F64)
    s = resolve(schema)
    assert s.columns["reward"] == "Reward"
    assert s.columns["behavior_prob"] == "Propensity"


@pytest.mark.parametrize(
    ("extra", "role", "option"),
    [
        ({"Reward": F64}, "reward", "--reward-col"),  # after 'reward', it replaced it
        ({"pscore": F64}, "behavior probability", "--behavior-prob-col"),
        ({"ACTION": I64}, "action", "--action-col"),
        ({"obs": pa.list_(F64)}, "observation", "--obs-col"),
        ({"trajectory_id": I64}, "episode id", "--episode-col"),
    ],
)
def test_two_columns_for_one_role_are_refused_unless_one_is_named(extra, role, option):
    """A column whose name matches a role's beside the one already found (in another case,
    or another alias) was picked by column order or alias rank, without a word: 'Reward'
    (zeros) after 'reward' printed every estimate 0.0. Both are named in one line, with the
    option that chooses; naming one reads that one."""
    schema = step_schema(**extra)
    with pytest.raises(DataError) as error:
        resolve(schema)
    message = str(error.value)
    assert f"could each be the {role}; name the one to use with {option}" in message
    assert "\n" not in message and repr(next(iter(extra))) in message
    field = option.removeprefix("--").removesuffix("-col").replace("-", "_")
    field = {"obs": "observation"}.get(field, field)
    assert resolve(schema, **{field: next(iter(extra))}).columns


def test_two_columns_for_a_role_the_run_does_not_read_pass():
    """Only roles read are refused: behavior columns under --behavior, target columns with
    --policy, a probability whose log is named (the refusal had no way out: naming the
    column beside --behavior is refused too)."""
    both = step_schema(pscore=F64)  # behavior_prob and pscore
    assert (
        "behavior_prob"
        not in resolve_schema(
            both, ColumnMapping(), logged_target=False, logged_behavior=False
        ).columns
    )
    targets = step_schema(target_prob=F64, target_probs=F64)
    assert "target_prob" not in resolve(targets).columns
    with_log = step_schema(pscore=F64, logp=F64)
    chosen = resolve(with_log, behavior_log_prob="logp")
    assert chosen.columns["behavior_log_prob"] == "logp" and "behavior_prob" not in chosen.columns


# ----------------------------------------------------------------------------- layout


def test_list_reward_column_means_episode_layout():
    schema = schema_of(
        episode_id=I64,
        observations=pa.list_(pa.list_(F64)),
        actions=pa.list_(I64),
        rewards=pa.list_(F64),
        action_probs=pa.list_(F64),
    )
    s = resolve(schema)
    assert s.layout == "episode"
    assert s.observation_kind == "vector"
    assert s.action_kind == "discrete"
    assert s.columns["behavior_prob"] == "action_probs"


def test_episode_layout_without_episode_id():
    schema = schema_of(
        observations=pa.large_list(F64),
        actions=pa.list_(I64),
        rewards=pa.large_list(F64),
        action_probs=pa.list_(F64),
    )
    s = resolve(schema)
    assert s.layout == "episode"
    assert "episode" not in s.columns
    assert s.observation_kind == "scalar"


def test_episode_layout_fixed_size_vector_observations():
    schema = schema_of(
        observations=pa.list_(pa.list_(F64, 3)),
        actions=pa.list_(I64),
        rewards=pa.list_(F64),
        action_probs=pa.list_(F64),
    )
    s = resolve(schema)
    assert (s.observation_kind, s.observation_dim) == ("vector", 3)


def test_episode_layout_requires_list_columns():
    schema = schema_of(
        observations=pa.list_(F64), actions=I64, rewards=pa.list_(F64), action_probs=pa.list_(F64)
    )
    with pytest.raises(DataError) as info:
        resolve(schema)
    assert "'actions'" in str(info.value)
    assert "--action-col" in str(info.value)


# -------------------------------------------------------------------------- value kinds


@pytest.mark.parametrize(
    ("dtype", "kind", "dim"),
    [
        (pa.int64(), "index", None),
        (pa.int32(), "index", None),
        (pa.float64(), "scalar", None),
        (pa.float32(), "scalar", None),
        (pa.list_(F64), "vector", None),
        (pa.large_list(pa.float32()), "vector", None),
        (pa.list_(F64, 4), "vector", 4),
        (pa.list_(pa.float32(), 7), "vector", 7),
    ],
)
def test_observation_kinds(dtype, kind, dim):
    s = resolve(step_schema(observation=dtype))
    assert s.observation_kind == kind
    assert s.observation_dim == dim


@pytest.mark.parametrize(
    ("dtype", "kind", "is_vector"),
    [
        (pa.int64(), "discrete", False),
        (pa.int8(), "discrete", False),
        (pa.uint16(), "discrete", False),
        (pa.float64(), "continuous", False),
        (pa.float32(), "continuous", False),
        (pa.list_(F64), "continuous", True),
        (pa.list_(pa.float32(), 2), "continuous", True),
    ],
)
def test_action_kinds(dtype, kind, is_vector):
    s = resolve(step_schema(action=dtype))
    assert s.action_kind == kind
    assert s.action_is_vector is is_vector


@pytest.mark.parametrize(
    ("overrides", "column", "option"),
    [
        ({"reward": pa.string()}, "reward", "--reward-col"),
        ({"behavior_prob": pa.string()}, "behavior_prob", "--behavior-prob-col"),
        ({"action": pa.string()}, "action", "--action-col"),
        ({"action": pa.list_(pa.string())}, "action", "--action-col"),
        ({"observation": pa.string()}, "observation", "--obs-col"),
        ({"observation": pa.list_(pa.string())}, "observation", "--obs-col"),
        ({"episode_id": F64}, "episode_id", "--episode-col"),
        ({"step": F64}, "step", "--step-col"),
    ],
)
def test_wrong_types_name_column_and_option(overrides, column, option):
    with pytest.raises(DataError) as info:
        resolve(step_schema(**overrides))
    message = str(info.value)
    assert repr(column) in message
    assert option in message


def test_string_and_dictionary_episode_ids_are_accepted():
    assert resolve(step_schema(episode_id=pa.string())).columns["episode"] == "episode_id"
    assert resolve(step_schema(episode_id=pa.large_string())).columns["episode"] == "episode_id"
    dictionary = pa.dictionary(pa.int32(), pa.string())
    assert resolve(step_schema(episode_id=dictionary)).columns["episode"] == "episode_id"


def test_dictionary_encoded_numbers_are_read_as_their_values():
    """Arrow IPC files keep dictionary-encoded columns as such (Parquet hands back their
    values): a dictionary of integer actions or float rewards was refused as "expected
    integers, numbers or lists of numbers"."""
    s = resolve(
        step_schema(
            action=pa.dictionary(pa.int32(), pa.int64()),
            reward=pa.dictionary(pa.int8(), pa.float64()),
            observation=pa.dictionary(pa.int16(), pa.int64()),
        )
    )
    assert (s.action_kind, s.observation_kind) == ("discrete", "index")


def test_string_view_episode_ids_are_accepted():
    """string_view is a string type (Polars writes it to Arrow IPC by default)."""
    assert resolve(step_schema(episode_id=pa.string_view())).columns["episode"] == "episode_id"


# ---------------------------------------------------------------- behavior / target


def test_behavior_log_prob_column():
    s = resolve(step_schema(behavior_prob=None, behavior_log_prob=F64))
    assert s.behavior_is_log is True
    assert s.columns["behavior_log_prob"] == "behavior_log_prob"
    assert "behavior_prob" not in s.columns


def test_both_behavior_columns_prefer_probability_and_read_the_log_to_compare():
    s = resolve(step_schema(behavior_log_prob=F64))
    assert s.behavior_is_log is False
    assert "behavior_log_prob" not in s.columns
    # read too, and compared with the probabilities used (episodes: the disagreement tests)
    assert s.cross_checked == {"behavior_log_prob": "behavior_log_prob"}
    assert "behavior_log_prob" in s.read_columns


def test_a_column_named_by_its_option_is_not_cross_checked():
    for mapping in (dict(behavior_prob="behavior_prob"), dict(behavior_log_prob="logp")):
        s = resolve(step_schema(logp=F64, behavior_log_prob=F64), **mapping)
        assert s.cross_checked == {}, mapping
    chosen = resolve(step_schema(logp=F64), behavior_log_prob="logp")
    assert chosen.read_columns.count("behavior_prob") == 0


def test_a_twin_column_that_is_not_numbers_is_not_read():
    s = resolve(step_schema(behavior_log_prob=pa.string()))
    assert s.cross_checked == {} and "behavior_log_prob" not in s.read_columns


def test_behavior_log_prob_option_wins_over_probability_column():
    s = resolve(step_schema(logp=F64), behavior_log_prob="logp")
    assert s.behavior_is_log is True
    assert s.columns["behavior_log_prob"] == "logp"
    assert "behavior_prob" not in s.columns


def test_logged_target_without_target_column_is_a_data_error():
    with pytest.raises(DataError, match="target"):
        resolve(step_schema(), logged_target=True)


@pytest.mark.parametrize(
    ("name", "target"), [("target_prob", "prob"), ("target_log_prob", "log_prob")]
)
def test_logged_target_column(name, target):
    s = resolve(step_schema(**{name: F64}), logged_target=True)
    assert s.target == target
    assert s.columns[f"target_{target}"] == name
    assert name in s.read_columns


def test_logged_target_does_not_need_observations():
    s = resolve(step_schema(observation=None, target_prob=F64), logged_target=True)
    assert s.observation_kind is None
    assert "observation" not in s.columns


def test_target_columns_dropped_without_logged_target():
    s = resolve(step_schema(target_prob=F64, target_log_prob=F64), logged_target=False)
    assert s.target is None
    assert "target_prob" not in s.columns
    assert "target_log_prob" not in s.columns
    assert "target_prob" not in s.read_columns
    assert "target_log_prob" not in s.read_columns


def test_both_target_columns_prefer_probability_unless_option():
    schema = step_schema(target_prob=F64, target_log_prob=F64)
    assert resolve(schema, logged_target=True).target == "prob"
    chosen = resolve(schema, logged_target=True, target_log_prob="target_log_prob")
    assert chosen.target == "log_prob"
    assert "target_prob" not in chosen.columns


def test_a_list_column_in_step_layout_names_the_column_that_decided_the_layout():
    """Scalar rewards beside list actions and propensities: the data reads as step layout,
    and the error said only that 'action_probs' has a list type, not why lists were wrong
    there; it names the reward column that decided. The other way round likewise."""
    fields = {
        "episode_id": pa.int64(),
        "observations": pa.list_(pa.float64()),
        "actions": pa.list_(pa.int64()),
        "rewards": pa.float64(),
        "action_probs": pa.list_(pa.float64()),
    }
    with pytest.raises(
        DataError, match=r"step layout, one row a step, as 'rewards' holds no lists"
    ):
        resolve_schema(pa.schema(fields), ColumnMapping(), logged_target=False)
    fields |= {"rewards": pa.list_(pa.float64()), "action_probs": pa.float64()}
    with pytest.raises(DataError, match=r"episode layout, as 'rewards' holds lists"):
        resolve_schema(pa.schema(fields), ColumnMapping(), logged_target=False)
