"""Per-linear pruning functions (the engine's plug-ins) and the calibration statistics they read.

A pruning function has the signature ``prune_fn(weight, stats, sparsity, nm) -> new_weight``:

- ``weight``: (C_out, C_in) fp32 copy of the dense weight (free to modify);
- ``stats``: the `LayerStats` of this linear's calibration inputs (Gram matrix, column norms, counts);
- ``sparsity``: this block's target sparsity (ignored by N:M masks, which prune N/M);
- ``nm``: None for unstructured masks, else ``(N, M)``: prune N of every M consecutive input weights per row.

It returns the new (C_out, C_in) weight; zeros are the pruned entries. Three are here, each as its official code:

- `magnitude_prune`: |W|, per layer (locuslab/wanda ``prune_magnitude``) or per output row;
- `wanda_prune_weight`: S_ij = |W_ij| * ||X_j||_2, compared per output row, no weight update (locuslab/wanda);
- `sparsegpt_prune_weight`: OBS with lazy-batch column updates and adaptive masks (IST-DASLab/sparsegpt
  ``fasterprune``, as copied into locuslab/wanda ``lib/sparsegpt.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lmlab.core.pruning.masks import matrix_mask, nm_mask, row_mask

PruneFn = Callable[[torch.Tensor, "LayerStats", float, "tuple[int, int] | None"], torch.Tensor]


@dataclass
class LayerStats:
    """Calibration statistics of one linear's inputs X (tokens x C_in), accumulated in fp32.

    Attributes:
        block (`int`): index of the decoder block.
        name (`str`): the linear's name inside its block (e.g. ``"self_attn.q_proj"``).
        n_samples (`int`): calibration sequences seen (the official code's ``nsamples``).
        n_tokens (`int`): calibration tokens seen.
        gram (`torch.Tensor`): (C_in, C_in) ``sum_t x_t x_t^T`` (unaveraged).
    """

    block: int
    name: str
    n_samples: int
    n_tokens: int
    gram: torch.Tensor

    @property
    def in_features(self) -> int:
        return self.gram.shape[0]

    @property
    def sq_norm(self) -> torch.Tensor:
        """(C_in,) ``||X_j||_2^2`` over all calibration tokens (the Gram's diagonal)."""
        return self.gram.diagonal()

    @property
    def scaler_row(self) -> torch.Tensor:
        """(C_in,) Wanda's ``scaler_row``: the running mean over samples of ``||X_j||^2`` (= sq_norm / n_samples)."""
        return self.sq_norm / max(self.n_samples, 1)

    def hessian(self) -> torch.Tensor:
        """(C_in, C_in) SparseGPT's ``H = (2 / n_samples) sum x x^T`` (a fresh tensor)."""
        return self.gram * (2.0 / max(self.n_samples, 1))

    def reconstruction_error(
        self, w_old: torch.Tensor, w_new: torch.Tensor, ref: float | None = None
    ) -> tuple[float, float]:
        """``(sum_t ||(W - W') x_t||^2, that / sum_t ||W x_t||^2)``: exact, from the Gram matrix.

        `ref` (``sum_t ||W x_t||^2``, e.g. measured on the layer's outputs) saves one (C_out, C_in, C_in) product.
        """
        d = (w_old.float() - w_new.float()).to(self.gram.device)
        err = float(((d @ self.gram) * d).sum())
        if ref is None:
            w = w_old.float().to(self.gram.device)
            ref = float(((w @ self.gram) * w).sum())
        return err, err / ref if ref > 0 else 0.0


def magnitude_prune(
    weight: torch.Tensor,
    stats: LayerStats | None,
    sparsity: float,
    nm: tuple[int, int] | None = None,
    *,
    group: str = "layer",
) -> torch.Tensor:
    """Magnitude pruning: zero the lowest |W| (no calibration data, no update).

    `group` is ``"layer"`` (the whole matrix, locuslab/wanda ``prune_magnitude``) or ``"row"`` (per output row).
    N:M masks are per row by construction.
    """
    scores = weight.abs()
    if nm is not None:
        mask = nm_mask(scores, *nm)
    elif group == "row":
        mask = row_mask(scores, sparsity)
    elif group == "layer":
        mask = matrix_mask(scores, sparsity)
    else:
        raise ValueError(f"magnitude group must be 'layer' or 'row', got {group!r}")
    return weight.masked_fill(mask, 0.0)


def wanda_scores(weight: torch.Tensor, stats: LayerStats) -> torch.Tensor:
    """(C_out, C_in) Wanda scores ``|W_ij| * sqrt(scaler_row_j)`` = |W_ij| * ||X_j||_2 up to a per-layer constant."""
    return weight.abs() * torch.sqrt(stats.scaler_row.to(weight.device)).reshape(1, -1)


def wanda_prune_weight(
    weight: torch.Tensor, stats: LayerStats, sparsity: float, nm: tuple[int, int] | None = None
) -> torch.Tensor:
    """Wanda: S_ij = |W_ij| * ||X_j||_2; per output row, zero the int(s * C_in) lowest (or N of every M)."""
    scores = wanda_scores(weight, stats)
    mask = nm_mask(scores, *nm) if nm is not None else row_mask(scores, sparsity)
    return weight.masked_fill(mask, 0.0)


@torch.no_grad()
def sparsegpt_prune_weight(
    weight: torch.Tensor,
    stats: LayerStats,
    sparsity: float,
    nm: tuple[int, int] | None = None,
    *,
    block_size: int = 128,
    dampening_frac: float = 0.01,
) -> torch.Tensor:
    """SparseGPT (Frantar & Alistarh, 2023): OBS reconstruction with lazy-batch column updates.

    H = (2/n) X X^T + percdamp * mean(diag H) * I; U = chol(H^-1) (upper). Columns are swept in blocks of
    `block_size`. Unstructured: per block, prune the int(s * rows * B) lowest ``w^2 / U_ii^2`` over all rows x B
    columns (adaptive mask selection). N:M: at each column i with i % M == 0, prune the N lowest of columns
    i..i+M-1 per row. Per column: ``err = (w - q) / U_ii``, ``W[:, i:] -= err U[i, i:]``; after the block,
    ``W[:, i2:] -= Err @ U[i1:i2, i2:]``.

    One deviation from the official code: its threshold ``tmp <= sorted[int(numel * s)]`` prunes one entry more
    per block (more with ties); here exactly ``int(numel * s)`` entries are pruned per block (stable sort).
    """
    if nm is None and sparsity <= 0:
        return weight.clone()
    W = weight.clone().float()  # (rows, cols)
    rows, cols = W.shape
    if nm is not None and block_size % nm[1]:
        raise ValueError(f"block_size {block_size} must be a multiple of M = {nm[1]} for N:M masks")
    H = stats.hessian().to(W.device).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    damp = dampening_frac * torch.mean(torch.diag(H))
    diag = torch.arange(cols, device=W.device)
    H[diag, diag] += damp
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    Hinv = torch.linalg.cholesky(H, upper=True)  # upper Cholesky factor of H^-1

    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        count = i2 - i1
        # the block is held transposed, (count, rows), so that a column is a contiguous row (same arithmetic)
        W1 = W[:, i1:i2].T.contiguous()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        d1 = torch.diag(Hinv1)
        d1_list = d1.tolist()
        if nm is None:
            tmp = W1**2 / d1.reshape(-1, 1) ** 2  # (count, rows)
            # the int(numel * s) lowest over the whole (rows, count) block, row-major order as the official sort
            mask1 = matrix_mask(tmp.T, sparsity).T.contiguous()
        else:
            mask1 = torch.zeros_like(W1, dtype=torch.bool)
        for i in range(count):
            if nm is not None and i % nm[1] == 0:
                n, m = nm
                tmp = W1[i : i + m] ** 2 / d1[i : i + m].reshape(-1, 1) ** 2  # (m, rows)
                idx = torch.sort(tmp, dim=0, stable=True).indices[:n]  # (n, rows)
                mask1.scatter_(0, i + idx, True)
            w = W1[i]
            q = w.masked_fill(mask1[i], 0.0)
            Q1[i] = q
            err1 = (w - q).div_(d1_list[i])
            W1[i:].addr_(Hinv1[i, i:], err1, alpha=-1.0)  # W1[:, i:] -= err1 (x) Hinv1[i, i:] (transposed)
            Err1[i] = err1
        W[:, i1:i2] = Q1.T
        W[:, i2:] -= Err1.T.matmul(Hinv[i1:i2, i2:])
    return W


def get_prune_fn(
    method: str,
    *,
    block_size: int = 128,
    dampening_frac: float = 0.01,
    magnitude_group: str = "layer",
) -> PruneFn:
    """The built-in pruning function called `method` (``magnitude``, ``wanda`` or ``sparsegpt``)."""
    if method == "magnitude":
        return lambda w, s, sp, nm: magnitude_prune(w, s, sp, nm, group=magnitude_group)
    if method == "wanda":
        return wanda_prune_weight
    if method == "sparsegpt":
        return lambda w, s, sp, nm: sparsegpt_prune_weight(
            w, s, sp, nm, block_size=block_size, dampening_frac=dampening_frac
        )
    raise ValueError(f"pruning method must be one of magnitude, wanda, sparsegpt (or a prune_fn), got {method!r}")


METHODS = ("magnitude", "wanda", "sparsegpt")

__all__ = [
    "METHODS",
    "LayerStats",
    "PruneFn",
    "get_prune_fn",
    "magnitude_prune",
    "sparsegpt_prune_weight",
    "wanda_prune_weight",
    "wanda_scores",
]
