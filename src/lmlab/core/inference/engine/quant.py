"""4-bit weights for torch's CPU int4 kernel: GGUF Q4_0 / Q4_1 / Q4_K blocks read as they are, or fp32 quantized.

torch's ``aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros)`` computes ``x @ W.T`` with

    W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n],   g = k // group,  q in 0..15,

from weights packed by ``aten._convert_weight_to_int4pack_for_cpu(q_int32 [N, K], 1)`` and scales/zeros stacked as
``[K // group, N, 2]``. Its fast path needs bfloat16 activations and bfloat16 scales/zeros (float32 and float16
inputs run a reference loop 10-30x slower: measured here).

The GGUF 4-bit formats are that form exactly, with 32 weights per group (ggml's ``dequantize_row_q4_*``):

- Q4_0: ``w = d * (q - 8)``                 -> scale = d, zero = 0;
- Q4_1: ``w = d * q + m``                   -> scale = d, zero = m + 8 d;
- Q4_K: 256-weight super-blocks of 8 groups, ``w = (d * sc_j) * q - dmin * m_j`` (6-bit sc_j, m_j)
                                             -> scale = d sc_j, zero = 8 d sc_j - dmin m_j.

So the 4-bit codes q are used unchanged (no re-quantization); only the scales and zeros are rounded from float16
(GGUF) to bfloat16, which the kernel requires (relative error <= 2^-9 per scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32  # weights per GGUF block (Q4_0, Q4_1) or sub-block (Q4_K)


@dataclass
class Int4Codes:
    """4-bit codes with per-group scale and zero: W = (q - 8) * scale + zero, groups of `group` along K."""

    q: torch.Tensor  # int32 [N, K], values 0..15
    scale: torch.Tensor  # float32 [N, K // group]
    zero: torch.Tensor  # float32 [N, K // group]
    group: int = GROUP

    def dequantize(self) -> torch.Tensor:
        n, k = self.q.shape
        g = self.group
        w = (self.q.view(n, k // g, g).float() - 8.0) * self.scale[..., None] + self.zero[..., None]
        return w.view(n, k)

    def rows(self, index: torch.Tensor | slice) -> Int4Codes:
        return Int4Codes(self.q[index], self.scale[index], self.zero[index], self.group)

    @staticmethod
    def cat(parts: list[Int4Codes]) -> Int4Codes:
        groups = {p.group for p in parts}
        if len(groups) != 1:
            raise ValueError(f"cannot fuse int4 matrices with different group sizes {sorted(groups)}")
        return Int4Codes(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.zero for p in parts]),
            parts[0].group,
        )


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 from a [..., 2] uint8 array, as float32."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-weight nibble layout: byte j holds weight j (low nibble) and weight j + 16 (high nibble)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def codes_from_gguf(kind: str, data: np.ndarray, n_cols: int) -> Int4Codes:
    """Read GGUF blocks (uint8 [N, bytes per row]) of type `kind` (Q4_0, Q4_1, Q4_K) as `Int4Codes` for [N, n_cols]."""
    data = np.asarray(data, dtype=np.uint8)
    n = data.shape[0]
    if kind in ("Q4_0", "Q4_1"):
        size = 18 if kind == "Q4_0" else 20
        blocks = data.reshape(n, n_cols // GROUP, size)
        d = _f16(blocks[..., 0:2])
        if kind == "Q4_1":
            m = _f16(blocks[..., 2:4])
            qs = blocks[..., 4:]
            zero = m + 8.0 * d
        else:
            qs = blocks[..., 2:]
            zero = np.zeros_like(d)
        q = _nibbles_32(qs).reshape(n, n_cols)
        return Int4Codes(
            torch.from_numpy(q.astype(np.int32)), torch.from_numpy(d.copy()), torch.from_numpy(zero.copy())
        )
    if kind == "Q4_K":
        blocks = data.reshape(n, n_cols // 256, 144)
        d = _f16(blocks[..., 0:2])[..., None]  # [n, sb, 1]
        dmin = _f16(blocks[..., 2:4])[..., None]
        sc12 = blocks[..., 4:16].astype(np.int32)  # [n, sb, 12]
        qs = blocks[..., 16:]  # [n, sb, 128]
        sc = np.empty(sc12.shape[:-1] + (8,), dtype=np.int32)
        mn = np.empty_like(sc)
        sc[..., :4] = sc12[..., 0:4] & 63
        mn[..., :4] = sc12[..., 4:8] & 63
        sc[..., 4:] = (sc12[..., 8:12] & 0x0F) | ((sc12[..., 0:4] >> 6) << 4)
        mn[..., 4:] = (sc12[..., 8:12] >> 4) | ((sc12[..., 4:8] >> 6) << 4)
        scale = d * sc.astype(np.float32)  # [n, sb, 8]
        zero = 8.0 * scale - dmin * mn.astype(np.float32)
        # each 64-weight chunk j uses 32 bytes: low nibbles -> group 2j, high nibbles -> group 2j + 1
        chunks = qs.reshape(n, -1, 4, 32)
        q = np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(n, n_cols)
        return Int4Codes(
            torch.from_numpy(q.astype(np.int32)),
            torch.from_numpy(scale.reshape(n, -1).astype(np.float32)),
            torch.from_numpy(zero.reshape(n, -1).astype(np.float32)),
        )
    raise ValueError(f"GGUF type {kind!r} is not a 4-bit block format (expected Q4_0, Q4_1 or Q4_K)")


def quantize(weight: torch.Tensor, group: int = GROUP) -> Int4Codes:
    """Asymmetric round-to-nearest 4-bit quantization of a float [N, K] matrix in groups of `group` along K."""
    if group not in (32, 64, 128, 256):
        raise ValueError(f"group must be one of 32, 64, 128, 256, got {group}")
    n, k = weight.shape
    if k % group:
        raise ValueError(f"K={k} is not a multiple of the group size {group}")
    w = weight.detach().float().reshape(n, k // group, group)
    lo, hi = w.amin(-1), w.amax(-1)
    scale = ((hi - lo) / 15.0).clamp_min(1e-12)
    q = torch.round((w - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32)
    return Int4Codes(q.reshape(n, k), scale, lo + 8.0 * scale, group)


class Int4Linear:
    """``y = x @ W.T`` with W in packed int4 (torch's CPU kernel). Input and output: bfloat16 [M, K] -> [M, N]."""

    def __init__(self, codes: Int4Codes) -> None:
        n, k = codes.q.shape
        self.out_features, self.in_features, self.group = n, k, codes.group
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.q.contiguous(), 1)
        self.scales_zeros = (
            torch.stack([codes.scale.t(), codes.zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        )  # [K // group, N, 2]

    @classmethod
    def from_state(cls, state: dict) -> Int4Linear:
        """Rebuild from `state()` (the packed tensors as saved), without re-packing."""
        lin = cls.__new__(cls)
        lin.out_features, lin.in_features, lin.group = state["n"], state["k"], state["group"]
        lin.packed, lin.scales_zeros = state["packed"], state["scales_zeros"]
        return lin

    def state(self) -> dict:
        return {"n": self.out_features, "k": self.in_features, "group": self.group, "packed": self.packed,
                "scales_zeros": self.scales_zeros}  # fmt: skip

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_zeros)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + self.scales_zeros.numel() * 2

    def dequantize(self) -> torch.Tensor:
        """The weight the kernel actually uses (bf16 scales/zeros), float32 [N, K] (via an identity product)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return self(eye).float().t().contiguous()


def int4_available() -> bool:
    """True if this torch build has the CPU int4 kernels."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )
