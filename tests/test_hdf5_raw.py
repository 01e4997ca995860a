"""Decoding small HDF5 datasets' storage in Python (ope_cli/data/sources/hdf5_raw.py): every
layout it claims to read gives exactly what h5py reads, and every other one (filters,
user blocks, newer object headers, strings, fill values) raises Unsupported."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from ope_cli.data.sources.hdf5_raw import RawReader, Unsupported  # noqa: E402

RNG = np.random.default_rng(0)
READ = {  # name: (data, create_dataset keywords)
    "contiguous_f8": (RNG.normal(size=(7, 3)), {}),
    "contiguous_f4_1d": (RNG.normal(size=11).astype(np.float32), {}),
    "big_endian_f8": (RNG.normal(size=(5, 2)).astype(">f8"), {}),
    "big_endian_i4": (RNG.integers(-9, 9, 6).astype(">i4"), {}),
    "half": (RNG.normal(size=4).astype(np.float16), {}),
    "uint16": (RNG.integers(0, 60000, 9).astype(np.uint16), {}),
    "int8": (RNG.integers(-100, 100, 9).astype(np.int8), {}),
    "bools": (RNG.uniform(size=8) < 0.5, {}),
    "compact": (np.arange(5, dtype=np.int64), {"compact": True}),
    "one_chunk": (RNG.normal(size=(6, 2)), {"chunks": True, "maxshape": (None, 2)}),
    "edge_chunks_2d": (RNG.normal(size=(1066, 8)).astype(np.float32), {"chunks": (533, 4)}),
    "ragged_chunks": (RNG.integers(0, 9, (10, 3)), {"chunks": (4, 2)}),
    "chunks_3d": (RNG.normal(size=(5, 3, 4)), {"chunks": (2, 3, 3)}),
    "bool_chunks": (RNG.uniform(size=(9,)) < 0.5, {"chunks": (4,), "maxshape": (None,)}),
    "empty_chunked": (np.zeros((0, 2)), {"chunks": (4, 2), "maxshape": (None, 2)}),
}
UNSUPPORTED = {
    "gzip": (RNG.normal(size=(50, 2)), {"chunks": (10, 2), "compression": "gzip"}),
    "shuffle": (RNG.normal(size=(50,)), {"chunks": (10,), "shuffle": True}),
    "strings": (np.array([b"ab", b"cd"]), {}),
    "scalar": (np.float64(3.0), {}),
    "compound": (np.zeros(3, [("a", "<f8"), ("b", "<i4")]), {}),
    "unallocated": (None, {"shape": (4,), "dtype": "f8"}),
    "fill_values": (None, {"shape": (8,), "dtype": "f8", "chunks": (4,)}),
}


def reader(path) -> RawReader:
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return RawReader(np.frombuffer(mapped, np.uint8))


def addresses(handle) -> dict[str, int]:
    found = {}
    handle.id.links.visit(lambda name, info: found.__setitem__(name.decode(), info.u), info=True)
    return found


def write(path, cases, **file_options):
    with h5py.File(path, "w", **file_options) as handle:
        for name, (data, options) in cases.items():
            if options.get("compact"):
                plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                plist.set_layout(h5py.h5d.COMPACT)
                options = {"dcpl": plist}
            handle.create_dataset(name, data=data, **options)
        if "fill_values" in cases:
            handle["fill_values"][:4] = 1.0  # one of two chunks written
        handle.create_group("episode_0/infos").create_dataset("x", data=np.arange(3.0))
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write(tmp_path_factory.mktemp("raw") / "raw.h5", {**READ, **UNSUPPORTED})


@pytest.mark.parametrize("name", [*READ, "episode_0/infos/x"])
def test_reads_what_h5py_reads(written, name):
    with h5py.File(written, "r") as handle:
        expected, address = handle[name][()], addresses(handle)[name]
    got = reader(written).read(address)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert reader(written).read(address, rows_only=True).shape == (expected.shape[0], 0)


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_other_storage_is_left_to_libhdf5(written, name):
    with h5py.File(written, "r") as handle:
        address = addresses(handle)[name]
    with pytest.raises(Unsupported):
        reader(written).read(address)


def test_a_group_is_not_a_dataset(written):
    with h5py.File(written, "r") as handle:
        address = addresses(handle)["episode_0"]
    with pytest.raises(Unsupported):
        reader(written).read(address)


def test_newer_file_formats_and_user_blocks_are_left_to_libhdf5(tmp_path):
    latest = write(tmp_path / "latest.h5", {"x": READ["contiguous_f8"]}, libver="latest")
    with h5py.File(latest, "r") as handle:
        address = addresses(handle)["x"]
    with pytest.raises(Unsupported, match="object header version"):
        reader(latest).read(address)
    user_block = write(tmp_path / "user.h5", {"x": READ["contiguous_f8"]}, userblock_size=512)
    with pytest.raises(Unsupported, match="user block"):
        reader(user_block)


def test_a_truncated_file_is_never_read_past_its_end(tmp_path, written):
    with h5py.File(written, "r") as handle:
        found = addresses(handle)
    data = written.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: found["edge_chunks_2d"] + 64])
    with pytest.raises(Unsupported):
        reader(cut).read(found["edge_chunks_2d"])


def test_groups_list_what_libhdf5_lists(tmp_path):
    path = tmp_path / "groups.h5"
    with h5py.File(path, "w") as handle:
        wide = handle.create_group("wide")  # hundreds of links: a B-tree of several levels
        for i in range(300):
            wide.create_dataset(f"d{i}", data=np.arange(2))
        nested = handle.create_group("episode_3")
        nested.create_dataset("actions", data=np.arange(3))
        nested.create_dataset("observations/pos", data=np.zeros((4, 2)))
        nested.create_dataset("infos/extra/speed", data=np.zeros((4, 2)))
    with h5py.File(path, "r") as handle:
        found = addresses(handle)
        for name in ("wide", "episode_3"):
            group, expected = handle[name], {}
            group.id.links.visit(
                lambda link, info, into=expected: into.__setitem__(link.decode(), info.u),
                info=True,
            )
            assert reader(path).links(found[name]) == expected
    assert len(reader(path).links(found["wide"])) == 300
    pos = found["episode_3/observations/pos"]
    assert reader(path).links(found["episode_3/observations"]) == {"pos": pos}
    with pytest.raises(Unsupported):
        reader(path).links(found["episode_3/actions"])  # a dataset


def test_newer_groups_are_left_to_libhdf5(tmp_path):
    path = tmp_path / "latest.h5"
    with h5py.File(path, "w", libver="latest") as handle:
        handle.create_dataset("episode_0/actions", data=np.arange(3))
    with h5py.File(path, "r") as handle:
        address = handle.id.links.get_info(b"episode_0").u
    with pytest.raises(Unsupported):
        reader(path).links(address)


def test_corrupt_headers_are_unsupported_or_read_never_a_crash(tmp_path, written):
    with h5py.File(written, "r") as handle:
        found = addresses(handle)
    data = bytearray(written.read_bytes())
    targets = [("read", found["edge_chunks_2d"]), ("links", found["episode_0"])]
    rng = np.random.default_rng(1)
    for kind, address in targets:
        for position in range(address, address + 256, 3):
            corrupt = bytearray(data)
            corrupt[position] = int(rng.integers(0, 256))
            path = tmp_path / "corrupt.h5"
            path.write_bytes(bytes(corrupt))
            try:
                getattr(reader(path), kind)(address)
            except Unsupported:
                pass
