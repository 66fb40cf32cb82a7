"""Invariants of RaLU: the CFG serializer, check_unit, rewind/branch bookkeeping, budgets, mutations, backends."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
import torch.nn.functional as F

from lmlab.core.execution.backends import BackendError
from lmlab.methods.decoding.ralu.backends import (
    OK_RESPONSE,
    ChatResponse,
    HFChatBackend,
    OpenAIChatBackend,
    OracleJudgeBackend,
    wrong_response,
)
from lmlab.methods.decoding.ralu.cfg import cfg_units
from lmlab.methods.decoding.ralu.method import (
    RaLUSession,
    check_unit,
    clean_spec,
    confidence,
    extract_block,
    extract_core_chars,
    ralu_repair,
    reasoning_path,
)
from lmlab.methods.decoding.ralu.mutations import (
    OPERATORS,
    context_names,
    injection_sites,
    mutate_snippet,
    unit_candidates,
)
from lmlab.methods.decoding.ralu.program import Program, text_fragments
from lmlab.methods.decoding.ralu.units import (
    apply_fix,
    extract_units,
    line_units,
    split_thirds,
    whole_unit,
)

# ---------------------------------------------------------------------------------------------------------------
# The CFG serializer: expected strings are the official builder's output (astor 0.8.1, autopep8 2.3) on the same
# functions, checked once against github.com/DeepAccept/RaLU src/cfg.

BRANCHES = """def sign(x):
    if x > 0:
        return 1
    elif x < 0:
        return -1
    else:
        return 0
"""

LOOPS = """def count_pairs(numbers, threshold):
    total = 0
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                total += 1
    k = 0
    while k < len(numbers):
        k += 2
    return total
"""

CALLS = """import math


def helper(n):
    return math.isqrt(n) ** 2 == n


def squares(xs):
    out = [x for x in xs if helper(x)]
    return out if out else None
"""

STRAIGHT = "\n".join(
    ["a = 1", "b = 2", "c = a + b", "d = c * 2", "e = d - 1", "f = e // 2", "g = f % 3", "h = g + a", "i = h * b"]
    + ["ans = i + c"]
)


def test_cfg_branches_match_the_official_serializer():
    assert [u.text for u in cfg_units(BRANCHES, "sign")] == [
        "#ENTER FUNCTION# sign{\n#BRANCH# If Condition `if x > 0` is satisfied, then RUN `return 1`",
        "#BRANCH# Otherwise, when Condition `if x > 0` is not satisfied, then #BRANCH# If Condition `if x < 0` is "
        "satisfied, then RUN `return -1`",
        "#BRANCH# Otherwise, when Condition `if x < 0` is not satisfied, then RUN `return 0`\n} #EXIT FUNCTION#",
    ]


def test_cfg_loops_match_the_official_serializer():
    units = [u.text for u in cfg_units(LOOPS, "count_pairs")]
    assert units == [
        "#ENTER FUNCTION# count_pairs{\nRUN `total = 0`",
        "#LOOP BEGIN# If looping Condition `for i, a in enumerate(numbers)` is satisfied, then enter the loop:",
        "#LOOP BEGIN# If looping Condition `for j, b in enumerate(numbers)` is satisfied, then enter the loop:",
        "#BRANCH# If Condition `if i != j and abs(a - b) < threshold` is satisfied, then RUN `total += 1`",
        # the join block is printed under the true branch, so the false branch runs into the loop's end
        "#BRANCH# Otherwise, when Condition `if i != j and abs(a - b) < threshold` is not satisfied, then #LOOP END# "
        "If not satisfying the looping Condition `for j, b in enumerate(numbers)`, then jump out of the loop.",
        "#LOOP END# If not satisfying the looping Condition `for i, a in enumerate(numbers)`, then jump out of the "
        "loop.",
        "RUN `k = 0`",
        "#LOOP BEGIN# If looping Condition `while k < len(numbers)` is satisfied, then enter the loop:",
        "RUN `k += 2`",
        "#LOOP END# If not satisfying the looping Condition `while k < len(numbers)`, then jump out of the loop.",
        "RUN `return total`\n} #EXIT FUNCTION#",
    ]


def test_cfg_functions_and_comprehensions_match_the_official_serializer():
    units = [u.text for u in cfg_units(CALLS, "squares")]
    assert units == [
        # an import before the definitions: the first unit is not the bare entry-point definition, so it stays
        "RUN [\nimport math\n[DEFINE FUNCTION] helper(n)\n[DEFINE FUNCTION] squares(xs)\n]",
        "#ENTER FUNCTION# helper{\nRUN `return math.isqrt(n) ** 2 == n`\n} #EXIT FUNCTION#",
        "#ENTER FUNCTION# squares{\nRUN `out = []`",
        "#LOOP BEGIN# If looping Condition `for x in xs` is satisfied, then enter the loop:",
        "#BRANCH# If Condition `if helper(x)` is satisfied, then RUN `out.append(x)`",
        "#BRANCH# Otherwise, when Condition `if helper(x)` is not satisfied, then #LOOP END# If not satisfying the "
        "looping Condition `for x in xs`, then jump out of the loop.",
        "#BRANCH# If Condition `if out` is satisfied, then RUN `return out`",
        "#BRANCH# Otherwise, when Condition `if out` is not satisfied, then RUN `return None`\n} #EXIT FUNCTION#",
    ]
    # without the import, the entry point's definition unit is dropped
    assert not cfg_units("def f(x):\n    return x + 1\n", "f")[0].text.startswith("RUN `[DEFINE FUNCTION]")


def test_long_run_block_is_split_in_three_only_without_entry_point():
    assert [u.text for u in cfg_units(STRAIGHT, None)] == [
        "RUN [:\na = 1\nb = 2\nc = a + b\nd = c * 2\n]",
        "RUN [:\ne = d - 1\nf = e // 2\ng = f % 3\nh = g + a\n]",
        "RUN [:\ni = h * b\nans = i + c\n]",
    ]
    # the official split sits on the math path only (entry_point None); with an entry point the block stays whole
    body = "def f():\n" + "\n".join("    " + line for line in STRAIGHT.splitlines()) + "\n    return ans\n"
    (unit,) = cfg_units(body, "f")
    assert unit.text.count("\n") == 14 and unit.text.startswith("#ENTER FUNCTION# f{\nRUN [")
    # split_thirds, the fallback when the CFG cannot be built, always splits
    assert len(split_thirds(STRAIGHT)) == 3


def test_every_fragment_writes_back_to_the_same_program():
    import copy

    from lmlab.methods.decoding.ralu.program import _unparse
    from lmlab.methods.decoding.ralu.units import _write

    for source, ep in ((BRANCHES, "sign"), (LOOPS, "count_pairs"), (CALLS, "squares")):
        prog = Program.parse(source)
        for mode, units in (("cfg", cfg_units(prog, ep)), ("line", line_units(prog)), ("cfg", whole_unit(prog))):
            for unit in units:
                assert [f.text for f in unit.fragments] == text_fragments(
                    unit.text, "line" if mode == "line" else "cfg"
                )
                # writing each snippet back into the node it points to, verbatim, gives the same program
                for frag in unit.fragments:
                    if frag.kind == "opaque":
                        continue
                    tree = copy.deepcopy(prog.tree)
                    assert _write(tree, frag, frag.text), (unit.text, frag)
                    assert _unparse(tree) == prog.source, (unit.text, frag)


def test_fixes_are_written_into_comprehensions_and_conditional_returns():
    prog = Program.parse(CALLS)
    units = cfg_units(prog, "squares")
    branch = next(u for u in units if "`if helper(x)` is satisfied" in u.text)
    fixed = apply_fix(prog, branch, branch.text.replace("if helper(x)", "if not helper(x)"))
    assert "out = [x for x in xs if not helper(x)]" in fixed
    ret = next(u for u in units if u.text.startswith("#BRANCH# If Condition `if out`"))
    fixed = apply_fix(prog, ret, ret.text.replace("return out", "return xs"))
    assert "return xs if out else None" in fixed
    # a corrected unit with another number of snippets cannot be written back
    assert apply_fix(prog, ret, "RUN `return 1`") is None


def test_extract_units_falls_back_to_thirds():
    units, used = extract_units(STRAIGHT, "cfg", "missing_entry")
    assert used == "cfg" and len(units) == 1  # a straight program with a (wrong) entry point is one unit
    bad = "def f(x):\n    if x:\n        break\n"  # a break outside a loop: the builder fails
    units, used = extract_units(bad, "cfg", "f")
    assert used == "thirds" and len(units) == 3
    with pytest.raises(ValueError, match="mode"):
        extract_units(BRANCHES, "words")
    with pytest.raises(ValueError, match="does not parse"):
        Program.parse("def f(:\n")


# ---------------------------------------------------------------------------------------------------------------
# The official helpers


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("OK\nAnalysis: fine", True),
        ("ok", True),
        ("Okay, this unit is right.", True),  # the official test only reads the first two letters
        ("  O.K. looks right", True),
        ("WRONG\n<Fix>\nRUN `x  =  a+1`\n</Fix>", True),  # the fix equals the unit on its core characters
        ("WRONG\n<fix>\nrun `X = A + 1`\n</fix>", True),
        ("WRONG\n<Fix>\nRUN `x = a + 2`\n</Fix>", False),
        ("WRONG, the bound is off", False),
        ("No. It should be OK", False),
    ],
)
def test_check_unit(reply, expected):
    assert check_unit("RUN `x = a + 1`", reply) is expected


def test_core_chars_block_and_spec_helpers():
    assert extract_core_chars("RUN [\n  x = y[0] ,\n]") == "runx=y0"
    assert extract_block("a <FIX> b </FIX> c") == "b" and extract_block("none") is None
    assert extract_block("<Unit>\nu\n</ Unit >", "Unit") == "u"
    spec = 'from typing import List\n\ndef add(a: int, b: int) -> int:\n    """ Write a function to add a and b.\n'
    spec += '    """\n'
    assert clean_spec(spec) == "add a and b.\nFormat of Target Function: add(a: int, b: int) -> int"
    assert confidence(None) == -1.0 and confidence([]) == -1.0
    assert confidence([math.log(0.5), math.log(0.25)]) == pytest.approx(37.5)
    path = reasoning_path(
        [
            {"role": "user", "content": "## Specification\nx"},
            {"role": "user", "content": "Unit 1: RUN `a`"},
            {"role": "assistant", "content": "OK\nAnalysis: fine."},
            {"role": "user", "content": "Unit 2: RUN `b`"},
            {"role": "assistant", "content": "OK"},
        ]
    )
    assert path == ["Unit 1: RUN `a`", "fine.", "Unit 2: RUN `b`", ""]


# ---------------------------------------------------------------------------------------------------------------
# Rewind-and-correct with a scripted backend


class Scripted:
    """Replies from a script (cycled per call); records what it was asked."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.asked = []

    def chat(self, messages, *, temperature=0.7, logprobs=True):
        self.asked.append([dict(m) for m in messages])
        text, lps = self.replies[(len(self.asked) - 1) % len(self.replies)]
        return ChatResponse(text, lps, prompt_tokens=10, completion_tokens=2)


HIGH = [math.log(0.9)] * 3  # confidence 90
LOW = [math.log(0.3)] * 3  # confidence 30


def test_rewind_after_two_wrong_verdicts_then_ok():
    backend = Scripted(
        [(wrong_response("RUN `a = 1`"), LOW), (wrong_response("RUN `a = 2`"), LOW), (OK_RESPONSE, HIGH)]
    )
    session = RaLUSession(backend, "## Specification\nspec", "SYS")
    (trace,) = session.reason(["RUN `a = 0`"], max_branches=3)
    assert [a.prompt for a in trace.attempts] == [
        "## Process\nUnit 1: RUN `a = 0`",
        "## Process\nUnit 1: RUN `a = 1`",
        "## Process\nUnit 1: RUN `a = 2`",
    ]
    assert [a.branch for a in trace.attempts] == ["b0", "b1", "b2"]
    assert trace.accepted == "RUN `a = 2`" and trace.decided_by == "judge" and session.current_id == "b2"
    # each rewind dropped the last exchange: every branch holds the spec plus its own single exchange
    for bid, fix in (("b0", "a = 1"), ("b1", "a = 2")):
        assert len(session.keep_state[bid]) == 3 and fix in session.keep_state[bid][-1]["content"]
    assert session.keep_state["b2"][-1]["content"] == OK_RESPONSE
    # the system prompt leads every call, and a rewound call no longer sees the wrong exchange
    assert all(m[0] == {"role": "system", "content": "SYS"} for m in backend.asked)
    assert len(backend.asked[2]) == 3
    assert session.n_judge_calls == 3 and session.prompt_tokens == 30 and session.completion_tokens == 6


def test_most_confident_branch_when_no_attempt_is_accepted():
    scores = [math.log(p) for p in (0.2, 0.8, 0.5, 0.3)]
    backend = Scripted([(wrong_response(f"RUN `a = {i + 1}`"), [lp]) for i, lp in enumerate(scores)])
    session = RaLUSession(backend, "## Specification\nspec", "SYS")
    (trace,) = session.reason(["RUN `a = 0`"], max_branches=3)
    assert len(trace.attempts) == 4 and trace.decided_by == "confidence"
    # the branch whose reply had confidence 80 (b1) wins; its fix is what the path keeps
    assert trace.branch == "b1" and trace.accepted == "RUN `a = 2`"


def test_selector_is_asked_when_confidence_is_unavailable():
    replies = [(wrong_response(f"RUN `a = {i + 1}`"), None) for i in range(4)]
    # a faithful selector repeats the listed prompt, "## Process" header included (the official matching needs it)
    replies.append(("<Unit>\n## Process\nUnit 1: RUN `a = 2`\n</Unit>", None))
    backend = Scripted(replies)
    session = RaLUSession(backend, "## Specification\nspec", "SYS")
    (trace,) = session.reason(["RUN `a = 0`"], max_branches=3)
    assert trace.decided_by == "selector" and trace.branch == "b2" and trace.accepted == "RUN `a = 3`"
    selector = backend.asked[-1]
    assert "4 controversial candidate units" in selector[0]["content"] and selector[1]["content"] == "SYS"
    assert selector[-1]["content"].count("<Unit>") == 4
    assert session.n_judge_calls == 4 and session.n_calls == 5


def test_low_confidence_ok_is_kept_after_the_retries():
    backend = Scripted([(OK_RESPONSE, LOW)])
    session = RaLUSession(backend, "spec", "SYS", max_valid_num=2)
    (trace,) = session.reason(["RUN `a = 0`"])
    assert len(trace.attempts) == 2 and trace.decided_by == "low_confidence" and trace.accepted == "RUN `a = 0`"


def test_budget_accounting():
    backend = Scripted([(OK_RESPONSE, HIGH)])
    session = RaLUSession(backend, "spec", "SYS", max_calls=2)
    traces = session.reason(["RUN `a`", "RUN `b`", "RUN `c`", "RUN `d`"])
    assert [t.decided_by for t in traces] == ["judge", "judge", "budget", "budget"]
    assert session.n_judge_calls == 2 == len(backend.asked) and session.budget_exhausted
    # spent in the middle of a unit's rewinds: the best branch so far is kept
    backend = Scripted([(OK_RESPONSE, HIGH), (wrong_response("RUN `b2`"), LOW), (wrong_response("RUN `b3`"), HIGH)])
    session = RaLUSession(backend, "spec", "SYS", max_calls=3)
    traces = session.reason(["RUN `a`", "RUN `b`", "RUN `c`"])
    assert [t.decided_by for t in traces] == ["judge", "budget", "budget"]
    assert traces[1].accepted == "RUN `b3`" and session.n_judge_calls == 3
    with pytest.raises(ValueError, match="max_calls"):
        RaLUSession(backend, "spec", "SYS", max_calls=-1)


def test_ralu_repair_writes_the_accepted_fix_back():
    program = "def f(x):\n    if x < 3:\n        return 1\n    return 0\n"
    backend = Scripted([(wrong_response("#BRANCH# If Condition `if x <= 3` is satisfied, then RUN `return 1`"), HIGH)])
    backend.replies += [(OK_RESPONSE, HIGH)] * 5
    result = ralu_repair("def f(x):\n    pass", program, backend, entry_point="f")
    assert result.units[0].startswith("#ENTER FUNCTION# f{\n#BRANCH# If Condition `if x < 3`")
    assert "if x <= 3:" in result.program and result.applied[0] and result.changed
    assert result.n_judge_calls == len(backend.asked) and result.synthesis == "reassemble"


# ---------------------------------------------------------------------------------------------------------------
# Mutations


def test_each_operator_and_its_inverse():
    cases = {
        "cmp": ("if a < b", "if a <= b"),
        "off_by_one": ("x = y[1:]", "x = y[2:]"),
        "and_or": ("ok = a and b", "ok = a or b"),
        "swap_const": ("while True", "while False"),
        "wrong_return": ("return best", "return count"),
    }
    names = {"best", "count"}
    for op, (snippet, mutant) in cases.items():
        produced = {m.text: m.op for m in mutate_snippet(snippet, names)}
        assert produced.get(mutant) == op, (op, produced)
        assert snippet in {m.text for m in mutate_snippet(mutant, names)}, op  # the inverse is a mutation too
    assert {m.op for m in mutate_snippet("return 'a' if c else 'b'")} == {"swap_const"}
    assert mutate_snippet("else:") == [] and mutate_snippet("[DEFINE FUNCTION] f(x)") == []
    assert {"threshold", "numbers", "i"} <= context_names(
        ["Format of Target Function: f(numbers, threshold)", "RUN `for i in range(3)`"]
    )


def test_mutants_fail_and_the_inverse_restores_the_canonical_program():
    from lmlab.core.execution.sandbox import run_many

    program = Program.parse(
        "def below(xs, t):\n    n = 0\n    for x in xs:\n        if x < t and x > 0:\n            n += 1\n"
        "    return n\n"
    )
    test = "assert below([1, 2, 3, 5], 3) == 2\nassert below([0, 3, 1], 4) == 2\nassert below([], 1) == 0"
    sites = [s for group in injection_sites(program, "below").values() for s in group]
    assert {s.op for s in sites} >= {"cmp", "off_by_one", "and_or", "wrong_return"}
    results = run_many(
        [{"source": s.program, "test": test} for s in sites] + [{"source": program.source, "test": test}]
    )
    assert results[-1].passed
    failing = [s for s, r in zip(sites, results) if not r.passed]
    assert len(failing) >= len(sites) - 2  # almost every single edit breaks this function
    for site in failing:
        mutant = Program.parse(site.program)
        names = context_names(
            ["Format of Target Function: below(xs, t)", *[u.text for u in cfg_units(mutant, "below")]]
        )
        restored = {
            apply_fix(mutant, unit, cand)
            for unit in cfg_units(mutant, "below")
            for _, cand in unit_candidates(unit.text, names)
        }
        assert program.source in restored, site
    assert set(OPERATORS) == {"cmp", "off_by_one", "and_or", "swap_const", "wrong_return"}


# ---------------------------------------------------------------------------------------------------------------
# Backends


def test_oracle_judge_flags_exactly_the_buggy_unit():
    canonical = "def f(x):\n    y = x + 1\n    if y > 3:\n        return y\n    return 0\n"
    mutant = Program.parse(canonical.replace("y > 3", "y >= 3"))
    good = Program.parse(canonical).source
    units = cfg_units(mutant, "f")
    oracle = OracleJudgeBackend(mutant, units, lambda sources: [s == good for s in sources])
    result = ralu_repair("def f(x):\n    pass", mutant, oracle, entry_point="f", units=units)
    assert result.program == good
    verdicts = [t.attempts[0].response.split("\n")[0] for t in result.traces]
    assert verdicts.count("WRONG") == 1 and oracle.n_test_runs >= 2


def _tiny_backend(model, tok, **kw):
    return HFChatBackend(model, tok, n_rewrites=1, rewrite_max_tokens=24, **kw)


def _dialogue(unit):
    return [
        {"role": "system", "content": "Judge each unit. Reply OK or WRONG."},
        {"role": "user", "content": "## Specification\nreturn x plus one"},
        {"role": "user", "content": f"## Process\nUnit 1: {unit}"},
    ]


def test_hf_judge_confidence_is_the_unit_text_probability(tiny_llama, tiny_tokenizer):
    unit = "RUN `return x + 1`"
    backend = _tiny_backend(tiny_llama, tiny_tokenizer, judge_bias=1e9)  # always OK
    reply = backend.chat(_dialogue(unit))
    assert reply.text == OK_RESPONSE and reply.info["verdict"] == "OK"
    # teacher forcing over the full prompt gives the same per-token log-probs for the unit's tokens
    prompt = backend.render(_dialogue(unit))
    ids = backend.encode(prompt)
    with torch.no_grad():
        lp = F.log_softmax(tiny_llama(torch.tensor([ids])).logits[0].float(), -1)
    start = len(backend.encode(prompt[: prompt.rfind(unit)]))
    expected = [float(lp[start + j - 1, ids[start + j]]) for j in range(len(reply.token_logprobs))]
    assert len(reply.token_logprobs) == len(unit.encode())  # byte tokenizer: one token per byte
    assert torch.allclose(torch.tensor(reply.token_logprobs), torch.tensor(expected), atol=1e-4)


def test_hf_wrong_verdict_picks_the_most_probable_candidate(tiny_llama, tiny_tokenizer):
    unit = "RUN `return x + 1`"
    backend = _tiny_backend(tiny_llama, tiny_tokenizer, judge_bias=-1e9)  # always WRONG
    reply = backend.chat(_dialogue(unit))
    fix = extract_block(reply.text)
    assert reply.text.startswith("WRONG\n<Fix>\n") and fix != unit
    assert reply.info["rewrites_sampled"] == 1  # the unit fits in rewrite_max_tokens: one rewrite was sampled
    assert fix in {c for _, c in unit_candidates(unit)} | set(reply.info["rewrites"])
    best = max(c for c, _ in reply.info["top"])
    assert confidence(reply.token_logprobs) == pytest.approx(best, abs=0.01)
    # deterministic replay, and the prefix cache changes nothing
    again = _tiny_backend(tiny_llama, tiny_tokenizer, judge_bias=-1e9)
    again.chat(_dialogue("RUN `return x - 1`"))  # warms the cache with a shared prefix
    replay = again.chat(_dialogue(unit))
    assert replay.text == reply.text
    assert torch.allclose(torch.tensor(replay.token_logprobs), torch.tensor(reply.token_logprobs), atol=1e-4)


def test_hf_backend_runs_the_whole_loop(tiny_llama, tiny_tokenizer):
    program = "def f(x):\n    if x < 3:\n        return x + 1\n    return 0\n"
    backend = _tiny_backend(tiny_llama, tiny_tokenizer)
    result = ralu_repair("def f(x):\n    pass", program, backend, entry_point="f", max_branches=1)
    assert result.n_judge_calls >= len(result.units) and Program.parse(result.program)
    assert all(t.decided_by for t in result.traces)


# ---------------------------------------------------------------------------------------------------------------
# The OpenAI-compatible backend against a local stand-in server


class _StandIn(BaseHTTPRequestHandler):
    script: list = []
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        status, text = type(self).script.pop(0) if type(self).script else (200, OK_RESPONSE)
        if status != 200:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("retry-after-ms", "1")  # the openai client's retry waits this long (keeps the test fast)
            self.end_headers()
            self.wfile.write(b'{"error": "nope"}')
            return
        payload = {
            "choices": [
                {
                    "message": {"role": "assistant", "content": text},
                    "logprobs": {"content": [{"token": t, "logprob": -0.1} for t in text.split()[:3]]},
                }
            ],
            "usage": {"prompt_tokens": 42, "completion_tokens": 3},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def stand_in():
    server = HTTPServer(("127.0.0.1", 0), _StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _StandIn.script, _StandIn.seen = [], []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", _StandIn
    server.shutdown()
    server.server_close()


@pytest.mark.loopback
def test_openai_backend_against_a_loopback_server(stand_in, monkeypatch):
    url, handler = stand_in
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    backend = OpenAIChatBackend(url, "served-model", max_retries=1)
    handler.script = [(500, ""), (200, wrong_response("RUN `return x + 1`"))]
    text, lps = backend.chat([{"role": "user", "content": "Unit 1: RUN `return x`"}])
    assert text.startswith("WRONG") and lps == [-0.1, -0.1, -0.1]  # a 500 is retried
    request = handler.seen[-1]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer k"
    body = request["body"]
    assert body["model"] == "served-model" and body["logprobs"] is True
    assert body["temperature"] == 0.7 and body["frequency_penalty"] == 0.3
    handler.script = [(400, "")]
    with pytest.raises(BackendError, match=r"/v1/chat/completions answered HTTP 400: nope$"):
        backend.chat([{"role": "user", "content": "x"}])  # a 4xx is not retried: one line naming the URL
    # the official loop runs unchanged over HTTP
    handler.script = [(200, wrong_response("#BRANCH# If Condition `if x <= 3` is satisfied, then RUN `return 1`"))]
    program = "def f(x):\n    if x < 3:\n        return 1\n    return 0\n"
    result = ralu_repair("def f(x):\n    pass", program, backend, entry_point="f")
    assert "if x <= 3:" in result.program and result.prompt_tokens == 42 * result.n_calls
    assert handler.seen[-1]["body"]["messages"][0]["role"] == "system"
    with pytest.raises(ValueError, match="base_url"):
        OpenAIChatBackend("127.0.0.1:8000", "m")


def test_step_ablation_with_llm_synthesis():
    backend = Scripted(
        [
            ("<Step>1: add one to x</Step>\n<Step>2: return it</Step>", None),
            (OK_RESPONSE, HIGH),
            (OK_RESPONSE, HIGH),
            ("<code>\ndef f(x):\n    return x + 1\n</code>\nAnalysis: adds one.", None),
        ]
    )
    spec = 'def f(x):\n    """Return x plus one."""\n'
    result = ralu_repair(
        spec, "def f(x):\n    return x\n", backend, unit_mode="step", entry_point="f", synthesis="llm"
    )
    assert result.units == ["1: add one to x", "2: return it"] and result.unit_mode == "step"
    assert result.synthesis == "llm" and "return x + 1" in result.program
    synthesis_call = backend.asked[-1]
    assert synthesis_call[1]["content"].startswith("# Reasoning Path\n## Process\nUnit 1: 1: add one to x")
    assert "entry point is f" in synthesis_call[0]["content"]
    with pytest.raises(ValueError, match="synthesis"):
        ralu_repair(spec, "def f(x):\n    return x\n", backend, unit_mode="step", entry_point="f")


def test_checks_that_hold_by_construction_are_mechanism_checks():
    """pass@1(initial) is 0 by selection, so "whole_refine >= initial" holds for any repair, and the oracle judge
    repairs by construction: both are shown as mechanism checks and never gate. The oracle upper bound is reported
    only; RaLU-CFG must beat whole-program refinement (a check it can fail)."""
    from lmlab.methods.decoding.ralu.config import SYSTEMS
    from lmlab.methods.decoding.ralu.experiment import build_claims
    from lmlab.results import combine_statuses, evaluate_claim

    claims = {(c.method, c.baseline): c for c in build_claims(SYSTEMS)}
    for pair in (("whole_refine", "initial"), ("oracle_cfg", "initial")):
        assert claims[pair].mechanism and not claims[pair].gate
    assert not claims[("oracle_cfg", "ralu_cfg")].gate and not claims[("oracle_cfg", "ralu_cfg")].mechanism
    assert claims[("ralu_cfg", "whole_refine")].gate and claims[("ralu_line", "whole_refine")].gate
    # with every system replaced by its baseline (here: no system repairs anything), the verdict does not hold
    zeros = [0.0] * 30
    gated = [c for c in claims.values() if c.gate]
    assert combine_statuses([evaluate_claim(c, zeros, zeros).status for c in gated]) != "supported"
    only = build_claims(["initial", "ralu_cfg"])  # without whole_refine a falsifiable gated check remains
    assert [(c.method, c.baseline) for c in only if c.gate] == [("ralu_cfg", "initial")]


def test_config_backend_specs():
    from lmlab.methods.decoding.ralu.config import RaLUConfig
    from lmlab.methods.decoding.ralu.experiment import _api_target

    assert _api_target(RaLUConfig(backend="hf")) is None
    # the older form keeps working: the endpoint in openai_base_url / openai_model
    old = RaLUConfig(backend="openai", openai_base_url="http://127.0.0.1:9/v1", openai_model="m")
    assert _api_target(old) == ("http://127.0.0.1:9/v1", "m")
    assert _api_target(RaLUConfig(backend="openai:http://h:8000/v1#served")) == ("http://h:8000/v1", "served")
    assert _api_target(RaLUConfig(backend="openai:http://h:8000/v1", openai_model="x")) == ("http://h:8000/v1", "x")
    local = RaLUConfig(backend="local:tiny-llama")  # the constrained local roles, on that model
    assert local.model == "tiny-llama" and _api_target(local) is None
    for bad, match in [
        ("smollm2", r"backend must be hf, openai, openai:URL\[#MODEL\] or local:MODEL, got 'smollm2'"),
        ("openai:localhost:8000", r"got 'openai:localhost:8000': .*must start with http:// or https://"),
        ("vllm:http://h/v1", r"unknown kind 'vllm'"),
    ]:
        with pytest.raises(ValueError, match=match):
            RaLUConfig(backend=bad)
    with pytest.raises(ValueError, match=r"openai_base_url must be http\(s\)://HOST\[:PORT\]/PATH, got 'h:1'"):
        RaLUConfig(backend="openai", openai_base_url="h:1")
