"""The model-variant zoo and the response-cache builder (`lmlab cache build` / `lmlab cache show`).

The selection and evaluation areas (cascade_routing, kabb, pmf_predict, cv_winrate) consume one table of per-query
results for a pool of "models" (`lmlab.data.respcache.ResponseCache`). This module makes that pool from the two real
models, without hub access (selection.md, "Model zoo of derived variants"), and fills the table:

=================  ===============================================================================================
variant            construction
=================  ===============================================================================================
``smol``           SmolLM2-135M-Instruct, chat prompt, zero-shot, greedy
``smol-fewshot``   the same with 3 solved train-split examples of the same task as earlier chat turns
``smol-sc5``       self-consistency: 5 samples at T=0.7, majority vote over the extracted answers (cost x5)
``smol-trunc10``   the first 10 of the 30 blocks + the final norm + lm_head (FLOPs scale with the kept blocks)
``smol-trunc20``   the same with 20 blocks
``smol-pot``       program of thought: the model writes an arithmetic expression, `safe_eval` (a whitelisted AST
                   walk, never ``eval``) computes it, the value is graded
``smol-wanda50``   pruned by the `wanda` method (`lmlab.methods.compression.wanda.wanda_prune`), 50% unstructured
``smol-atp50``     pruned by the `atp` method's allocation: per-block sparsities in an arithmetic progression of mean
                   50% (beta searched on corpus dev perplexity, `atp.method.search_beta`), each block by Wanda
``smol-int4``      decoded on the fast engine's int4 path (``engine="fast-int4"``, the GGUF's own Q4 blocks)
``smol-lora-*``    peft LoRA r=8 on q/v of the top blocks, a few hundred steps on one task family (arith / geo)
``gemma-fewshot``  Gemma-3-270M base, 3-shot ``Question: / Answer:`` prompt, greedy, stop at the newline
``tiny-random``    the 2-layer / hidden-64 random llama with a byte tokenizer (the junk floor; unit tests)
=================  ===============================================================================================

Suite ``mixed``: exact-graded queries from `lmlab.data` suites, interleaved by task so any prefix is balanced
(`MIXED_TASKS`: arithmetic word problems with 1 and 2 digits, country capital / currency / continent, word
reversal, letter counting, composition of two permutations of S3). Each query is graded by its suite's own grader
(`lmlab.data.grade`). The continent task is multiple choice over `CONTINENT_OPTIONS`; where cheap (variants whose
answer is the HF model's greedy text) its ``option_probs`` are the options' first-token probabilities at the answer
position, renormalised over the options (one prompt forward; not part of ``cost_flops``).

Cost: `lmlab.data.respcache.flop_cost` = 2 x flop params (`lmlab.core.inference.models.flop_params`: non-embedding
weights
plus the head) x (prompt + generated tokens), summed over samples. Unstructured sparsity and int4 weights do not
change this count (dense kernels do the same multiply-adds); the variant's description records its sparsity /
weight format.

Build: `build_cache` runs the variants one after another; each variant's rows go to their own part file
(``<out>/<suite>-s<seed>.parts/<variant>.jsonl.gz``, atomic), so a killed build resumes at the next variant; the
final cache (every valid part in pool order) is saved atomically as ``<out>/<suite>-s<seed>.jsonl.gz``, where
`lmlab.data.respcache.load_cache` finds it (default ``out``: `lmlab.data.respcache.user_dir`). A variant that fails
is recorded in ``failed`` with a one-line reason, never fatal.
"""

from __future__ import annotations

import ast
import copy
import gc
import logging
import math
import operator
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab import data as lmdata
from lmlab.data import Example, seeded_rng
from lmlab.data.respcache import (
    ResponseCache,
    ResponseRow,
    cache_filename,
    flop_cost,
    user_dir,
)

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# The "mixed" suite


@dataclass(frozen=True)
class TaskDef:
    """One task of a zoo suite: which `lmlab.data` suite generates it (with which keywords) and its tags."""

    name: str
    suite: str
    kwargs: dict[str, Any]
    tags: tuple[str, ...]
    suffix: str = ""  # an answer-format instruction appended to the suite's prompt (short answers fit the budget)


_NUMBER_ONLY = " Answer with the number only."
MIXED_TASKS: tuple[TaskDef, ...] = (
    TaskDef("arith1", "arithmetic", {"kind": "word", "digits": 1}, ("arithmetic", "math"), _NUMBER_ONLY),
    TaskDef("arith2", "arithmetic", {"kind": "word", "digits": 2}, ("arithmetic", "math"), _NUMBER_ONLY),
    TaskDef("capital", "countries", {"task": "capital"}, ("geography", "facts")),
    TaskDef("currency", "countries", {"task": "currency"}, ("geography", "facts")),
    TaskDef("continent", "countries", {"task": "continent"}, ("geography", "facts", "mc")),
    TaskDef("reverse", "strings", {"task": "reverse"}, ("strings", "symbolic")),
    TaskDef("count", "strings", {"task": "count"}, ("strings", "counting")),
    TaskDef("permutations", "permutations", {"n_elements": 3, "length": 2}, ("symbolic", "state_tracking")),
)
ZOO_SUITES: dict[str, tuple[TaskDef, ...]] = {"mixed": MIXED_TASKS}

# Multiple-choice options of the continent task, in the order of every row's `option_probs`.
CONTINENT_OPTIONS: tuple[str, ...] = ("Africa", "Asia", "Europe", "North America", "Oceania", "South America")
MC_OPTIONS: dict[str, tuple[str, ...]] = {"continent": CONTINENT_OPTIONS}


@dataclass(frozen=True)
class Query:
    """One query of a zoo suite: the suite's example, its task and the `lmlab.data` suite that grades it."""

    example: Example
    task: str
    suite: str
    tags: tuple[str, ...]
    suffix: str = ""

    @property
    def id(self) -> str:
        return self.example.id

    @property
    def prompt(self) -> str:
        """The suite's prompt plus the task's answer-format suffix (what every variant but ``pot`` is asked)."""
        return self.example.prompt + self.suffix

    def grade(self, output: str) -> float:
        return float(lmdata.grade(self.suite, self.example, output))


def _task_defs(suite: str) -> tuple[TaskDef, ...]:
    if suite not in ZOO_SUITES:
        raise ValueError(f"suite must be one of {', '.join(ZOO_SUITES)}, got {suite!r}")
    return ZOO_SUITES[suite]


def suite_queries(suite: str = "mixed", n: int = 120, seed: int = 0, split: str = "test") -> list[Query]:
    """`n` queries of `suite`, split as evenly as possible over its tasks and interleaved round-robin by task."""
    defs = _task_defs(suite)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (queries of suite {suite!r}), got {n!r}")
    # n < len(defs): the first n tasks get one query each
    per = [n // len(defs) + (1 if i < n % len(defs) else 0) for i in range(len(defs))]
    by_task: list[list[Query]] = []
    for d, k in zip(defs, per):
        if k == 0:
            continue
        try:
            exs = lmdata.load(d.suite, k, seed=seed, split=split, **d.kwargs)
        except ValueError as e:
            raise ValueError(f"task {d.name!r} of suite {suite!r} cannot give {k} queries ({e}); lower n") from None
        by_task.append([Query(e, d.name, d.suite, d.tags, d.suffix) for e in exs])
    out: list[Query] = []
    for i in range(max(per)):
        out += [qs[i] for qs in by_task if i < len(qs)]
    return out


def _shot_pool(task: TaskDef, seed: int, n: int = 40) -> list[Example]:
    """Train-split examples of `task` (few-shot shots and LoRA training items never come from the test split)."""
    while True:  # the largest of n, n/2, n/4, ... that the train split holds
        try:
            return lmdata.load(task.suite, n, seed=seed, split="train", **task.kwargs)
        except ValueError:
            if n <= 1:
                raise
            n //= 2


def _shots(q: Query, pool: list[Example], k: int, seed: int) -> list[Example]:
    cands = [e for e in pool if e.id != q.id]
    return seeded_rng("zoo-shots", seed, q.id).sample(cands, min(k, len(cands)))


# ----------------------------------------------------------------------------------------------------------------
# Answer keys (self-consistency votes) and the safe evaluator (program of thought)


def answer_key(q: Query, text: str) -> str | None:
    """The answer an output commits to, as a voting key (no gold used): the suite's own extraction where it has one
    (last number, last word, last bracketed list), the last normalised word for the country facts."""
    from lmlab.data.normalize import last_number, normalize

    if q.suite == "arithmetic":
        v = last_number(text)
        return None if v is None else str(v)
    if q.suite == "strings":
        from lmlab.data.strings import extract_answer

        a = extract_answer(q.example.meta["task"], text)
        return None if a is None else a.casefold()
    if q.suite == "permutations":
        from lmlab.data.permutations import parse_answer

        p = parse_answer(text)
        return None if p is None else " ".join(map(str, p))
    words = normalize(text).split()
    return words[-1] if words else None


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def safe_eval(expr: str, *, max_abs: float = 1e12, max_len: int = 200) -> float:
    """The value of an arithmetic expression (numbers, + - * / // % **, unary +/-, parentheses), by walking its AST.

    Never calls `eval`: names, calls, attributes, subscripts and every other node raise `ValueError`, as do
    exponents above 12, magnitudes above `max_abs`, division by zero and inputs longer than `max_len` characters.
    """
    if len(expr) > max_len:
        raise ValueError(f"expression is {len(expr)} characters long, expected at most {max_len}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expr!r}") from None

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and (abs(b) > 12 or abs(a) > 1e6):
                raise ValueError(f"exponent too large in {expr!r}")
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and b == 0:
                raise ValueError(f"division by zero in {expr!r}")
            v = _BINOPS[type(node.op)](a, b)
            if isinstance(v, complex) or not math.isfinite(v) or abs(v) > max_abs:
                raise ValueError(f"value out of range in {expr!r}")
            return v
        raise ValueError(f"{type(node).__name__} is not allowed in an arithmetic expression: {expr!r}")

    return walk(tree)


_EXPR_RUN = re.compile(r"[0-9][0-9\s+\-*/().%]*|\([0-9\s+\-*/().%]*")


def extract_expression(text: str) -> str | None:
    """The longest run of arithmetic characters (digits, operators, parentheses) that `safe_eval` accepts."""
    text = text.replace("\u00d7", "*").replace("\u2212", "-").replace("`", " ")
    text = re.sub(r"(?<=[0-9)])\s*[xX]\s*(?=[0-9(])", " * ", text)
    text = text.split("=")[0] if "=" in text and not text.strip().startswith("=") else text
    runs = sorted((m.group(0).strip() for m in _EXPR_RUN.finditer(text)), key=len, reverse=True)
    for r in runs:
        r = r.rstrip("+-*/%(. \n").strip()
        if not r or not any(ch.isdigit() for ch in r):
            continue
        try:
            safe_eval(r)
        except ValueError:
            continue
        return r
    return None


def _format_value(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return f"{v:.6g}"


POT_INSTRUCTION = (
    "Translate the question into one arithmetic expression that computes the answer, using only numbers, "
    "+, -, * and /. Do not compute it. Answer with the expression only.\n"
    "Example: 'Ana has 3 apples. She gets 4 more apples. How many apples does Ana have now?' -> 3 + 4\n"
    "Question: {q}"
)


# ----------------------------------------------------------------------------------------------------------------
# Variants


@dataclass(frozen=True)
class VariantSpec:
    """A zoo member: how to build and query it.

    Args:
        id (`str`): the variant id (the cache's row key).
        kind (`str`): one of `KINDS` (zeroshot, fewshot, sc, trunc, pot, wanda, atp, int4, lora, base_fewshot).
        model (`str`): the `lmlab.core.inference.models.load_model` spec of the base model.
        params (`dict`): the kind's knobs (shots, samples, temperature, layers, sparsity, steps, ...).
        description (`str`): one line for `lmlab cache show` and the cache header.
    """

    id: str
    kind: str
    model: str
    params: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model, "params": dict(self.params), "construction": self.description}


KINDS: tuple[str, ...] = ("zeroshot", "fewshot", "sc", "trunc", "pot", "wanda", "atp", "int4", "lora", "base_fewshot")

_SMOL = "smollm2-135m"
VARIANTS: dict[str, VariantSpec] = {
    v.id: v
    for v in (
        VariantSpec("smol", "zeroshot", _SMOL, {}, "SmolLM2-135M-Instruct, chat prompt, zero-shot, greedy"),
        VariantSpec("smol-fewshot", "fewshot", _SMOL, {"shots": 3}, "SmolLM2, 3 train-split shots as chat turns"),
        VariantSpec(
            "smol-sc5",
            "sc",
            _SMOL,
            {"samples": 5, "temperature": 0.7},
            "SmolLM2, 5 samples at T=0.7, majority vote over extracted answers",
        ),
        VariantSpec("smol-trunc10", "trunc", _SMOL, {"layers": 10}, "SmolLM2, first 10 of 30 blocks + norm + head"),
        VariantSpec("smol-trunc20", "trunc", _SMOL, {"layers": 20}, "SmolLM2, first 20 of 30 blocks + norm + head"),
        VariantSpec(
            "smol-pot", "pot", _SMOL, {}, "SmolLM2 writes an arithmetic expression; safe AST evaluator computes it"
        ),
        VariantSpec(
            "smol-wanda50",
            "wanda",
            _SMOL,
            {"sparsity": 0.5, "n_calib": 8, "calib_seqlen": 128},
            "SmolLM2 pruned by wanda, 50% unstructured (corpus train calibration)",
        ),
        VariantSpec(
            "smol-atp50",
            "atp",
            _SMOL,
            {"sparsity": 0.5, "n_calib": 8, "calib_seqlen": 128, "n_val": 8, "betas": [0.0, 0.008, 0.016, 0.024]},
            "SmolLM2 pruned by wanda at ATP's per-block sparsities (mean 50%, beta searched on corpus dev)",
        ),
        VariantSpec("smol-int4", "int4", _SMOL, {}, "SmolLM2 on the fast engine's int4 weights (GGUF Q4 blocks)"),
        VariantSpec(
            "smol-lora-arith",
            "lora",
            _SMOL,
            {
                "family": "arithmetic",
                "rank": 8,
                "alpha": 16.0,
                "targets": ["q_proj", "v_proj"],
                "train_layers": 4,
                "steps": 200,
                "batch": 4,
                "max_items": 96,
                "lr": 1e-3,
            },
            "SmolLM2 + LoRA r=8 q/v (top 4 blocks), 200 steps x 4 on arithmetic word problems",
        ),
        VariantSpec(
            "smol-lora-geo",
            "lora",
            _SMOL,
            {
                "family": "geography",
                "rank": 8,
                "alpha": 16.0,
                "targets": ["q_proj", "v_proj"],
                "train_layers": 4,
                "steps": 200,
                "batch": 4,
                "max_items": 96,
                "lr": 1e-3,
            },
            "SmolLM2 + LoRA r=8 q/v (top 4 blocks), 200 steps x 4 on country facts",
        ),
        VariantSpec(
            "gemma-fewshot",
            "base_fewshot",
            "gemma3-270m",
            {"shots": 3},
            "Gemma-3-270M base, 3-shot Question/Answer prompt, greedy",
        ),
        VariantSpec("tiny-random", "zeroshot", "tiny-llama", {}, "2-layer hidden-64 random llama (junk floor)"),
    )
}
DEFAULT_VARIANTS: tuple[str, ...] = tuple(VARIANTS)


def resolve_variants(variants: Sequence[str | VariantSpec] | str | None) -> list[VariantSpec]:
    """Variant specs from ids (or a comma-separated string), `VariantSpec`s, or None (the whole default zoo)."""
    if variants is None:
        return [VARIANTS[v] for v in DEFAULT_VARIANTS]
    if isinstance(variants, str):
        variants = [v.strip() for v in variants.split(",") if v.strip()]
    out: list[VariantSpec] = []
    for v in variants:
        if isinstance(v, VariantSpec):
            spec = v
        elif v in VARIANTS:
            spec = VARIANTS[v]
        else:
            raise ValueError(f"unknown variant {v!r}; expected one of {', '.join(VARIANTS)}")
        if spec.kind not in KINDS:
            raise ValueError(f"variant {spec.id!r} has kind {spec.kind!r}, expected one of {', '.join(KINDS)}")
        out.append(spec)
    ids = [s.id for s in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"variants must be distinct, got {ids}")
    if not out:
        raise ValueError("variants is empty; expected at least one variant id")
    return out


# ----------------------------------------------------------------------------------------------------------------
# Running one variant


@dataclass
class BuildOptions:
    seed: int = 0
    batch_size: int = 16
    max_new_tokens: int = 16
    option_probs: bool = True
    progress: bool = False


def truncated_model(model: Any, n_layers: int) -> Any:
    """`lmlab.core.training.partial.truncated_model` (imported on use: the data layer loads without torch)."""
    from lmlab.core.training.partial import truncated_model as truncate

    return truncate(model, n_layers)


def _full_copy(model: Any) -> Any:
    from lmlab.core.training.partial import _stash_model_caches

    saved = _stash_model_caches(model)
    try:
        return copy.deepcopy(model)
    finally:
        model.__dict__.update(saved)


def _chat(tok: Any, user: str, history: Sequence[tuple[str, str]] = ()) -> str:
    from lmlab.core.inference.scoring import chat_prompt

    hist = [m for u, a in history for m in ({"role": "user", "content": u}, {"role": "assistant", "content": a})]
    return chat_prompt(tok, user, history=hist)


def _base_prompt(q: Query, shots: Sequence[Example]) -> str:
    blocks = [f"Question: {s.prompt}{q.suffix}\nAnswer: {s.target}\n\n" for s in shots]
    return "".join(blocks) + f"Question: {q.prompt}\nAnswer:"


def _generate(
    model: Any,
    tok: Any,
    prompts: list[str],
    opts: BuildOptions,
    *,
    engine: str | None = None,
    stop_strings: Sequence[str] = (),
    max_new_tokens: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    desc: str = "",
) -> tuple[list[Any], list[float]]:
    """One batched decoding pass (prompts sorted by length to limit padding); (outputs, wall seconds per prompt)."""
    from lmlab.core.inference.generation import decode_batch

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list[Any] = [None] * len(prompts)
    walls = [0.0] * len(prompts)
    starts = range(0, len(order), opts.batch_size)
    if opts.progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=desc, leave=False, unit="batch")
    for s in starts:
        idx = order[s : s + opts.batch_size]
        t0 = time.perf_counter()
        res = decode_batch(
            model,
            tok,
            [prompts[i] for i in idx],
            max_new_tokens=max_new_tokens or opts.max_new_tokens,
            do_sample=do_sample,
            temperature=temperature,
            stop_strings=stop_strings,
            seed=opts.seed + s if do_sample else None,
            batch_size=len(idx),
            engine=engine,
        )
        dt = (time.perf_counter() - t0) / len(idx)
        for i, r in zip(idx, res):
            outs[i], walls[i] = r, dt
    return outs, walls


def _option_probs(model: Any, tok: Any, queries: list[Query], prompts: list[str], opts: BuildOptions) -> dict:
    """query id -> the MC options' probabilities at the answer's first position, renormalised over the options.

    One forward per prompt with the head on the last position only (selection.md's speed tip: read the logits at
    the answer position); an option is represented by its first answer token (the continent names' first tokens
    are distinct); where two options share a first token, their whole answers are scored instead.
    """
    import torch

    from lmlab.core.inference.scoring import _left_pad, _pad_id, encode_prompt, split_pair

    if not opts.option_probs:
        return {}
    todo = [(q, p) for q, p in zip(queries, prompts) if MC_OPTIONS.get(q.task)]
    if not todo:
        return {}
    device = next(model.parameters()).device
    out: dict[str, tuple[float, ...]] = {}
    for s in range(0, len(todo), opts.batch_size):
        chunk = todo[s : s + opts.batch_size]
        firsts = []
        for q, p in chunk:
            lead = "" if (not p or p[-1].isspace()) else " "
            ids = [split_pair(tok, p, lead + o)[1][:1] for o in MC_OPTIONS[q.task]]
            if any(not i for i in ids) or len({i[0] for i in ids}) < len(ids):
                return _option_probs_full(model, tok, todo, opts)  # e.g. a byte tokenizer: "Africa" / "Asia"
            firsts.append([i[0] for i in ids])
        ids, mask, pos = _left_pad([encode_prompt(tok, p) for _, p in chunk], _pad_id(tok), device)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1).logits[:, -1]
        logp = torch.log_softmax(logits.float(), dim=-1)  # (b, vocab)
        for row, ((q, _), first) in enumerate(zip(chunk, firsts)):
            probs = torch.softmax(logp[row, torch.tensor(first, device=device)], dim=-1)
            out[q.id] = tuple(round(float(x), 6) for x in probs)
    return out


def _option_probs_full(model: Any, tok: Any, todo: list[tuple[Query, str]], opts: BuildOptions) -> dict:
    """The fallback: each option's whole-answer log-likelihood (`lmlab.core.inference.scoring.loglikelihood`),
    softmaxed."""
    from lmlab.core.inference.scoring import loglikelihood

    reqs = []
    for q, p in todo:
        lead = "" if (not p or p[-1].isspace()) else " "
        reqs += [(p, lead + o) for o in MC_OPTIONS[q.task]]
    scores = [lp for lp, _ in loglikelihood(model, tok, reqs, batch_size=opts.batch_size)]
    out, k = {}, 0
    for q, _ in todo:
        m = len(MC_OPTIONS[q.task])
        row, k = scores[k : k + m], k + m
        top = max(row)
        ex = [math.exp(x - top) for x in row]
        out[q.id] = tuple(round(e / sum(ex), 6) for e in ex)
    return out


def _rows(
    spec: VariantSpec,
    queries: list[Query],
    outs: list[Any],
    walls: list[float],
    n_params: int,
    *,
    probs: dict | None = None,
) -> list[ResponseRow]:
    rows = []
    for q, o, w in zip(queries, outs, walls):
        rows.append(
            ResponseRow(
                variant=spec.id,
                query_id=q.id,
                task=q.task,
                tags=q.tags,
                answer=o.text,
                correct=q.grade(o.text),
                answer_logprob=float(sum(o.token_logprobs)) if o.token_logprobs else float("nan"),
                option_probs=(probs or {}).get(q.id),
                n_prompt_tokens=len(o.prompt_ids),
                n_gen_tokens=len(o.token_ids),
                cost_flops=flop_cost(n_params, len(o.prompt_ids), len(o.token_ids)),
                wall_s=round(w, 6),
            )
        )
    return rows


def _greedy_rows(
    spec: VariantSpec,
    model: Any,
    tok: Any,
    queries: list[Query],
    prompts: list[str],
    opts: BuildOptions,
    *,
    engine: str | None = None,
    stop_strings: Sequence[str] = (),
    mc: bool = True,
) -> list[ResponseRow]:
    from lmlab.core.inference.models import flop_params

    outs, walls = _generate(model, tok, prompts, opts, engine=engine, stop_strings=stop_strings, desc=spec.id)
    probs = _option_probs(model, tok, queries, prompts, opts) if mc else {}
    return _rows(spec, queries, outs, walls, flop_params(model), probs=probs)


def _fewshot_prompts(tok: Any, queries: list[Query], shots: int, seed: int, *, base: bool) -> list[str]:
    defs = {d.name: d for d in MIXED_TASKS}
    pools = {t: _shot_pool(defs[t], seed) for t in {q.task for q in queries}}
    prompts = []
    for q in queries:
        chosen = _shots(q, pools[q.task], shots, seed)
        if base:
            prompts.append(_base_prompt(q, chosen))
        else:
            prompts.append(_chat(tok, q.prompt, [(s.prompt + q.suffix, s.target) for s in chosen]))
    return prompts


def _run_sc(spec: VariantSpec, model: Any, tok: Any, queries: list[Query], opts: BuildOptions) -> list[ResponseRow]:
    from lmlab.core.inference.models import flop_params

    k = int(spec.params.get("samples", 5))
    temp = float(spec.params.get("temperature", 0.7))
    if k < 1 or not temp > 0:
        raise ValueError(f"self-consistency needs samples >= 1 and temperature > 0, got {k}, {temp}")
    prompts = [_chat(tok, q.prompt) for q in queries]
    outs, walls = _generate(
        model, tok, [p for p in prompts for _ in range(k)], opts, do_sample=True, temperature=temp, desc=spec.id
    )
    n_params = flop_params(model)
    rows = []
    for j, q in enumerate(queries):
        samples = outs[j * k : (j + 1) * k]
        keys = [answer_key(q, s.text) for s in samples]
        votes = Counter(key for key in keys if key is not None)
        if votes:
            best = max(votes.values())
            winner = next(key for key in keys if key is not None and votes[key] == best)  # ties: first seen
            rep = samples[keys.index(winner)]
        else:
            rep = samples[0]
        rows.append(
            ResponseRow(
                variant=spec.id,
                query_id=q.id,
                task=q.task,
                tags=q.tags,
                answer=rep.text,
                correct=q.grade(rep.text),
                answer_logprob=float(sum(rep.token_logprobs)) if rep.token_logprobs else float("nan"),
                n_prompt_tokens=len(rep.prompt_ids),
                n_gen_tokens=sum(len(s.token_ids) for s in samples),
                cost_flops=sum(flop_cost(n_params, len(s.prompt_ids), len(s.token_ids)) for s in samples),
                wall_s=round(sum(walls[j * k : (j + 1) * k]), 6),
            )
        )
    return rows


def _run_pot(spec: VariantSpec, model: Any, tok: Any, queries: list[Query], opts: BuildOptions) -> list[ResponseRow]:
    from lmlab.core.inference.models import flop_params

    prompts = [_chat(tok, POT_INSTRUCTION.format(q=q.example.prompt)) for q in queries]  # no answer suffix
    outs, walls = _generate(
        model, tok, prompts, opts, max_new_tokens=int(spec.params.get("max_new_tokens", 24)), desc=spec.id
    )
    n_params = flop_params(model)
    rows = []
    for q, o, w in zip(queries, outs, walls):
        expr = extract_expression(o.text)
        if expr is None:
            answer, correct = f"[no program] {o.text}", 0.0
        else:
            value = _format_value(safe_eval(expr))
            answer, correct = f"{expr} = {value}", q.grade(value)
        rows.append(
            ResponseRow(
                variant=spec.id,
                query_id=q.id,
                task=q.task,
                tags=q.tags,
                answer=answer,
                correct=correct,
                answer_logprob=float(sum(o.token_logprobs)) if o.token_logprobs else float("nan"),
                n_prompt_tokens=len(o.prompt_ids),
                n_gen_tokens=len(o.token_ids),
                cost_flops=flop_cost(n_params, len(o.prompt_ids), len(o.token_ids)),
                wall_s=round(w, 6),
            )
        )
    return rows


def _corpus_windows(tok: Any, split: str, n: int, seq_len: int, seed: int, *, random_windows: bool) -> Any:
    """(n, seq_len) token windows of the `corpus` suite's `split`: random (calibration) or consecutive (scoring)."""
    from lmlab.core.pruning.evaluate import calibration_windows, eval_windows, token_stream

    stream = token_stream(tok, [e.prompt for e in lmdata.load("corpus", None, seed=seed, split=split)])
    if random_windows:
        return calibration_windows(stream, n, seq_len, seed=seed)
    return eval_windows(stream, n, seq_len)


def _zero_weights(model: Any) -> int:
    linears = [m for layer in model.model.layers for m in layer.modules() if type(m).__name__ == "Linear"]
    return sum(int((m.weight == 0).sum()) for m in linears)


def _pruned_model(spec: VariantSpec, model: Any, tok: Any, seed: int) -> tuple[Any, dict[str, Any]]:
    """A Wanda-pruned copy: one sparsity for every block (`wanda`), or ATP's arithmetic progression (`atp`).

    For `atp` the common difference beta is chosen as in `lmlab.methods.compression.atp` (`search_beta`: the grid
    walked upward with patience, lowest validation perplexity on the corpus dev split wins; beta = 0 is uniform, so
    the variant falls back to uniform Wanda when no beta helps).
    """
    from lmlab.methods.compression.wanda import wanda_prune

    sparsity = float(spec.params.get("sparsity", 0.5))
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"sparsity must be in (0, 1), got {sparsity}")
    seq_len = int(spec.params.get("calib_seqlen", 128))
    calib = _corpus_windows(tok, "train", int(spec.params.get("n_calib", 8)), seq_len, seed, random_windows=True)
    extra: dict[str, Any] = {"calib_windows": list(calib.shape)}

    def prune(rates: float | list[float]) -> Any:
        pruned = _full_copy(model)
        wanda_prune(pruned, calib, rates, "unstructured", track_dense=False)
        return pruned.eval()

    if spec.kind == "wanda":
        pruned = prune(sparsity)
    else:
        from lmlab.core.pruning.evaluate import window_nll
        from lmlab.methods.compression.atp.method import max_beta, search_beta

        val = _corpus_windows(tok, "dev", int(spec.params.get("n_val", 8)), seq_len, seed, random_windows=False)
        n_blocks = len(model.model.layers)
        betas = [float(b) for b in spec.params.get("betas", [0.0, 0.008, 0.016, 0.024])]
        bound = max_beta(n_blocks, sparsity)
        illegal = [b for b in betas if b > bound + 1e-12]
        if illegal:
            raise ValueError(
                f"betas {illegal} exceed beta_max={bound:.4f} for {n_blocks} blocks at sparsity {sparsity}"
            )
        best: dict[str, Any] = {}

        def evaluate(rates: list[float]) -> float:
            candidate = prune(rates)
            nll = window_nll(candidate, val)
            ppl = math.exp(sum(nll) / len(nll))
            if not best or ppl < best["ppl"]:
                best.update(ppl=ppl, model=candidate)
            else:
                del candidate
            return ppl

        search = search_beta(evaluate, n_blocks, sparsity, betas, patience=int(spec.params.get("patience", 1)))
        pruned = best["model"]
        extra.update(
            beta=search.best_beta,
            beta_search=[{"beta": r["beta"], "val_ppl": round(r["val_ppl"], 3)} for r in search.table],
            block_sparsity_first_last=[round(search.sparsities[0], 4), round(search.sparsities[-1], 4)],
        )
    extra["pruned_zero_weights"] = _zero_weights(pruned)
    return pruned, extra


def _lora_items(family: str, seed: int, max_items: int = 96) -> list[tuple[Example, str]]:
    """(train-split example, prompt suffix) of one task family of `MIXED_TASKS`, at most `max_items`, balanced."""
    tasks = {"arithmetic": ("arith1", "arith2"), "geography": ("capital", "currency", "continent")}
    if family in tasks:
        per = max(1, max_items // len(tasks[family]))
        return [(e, d.suffix) for d in MIXED_TASKS if d.name in tasks[family] for e in _shot_pool(d, seed, per)]
    raise ValueError(f"family must be 'arithmetic' or 'geography', got {family!r}")


def _lora_model(spec: VariantSpec, model: Any, tok: Any, seed: int) -> tuple[Any, dict[str, Any]]:
    """Train a LoRA (peft, on the top `train_layers` blocks over a cached frozen trunk) and merge it into a copy."""
    import torch
    from peft import LoraConfig

    from lmlab.core.inference.scoring import _pad_id
    from lmlab.core.training.lora import PaddedCache, index_batches, train_steps
    from lmlab.core.training.partial import FrozenTrunk, policy_model, response_token_logps
    from lmlab.core.training.preference import weighted_sft_loss
    from lmlab.core.training.sft import encode_sequences

    p = spec.params
    items = _lora_items(str(p.get("family")), seed, int(p.get("max_items", 96)))
    n_layers = len(model.model.layers)
    k = min(int(p.get("train_layers", 4)), n_layers)
    trunk = FrozenTrunk(model, k)
    eos = tok.eos_token or ""
    seqs = encode_sequences(tok, [_chat(tok, e.prompt + s) for e, s in items], [e.target + eos for e, _ in items])
    cache = PaddedCache(trunk, seqs, _pad_id(tok))
    lora = LoraConfig(
        r=int(p.get("rank", 8)),
        lora_alpha=float(p.get("alpha", 16.0)),
        target_modules=list(p.get("targets", ["q_proj", "v_proj"])),
        lora_dropout=0.0,
        bias="none",
    )
    torch.manual_seed(seed)
    policy = trunk.top_k(train_norm=False, lora=lora)

    def loss_fn(pol: Any, batch: list[int]) -> torch.Tensor:
        sub, tm = cache.batch(batch)
        return weighted_sft_loss(response_token_logps(pol, sub, tm), tm, reduction="mean")

    steps, batch = int(p.get("steps", 200)), int(p.get("batch", 4))
    losses = train_steps(policy, loss_fn, index_batches(len(seqs), steps, batch, seed), float(p.get("lr", 1e-3)))
    merged = policy_model(model, policy)
    for key in ("_lmlab_engines", "_lmlab_flop_params"):
        merged.__dict__.pop(key, None)
    return merged, {
        "train_items": len(items),
        "train_layers": k,
        "loss_first": round(losses[0], 4),
        "loss_last": round(float(sum(losses[-10:]) / len(losses[-10:])), 4),
    }


def run_variant(
    spec: VariantSpec, queries: list[Query], opts: BuildOptions | None = None
) -> tuple[list[ResponseRow], dict[str, Any]]:
    """Build `spec`'s model, answer every query, grade and cost it; (rows, description for the cache header)."""
    from lmlab.core.inference.models import flop_params, load_model

    opts = opts or BuildOptions()
    if not queries:
        raise ValueError("queries is empty; expected at least one query")
    t0 = time.perf_counter()
    base, tok = load_model(spec.model)
    desc = spec.describe()
    model = base
    extra: dict[str, Any] = {}
    kind = spec.kind
    if kind == "zeroshot":
        rows = _greedy_rows(spec, model, tok, queries, [_chat(tok, q.prompt) for q in queries], opts)
    elif kind == "fewshot":
        prompts = _fewshot_prompts(tok, queries, int(spec.params.get("shots", 3)), opts.seed, base=False)
        rows = _greedy_rows(spec, model, tok, queries, prompts, opts)
    elif kind == "base_fewshot":
        prompts = _fewshot_prompts(tok, queries, int(spec.params.get("shots", 3)), opts.seed, base=True)
        rows = _greedy_rows(spec, model, tok, queries, prompts, opts, stop_strings=("\n",))
    elif kind == "sc":
        rows = _run_sc(spec, model, tok, queries, opts)
    elif kind == "pot":
        rows = _run_pot(spec, model, tok, queries, opts)
    elif kind == "int4":
        rows = _greedy_rows(
            spec, model, tok, queries, [_chat(tok, q.prompt) for q in queries], opts, engine="fast-int4", mc=False
        )
        from lmlab.core.inference.generation import resolve_engine

        extra["engine"] = "fast-int4" if resolve_engine(model, "fast-int4") is not None else "hf (int4 unsupported)"
    elif kind in ("trunc", "wanda", "atp", "lora"):
        if kind == "trunc":
            model = truncated_model(base, int(spec.params.get("layers", 10)))
        elif kind in ("wanda", "atp"):
            model, extra = _pruned_model(spec, base, tok, opts.seed)
        else:
            model, extra = _lora_model(spec, base, tok, opts.seed)
        rows = _greedy_rows(spec, model, tok, queries, [_chat(tok, q.prompt) for q in queries], opts)
    else:  # pragma: no cover - resolve_variants checks the kind
        raise ValueError(f"unknown kind {kind!r}")
    desc.update(extra)
    desc["flop_params"] = int(flop_params(model))
    desc["build_s"] = round(time.perf_counter() - t0, 2)
    if model is not base:
        del model
        gc.collect()
    return rows, desc


# ----------------------------------------------------------------------------------------------------------------
# The builder


def parts_dir(out: str | Path, suite: str, seed: int) -> Path:
    return Path(out) / f"{suite}-s{int(seed)}.parts"


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".strip()[:300]


def _valid_part(path: Path, suite: str, seed: int, qids: list[str]) -> ResponseCache | None:
    try:
        part = ResponseCache.load(path)
    except (ValueError, FileNotFoundError) as e:
        logger.warning("ignoring part %s: %s", path, e)
        return None
    if part.suite != suite or part.seed != seed or part.query_ids != qids:
        return None
    return part


def build_cache(
    suite: str = "mixed",
    seed: int = 0,
    n: int = 120,
    *,
    variants: Sequence[str | VariantSpec] | str | None = None,
    out: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    batch_size: int = 16,
    max_new_tokens: int = 16,
    option_probs: bool = True,
) -> ResponseCache:
    """Build (or resume) the response cache of `suite` / `seed` with `n` queries for `variants`.

    Args:
        suite (`str`, defaults to ``"mixed"``): a zoo suite (`ZOO_SUITES`).
        seed (`int`): the data seed (queries, shots, samples, calibration and LoRA order).
        n (`int`, defaults to 120): queries, split evenly over the suite's tasks.
        variants: ids of `VARIANTS`, `VariantSpec`s, a comma-separated string, or None (the default zoo).
        out (`str`, *optional*): folder of the cache (default `lmlab.data.respcache.user_dir`).
        resume (`bool`, defaults to `True`): reuse part files of earlier (possibly killed) builds whose suite, seed and
            query ids match; `False` rebuilds every requested variant.
        progress (`bool`): tqdm bars on stderr (off with ``LMLAB_NO_PROGRESS=1`` or when stderr is not a TTY).
        batch_size, max_new_tokens: the batched greedy pass (short answers).
        option_probs (`bool`): score the MC options of the continent task where cheap.

    Returns:
        `ResponseCache`: every valid part in `out` for this suite and seed (requested variants first, in order),
        with ``failed`` for the variants that raised; also saved atomically at ``<out>/<suite>-s<seed>.jsonl.gz``.
    """
    from lmlab.runner import progress_enabled

    specs = resolve_variants(variants)
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
    queries = suite_queries(suite, n, seed)
    qids = [q.id for q in queries]
    out = Path(out) if out is not None else user_dir()
    parts = parts_dir(out, suite, seed)
    parts.mkdir(parents=True, exist_ok=True)
    show = progress_enabled(progress if progress is False else None)
    opts = BuildOptions(
        seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens, option_probs=option_probs, progress=show
    )
    failed: dict[str, str] = {}
    done: dict[str, ResponseCache] = {}
    bar = specs
    if show:
        from tqdm import tqdm

        bar = tqdm(specs, desc=f"lmlab cache build {suite}/s{seed}", unit="variant")
    for spec in bar:
        path = parts / f"{spec.id}.jsonl.gz"
        if resume and path.is_file():
            part = _valid_part(path, suite, seed, qids)
            if part is not None:
                logger.info("variant %s: reusing %s", spec.id, path)
                done[spec.id] = part
                continue
        try:
            rows, desc = run_variant(spec, queries, opts)
        except Exception as e:  # noqa: BLE001 - a failing variant is recorded, never fatal
            logger.warning("variant %s failed: %s", spec.id, _one_line(e))
            failed[spec.id] = _one_line(e)
            continue
        part = ResponseCache(suite=suite, seed=seed, rows=rows, variants={spec.id: desc})
        part.save(path)
        done[spec.id] = part
    # other variants built earlier into the same folder (e.g. a slice rebuilt with --variants) stay in the cache;
    # rows follow the zoo's own order, whichever slice was rebuilt last
    order = list(VARIANTS) + [s.id for s in specs]
    order += sorted(p.name[: -len(".jsonl.gz")] for p in parts.glob("*.jsonl.gz"))
    for vid in dict.fromkeys(order):
        if vid in done or vid in failed:
            continue
        path = parts / f"{vid}.jsonl.gz"
        if path.is_file():
            part = _valid_part(path, suite, seed, qids)
            if part is not None:
                done[vid] = part
    final = out / cache_filename(suite, seed)
    if final.is_file():  # failures of variants not rebuilt this time stay on record
        try:
            old = ResponseCache.load(final)
        except ValueError:
            old = None
        if old is not None and old.query_ids == qids:
            for vid, why in old.failed.items():
                if vid not in done and vid not in failed and vid not in {s.id for s in specs}:
                    failed[vid] = why
    rows: list[ResponseRow] = []
    descs: dict[str, dict[str, Any]] = {}
    for vid in dict.fromkeys(order):
        if vid in done:
            rows += done[vid].rows
            descs[vid] = done[vid].variants.get(vid, {})
    meta = {
        "n": n,
        "tasks": [d.name for d in _task_defs(suite)],
        "task_suites": {d.name: {"suite": d.suite, **d.kwargs} for d in _task_defs(suite)},
        "options": {k: list(v) for k, v in MC_OPTIONS.items()},
        "max_new_tokens": max_new_tokens,
        "cost": "2 x flop_params x (prompt + generated tokens), summed over samples",
    }
    cache = ResponseCache(suite=suite, seed=seed, rows=rows, variants=descs, failed=failed, meta=meta)
    cache.save(final)
    return cache


# ----------------------------------------------------------------------------------------------------------------
# `lmlab cache show`


def format_matrix(cache: ResponseCache) -> str:
    """The accuracy matrix variant x task (+ overall, mean cost in GFLOPs per query) and the failed variants."""
    import numpy as np

    table = cache.accuracy_table()
    tasks = list(dict.fromkeys(cache.tasks().values()))
    cost: dict[str, float] = {}
    for v in cache.variant_ids:
        cost[v] = float(np.mean([r.cost_flops for r in cache.rows if r.variant == v])) / 1e9
    cols = ["variant", *tasks, "all", "GFLOP/q"]
    lines_rows = []
    for v in cache.variant_ids:
        row = {"variant": v, **{t: f"{table[v].get(t, float('nan')):.2f}" for t in [*tasks, "all"]}}
        row["GFLOP/q"] = f"{cost[v]:.3g}"
        lines_rows.append(row)
    widths = {c: max(len(c), *(len(r[c]) for r in lines_rows)) if lines_rows else len(c) for c in cols}
    n_q = len(cache.query_ids)
    out = [f"response cache {cache.suite}/seed {cache.seed}: {len(cache.variant_ids)} variants x {n_q} queries"]
    out.append("  ".join(c.ljust(widths[c]) for c in cols))
    out.append("  ".join("-" * widths[c] for c in cols))
    out += ["  ".join(r[c].ljust(widths[c]) for c in cols) for r in lines_rows]
    if cache.failed:
        out.append("failed variants:")
        out += [f"  {v}: {why}" for v, why in cache.failed.items()]
    return "\n".join(out)


__all__ = [
    "CONTINENT_OPTIONS",
    "DEFAULT_VARIANTS",
    "KINDS",
    "MC_OPTIONS",
    "MIXED_TASKS",
    "VARIANTS",
    "ZOO_SUITES",
    "BuildOptions",
    "Query",
    "TaskDef",
    "VariantSpec",
    "answer_key",
    "build_cache",
    "extract_expression",
    "format_matrix",
    "parts_dir",
    "resolve_variants",
    "run_variant",
    "safe_eval",
    "suite_queries",
    "truncated_model",
]
