"""A GGUF file's metadata and tensor table, read in one pass over its header.

gguf-py's ``GGUFReader`` builds a memory-mapped view per value, so a vocabulary of 49k-262k strings
(tokens, merges) takes it 7-18 s; this reader decodes the same header from bytes in well under a
second. Tensor data stays memory-mapped, in the layout ``gguf.quants.dequantize`` takes (the
reader's own: element arrays for float and integer types, bytes per row for block-quantized ones).
The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (little-endian files; big-endian
ones are refused by name).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# value type id -> (struct code, numpy dtype) for scalars; 8 is a string, 9 an array
_SCALARS = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "?"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY = 8, 9
# tensor types stored as plain element arrays (the rest are blocks of bytes)
_ELEMENT_TYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}


class GGUFFormatError(ValueError):
    """The file is not a GGUF this reader can read (truncated, damaged or big-endian)."""


@dataclass
class Tensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: the contiguous dimension first
    data: np.ndarray  # memory-mapped (for small tensors: read_data copies a large one out without a map)
    path: Path
    offset: int  # of the data in the file


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def take(self, code: str):
        size = struct.calcsize(code)
        if self.pos + size > len(self.buf):
            raise GGUFFormatError(f"the header ends early (at byte {self.pos})")
        (value,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFFormatError(f"a string runs past the end of the file (at byte {self.pos})")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item not in _SCALARS:  # arrays of arrays: no model key uses them
                raise GGUFFormatError(f"unsupported array item type {item}")
            dtype = np.dtype(_SCALARS[item][1])
            end = self.pos + count * dtype.itemsize
            if end > len(self.buf):
                raise GGUFFormatError(f"an array runs past the end of the file (at byte {self.pos})")
            values = np.frombuffer(self.buf[self.pos : end], dtype=dtype).tolist()
            self.pos = end
            return values
        if kind not in _SCALARS:
            raise GGUFFormatError(f"unknown value type {kind} at byte {self.pos}")
        return self.take(_SCALARS[kind][0])


def read(path: Path) -> tuple[dict[str, Any], list[Tensor]]:
    """(metadata, tensors) of the GGUF at ``path``; raises GGUFFormatError on a file it cannot read."""
    import gguf

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(raw.data)
    if bytes(cur.buf[:4]) != MAGIC:
        raise GGUFFormatError("not a GGUF file (no GGUF magic)")
    cur.pos = 4
    version = cur.take("<I")
    if version not in (2, 3):
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        raise GGUFFormatError(
            f"big-endian GGUF (version {swapped}) is not supported"
            if swapped in (2, 3)
            else f"unsupported GGUF version {version}"
        )
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
        infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
    alignment = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cur.pos // alignment) * alignment

    tensors, seen = [], set()
    for name, dims, type_id, offset in infos:
        if name in seen:
            raise GGUFFormatError(f"tensor '{name}' appears twice")
        seen.add(name)
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise GGUFFormatError(f"tensor '{name}' has an unknown type {type_id}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        count = int(np.prod(dims, dtype=np.int64))
        n_bytes = count * type_size // block
        begin = start + offset
        if begin + n_bytes > raw.size:
            raise GGUFFormatError(f"tensor '{name}' runs past the end of the file")
        shape = tuple(reversed(dims))
        if qtype.name in _ELEMENT_TYPES:
            data = raw[begin : begin + n_bytes].view(_ELEMENT_TYPES[qtype.name]).reshape(shape)
        else:
            data = raw[begin : begin + n_bytes].reshape(gguf.quant_shape_to_byte_shape(shape, qtype))
        tensors.append(Tensor(name, qtype, dims, data, path, begin))
    return meta, tensors


def read_data(t: Tensor) -> np.ndarray:
    """``t.data`` copied out of the file with pread: a memory map's touched pages would count as the
    process's memory for as long as the map is open (tensors.py)."""
    from .tensors import pread_array

    return pread_array(t.path, t.offset, t.data.nbytes, t.data.dtype, t.data.shape)
