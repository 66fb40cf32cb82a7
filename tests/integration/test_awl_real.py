"""AWL on SmolLM2-135M (trimmed quick preset, arithmetic): after WKL and the mixed TUA stage, the model calls the
calculator less often than tool-only SFT and its tool-use decisions follow its own no-tool correctness better.

Tool-only SFT learns to call a tool on (nearly) every item, so its balanced tool-usage accuracy sits near 0.5; AWL
should answer the 1-digit sums directly and call the calculator on products. The direction of both gated quick
checks is asserted, plus the over-reliance of the tool-only baseline.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_awl_adapts_tool_use_where_tool_only_sft_over_relies(smollm2):
    result = run_method(
        "awl",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        n_train=40,
        n_test=20,
    )
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert all(math.isfinite(r.value) for r in result.metrics)
    # the baseline's over-reliance: tool-only SFT calls a tool on most held-out items
    assert m[("tool_only", "tool_call_rate")] >= 0.8
    # AWL calls tools less often and decides better by its own no-tool correctness
    assert m[("awl", "tool_call_rate")] < m[("tool_only", "tool_call_rate")]
    assert m[("awl", "tool_usage_acc")] > m[("tool_only", "tool_usage_acc")]
    # the WKL model split the training problems into both classes (otherwise TUA has nothing to adapt)
    split = result.flags["train_split"]
    assert split["easy"] > 0 and split["hard"] > 0
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}


def test_tool_traces_of_smollm2_parse_and_execute(smollm2):
    from lmlab.data.tools import default_tools
    from lmlab.methods.adaptation.awl import render_prompt, run_with_tools

    model, tok = smollm2
    tools = default_tools()
    prompts = [render_prompt(tok, "tools", q, tools) for q in ("What is 386 * 275?", "What is the capital of Chad?")]
    traces = run_with_tools(model, tok, prompts, tools, max_new_tokens=24, batch_size=2)
    assert len(traces) == 2
    for t in traces:
        assert t.turns and len(t.observations) == len(t.calls) <= 1
        assert all(not o.startswith("Traceback") for o in t.observations)
