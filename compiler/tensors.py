"""Weights that are read when asked for, one tensor at a time, so a build's memory does not grow
with the model.

A ``Tensors`` maps a name to how to make that array (read it from a checkpoint, cut or join other
tensors, merge a LoRA) and, where known without making it, its shape. Every stage between the
checkpoint and the quantized parameters (import, LoRA merge, the family's name mapping) passes
``Tensors`` on; quantization asks for one tensor, encodes it and drops it. Nothing is kept unless
asked for: ``cached(max_bytes)`` keeps the most recently used arrays up to a budget, for a pass
that reads the same layer's weights again and again (GPTQ's calibration forward).

Checkpoint readers here copy each tensor out of its file with ``pread`` instead of a memory map:
a mapped file's touched pages count as the process's memory until the map goes, so reading a
3 GB checkpoint through one would hold 3 GB.
"""

from __future__ import annotations

import json
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from .errors import LanternError

Loader = Callable[[], np.ndarray]


class Tensors(Mapping[str, np.ndarray]):
    """name -> float array, made on each look-up (see the module's docstring)."""

    def __init__(
        self,
        loaders: Mapping[str, Loader],
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        origins: Mapping[str, str] | None = None,
    ):
        self._loaders = dict(loaders)
        self._shapes = {k: tuple(v) for k, v in (shapes or {}).items() if k in self._loaders}
        self._origins = {k: v for k, v in (origins or {}).items() if k in self._loaders}  # name -> its file

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray]) -> "Tensors":
        """Arrays already in memory (tests, small adapters) as Tensors; a Tensors is returned as is."""
        if isinstance(arrays, Tensors):
            return arrays
        loaders = {k: (lambda v=v: v) for k, v in arrays.items()}
        return cls(loaders, {k: np.shape(v) for k, v in arrays.items()})

    def __getitem__(self, name: str) -> np.ndarray:
        return self._loaders[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def __contains__(self, name: object) -> bool:
        return name in self._loaders

    def loader(self, name: str) -> Loader:
        return self._loaders[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape; made (and dropped) to learn it where no reader said."""
        if name not in self._shapes:
            self._shapes[name] = tuple(self[name].shape)
        return self._shapes[name]

    def origin(self, name: str) -> str | None:
        """The checkpoint file a tensor is read from, where one is (for error messages)."""
        return self._origins.get(name)

    def size(self, name: str) -> int:
        return int(np.prod(self.shape(name), dtype=np.int64))

    def replaced(
        self, loaders: Mapping[str, Loader], shapes: Mapping[str, tuple[int, ...]] | None = None, drop: tuple[str, ...] = ()
    ) -> "Tensors":
        """These tensors with ``loaders`` added or replacing, and ``drop`` left out. A replaced tensor
        keeps its known shape unless ``shapes`` gives another."""
        merged = {k: v for k, v in self._loaders.items() if k not in drop}
        merged.update(loaders)
        known = {k: v for k, v in self._shapes.items() if k not in drop}
        known.update(shapes or {})
        return Tensors(merged, known, {k: v for k, v in self._origins.items() if k not in drop})

    def renamed(self, fn: Callable[[str], str]) -> "Tensors":
        """These tensors under the names ``fn`` gives."""
        return Tensors(
            {fn(k): v for k, v in self._loaders.items()},
            {fn(k): v for k, v in self._shapes.items()},
            {fn(k): v for k, v in self._origins.items()},
        )

    def transformed(self, names, fn: Callable[[np.ndarray], np.ndarray]) -> "Tensors":
        """These tensors with ``fn`` applied to each of ``names`` when it is made (``fn`` keeps the shape)."""
        made = {k: (lambda load=self._loaders[k]: fn(load())) for k in names}
        return self.replaced(made)

    def cached(self, max_bytes: int) -> "Tensors":
        """A view that keeps the most recently made arrays, up to ``max_bytes`` in all (thread-safe)."""
        keep: OrderedDict[str, np.ndarray] = OrderedDict()
        lock = threading.Lock()

        def load(name: str) -> np.ndarray:
            with lock:
                if name in keep:
                    keep.move_to_end(name)
                    return keep[name]
            array = self._loaders[name]()
            if array.nbytes <= max_bytes:
                with lock:
                    keep[name] = array
                    while sum(a.nbytes for a in keep.values()) > max_bytes:
                        keep.popitem(last=False)
            return array

        loaders = {k: (lambda k=k: load(k)) for k in self._loaders}
        return Tensors(loaders, self._shapes, self._origins)


def join_rows(parts: list[Loader]) -> Loader:
    """A loader of the named parts stacked along the first axis (fused q/k/v, gate/up)."""
    return lambda: np.concatenate([p() for p in parts], axis=0)


def pread_array(path: Path, offset: int, nbytes: int, dtype, shape) -> np.ndarray:
    """``nbytes`` at ``offset`` of ``path`` as a fresh array (no memory map: see the module's docstring)."""
    out = np.empty(nbytes, dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        got = f.seek(offset) == offset and f.readinto(out.data) or 0
    if got != nbytes:
        raise LanternError(f"{path.name} is truncated (read {got} of {nbytes} bytes at offset {offset})")
    return out.view(dtype).reshape(shape)


# --------------------------------------------------------------------------- safetensors

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def safetensors_tensors(path: Path) -> Tensors:
    """The tensors of a .safetensors file as float32 (bf16 included, no torch needed), each read
    when asked for. The header is checked whole here: a truncated file or an unknown dtype fails
    before anything is read, naming the file and the tensor."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size - 8:
                raise ValueError(f"its header claims {header_len} bytes of a {size}-byte file")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError, struct.error) as err:
        raise LanternError(f"cannot read safetensors file {path.name}: {err}") from None
    start = 8 + header_len
    loaders, shapes = {}, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if name.endswith(".position_ids") and info.get("dtype") in ("I64", "I32"):
            continue  # a buffer older transformers saved with BERT-style models (0, 1, 2 ...), not a weight
        if info.get("dtype") not in _ST_DTYPES:
            raise LanternError(f"{path.name}: tensor '{name}' has unsupported dtype {info.get('dtype')}")
        begin, end = info["data_offsets"]
        shape = tuple(int(d) for d in info["shape"])
        dtype = np.dtype(_ST_DTYPES[info["dtype"]])
        if start + end > size:
            raise LanternError(f"{path.name} is truncated (tensor '{name}' ends past the file)")
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise LanternError(
                f"{path.name}: tensor '{name}' holds {end - begin} bytes, not the "
                f"{int(np.prod(shape, dtype=np.int64)) * dtype.itemsize} its shape {list(shape)} needs"
            )

        def load(offset=start + begin, n=end - begin, dtype=dtype, shape=shape, bf16=info["dtype"] == "BF16"):
            raw = pread_array(path, offset, n, dtype, shape)
            if not bf16:
                return raw.astype(np.float32, copy=False)
            out = np.empty(shape, np.float32)  # bf16 is a float32's upper half: widen in place
            bits = out.view(np.uint32)
            bits[...] = raw
            bits <<= 16
            return out

        loaders[name], shapes[name] = load, shape
    return Tensors(loaders, shapes, {name: path.name for name in loaders})


def checkpoint_tensors(files: list[Path]) -> Tensors:
    """Every tensor of a checkpoint's safetensors files (``read_index`` finds a sharded one's)."""
    loaders, shapes = {}, {}
    origins: dict[str, str] = {}
    for f in files:
        t = safetensors_tensors(f)
        for name in t:
            if name in loaders:
                raise LanternError(f"tensor '{name}' appears in two checkpoint files ({origins[name]} and {f.name})")
            loaders[name], shapes[name], origins[name] = t.loader(name), t.shape(name), f.name
    return Tensors(loaders, shapes, origins)


def read_index(folder: Path) -> list[Path] | None:
    """The shard files ``model.safetensors.index.json`` lists, each checked to exist; None without an index."""
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise LanternError(f"{index.name} is not a safetensors index: {err}") from None
    files = sorted({folder / f for f in weight_map.values()})
    missing = [(f, next(k for k, v in weight_map.items() if folder / v == f)) for f in files if not f.exists()]
    if missing:
        f, tensor = missing[0]
        raise LanternError(f"missing checkpoint shard {f.name} (listed in {index.name}; it holds tensor '{tensor}')")
    return files


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux's VmHWM; ru_maxrss elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Start a new peak (Linux: ``/proc/self/clear_refs`` 5); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
