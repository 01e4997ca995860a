"""Where the values of a small HDF5 dataset lie in its file, read from the dataset's object
header in Python, so that they can be taken from a memory map of the file; and the links
of a group, from its symbol table.

libhdf5 costs about 0.1 ms to open a dataset and as much again to read a chunked one the
first time (it loads and decodes the object header, then the chunk index); Minari stores
five or more small datasets per episode, so that dominates reading it. This module decodes
only the common case (HDF5 file format of libver "earliest", h5py's default: version 1
object headers, old-style groups, version 3 layout messages, version 1 B-trees) of
unfiltered integer, IEEE float or h5py bool datasets, compact, contiguous or chunked;
anything else raises Unsupported, and the caller lets libhdf5 read it. See the HDF5 File
Format Specification, sections III.A (B-trees, symbol tables, local heaps), IV.A (object
headers) and IV.A.2 (messages).
"""

from __future__ import annotations

import functools
import math
import struct

import numpy as np

SIGNATURE = b"\x89HDF\r\n\x1a\n"
UNDEFINED = 0xFFFF_FFFF_FFFF_FFFF
DATASPACE, DATATYPE, EXTERNAL, LAYOUT, FILTERS, CONTINUATION = 0x1, 0x3, 0x7, 0x8, 0xB, 0x10
SYMBOL_TABLE = 0x11  # an old-style group: its B-tree and local heap
ENTRY = 40  # bytes of a symbol table entry (8-byte offsets)
SHARED = 0x02  # message flag: the message lives elsewhere
# (bit precision, exponent location, exponent size, mantissa size, exponent bias) of IEEE
IEEE = {2: (16, 10, 5, 10, 15), 4: (32, 23, 8, 23, 127), 8: (64, 52, 11, 52, 1023)}


class Unsupported(Exception):
    """A dataset stored in a way this module does not decode (libhdf5 reads it)."""


def _decoding(method):
    """``method`` raising Unsupported for bytes it cannot decode (a corrupt file: libhdf5
    then reads it, and says what is wrong)."""

    @functools.wraps(method)
    def decode(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except (struct.error, ValueError, IndexError, KeyError, TypeError, OverflowError) as error:
            raise Unsupported(f"cannot decode: {error}") from None

    return decode


class RawReader:
    """Reads datasets of one HDF5 file from ``data``, the file's bytes (a memory map).

    Addresses are those libhdf5 reports for objects (relative to the superblock's base).
    """

    def __init__(self, data: np.ndarray):
        self.data = data
        self.raw = memoryview(data)
        if bytes(self.raw[:8]) != SIGNATURE:
            raise Unsupported("no superblock at the start of the file (a user block?)")
        version = self.raw[8]
        sizes = (self.raw[13], self.raw[14]) if version < 2 else (self.raw[9], self.raw[10])
        if sizes != (8, 8):
            raise Unsupported(f"offsets and lengths of {sizes} bytes")
        base_at = {0: 24, 1: 28}.get(version, 12)
        self.base = self._u64(base_at)

    def _u64(self, at: int) -> int:
        return struct.unpack_from("<Q", self.raw, at)[0]

    def _check(self, at: int, size: int) -> int:
        if at < 0 or at + size > self.data.size:
            raise Unsupported("an address past the end of the file")
        return at

    @_decoding
    def read(self, address: int, rows_only: bool = False) -> np.ndarray:
        """[K, ...] values of the dataset whose object header is at ``address`` (an empty
        [K, 0] array when ``rows_only``); raises Unsupported."""
        messages = self._messages(self.base + address)
        if EXTERNAL in messages or DATASPACE not in messages or DATATYPE not in messages:
            raise Unsupported("not a dataset stored in this file")
        filters = messages.get(FILTERS)
        if filters is not None and filters[1] != 0:
            raise Unsupported("filtered (compressed) data")
        dims = _dims(messages[DATASPACE])
        if rows_only:
            return np.empty((dims[0], 0), np.uint8)
        dtype = _dtype(messages[DATATYPE])
        return self._values(messages.get(LAYOUT), dims, dtype)

    def _messages(self, at: int) -> dict[int, memoryview]:
        """{message type: its data} of a version 1 object header at absolute ``at``."""
        raw = self.raw
        self._check(at, 16)
        if raw[at] != 1:
            raise Unsupported(f"object header version {raw[at]}")
        count, size = (
            struct.unpack_from("<H", raw, at + 2)[0],
            struct.unpack_from("<I", raw, at + 8)[0],
        )
        blocks, found, seen = [(at + 16, size)], {}, 0
        while blocks and seen < count:
            start, size = blocks.pop(0)
            position, end = start, self._check(start, size) + size
            while position + 8 <= end and seen < count:
                kind, length, flags = struct.unpack_from("<HHB", raw, position)
                body = raw[position + 8 : position + 8 + length]
                position += 8 + length
                seen += 1
                if kind in (DATASPACE, DATATYPE, LAYOUT, FILTERS) and flags & SHARED:
                    raise Unsupported("a shared message")
                if kind == CONTINUATION:
                    offset, length = struct.unpack_from("<QQ", body)
                    blocks.append((self.base + offset, length))
                elif kind not in found:
                    found[kind] = body
        return found

    @_decoding
    def links(self, address: int, prefix: str = "", depth: int = 0) -> dict[str, int]:
        """{path: object header address} of the objects under the old-style group whose
        object header is at ``address``, through the subgroups whose symbol table entries
        cache their symbol tables (libhdf5 writes them so); raises Unsupported."""
        if depth > 8:
            raise Unsupported("groups nested too deep")
        table = self._messages(self.base + address).get(SYMBOL_TABLE)
        if table is None:
            raise Unsupported("not an old-style group")
        return self._table(*struct.unpack_from("<QQ", table), prefix, depth)

    def _table(self, tree: int, heap: int, prefix: str, depth: int) -> dict[str, int]:
        raw, at = self.raw, self._check(self.base + heap, 32)
        if bytes(raw[at : at + 4]) != b"HEAP":
            raise Unsupported("not a local heap")
        size, _, names_at = struct.unpack_from("<QQQ", raw, at + 8)
        names = bytes(raw[self._check(self.base + names_at, size) :][:size])
        found: dict[str, int] = {}
        for node in self._nodes(self.base + tree, 0, 0):
            at = self._check(node, 8)
            if bytes(raw[at : at + 4]) != b"SNOD":
                raise Unsupported("not a symbol table node")
            count = struct.unpack_from("<H", raw, at + 6)[0]
            self._check(at + 8, count * ENTRY)
            for i in range(count):
                offset, header, cache = struct.unpack_from("<QQI", raw, at + 8 + i * ENTRY)
                name = prefix + names[offset : names.index(b"\0", offset)].decode()
                found[name] = header
                if cache == 1:  # a group: its B-tree and heap in the scratch pad
                    cached = struct.unpack_from("<QQ", raw, at + 8 + i * ENTRY + 24)
                    found.update(self._table(*cached, f"{name}/", depth + 1))
        return found

    def _nodes(self, at: int, kind: int, depth: int) -> list[int]:
        """Absolute addresses of the leaves (children of level 0) under the version 1
        B-tree node at absolute ``at`` of node type ``kind``."""
        raw = self.raw
        self._check(at, 24)
        if bytes(raw[at : at + 4]) != b"TREE" or raw[at + 4] != kind or depth > 16:
            raise Unsupported("not a B-tree node of the expected type")
        level, entries = raw[at + 5], struct.unpack_from("<H", raw, at + 6)[0]
        self._check(at + 24, entries * 16 + 8)
        children = struct.unpack_from(f"<{2 * entries + 1}Q", raw, at + 24)[1::2]
        if level == 0:
            return [self.base + c for c in children]
        return [leaf for c in children for leaf in self._nodes(self.base + c, kind, depth + 1)]

    def _values(self, layout: memoryview | None, dims: tuple[int, ...], dtype: np.dtype):
        if layout is None or layout[0] != 3:
            raise Unsupported("layout message version other than 3")
        size = math.prod(dims) * dtype.itemsize
        if layout[1] == 0:  # compact: the values are in the header
            stored = struct.unpack_from("<H", layout, 2)[0]
            if stored < size:
                raise Unsupported("compact data smaller than its dataspace")
            return np.frombuffer(layout[4 : 4 + size], dtype).reshape(dims)
        if layout[1] == 1:  # contiguous
            address = struct.unpack_from("<Q", layout, 2)[0]
            if address == UNDEFINED:
                raise Unsupported("unallocated data")
            at = self._check(self.base + address, size)
            return self.data[at : at + size].view(dtype).reshape(dims)
        if layout[1] == 2:
            return self._chunked(layout, dims, dtype)
        raise Unsupported(f"layout class {layout[1]}")

    def _chunked(self, layout: memoryview, dims: tuple[int, ...], dtype: np.dtype):
        """Values of a chunked dataset: its chunks copied into place (a loop over chunks,
        not rows; a Minari dataset has one or a few)."""
        rank = layout[2] - 1
        address = struct.unpack_from("<Q", layout, 3)[0]
        shape = struct.unpack_from(f"<{rank + 1}I", layout, 11)
        if rank != len(dims) or shape[-1] != dtype.itemsize:
            raise Unsupported("chunk dimensions do not match the dataspace")
        chunk, chunk_bytes = shape[:rank], math.prod(shape)
        expected = math.prod(-(-d // c) for d, c in zip(dims, chunk, strict=True))
        if address == UNDEFINED:
            if expected:
                raise Unsupported("unallocated chunks")
            return np.zeros(dims, dtype)
        chunks = self._chunks(self.base + address, rank, 0)
        if len(chunks) != expected:
            raise Unsupported("missing chunks (fill values)")
        if len(chunks) == 1 and chunk == dims and chunks[0][1:3] == (chunk_bytes, 0):
            at = self._check(self.base + chunks[0][0], chunk_bytes)
            return self.data[at : at + chunk_bytes].view(dtype).reshape(dims)
        values = np.empty(dims, dtype)
        for where, size, mask, offsets in chunks:
            if mask != 0 or size != chunk_bytes:
                raise Unsupported("a filtered chunk")
            at = self._check(self.base + where, size)
            block = self.data[at : at + size].view(dtype).reshape(chunk)
            target = tuple(
                slice(o, min(o + c, d)) for o, c, d in zip(offsets, chunk, dims, strict=True)
            )
            values[target] = block[tuple(slice(0, s.stop - s.start) for s in target)]
        return values

    def _chunks(self, at: int, rank: int, depth: int) -> list[tuple[int, int, int, tuple]]:
        """(address, size, filter mask, [rank] offsets) of every chunk under the version 1
        B-tree node at absolute ``at``."""
        raw = self.raw
        self._check(at, 24)
        if bytes(raw[at : at + 4]) != b"TREE" or raw[at + 4] != 1 or depth > 16:
            raise Unsupported("not a chunk B-tree node")
        level, entries = raw[at + 5], struct.unpack_from("<H", raw, at + 6)[0]
        key = 8 + 8 * (rank + 1)
        self._check(at + 24, entries * (key + 8) + key)
        found = []
        for i in range(entries):
            position = at + 24 + i * (key + 8)
            size, mask = struct.unpack_from("<II", raw, position)
            offsets = struct.unpack_from(f"<{rank}Q", raw, position + 8)
            child = struct.unpack_from("<Q", raw, position + key)[0]
            if level == 0:
                found.append((child, size, mask, offsets))
            else:
                found += self._chunks(self.base + child, rank, depth + 1)
        return found


def _dims(message: memoryview) -> tuple[int, ...]:
    """The dimensions of a simple dataspace (version 1 or 2 message)."""
    version, rank = message[0], message[1]
    if version == 1:
        start = 8
    elif version == 2 and message[3] == 1:
        start = 4
    else:
        raise Unsupported("a scalar, null or unknown dataspace")
    if rank == 0:
        raise Unsupported("a scalar dataspace")
    return struct.unpack_from(f"<{rank}Q", message, start)


def _dtype(message: memoryview) -> np.dtype:
    """The NumPy dtype of an integer or IEEE float datatype message; raises Unsupported."""
    kind, bits = message[0] & 0x0F, message[1] | message[2] << 8 | message[3] << 16
    size = struct.unpack_from("<I", message, 4)[0]
    order = ">" if bits & 1 else "<"
    if kind == 0:  # fixed point: bit offset 0, every bit used, no padding bits
        offset, precision = struct.unpack_from("<HH", message, 8)
        if bits & 0b110 or offset != 0 or precision != 8 * size or size not in (1, 2, 4, 8):
            raise Unsupported("an integer type with padding")
        return np.dtype(f"{order}{'i' if bits & 0b1000 else 'u'}{size}")
    if kind == 1 and size in IEEE:
        offset, precision, exp_at, exp_size, man_at, man_size, bias = struct.unpack_from(
            "<HHBBBBI", message, 8
        )
        ieee = (precision, exp_at, exp_size, man_size, bias)
        sign = (bits >> 8) & 0xFF
        plain = bits & 0b1110 == 0 and bits & 0x40 == 0 and (bits >> 4) & 0b11 == 2
        if plain and offset == 0 and man_at == 0 and ieee == IEEE[size] and sign == precision - 1:
            return np.dtype(f"{order}f{size}")
    if kind == 8 and _is_bool(message, bits & 0xFFFF):
        return np.dtype(bool)
    raise Unsupported(f"datatype class {kind} of {size} bytes")


def _is_bool(message: memoryview, members: int) -> bool:
    """Whether an enumeration datatype message is h5py's bool: base int8, FALSE = 0 and
    TRUE = 1 (version 1 or 2: names null-terminated, padded to 8 bytes, then values)."""
    base = message[8:20]  # an 8-bit integer's message: 8 bytes and 4 of properties
    if members != 2 or message[0] >> 4 not in (1, 2) or len(base) < 12:
        return False
    if base[0] & 0x0F != 0 or struct.unpack_from("<I", base, 4)[0] != 1:
        return False
    if bytes(message[20:36]) != b"FALSE\0\0\0TRUE\0\0\0\0":
        return False
    return bytes(message[36:38]) == b"\x00\x01"
