"""Arrow columns -> NumPy with null and ragged flags (ope_cli/data/decode.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ope_cli.data.decode import Where, list_lengths, numbers, plain, vectors
from ope_cli.data.validate import READ_FLAGS
from ope_cli.errors import DataError


def locate(row: int) -> tuple[object, int]:
    return 7, row


def test_numbers_raise_on_a_null_without_flags():
    with pytest.raises(DataError, match=r"f: episode 7, step 1: column 'r' is null.*1 row"):
        numbers(pa.array([1.0, None]), "r", np.float64, Where("f", locate), "null_reward")


def test_numbers_fill_and_mark_nulls_with_flags():
    flags = np.zeros(3, np.uint16)
    values = numbers(
        pa.array([0.5, None, 0.25]), "p", np.float64, Where("f", locate, flags), "null_reward", 1.0
    )
    np.testing.assert_array_equal(values, [0.5, 1.0, 0.25])
    np.testing.assert_array_equal(flags, [0, 1 << READ_FLAGS.index("null_reward"), 0])


def test_vectors_mark_ragged_rows_as_zeros():
    flags = np.zeros(3, np.uint16)
    array = pa.array([[1.0, 2.0], [3.0], [4.0, 5.0]])
    matrix = vectors(array, "obs", Where("f", locate, flags), None)
    np.testing.assert_array_equal(matrix, [[1, 2], [0, 0], [4, 5]])
    assert flags[1] == 1 << READ_FLAGS.index("ragged_observation")
    with pytest.raises(DataError, match="vector of length 1, but the data.s vectors have length 2"):
        vectors(array, "obs", Where("f", locate), None)


def test_plain_and_list_lengths():
    assert plain(pa.chunked_array([["a"], ["b"]]).dictionary_encode()).type == pa.string()
    np.testing.assert_array_equal(list_lengths(pa.array([[1], None, [1, 2]])), [1, 0, 2])


def test_numbers_read_whole_floats_as_integers_and_refuse_fractions():
    np.testing.assert_array_equal(
        numbers(pa.array([0.0, 2.0]), "a", np.int64, Where("f", locate), "null_action"), [0, 2]
    )
    for bad in (0.9, float("nan")):
        with pytest.raises(
            DataError,
            match=r"f: episode 7, step 1: column 'a' holds .* where "
            r"whole numbers are expected.*1 such value",
        ):
            numbers(pa.array([1.0, bad]), "a", np.int64, Where("f", locate), "null_action")


def test_vectors_without_a_width_take_the_first_non_null_ones():
    """Without the data's width (``StepConverter`` is normally given it), a batch's first
    non-null vector sets it, whatever most of the batch holds; a batch of nulls sets none."""
    flags = np.zeros(4, np.uint16)
    array = pa.array([None, [1.0, 2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])
    matrix = vectors(array, "obs", Where("f", locate, flags), None)
    assert matrix.shape == (4, 3)
    ragged = 1 << READ_FLAGS.index("ragged_observation")
    np.testing.assert_array_equal(flags & ragged, [0, 0, ragged, ragged])
    nulls = vectors(
        pa.array([None, None], pa.list_(pa.float64())),
        "obs",
        Where("f", locate, np.zeros(2, np.uint16)),
        None,
    )
    assert nulls.shape == (2, 0)


def test_a_null_inside_a_vector_is_not_called_a_null_column():
    """[0.3, None] is a vector with a null entry: the message says so (the row is not
    null), and the one of a null row stays as it was."""
    inside = pa.array([[0.1, 0.2], [0.3, None]], pa.list_(pa.float64()))
    with pytest.raises(DataError, match=r"step 1: column 'obs' has a null in its list; every"):
        vectors(inside, "obs", Where("f", locate), 2)
    row = pa.array([[0.1, 0.2], None], pa.list_(pa.float64()))
    with pytest.raises(DataError, match=r"step 1: column 'obs' is null; every step"):
        vectors(row, "obs", Where("f", locate), 2)
    flags = np.zeros(2, np.uint16)
    vectors(inside, "obs", Where("f", locate, flags), 2)  # flagged: the row's null bit
    np.testing.assert_array_equal(flags, [0, 1 << READ_FLAGS.index("null_observation")])
