"""Reproduction of <Method name>: <claim>, against <baselines>, on <model>."""

from __future__ import annotations

from typing import Any

from lmlab.results import Claim


def run(cfg: Any, ctx: Any):
    model, tok = ctx.load_model()
    examples = ctx.data("<suite>", 8)
    ...  # run the method and each baseline on `examples`; ctx.record(system, metric, per_example_values)
    return ctx.finish([Claim("<metric>", "<method>", "<baseline>", ">")])
