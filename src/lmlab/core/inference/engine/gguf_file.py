"""A minimal GGUF tensor index: names, shapes, types and raw block bytes, without parsing the metadata values.

`gguf.GGUFReader` builds numpy views of every metadata field (SmolLM2's 49k-token vocabulary takes ~10 s on this
machine); the engine only needs the tensors, so this reader skips the key/value section byte by byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# ggml type id -> (name, weights per block, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    30: ("BF16", 1, 2),
}
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    kind: str  # ggml type name, e.g. "Q4_1"
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (K)
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFIndex:
    """Tensor index of a GGUF file (v2/v3). `blocks(name)` returns the raw bytes as uint8 [rows, bytes per row]."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.data = np.memmap(self.path, dtype=np.uint8, mode="r")
        buf = memoryview(self.data)
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported (2 or 3 expected)")
        pos = 24
        alignment = 32

        def read_str(p: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", buf, p)
            return bytes(buf[p + 8 : p + 8 + n]).decode("utf-8", "replace"), p + 8 + n

        def skip_value(t: int, p: int) -> int:
            if t in _SCALAR:
                return p + _SCALAR[t]
            if t == 8:
                (n,) = struct.unpack_from("<Q", buf, p)
                return p + 8 + n
            if t == 9:
                sub, count = struct.unpack_from("<IQ", buf, p)
                p += 12
                if sub in _SCALAR:
                    return p + count * _SCALAR[sub]
                for _ in range(count):
                    p = skip_value(sub, p)
                return p
            raise ValueError(f"unknown GGUF value type {t}")

        for _ in range(n_kv):
            key, pos = read_str(pos)
            (t,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            if key == "general.alignment" and t == 4:
                (alignment,) = struct.unpack_from("<I", buf, pos)
            pos = skip_value(t, pos)
        infos = []
        for _ in range(n_tensors):
            name, pos = read_str(pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            t, off = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            infos.append((name, tuple(int(d) for d in dims), t, off))
        start = (pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, GGUFTensor] = {}
        for name, dims, t, off in infos:
            kind, per_block, block_bytes = GGML_TYPES.get(t, (f"type{t}", 1, 0))
            n_el = int(np.prod(dims))
            self.tensors[name] = GGUFTensor(name, kind, dims, start + off, n_el // per_block * block_bytes)

    def blocks(self, name: str) -> np.ndarray:
        """Raw bytes of tensor `name` as uint8 [rows, bytes per row] (rows = product of dims after the first)."""
        t = self.tensors[name]
        rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        return np.asarray(self.data[t.offset : t.offset + t.nbytes]).reshape(rows, -1)
