"""Adapting While Learning (AWL): World Knowledge Learning from tool-derived solutions, then Tool Usage Adaptation.

Paper: Lyu et al., *Adapting While Learning: Grounding LLMs for Scientific Problems with Tool Usage Adaptation*
(ICML 2025); code https://github.com/Rose-STL-Lab/Adapting-While-Learning (commit c916359).

    Stage 1 (WKL):   min_θ  E_{(x, y) ∈ D}  -log p_θ(s(y) | P_notool(x)),   s(y): trace y rewritten tool-free
    split:           easy = {x : answer(greedy p_θ1(· | P_notool(x))) correct},   hard = D \\ easy
    Stage 2 (TUA):   min_θ  L_WKL(D) + L(easy: P_tool(x) → answer_question + s(y)) + L(hard: P_tool(x) → y)
                     implemented by mixing data (the README's "mixed loss", Eqs. 5-6), the minority of {easy, hard}
                     repeated len(major) // len(minor) times, starting from the stage-1 weights θ1
    tool-usage acc:  TUA = ½ · P(no tool | easy) + ½ · P(tool | hard),  easy/hard by the *evaluated* model's own
                     no-tool correctness on each test item (``Climate/evaluate.py``; `metric`, with its CIs)

Traces are ReAct-style text (SmolLM2's chat template has no tool schema): ``Action: calculator[12*37]`` /
``Observation: 444`` / ``Answer: 444`` for a tool call, ``Action: answer_question`` then the solution for a direct
answer. Tools run through `lmlab.core.execution.tools` (an AST-whitelisted calculator, a country-fact lookup), never
``eval``.
Observations are inputs, not targets: the loss covers the model's own tokens only (the climate code rewrites the
tool role to ``user`` for the same reason).

This module is pure: data builders, the trace parser, the SFT step loop over a cached frozen trunk
(`lmlab.core.training.partial`, `lmlab.core.training.lora`) and the batched tool-using decoder; no I/O, no printing.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmlab.core.execution.tools import ToolBox, ToolCall, parse_call

ANSWER_TOOL = "answer_question"
SETTINGS = ("no_tools", "tools")
KINDS = ("wkl", "direct", "tool")
STOP = "Observation:"
NO_TOOL_SYSTEM = "Answer directly. End with 'Answer: <answer>'."
TOOL_SYSTEM = "Tools: {tools}. Write 'Action: <tool>[<input>]' or 'Action: answer_question', then 'Answer: <answer>'."
_LABELS = ("Thought", "Action", "Observation", "Answer")
_LABEL_RE = re.compile(r"^(Thought|Action|Observation|Answer):\s?(.*)$")


# ----------------------------------------------------------------------------------------------------------------
# problems and traces


@dataclass(frozen=True)
class Problem:
    """A problem with its tool call and the template of its tool-free solution.

    Attributes:
        id, question, answer (`str`): the item, the user question and the gold answer.
        domain, difficulty (`str`): the task-bank domain and difficulty tag.
        call (`ToolCall`): the call that solves it (``calculator[386*275]``, ``lookup[Chad, capital]``).
        fact (`str`): the solution's lead-in, completed by the tool's output (``"386 * 275 ="``).
        example: the task-bank `Example` (for grading with ``lmlab.data.taskbank.grade``).
    """

    id: str
    question: str
    answer: str
    domain: str
    difficulty: str
    call: ToolCall
    fact: str
    example: Any = field(default=None, compare=False, repr=False)


_GEO_FIELD = {"capital": "capital", "continent": "continent", "iso3": "iso3", "currency_code": "currency_code"}
_GEO_FACT = {
    "capital": "The capital of {c} is",
    "continent": "{C} is in",
    "iso3": "The ISO 3166-1 alpha-3 code of {c} is",
    "currency_code": "The currency code of {c} is",
}


def problem_from_example(ex: Any) -> Problem:
    """A `Problem` from a task-bank example (arithmetic ``add``/``sub``/``mul``, geography ``capital``,
    ``continent``, ``iso3``, ``currency_code``)."""
    meta = ex.meta
    domain, task = meta.get("domain"), meta.get("task")
    q = ex.prompt.removeprefix("Q: ").removesuffix("\nA:").strip()
    if domain == "arithmetic" and task in ("add", "sub", "mul"):
        expr = meta["expression"]
        call, fact = ToolCall("calculator", expr.replace(" ", "")), f"{expr} ="
    elif domain == "geography" and task in _GEO_FIELD:
        country = meta["country"]
        call = ToolCall("lookup", f"{country}, {_GEO_FIELD[task]}")
        the = q.split(" of ", 1)[-1].rstrip("?") if task != "continent" else q.split(" is ", 1)[-1].rstrip("?")
        fact = _GEO_FACT[task].format(c=the, C=the[:1].upper() + the[1:])
    else:
        raise ValueError(f"example {ex.id} is {domain}/{task}; expected arithmetic add/sub/mul or geography "
                         f"{'/'.join(_GEO_FIELD)}")  # fmt: skip
    return Problem(ex.id, q, ex.target, domain, meta.get("difficulty", ""), call, fact, ex)


Segments = tuple[tuple[str, bool], ...]  # (text, is_target) pieces of a response


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: a question in a `setting` and the response as (text, is_target) segments."""

    problem_id: str
    setting: str  # "no_tools" or "tools"
    kind: str  # "wkl", "direct" or "tool"
    question: str
    segments: Segments

    @property
    def response(self) -> str:
        return "".join(t for t, _ in self.segments)


def solution_text(problem: Problem, observation: str) -> str:
    """The tool-free solution that states the tool's output as a fact (the WKL rewrite, by template)."""
    return f"{problem.fact} {observation}. Answer: {observation}"


def wkl_example(problem: Problem, observation: str) -> SFTExample:
    """Stage-1 data: no-tool prompt -> tool-free solution."""
    return SFTExample(problem.id, "no_tools", "wkl", problem.question, ((solution_text(problem, observation), True),))


def direct_example(problem: Problem, observation: str) -> SFTExample:
    """TUA-easy: tool-available prompt -> ``Action: answer_question`` and the tool-free solution."""
    text = f"Action: {ANSWER_TOOL}\n{solution_text(problem, observation)}"
    return SFTExample(problem.id, "tools", "direct", problem.question, ((text, True),))


def tool_example(problem: Problem, observation: str) -> SFTExample:
    """TUA-hard (and tool-only SFT): the tool trace; the observation is an input (not a target)."""
    segs = ((f"Action: {problem.call}\n{STOP}", True), (f" {observation}\n", False), (f"Answer: {observation}", True))
    return SFTExample(problem.id, "tools", "tool", problem.question, segs)


def observe_all(problems: Sequence[Problem], tools: ToolBox) -> list[str]:
    """Each problem's tool output (the deterministic stand-in for the paper's tool-using LLM, `answer_agent.py`)."""
    return [tools.observe(p.call) for p in problems]


def keep_correct(
    problems: Sequence[Problem], observations: Sequence[str], grade: Callable[[Any, str], float]
) -> tuple[list[Problem], list[str]]:
    """Drop traces whose tool-derived answer is wrong (the code drops solutions the teacher marks wrong)."""
    kept = [(p, o) for p, o in zip(problems, observations, strict=True) if grade(p.example, o) > 0]
    return [p for p, _ in kept], [o for _, o in kept]


def make_wkl_data(problems: Sequence[Problem], observations: Sequence[str]) -> list[SFTExample]:
    """Stage-1 WKL data: one tool-free solution per problem."""
    return [wkl_example(p, o) for p, o in zip(problems, observations, strict=True)]


def split_easy_hard(problems: Sequence[Problem], correct: Sequence[bool | float]) -> tuple[list[int], list[int]]:
    """(easy, hard) indices: easy where the stage-1 model answered without tools correctly (one greedy sample)."""
    if len(problems) != len(correct):
        raise ValueError(f"got {len(problems)} problems but {len(correct)} correctness flags; expected one each")
    easy = [i for i, c in enumerate(correct) if bool(c)]
    hard = [i for i, c in enumerate(correct) if not bool(c)]
    return easy, hard


def balance_repeat(easy: Sequence[Any], hard: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The code's class balancing: the smaller of {easy, hard} repeated ``len(major) // len(minor)`` times (an empty
    class stays empty: nothing to repeat)."""
    easy, hard = list(easy), list(hard)
    if not easy or not hard:
        return easy, hard
    if len(easy) < len(hard):
        return easy * (len(hard) // len(easy)), hard
    return easy, hard * (len(easy) // len(hard))


def make_stage2_data(
    problems: Sequence[Problem],
    observations: Sequence[str],
    easy: Sequence[int],
    hard: Sequence[int],
    *,
    balance: str = "repeat",
) -> list[SFTExample]:
    """Stage-2 mixed data: the WKL data again, TUA-easy (answer directly) and TUA-hard (tool trace).

    Args:
        balance (`str`, defaults to ``"repeat"``): ``"repeat"`` (the code's rule, `balance_repeat`) or ``"none"``.
    """
    if balance not in ("repeat", "none"):
        raise ValueError(f"balance must be 'repeat' or 'none', got {balance!r}")
    bad = [i for i in [*easy, *hard] if not 0 <= i < len(problems)]
    if bad:
        raise ValueError(f"easy/hard indices must be in [0, {len(problems)}), got {bad[:3]}")
    e, h = balance_repeat(easy, hard) if balance == "repeat" else (list(easy), list(hard))
    data = make_wkl_data(problems, observations)
    data += [direct_example(problems[i], observations[i]) for i in e]
    data += [tool_example(problems[i], observations[i]) for i in h]
    return data


def make_tool_only_data(problems: Sequence[Problem], observations: Sequence[str]) -> list[SFTExample]:
    """The tool-only SFT baseline's data: every problem answered with its tool trace (the over-reliance case)."""
    return [tool_example(p, o) for p, o in zip(problems, observations, strict=True)]


# ----------------------------------------------------------------------------------------------------------------
# ReAct text


@dataclass(frozen=True)
class Step:
    """One labelled line of a ReAct trace: ``kind`` in thought / action / observation / answer (or ``text`` for
    unlabelled lines before the first label)."""

    kind: str
    text: str


def parse_react(text: str) -> list[Step]:
    """The labelled steps of a ReAct text; an unlabelled line continues the previous step."""
    steps: list[Step] = []
    for line in text.split("\n"):
        m = _LABEL_RE.match(line.strip())
        if m:
            steps.append(Step(m.group(1).lower(), m.group(2).strip()))
        elif steps:
            last = steps[-1]
            steps[-1] = Step(last.kind, f"{last.text}\n{line}" if last.text else line)
        elif line.strip():
            steps.append(Step("text", line))
    return steps


def format_react(steps: Sequence[Step]) -> str:
    """The text of `steps` (inverse of `parse_react` on labelled steps)."""
    out = []
    for s in steps:
        if s.kind == "text":
            out.append(s.text)
        elif s.kind.capitalize() in _LABELS:
            out.append(f"{s.kind.capitalize()}: {s.text}")
        else:
            raise ValueError(f"step kind must be text or one of {', '.join(k.lower() for k in _LABELS)}, got "
                             f"{s.kind!r}")  # fmt: skip
    return "\n".join(out)


def first_action(text: str) -> ToolCall | None:
    """The call of the first ``Action:`` step (None when there is none or it is not ``name[...]`` / a name)."""
    for s in parse_react(text):
        if s.kind == "action":
            return parse_call(s.text.split("\n", 1)[0])
    return None


def calls_tool(text: str) -> bool:
    """The tool-use criterion: the first action is something other than ``answer_question``."""
    call = first_action(text)
    return call is not None and call.name != ANSWER_TOOL


def extract_answer(text: str) -> str:
    """The text after the last ``Answer:`` (its first line), or the whole text when there is none."""
    if "Answer:" not in text:
        return text.strip()
    return text.rsplit("Answer:", 1)[1].strip().split("\n", 1)[0].strip()


# ----------------------------------------------------------------------------------------------------------------
# encoding and the SFT loop over a cached frozen trunk


def system_prompt(setting: str, tools: ToolBox | None = None) -> str:
    """The system message of the no-tool or the tool-available setting."""
    if setting == "no_tools":
        return NO_TOOL_SYSTEM
    if setting == "tools":
        if tools is None:
            raise ValueError("the tools setting needs a ToolBox to describe")
        return TOOL_SYSTEM.format(tools=", ".join(t.syntax for t in tools.tools.values()))
    raise ValueError(f"setting must be one of {', '.join(SETTINGS)}, got {setting!r}")


def render_prompt(tokenizer: Any, setting: str, question: str, tools: ToolBox | None = None) -> str:
    """The chat prompt of `question` in `setting` (the tokenizer's chat template with the generation prompt)."""
    from lmlab.core.inference.scoring import chat_prompt

    return chat_prompt(tokenizer, question, system=system_prompt(setting, tools))


def encode_segments(
    tokenizer: Any, prompt: str, segments: Segments, *, eos: bool = True
) -> tuple[list[int], list[bool]]:
    """Token ids of ``prompt + response`` and a per-token target flag (response tokens of target segments, and EOS).

    Token boundaries are those of the whole text (a segment starts at the common prefix of the encodings of the text
    up to it and of the whole), so training sees the tokens generation would.
    """
    from lmlab.core.inference.scoring import encode_prompt

    full = prompt + "".join(t for t, _ in segments)
    ids = encode_prompt(tokenizer, full)

    def cp(text: str) -> int:
        pre = encode_prompt(tokenizer, text)
        k = 0
        while k < min(len(pre), len(ids)) and pre[k] == ids[k]:
            k += 1
        return k

    bounds, pos = [cp(prompt)], len(prompt)
    for text, _ in segments:
        pos += len(text)
        bounds.append(cp(full[:pos]) if pos < len(full) else len(ids))
    target = [False] * len(ids)
    for (_, is_t), a, b in zip(segments, bounds[:-1], bounds[1:]):
        for j in range(a, b):
            target[j] = is_t
    if bounds[0] < 1 or not any(target):
        raise ValueError(f"the example ({prompt[-30:]!r}, {full[len(prompt):][:30]!r}) has an empty prompt or no "
                         "target tokens after tokenisation")  # fmt: skip
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if eos and eos_id is not None:
        ids, target = [*ids, int(eos_id)], [*target, True]
    return ids, target


class TraceCache:
    """Frozen-trunk caches of encoded sequences, one right-padded `lmlab.core.training.lora.PaddedCache` per group
    (e.g.
    per kind, so short WKL sequences are not padded to the tool traces' width), with per-token target masks.

    Args:
        trunk (`lmlab.core.training.partial.FrozenTrunk`): the frozen lower blocks.
        encoded (`list[tuple[list[int], list[bool]]]`): (ids, target flags) per sequence; its position is its id.
        groups (`list[int]`, *optional*): group of each sequence (default: one group).
        pad_id (`int`): padding token id.
    """

    def __init__(self, trunk: Any, encoded: Sequence[tuple[list[int], list[bool]]], *,
                 groups: Sequence[int] | None = None, pad_id: int = 0) -> None:  # fmt: skip
        self.trunk, self.pad_id = trunk, pad_id
        self.where: dict[int, tuple[int, int]] = {}
        self.caches: list[Any] = []
        self.n = 0
        self.extend(encoded, groups=groups)

    def extend(
        self, encoded: Sequence[tuple[list[int], list[bool]]], *, groups: Sequence[int] | None = None
    ) -> list[int]:
        """Cache more sequences (in new padded groups); returns their ids (continuing the numbering)."""
        import torch

        from lmlab.core.training.lora import PaddedCache

        if not encoded:
            raise ValueError("TraceCache needs at least one sequence")
        groups = list(groups) if groups is not None else [0] * len(encoded)
        if len(groups) != len(encoded):
            raise ValueError(f"got {len(groups)} group ids for {len(encoded)} sequences; expected one each")
        start = self.n
        for g in sorted(set(groups)):
            members = [i for i, x in enumerate(groups) if x == g]
            seqs = [(encoded[i][0], encoded[i][1].index(True)) for i in members]
            pc = PaddedCache(self.trunk, seqs, self.pad_id)
            tm = torch.zeros_like(pc.tmask)  # (n, T-1): position t predicts token t+1
            for row, i in enumerate(members):
                flags = encoded[i][1]
                tm[row, : len(flags) - 1] = torch.tensor(flags[1:], dtype=torch.bool)
                self.where[start + i] = (len(self.caches), row)
            pc.tmask = tm
            self.caches.append(pc)
        self.n += len(encoded)
        return list(range(start, self.n))

    def batches(self, seq_ids: Sequence[int]) -> list[tuple[Any, Any, list[int]]]:
        """(TrunkCache, target mask, sequence ids) per group of `seq_ids` (repeats kept)."""
        by: dict[int, list[int]] = {}
        for i in seq_ids:
            by.setdefault(self.where[i][0], []).append(i)
        out = []
        for g, members in sorted(by.items()):
            sub, tm = self.caches[g].batch([self.where[i][1] for i in members])
            out.append((sub, tm, members))
        return out


def clone_topk(topk: Any) -> Any:
    """A trainable copy of a `TopK` sharing its frozen LM head (stage 2 starts from the stage-1 weights)."""
    head = topk.lm_head
    memo = {id(head): head, **{id(p): p for p in head.parameters()}}
    new = copy.deepcopy(topk, memo)
    new.train()
    return new


def sft_steps(
    policy: Any,
    cache: TraceCache,
    seq_ids: Sequence[int],
    *,
    steps: int,
    batch: int,
    lr: float,
    warmup_ratio: float = 0.1,
    seed: int = 0,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """`steps` AdamW steps on `seq_ids` (seeded epochs of permutations, `batch` per step), cosine schedule with
    linear warm-up (LLaMA-Factory's recipe), loss = per-token mean NLL of each sequence's target tokens
    (`lmlab.core.training.preference.weighted_sft_loss`, uniform weights) averaged over the batch. Trains `policy` in
    place.

    Returns:
        `list[float]`: the loss of every step.
    """
    import torch

    from lmlab.core.training.lora import index_batches
    from lmlab.core.training.partial import response_token_logps
    from lmlab.core.training.preference import weighted_sft_loss
    from lmlab.core.training.pretrain import cosine_lr

    if not len(seq_ids):
        raise ValueError("seq_ids is empty: sft_steps needs at least one sequence to train on")
    if steps < 1 or batch < 1:
        raise ValueError(f"steps and batch must be >= 1, got steps={steps}, batch={batch}")
    params = list(policy.trainable_parameters())
    if not params:
        raise ValueError("the policy has no trainable parameters; expected a trainable TopK")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warm = int(round(warmup_ratio * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, steps=steps, warmup=warm, min_ratio=0.0))
    ids = list(seq_ids)
    policy.train()
    losses = []
    for rows in index_batches(len(ids), steps, batch, seed):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        chosen = [ids[r] for r in rows]
        for sub, tm, _ in cache.batches(chosen):
            lp = response_token_logps(policy, sub, tm)  # (b, T-1)
            loss = weighted_sft_loss(lp, tm, reduction="none").sum() / len(chosen)
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        sched.step()
        losses.append(total)
    policy.eval()
    return losses


# ----------------------------------------------------------------------------------------------------------------
# the two stages end to end


@dataclass
class AWLRun:
    """What `train_awl` trained: the stage-1 (``wkl``) and stage-2 (``awl``) tops over one frozen trunk, the
    training split and everything cached (reused by `train_tool_only`)."""

    trunk: Any
    cache: TraceCache
    problems: list[Problem]
    observations: list[str]
    wkl: Any
    awl: Any
    easy: list[int]
    hard: list[int]
    correct: list[bool]
    losses: dict[str, list[float]]
    seq_of: dict[tuple[str, str], int]
    dropped: int = 0

    def ids(self, examples: Sequence[SFTExample]) -> list[int]:
        """Cached sequence ids of `examples` (by problem and kind)."""
        return [self.seq_of[(e.problem_id, e.kind)] for e in examples]

    def full_model(self, model: Any, which: str = "awl") -> Any:
        """A full HF model with the ``awl`` or ``wkl`` top blocks (``generate``, ``save_pretrained``)."""
        from lmlab.core.training.partial import policy_model

        if which not in ("awl", "wkl"):
            raise ValueError(f"which must be 'awl' or 'wkl', got {which!r}")
        return policy_model(model, getattr(self, which))


def _default_grade(example: Any, text: str) -> float:
    from lmlab.data.taskbank import grade

    return grade(example, text)


def train_awl(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Problem],
    tools: ToolBox,
    *,
    grade: Callable[[Any, str], float] | None = None,
    train_layers: int = 2,
    stage1_steps: int = 20,
    stage2_steps: int = 20,
    batch: int = 8,
    lr: float = 5e-4,
    warmup_ratio: float = 0.1,
    balance: str = "repeat",
    max_new_tokens: int = 32,
    batch_size: int = 16,
    seed: int = 0,
    meter: Any = None,
) -> AWLRun:
    """AWL on `problems`: tool traces -> WKL SFT -> easy/hard by the WKL model (greedy, no tools) -> mixed SFT.

    Fine-tunes the top `train_layers` blocks of `model` over a cached frozen trunk (`model` is not modified).
    `grade(example, text) -> float` checks an answer (default: ``lmlab.data.taskbank.grade``); traces whose tool
    output it grades wrong are dropped.
    """
    from lmlab.core.inference.generation import decode_batch
    from lmlab.core.stats.seeding import derive_seed
    from lmlab.core.training.partial import FrozenTrunk, policy_model

    grade = grade or _default_grade
    if balance not in ("repeat", "none"):
        raise ValueError(f"balance must be 'repeat' or 'none', got {balance!r}")
    kept, obs = keep_correct(problems, observe_all(problems, tools), grade)
    if len(kept) < 2:
        raise ValueError(f"only {len(kept)} of {len(problems)} problems have a correct tool trace; expected >= 2")
    trunk = FrozenTrunk(model, train_layers)
    builders = {"wkl": wkl_example, "direct": direct_example, "tool": tool_example}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)

    def encode(kinds: Sequence[str], rows: Sequence[int]) -> tuple[list[Any], list[int], list[tuple[str, str]]]:
        enc, groups, keys = [], [], []
        for kind in kinds:
            for i in rows:
                ex = builders[kind](kept[i], obs[i])
                prompt = render_prompt(tokenizer, ex.setting, ex.question, tools)
                enc.append(encode_segments(tokenizer, prompt, ex.segments))
                groups.append(KINDS.index(kind))
                keys.append((kept[i].id, kind))
        return enc, groups, keys

    # each sequence cached once, one padded group per kind: WKL solutions and tool traces now, the direct answers of
    # the easy problems after the split
    enc, groups, keys = encode(["wkl", "tool"], range(len(kept)))
    cache = TraceCache(trunk, enc, groups=groups, pad_id=pad)
    seq_of = {k: i for i, k in enumerate(keys)}
    kw = dict(batch=batch, lr=lr, warmup_ratio=warmup_ratio)
    wkl = trunk.top_k()
    losses = {"wkl": sft_steps(wkl, cache, [seq_of[(p.id, "wkl")] for p in kept], steps=stage1_steps,
                               seed=derive_seed(seed, "awl-stage1"), **kw)}  # fmt: skip
    prompts = [render_prompt(tokenizer, "no_tools", p.question) for p in kept]
    outs = decode_batch(policy_model(model, wkl), tokenizer, prompts, max_new_tokens=max_new_tokens,
                        batch_size=batch_size, meter=meter, meter_name="wkl:split")  # fmt: skip
    correct = [grade(p.example, extract_answer(o.text)) > 0 for p, o in zip(kept, outs)]
    easy, hard = split_easy_hard(kept, correct)
    if easy:
        enc, groups, keys = encode(["direct"], easy)
        seq_of.update(zip(keys, cache.extend(enc, groups=groups)))
    stage2 = make_stage2_data(kept, obs, easy, hard, balance=balance)
    awl = clone_topk(wkl)
    losses["awl"] = sft_steps(awl, cache, [seq_of[(e.problem_id, e.kind)] for e in stage2], steps=stage2_steps,
                              seed=derive_seed(seed, "awl-stage2"), **kw)  # fmt: skip
    return AWLRun(trunk, cache, list(kept), list(obs), wkl, awl, easy, hard, correct, losses, seq_of,
                  len(problems) - len(kept))  # fmt: skip


def train_tool_only(run: AWLRun, *, steps: int, batch: int = 8, lr: float = 5e-4, warmup_ratio: float = 0.1,
                    seed: int = 0) -> tuple[Any, list[float]]:  # fmt: skip
    """The tool-only SFT baseline on `run`'s problems and cache: a fresh top trained on every tool trace."""
    from lmlab.core.stats.seeding import derive_seed

    policy = run.trunk.top_k()
    ids = run.ids(make_tool_only_data(run.problems, run.observations))
    losses = sft_steps(policy, run.cache, ids, steps=steps, batch=batch, lr=lr, warmup_ratio=warmup_ratio,
                       seed=derive_seed(seed, "awl-tool-only"))  # fmt: skip
    return policy, losses


# ----------------------------------------------------------------------------------------------------------------
# tool-using generation


@dataclass
class Trace:
    """A tool-using answer: the model-written turns, the calls executed and their observations."""

    prompt: str
    turns: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The transcript after the prompt (model turns and observations)."""
        out = ""
        for i, t in enumerate(self.turns):
            out += t
            if i < len(self.observations):
                out += f"{STOP} {self.observations[i]}\n"
        return out

    @property
    def used_tool(self) -> bool:
        return bool(self.turns) and calls_tool(self.turns[0])

    @property
    def final(self) -> str:
        """The last model-written turn (the answer is read there, never from an observation)."""
        return self.turns[-1] if self.turns else ""

    @property
    def answer(self) -> str:
        return extract_answer(self.final)


def run_with_tools(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    tools: ToolBox,
    *,
    max_turns: int = 2,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    meter: Any = None,
    meter_name: str | None = None,
) -> list[Trace]:
    """Greedy, batched (left-padded) ReAct decoding: each turn stops at ``Observation:`` or EOS; a turn whose first
    action is a tool call gets the tool's observation appended (`ToolBox.observe`: errors become ``Error: ...``
    lines) and the model continues, for at most `max_turns` turns.
    """
    from lmlab.core.inference.generation import decode_batch

    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    traces = [Trace(p) for p in prompts]
    context = list(prompts)
    active = list(range(len(prompts)))
    for turn in range(max_turns):
        if not active:
            break
        outs = decode_batch(model, tokenizer, [context[i] for i in active], max_new_tokens=max_new_tokens,
                            stop_strings=(STOP,), batch_size=batch_size, meter=meter,
                            meter_name=meter_name)  # fmt: skip
        nxt = []
        for i, o in zip(active, outs):
            text = o.text
            traces[i].turns.append(text)
            call = first_action(text)
            if turn + 1 < max_turns and call is not None and call.name != ANSWER_TOOL:
                obs = tools.observe(call)
                traces[i].calls.append(str(call))
                traces[i].observations.append(obs)
                body = text if text.endswith("\n") else text + "\n"
                context[i] = context[i] + body + f"{STOP} {obs}\n"
                nxt.append(i)
        active = nxt
    return traces


__all__ = [
    "ANSWER_TOOL",
    "AWLRun",
    "KINDS",
    "SETTINGS",
    "Problem",
    "SFTExample",
    "Step",
    "TraceCache",
    "Trace",
    "balance_repeat",
    "calls_tool",
    "clone_topk",
    "direct_example",
    "encode_segments",
    "extract_answer",
    "first_action",
    "format_react",
    "keep_correct",
    "make_stage2_data",
    "make_tool_only_data",
    "make_wkl_data",
    "observe_all",
    "parse_react",
    "problem_from_example",
    "render_prompt",
    "run_with_tools",
    "sft_steps",
    "solution_text",
    "split_easy_hard",
    "system_prompt",
    "tool_example",
    "train_awl",
    "train_tool_only",
    "wkl_example",
]
