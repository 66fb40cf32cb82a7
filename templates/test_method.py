"""Invariants of <Method name> on the tiny random llama."""

from __future__ import annotations


def test_invariant(tiny_llama, tiny_tokenizer):
    ...
