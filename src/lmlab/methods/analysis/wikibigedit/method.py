"""Lifelong knowledge editing (WikiBigEdit, Thede et al., ICML 2025, arXiv 2503.05683): the protocol and metric.

Official code: https://github.com/ExplainableML/WikiBigEdit (``EasyEdit_Experiments``: an adapted EasyEdit).

The paper proposes no editor of its own: it is a benchmark, and its protocol and metric live here, with the `Editor`
interface every compared editor implements. The editors live next to this module:

- `baselines`: the general-purpose techniques the paper sets against the knowledge editors: retrieval
  (`RAGEditor`) and continual fine-tuning (`LoRAEditor`, plain and LoRA-Merge; `FTEditor`).
- `locate_edit`: the dedicated knowledge editors, sequential ROME / R-ROME (`ROMEEditor`) and MEMIT
  (`MEMITEditor`), with their locate-then-edit machinery (keys, optimised values, covariances, closed-form updates).

Protocol (``run_lifelong_edit.py``): the edits arrive in increments; each editor applies increment after increment
to the same model, never restoring the original weights (``keep_original_weight=False``; RAG keeps them and grows
a memory), and after each increment everything edited so far is evaluated (current increment and ``past_eval``).

Metric (``evaluate_utils.py:test_prediction_acc``): teacher-forced token accuracy of the answer tokens in
"Q: {question} A: {answer}" after fixed few-shot examples: the share of answer tokens that are the argmax given
the true preceding tokens. Locality (EasyEdit's convention) is the share of the locality answer's tokens whose
argmax prediction is the same after the edits as before them (drift, not knowledge).

This module holds the edit record (`EditRecord`), the scorer (`score_answers`: the metric, with the few-shot prefix
run once and its KV cache reused), the `Editor` interface (`Editor.edit` has EasyEdit's ``BaseEditor.edit`` shape),
the model-structure checks shared by the weight editors (`decoder_layers`, `check_editable`, `check_layers`) and the
lifelong loop (`make_reference`, `evaluate_facts`, `run_lifelong`).

Everything here is pure (no I/O, no printing): models, tokenizers and records in, numbers out.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmlab.core.inference.generation import cache_kwargs, new_cache
from lmlab.core.inference.scoring import _pad_id, encode, split_pair

# Three fixed geography shots in the official "Q: ... A: ... \n" format (`evaluate.py` fs_examples); none of them is
# a fact the stream edits.
FEWSHOT = (
    "Q: What is the largest ocean on Earth? A: Pacific Ocean\n"
    "Q: Which river flows through Cairo? A: Nile\n"
    "Q: What is the highest mountain in the world? A: Mount Everest\n"
)
# Families whose MLP output is ``down_proj``'s output (ROME/MEMIT/FT edit it; gemma3 adds a norm after it).
EDITABLE_FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3")


def qa_prompt(question: str, context: str = "") -> str:
    """The official frame ``"Q: {question} A:"``, after an optional retrieved context."""
    return f"{context}Q: {question} A:"


@dataclass(frozen=True)
class EditRecord:
    """One edit of the stream (WikiBigEdit's record schema; see `lmlab.data.geobigedit`).

    ``key`` names the fact: a re-edit shares it with the record it overwrites. ``mhop``/``mhop_ans`` may be None.
    """

    key: str
    src: str
    alt: str
    subject: str
    increment: int = 0
    sentence: str = ""
    rephrase: str | None = None
    persona: str | None = None
    loc: str | None = None
    loc_ans: str | None = None
    mhop: str | None = None
    mhop_ans: str | None = None
    tag: str = ""

    @classmethod
    def from_example(cls, ex: Any) -> EditRecord:
        m = ex.meta
        return cls(key=m["key"], src=ex.prompt, alt=ex.target, subject=m["subject"], increment=int(m["increment"]),
                   sentence=m.get("sentence") or f"{ex.prompt} {ex.target}", rephrase=m.get("rephrase"),
                   persona=m.get("genv2_persona"), loc=m.get("loc"), loc_ans=m.get("loc_ans"), mhop=m.get("mhop"),
                   mhop_ans=m.get("mhop_ans"), tag=m.get("tag", ""))  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Scoring: teacher-forced answer tokens, the few-shot prefix computed once and reused from the KV cache


@dataclass(frozen=True)
class AnswerScore:
    """Teacher-forced score of one answer: token accuracy, all tokens argmax, summed log-prob, argmax ids."""

    token_acc: float
    exact: bool
    logprob: float
    pred: tuple[int, ...]
    n_tokens: int


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _right_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


@torch.no_grad()
def score_answers(
    model: nn.Module,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    *,
    contexts: Sequence[str] | None = None,
    prefix: str = FEWSHOT,
    batch_size: int = 8,
) -> list[AnswerScore]:
    """Teacher-forced token accuracy of ``" " + answer`` after ``prefix + context + "Q: {question} A:"``.

    The official metric (``test_prediction_acc``): mean over answer tokens of [argmax p(. | true prefix) = token].
    The prefix (the few-shot shots) is tokenised on its own (it ends in a newline, a pre-tokeniser boundary), run
    once, and its KV cache reused for every batch (the scores equal those of the concatenated sequences; tested).
    Rows are right-padded after the prefix, so padding never sits between a row's tokens.

    Returns one `AnswerScore` per (question, answer).
    """
    if len(questions) != len(answers):
        raise ValueError(f"got {len(questions)} questions but {len(answers)} answers")
    if contexts is not None and len(contexts) != len(questions):
        raise ValueError(f"got {len(contexts)} contexts for {len(questions)} questions")
    if not questions:
        return []
    device = _device(model)
    pre_ids = encode(tokenizer, prefix, add_special_tokens=True) if prefix else []
    rows, spans = [], []
    for i, (q, a) in enumerate(zip(questions, answers)):
        if not a:
            raise ValueError(f"answer {i} is empty: an answer needs at least one token")
        ctx, cont = split_pair(tokenizer, qa_prompt(q, contexts[i] if contexts else ""), " " + a,
                               add_special_tokens=not pre_ids)  # fmt: skip
        rows.append(ctx + cont)
        spans.append((len(ctx), len(cont)))
    n_pre = len(pre_ids)
    cache = None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model: its base's kwarg
    if n_pre:
        cache = new_cache(base)
        model(input_ids=torch.tensor([pre_ids], device=device), **cache_kwargs(base, cache))
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    out: list[AnswerScore | None] = [None] * len(rows)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids, mask = _right_pad([rows[i] for i in idx], _pad_id(tokenizer))
        n, width = ids.shape
        kw: dict[str, Any] = {"use_cache": False}
        if cache is not None:
            batch_cache = copy.deepcopy(cache)
            batch_cache.batch_repeat_interleave(n)
            kw = cache_kwargs(base, batch_cache)
            mask = torch.cat([torch.ones(n, n_pre, dtype=torch.long), mask], dim=1)
        pos = (n_pre + torch.arange(width))[None].expand(n, -1)
        logits = model(
            input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device), **kw
        ).logits  # fmt: skip  (n, width, vocab)
        for row, i in enumerate(idx):
            c, k = spans[i]
            # the logit at position c-1+j predicts answer token j (c >= 1: "Q:" is always in the row)
            lp = F.log_softmax(logits[row, c - 1 : c - 1 + k].float(), dim=-1)  # (k, vocab)
            target = ids[row, c : c + k].to(device)
            pred = lp.argmax(-1)
            hit = (pred == target).float()
            out[i] = AnswerScore(float(hit.mean()), bool(hit.all()), float(lp.gather(-1, target[:, None]).sum()),
                                 tuple(int(t) for t in pred.tolist()), k)  # fmt: skip
    return out  # type: ignore[return-value]


def agreement(pred: Sequence[int], ref: Sequence[int]) -> float:
    """Share of positions where two argmax sequences agree (EasyEdit's locality: post vs pre predictions)."""
    if len(pred) != len(ref) or not ref:
        raise ValueError(f"prediction sequences must have the same non-zero length, got {len(pred)} and {len(ref)}")
    return float(np.mean([a == b for a, b in zip(pred, ref)]))


# ----------------------------------------------------------------------------------------------------------------
# The editor interface


class Editor:
    """Lifelong editor interface: `apply` one increment in place; `contexts` adds retrieved text (RAG only).

    Attributes:
        model: the model to score (edited in place by parametric editors; a peft model for plain LoRA).
        parametric (`bool`): whether editing changes weights (False for RAG).
        shots (`str`): the few-shot prefix its questions are scored after, in the format of its own prompts
            (`FEWSHOT`; RAG's shots also carry the "Fact:" lines its prompts have).
    """

    name = "editor"
    parametric = True
    shots = FEWSHOT

    def __init__(self, model: nn.Module, tokenizer: Any):
        self.model = model
        self.tokenizer = tokenizer
        self.n_edits = 0

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError

    def contexts(self, questions: Sequence[str]) -> list[str] | None:
        return None

    def edit(
        self,
        prompts: Sequence[str],
        target_new: Sequence[str],
        subject: Sequence[str],
        *,
        keys: Sequence[str] | None = None,
        sentences: Sequence[str] | None = None,
        rephrase_prompts: Sequence[str] | None = None,
        locality_inputs: dict[str, Sequence[str]] | None = None,
        portability_inputs: dict[str, Sequence[str]] | None = None,
        sequential_edit: bool = True,
    ) -> dict[str, list[float]]:
        """EasyEdit's ``BaseEditor.edit`` shape: apply the edits, then score them after *all* edits.

        ``sequential_edit=True`` is the only mode: the evaluation runs once after the whole batch (EasyEdit issue
        #282), never per edit with rollback. ``locality_inputs = {"prompt": [...], "ground_truth": [...]}`` are
        scored as agreement with the pre-edit predictions; ``portability_inputs`` likewise as accuracy.
        Returns lists of per-edit scores: ``rewrite_acc``, ``rephrase_acc``, ``locality``, ``portability``.
        """
        if not sequential_edit:
            raise ValueError("sequential_edit must be True: lifelong editing evaluates after the whole stream")
        if not (len(prompts) == len(target_new) == len(subject)) or not prompts:
            raise ValueError(f"prompts, target_new and subject must be equally long and non-empty, got "
                             f"{len(prompts)}, {len(target_new)}, {len(subject)}")  # fmt: skip
        pre_loc = None
        if locality_inputs:
            loc_q, loc_a = locality_inputs["prompt"], locality_inputs["ground_truth"]
            pre_loc = score_answers(self.model, self.tokenizer, loc_q, loc_a, contexts=self.contexts(loc_q),
                                    prefix=self.shots)  # fmt: skip
        reqs = [EditRecord(key=keys[i] if keys else f"edit/{self.n_edits + i}", src=p, alt=t, subject=s,
                           sentence=sentences[i] if sentences else f"{p} {t}")
                for i, (p, t, s) in enumerate(zip(prompts, target_new, subject))]  # fmt: skip
        self.apply(reqs)
        out: dict[str, list[float]] = {}

        def acc(qs: Sequence[str], ans: Sequence[str]) -> list[float]:
            scored = score_answers(self.model, self.tokenizer, qs, ans, contexts=self.contexts(qs), prefix=self.shots)
            return [s.token_acc for s in scored]

        out["rewrite_acc"] = acc(prompts, target_new)
        if rephrase_prompts:
            out["rephrase_acc"] = acc(rephrase_prompts, target_new)
        if locality_inputs and pre_loc is not None:
            post = score_answers(self.model, self.tokenizer, loc_q, loc_a, contexts=self.contexts(loc_q),
                                 prefix=self.shots)  # fmt: skip
            out["locality"] = [agreement(b.pred, a.pred) for a, b in zip(pre_loc, post)]
        if portability_inputs:
            out["portability"] = acc(portability_inputs["prompt"], portability_inputs["ground_truth"])
        return out


# ----------------------------------------------------------------------------------------------------------------
# Model structure shared by the weight editors (`baselines.FTEditor`, `locate_edit`)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = model.model if hasattr(model, "model") else model
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"expected a decoder-only model with .model.layers, got {type(model).__name__}")
    return layers


def check_editable(model: nn.Module, what: str) -> None:
    """Locate-and-edit and FT edit ``down_proj``, which is the MLP output only in llama-style blocks."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in EDITABLE_FAMILIES:
        raise ValueError(
            f"{what} edits llama-style down_proj MLPs ({', '.join(EDITABLE_FAMILIES)}), got model_type {kind!r}"
        )


def check_layers(model: nn.Module, layers: Sequence[int], what: str) -> None:
    n = len(decoder_layers(model))
    bad = [layer for layer in layers if not 0 <= layer < n]
    if bad or not layers:
        raise ValueError(f"{what} must be layer indices in [0, {n - 1}] for this model, got {list(layers)}")


# ----------------------------------------------------------------------------------------------------------------
# Lifelong evaluation


@dataclass
class Reference:
    """Pre-edit predictions the lifelong metrics compare against (taken once on the unedited model)."""

    # (locality question, its answer) -> argmax tokens. Keyed by the question, not the fact: a re-edit of a city's
    # country shares the fact key but asks about a neighbour of the new country.
    loc_pred: dict[tuple[str, str], tuple[int, ...]]
    general: list[tuple[str, str]]  # (question, answer) facts no edit touches
    fluency: list[str]  # texts whose mean token log-prob tracks general fluency


@dataclass
class IncrementResult:
    """Per-fact scores after one increment: ``scores[metric][fact key]``; general/fluency per item."""

    increment: int
    n_edits: int
    current: list[str]
    past: list[str]
    scores: dict[str, dict[str, float]]
    general: list[float]
    fluency: list[float]
    edit_s: float
    eval_s: float
    info: dict[str, Any] = field(default_factory=dict)


def fluency_logprob(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 8) -> list[float]:
    """Mean token log-prob (nats) of each text (`lmlab.core.inference.scoring.rolling_token_logprobs`)."""
    from lmlab.core.inference.scoring import rolling_token_logprobs

    per = rolling_token_logprobs(model, tokenizer, list(texts), batch_size=batch_size)
    return [float(np.mean(v)) if v else 0.0 for v in per]


def evaluate_facts(
    editor: Editor, facts: Sequence[EditRecord], ref: Reference, *, prefix: str | None = None, batch_size: int = 8
) -> tuple[dict[str, dict[str, float]], list[float], list[float]]:
    """Score every fact's latest value: edit (src), rephrase, persona, mhop (token accuracy), locality (agreement
    with the pre-edit argmax), exact (all src tokens right), retrieval hit (RAG); plus general facts and fluency.

    `prefix`: the few-shot shots; None takes the editor's own (`Editor.shots`)."""
    prefix = editor.shots if prefix is None else prefix
    qs, ans, tags = [], [], []
    for f in facts:
        for metric, q, a in (("edit", f.src, f.alt), ("rephrase", f.rephrase, f.alt), ("persona", f.persona, f.alt),
                             ("mhop", f.mhop, f.mhop_ans), ("locality", f.loc, f.loc_ans)):  # fmt: skip
            if q and a and (metric != "locality" or (q, a) in ref.loc_pred):
                qs.append(q)
                ans.append(a)
                tags.append((metric, f.key))
    n_fact_q = len(qs)
    qs += [q for q, _ in ref.general]
    ans += [a for _, a in ref.general]
    ctx = editor.contexts(qs)
    keys = getattr(editor, "last_keys", None) if ctx is not None else None
    scored = score_answers(editor.model, editor.tokenizer, qs, ans, contexts=ctx, prefix=prefix, batch_size=batch_size)
    out: dict[str, dict[str, float]] = {}
    for i, ((metric, key), s) in enumerate(zip(tags, scored[:n_fact_q])):
        if metric == "locality":
            out.setdefault("locality", {})[key] = agreement(s.pred, ref.loc_pred[(qs[i], ans[i])])
            continue
        out.setdefault(metric, {})[key] = s.token_acc
        if metric == "edit":
            out.setdefault("exact", {})[key] = float(s.exact)
            if keys is not None:
                out.setdefault("retrieval_hit", {})[key] = float(key in keys[i])
    general = [s.token_acc for s in scored[n_fact_q:]]
    flu = fluency_logprob(editor.model, editor.tokenizer, ref.fluency, batch_size=batch_size) if ref.fluency else []
    return out, general, flu


def make_reference(
    model: nn.Module, tokenizer: Any, facts: Sequence[EditRecord], general: Sequence[tuple[str, str]],
    fluency: Sequence[str], *, prefix: str = FEWSHOT, batch_size: int = 8,
) -> Reference:  # fmt: skip
    """The unedited model's argmax tokens on every locality question (locality is drift from these)."""
    with_loc = [f for f in facts if f.loc and f.loc_ans]
    scored = score_answers(model, tokenizer, [f.loc for f in with_loc], [f.loc_ans for f in with_loc], prefix=prefix,
                           batch_size=batch_size)  # fmt: skip
    return Reference({(f.loc, f.loc_ans): s.pred for f, s in zip(with_loc, scored)}, list(general), list(fluency))


def known_before(
    model: nn.Module, tokenizer: Any, records: Sequence[EditRecord], *, prefix: str = FEWSHOT, batch_size: int = 8
) -> list[bool]:
    """WikiBigEdit's ``filter_edits``: whether the unedited model already gives the new answer (every token)."""
    scored = score_answers(model, tokenizer, [r.src for r in records], [r.alt for r in records], prefix=prefix,
                           batch_size=batch_size)  # fmt: skip
    return [s.exact for s in scored]


def run_lifelong(
    editor: Editor,
    increments: Sequence[Sequence[EditRecord]],
    ref: Reference,
    *,
    eval_past: bool = True,
    prefix: str | None = None,
    batch_size: int = 8,
    on_increment: Callable[[int], None] | None = None,
) -> list[IncrementResult]:
    """Apply the increments in order (no rollback) and evaluate after each one.

    After increment t every fact edited so far is scored at its latest value (a re-edit replaces the fact's
    earlier value): ``current`` are the facts whose latest edit is in increment t, ``past`` the others (retention;
    skipped with ``eval_past=False``). `prefix`: the few-shot shots (None: the editor's own, `Editor.shots`).
    Returns one `IncrementResult` per increment.
    """
    latest: dict[str, EditRecord] = {}
    owner: dict[str, int] = {}
    results = []
    for t, batch in enumerate(increments):
        t0 = time.perf_counter()
        info = editor.apply(list(batch))
        edit_s = time.perf_counter() - t0
        for r in batch:
            latest[r.key] = r
            owner[r.key] = t
        current = [k for k in latest if owner[k] == t]
        past = [k for k in latest if owner[k] < t] if eval_past else []
        t1 = time.perf_counter()
        scores, general, flu = evaluate_facts(editor, [latest[k] for k in current + past], ref, prefix=prefix,
                                              batch_size=batch_size)  # fmt: skip
        results.append(IncrementResult(t, len(latest), current, past, scores, general, flu, edit_s,
                                       time.perf_counter() - t1, info))  # fmt: skip
        if on_increment is not None:
            on_increment(t)
    return results


__all__ = [
    "FEWSHOT",
    "AnswerScore",
    "EditRecord",
    "Editor",
    "IncrementResult",
    "Reference",
    "agreement",
    "check_editable",
    "check_layers",
    "decoder_layers",
    "evaluate_facts",
    "fluency_logprob",
    "known_before",
    "make_reference",
    "qa_prompt",
    "run_lifelong",
    "score_answers",
]
