"""Episode id keys and reappearing ids (ope_cli/data/ids.py); hashing is also covered end to
end in test_episodes.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ope_cli.data.ids import SeenKeys, display_id, id_keys, run_starts
from ope_cli.errors import DataError


def test_keys_are_stable_and_distinguish_types_of_ids():
    ints = id_keys(np.array([1, 2, 3]))
    assert ints.dtype == np.uint64 and len(set(ints.tolist())) == 3
    np.testing.assert_array_equal(ints, id_keys(pa.array([1, 2, 3])))
    strings = id_keys(pa.array(["a", "b", "a"]))
    assert strings[0] == strings[2] != strings[1]
    np.testing.assert_array_equal(strings, id_keys(pa.array(["a", "b", "a"], pa.large_string())))


def test_display_id_unwraps_numpy_scalars():
    assert type(display_id(np.int64(3))) is int and display_id("x") == "x"


def test_seen_keys_catch_a_reappearing_id():
    seen = SeenKeys()
    assert seen.add("a", id_keys(np.arange(5)), np.arange(5)) is None
    with pytest.raises(DataError, match="a.parquet: episode 3: episode id appears"):
        seen.add("a.parquet", id_keys(np.array([7, 3])), np.array([7, 3]))
    flagged = seen.add("b", id_keys(np.array([9, 4, 9])), np.array([9, 4, 9]), raise_error=False)
    np.testing.assert_array_equal(flagged, [1, 2])  # 4 seen before, 9 twice here
    assert set(seen.all_keys().tolist()) == set(id_keys(np.array([0, 1, 2, 3, 4, 9])).tolist())


@pytest.mark.parametrize("chunk", [7, 300, 5000])
def test_seen_keys_flag_exactly_the_reappearances_of_a_set(chunk):
    """Against a Python set, over enough chunks that the latest keys are merged into the
    rest several times: each chunk's flags are the ids seen in an earlier chunk and every
    repetition within it after its first; the keys kept hold each id once."""
    rng = np.random.default_rng(chunk)
    ids = rng.integers(0, 40_000, size=30_000)
    seen, before = SeenKeys(), set()
    for start in range(0, ids.size, chunk):
        part = ids[start : start + chunk]
        expected, here = [], set()
        for row, value in enumerate(part.tolist()):
            if value in before or value in here:
                expected.append(row)
            here.add(value)
        flagged = seen.add("f", id_keys(part), part, raise_error=False)
        np.testing.assert_array_equal([] if flagged is None else flagged, expected)
        before |= here
    np.testing.assert_array_equal(seen.all_keys(), np.sort(id_keys(np.array(sorted(before)))))


def test_seen_keys_name_where_a_reappearing_id_was_first_seen():
    """An episode split over files names both: the one it reappears in and the first;
    over enough files that the keys seen first were merged with later ones."""
    seen = SeenKeys()
    for k in range(40):  # 40 files of 200 ids each: several merges of the latest keys
        ids = np.arange(200 * k, 200 * (k + 1))
        seen.add(f"part-{k}.parquet", id_keys(ids), ids)
    for episode, first in ((5, "part-0.parquet"), (7_999, "part-39.parquet")):
        with pytest.raises(DataError) as error:
            seen.add("late.parquet", id_keys(np.array([episode])), np.array([episode]))
        assert str(error.value) == (
            f"late.parquet: episode {episode}: episode id appears in more than one place (its "
            f"rows must be contiguous within one file); seen first in {first}"
        )
    with pytest.raises(DataError, match=r"appears .*; seen earlier in this file$"):
        seen.add("part-3.parquet", id_keys(np.array([600])), np.array([600]))
    # an id twice in one chunk is found before one seen in an earlier file (1, in part-0)
    with pytest.raises(DataError, match=r"episode 90000: .*; seen earlier in this file$"):
        seen.add("x.parquet", id_keys(np.array([90_000, 1, 90_000])), np.array([90_000, 1, 90_000]))


def test_seen_keys_name_the_first_reappearing_row():
    seen = SeenKeys()
    seen.add("a", id_keys(np.arange(0, 10_000, 2)), np.arange(0, 10_000, 2))
    later = np.array([5, 7, 4002, 11, 8])  # rows 2 and 4 seen before
    with pytest.raises(DataError, match="b: episode 4002: episode id appears"):
        seen.add("b", id_keys(later), later)


def colliding_ids() -> tuple[str, str]:
    """Two different strings of one key: the Thue-Morse string of length 2048 and its
    complement collide under any polynomial hash modulo 2^64 with an odd base."""
    bits = [bin(i).count("1") % 2 for i in range(2048)]
    return "".join("ab"[b] for b in bits), "".join("ba"[b] for b in bits)


def test_runs_of_string_ids_start_where_the_ids_change_even_when_their_keys_collide():
    first, second = colliding_ids()
    ids = np.array([first, first, second, second], object)
    keys = id_keys(pa.array(ids.tolist()))
    assert keys[0] == keys[2]  # the collision the ids themselves resolve
    assert run_starts(keys).tolist() == [0]
    assert run_starts(keys, ids).tolist() == [0, 2]
    integers = np.array([5, 5, 7, 7, 5])
    assert run_starts(id_keys(integers), integers).tolist() == [0, 2, 4]


def test_an_id_and_its_64_bit_twin_of_the_other_signedness_are_said_to_be_one():
    """-1 in an int64 column and 2**64 - 1 in a uint64 one are one 64-bit key: they were
    refused as one episode's rows in two places, with no word of why two different ids
    were one. The message says it."""
    seen = SeenKeys()
    signed = np.array([-1, 5], np.int64)
    seen.add("a.parquet", id_keys(signed), signed)
    unsigned = np.array([2**64 - 1], np.uint64)
    with pytest.raises(DataError) as error:
        seen.add("b.parquet", id_keys(unsigned), unsigned)
    assert str(error.value).endswith(
        "seen first in a.parquet (ids are compared as 64-bit integers: 18446744073709551615 "
        "and -1 are one id)"
    )
    # the same id again in a column of the same kind, or an id both kinds hold: as before
    for ids in (signed[:1], signed[1:], np.array([5], np.uint64)):
        with pytest.raises(DataError, match=r"seen first in a.parquet$"):
            seen.add("c.parquet", id_keys(ids), ids)
