"""Frozen trunk plus trainable top-k blocks: the CPU fine-tuning recipe of the alignment area.

On SmolLM2-135M one forward of a 16 x 64 batch costs seconds on 2 cores and the backward pass twice that, so
training every layer (or a LoRA on every layer, whose backward still crosses the whole trunk) does not fit a
minutes-long run. Instead:

1. `FrozenTrunk(model, k)` runs embeddings and blocks ``0 .. L-k-1`` once under ``no_grad`` and caches the hidden
   states entering block ``L-k`` together with every argument the top blocks receive (attention masks, rotary
   position embeddings, position ids), captured from the model's own forward, so masks and positions are exactly
   what the full model would use (left padding, Gemma 3's sliding-window layers included).
2. `TopK` holds the top k blocks, the final norm and the LM head and maps a `TrunkCache` to logits. The trainable one
   is a deep copy of the blocks and norm (the model is left untouched); the LM head is shared and frozen by default
   (SmolLM2's head is tied to the input embeddings, which the cache already depends on). An optional peft LoRA
   adapts the copied blocks (`peft.LoraModel` on the copied block list; peft works on any ``nn.Module``).
3. The frozen reference is ``trunk.reference``: the model's original top k blocks, run under ``no_grad`` on the same
   cache, so reference log-probs cost k blocks, not L.
4. `merge_back(model, topk)` writes the trained blocks (LoRA merged) and norm into a full model, which then saves as
   a standard Hugging Face folder (``model.save_pretrained``) loadable with ``--model DIR``.

Usage:
    >>> trunk = FrozenTrunk(model, k=4)
    >>> cache = trunk(batch.input_ids, attention_mask=batch.attention_mask)        # once per batch
    >>> policy = trunk.top_k()                                                     # trainable copy
    >>> opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    >>> lp = token_logps_from_cache(policy, cache)                                 # (batch, T-1), has grad
    >>> ref = token_logps_from_cache(trunk.reference, cache)                       # no grad
    >>> merge_back(copy.deepcopy(model), policy).save_pretrained(out_dir)

Supported: decoder-only HF models with ``model.model.layers``, ``model.model.norm`` and ``model.lm_head`` whose
blocks take the hidden states as first argument (llama / SmolLM2, gemma3, qwen2, mistral).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _parts(model: Any) -> tuple[nn.ModuleList, nn.Module, nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    norm = getattr(inner, "norm", None)
    head = getattr(model, "lm_head", None)
    if not isinstance(layers, nn.ModuleList) or norm is None or head is None:
        raise ValueError(
            f"{type(model).__name__} is not a supported decoder-only LM: expected model.model.layers (ModuleList), "
            "model.model.norm and model.lm_head (llama, gemma3, qwen2, mistral)"
        )
    return layers, norm, head


def _tied(model: Any) -> bool:
    head = model.get_output_embeddings()
    emb = model.get_input_embeddings()
    return head is not None and emb is not None and head.weight is emb.weight


@dataclass
class TrunkCache:
    """The frozen trunk's output for one batch.

    Attributes:
        hidden (`torch.Tensor`, (batch, T, hidden)): hidden states entering block ``L-k``.
        layer_kwargs (`list[dict]`): per top block, the keyword arguments the model passed it (masks, rotary
            ``position_embeddings``, ``position_ids``); detached, shared by every `TopK` of the trunk.
        input_ids, attention_mask, position_ids (`torch.LongTensor`, (batch, T)).
        k, n_layers (`int`): which split produced it, checked by `TopK`.
    """

    hidden: torch.Tensor
    layer_kwargs: list[dict[str, Any]]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    k: int
    n_layers: int
    layer_args: list[tuple[Any, ...]] = field(default_factory=list)

    def nbytes(self) -> int:
        return self.hidden.numel() * self.hidden.element_size()


class _Capture(nn.Module):
    """Stands in for a top block during the trunk pass: records its inputs and returns the hidden states unchanged,
    so the top blocks cost nothing there."""

    def __init__(self, store: dict[int, Any], index: int, original: nn.Module) -> None:
        super().__init__()
        self.store, self.index = store, index
        # some models read attributes of their blocks (e.g. attention_type) while looping over them
        self.__dict__["_original"] = original

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_original"], name)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.store[self.index] = (hidden_states, args, kwargs)
        return hidden_states


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, tuple):
        return tuple(_detach(v) for v in x)
    if isinstance(x, list):
        return [_detach(v) for v in x]
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return x


class TopK(nn.Module):
    """The top k blocks, the final norm and the LM head of a decoder-only LM, run on a `TrunkCache`.

    Build it with `FrozenTrunk.top_k` (a trainable copy) or take ``trunk.reference`` (the original blocks, frozen).

    Args:
        layers (`nn.ModuleList`): the k blocks.
        norm (`nn.Module`): the final norm.
        head (`nn.Module`): the LM head; kept outside the module's parameters unless ``train_head`` (so an
            optimiser over `trainable_parameters` never touches a shared, tied head).
        n_layers (`int`): the full model's depth (to check caches).
        softcap (`float`, *optional*): Gemma's final logit soft-capping.
        frozen (`bool`): run under ``no_grad`` (the reference).
    """

    def __init__(
        self,
        layers: nn.ModuleList,
        norm: nn.Module,
        head: nn.Module,
        *,
        n_layers: int,
        softcap: float | None = None,
        train_head: bool = False,
        frozen: bool = False,
    ) -> None:
        super().__init__()
        self.layers = layers
        self.norm = norm
        self.k, self.n_layers, self.softcap, self.frozen, self.train_head = (
            len(layers),
            n_layers,
            softcap,
            frozen,
            train_head,
        )
        if train_head:
            self.head = head
        else:
            self.__dict__["_shared_head"] = head  # not a submodule: no parameters, no state_dict entry
        self.lora: Any = None  # the peft.LoraModel wrapping `layers`, when a LoRA is attached

    @property
    def lm_head(self) -> nn.Module:
        return self.head if self.train_head else self.__dict__["_shared_head"]

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters that receive gradients (empty for the reference)."""
        if self.frozen:
            return iter(())
        return (p for p in self.parameters() if p.requires_grad)

    def _check(self, cache: TrunkCache) -> None:
        if cache.k != self.k or cache.n_layers != self.n_layers:
            raise ValueError(
                f"the cache was made for the top {cache.k} of {cache.n_layers} blocks, this TopK holds the top "
                f"{self.k} of {self.n_layers}"
            )

    def hidden_states(self, cache: TrunkCache) -> torch.Tensor:
        """Final-norm hidden states (batch, T, hidden) of the cached batch."""
        self._check(cache)
        with torch.no_grad() if self.frozen else contextlib.nullcontext():
            h = cache.hidden
            for layer, args, kwargs in zip(self.layers, cache.layer_args, cache.layer_kwargs, strict=True):
                out = layer(h, *args, **kwargs)
                h = out[0] if isinstance(out, tuple) else out
            return self.norm(h)

    def forward(self, cache: TrunkCache, *, logits_to_keep: int = 0) -> torch.Tensor:
        """Logits (batch, T or logits_to_keep, vocab) of the cached batch, as the full model's forward gives them."""
        with torch.no_grad() if self.frozen else contextlib.nullcontext():
            h = self.hidden_states(cache)
            if logits_to_keep:
                h = h[:, -logits_to_keep:]
            return self.head_logits(h)

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head (and Gemma's soft-cap) on final-norm hidden states ``(..., hidden) -> (..., vocab)``."""
        head = self.lm_head
        if self.train_head:
            logits = head(h)
        else:
            # the shared head stays frozen: its weight may be the tied input embedding the cache was built from
            bias = head.bias.detach() if getattr(head, "bias", None) is not None else None
            logits = F.linear(h, head.weight.detach(), bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class FrozenTrunk:
    """Runs a model's embeddings and blocks ``0 .. L-k-1`` once per batch under ``no_grad`` and caches the result.

    Args:
        model: a decoder-only HF causal LM (see the module docstring); never modified.
        k (`int`): number of top blocks to train, 1 <= k <= L (k = L leaves only the embeddings in the trunk).
    """

    def __init__(self, model: Any, k: int) -> None:
        layers, norm, head = _parts(model)
        n = len(layers)
        if not isinstance(k, int) or not 1 <= k <= n:
            raise ValueError(f"k must be an int in [1, {n}] (the model has {n} blocks), got {k!r}")
        self.model, self.k, self.n_layers = model, k, n
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.reference = TopK(
            layers[n - k :], norm, head, n_layers=n, softcap=self.softcap, frozen=True
        )  # a ModuleList slice: the model's own blocks

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> TrunkCache:
        """Cache the trunk's output for a (batch, T) batch; `position_ids` default to ``cumsum(mask) - 1``, right for
        both padding sides (HF's default ``arange`` is wrong for left padding)."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, T), got shape {tuple(input_ids.shape)}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        layers, _, _ = _parts(self.model)
        n, k = self.n_layers, self.k
        store: dict[int, Any] = {}
        originals = [layers[i] for i in range(n - k, n)]
        try:
            for j, i in enumerate(range(n - k, n)):
                layers[i] = _Capture(store, j, originals[j])
            # logits_to_keep=1: the head (as costly as ~8 SmolLM2 blocks per token) runs on one position only
            self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=1,
            )
        finally:
            for j, i in enumerate(range(n - k, n)):
                layers[i] = originals[j]
        if len(store) != k:
            raise RuntimeError(f"captured the inputs of {len(store)} of the top {k} blocks; the model skipped some")
        kwargs, args = [], []
        for j in range(k):
            _, a, kw = store[j]
            kw = {name: v for name, v in kw.items() if name not in ("cache", "past_key_values", "past_key_value")}
            kwargs.append(_detach(kw))
            args.append(_detach(a))
        hidden = store[0][0].detach()
        return TrunkCache(hidden, kwargs, input_ids, attention_mask, position_ids, k, n, args)

    def top_k(
        self,
        *,
        train_norm: bool = True,
        train_head: bool = False,
        lora: Any = None,
    ) -> TopK:
        """A trainable deep copy of the top k blocks (and the final norm); the model is left as it is.

        Args:
            train_norm (`bool`, *optional*, defaults to `True`): train the final norm too.
            train_head (`bool`, *optional*, defaults to `False`): copy and train the LM head; refused when the head
                is tied to the input embeddings (training it would change the embeddings the cache came from).
            lora (`peft.LoraConfig`, *optional*): attach a LoRA to the copied blocks (only adapter weights train);
                ``target_modules`` name the blocks' linear layers, e.g. ``["q_proj", "v_proj"]``.
        """
        layers, norm, head = _parts(self.model)
        n, k = self.n_layers, self.k
        if train_head and _tied(self.model):
            raise ValueError(
                "train_head=True, but the LM head is tied to the input embeddings that the cached trunk used; keep "
                "the head frozen or untie it first"
            )
        new_layers = copy.deepcopy(layers[n - k :])
        new_norm = copy.deepcopy(norm)
        new_head = copy.deepcopy(head) if train_head else head
        for p in new_layers.parameters():
            p.requires_grad_(True)
        for p in new_norm.parameters():
            p.requires_grad_(train_norm)
        if train_head:
            for p in new_head.parameters():
                p.requires_grad_(True)
        tk = TopK(new_layers, new_norm, new_head, n_layers=n, softcap=self.softcap, train_head=train_head)
        if lora is not None:
            from peft import LoraModel

            # LoraModel injects adapters in place into `new_layers` and freezes its base weights; kept as a plain
            # attribute (not a submodule) so the blocks' parameters are not listed twice
            object.__setattr__(tk, "lora", LoraModel(new_layers, copy.deepcopy(lora), "default"))
        tk.train()
        return tk


def logits_from_cache(topk: TopK, cache: TrunkCache, *, logits_to_keep: int = 0) -> torch.Tensor:
    """Logits (batch, T, vocab) of a cached batch: equal to ``model(...).logits`` of the full model (same masks)."""
    return topk(cache, logits_to_keep=logits_to_keep)


def response_token_logps(topk: TopK, cache: TrunkCache, target_mask: torch.Tensor) -> torch.Tensor:
    """`token_logps_from_cache` with the LM head run only where ``target_mask`` (batch, T-1) is True.

    The head costs as much as ~8 SmolLM2 blocks per position and prompts are most of a preference sequence, so it
    runs on the gathered hidden states ``h[:, :-1][target_mask]`` (N, hidden) only. Returns (batch, T-1) float32, 0
    off the mask; differentiable through a trainable `topk`, no graph for a frozen one.
    """
    tm = target_mask.bool()
    with torch.no_grad() if topk.frozen else contextlib.nullcontext():
        h = topk.hidden_states(cache)[:, :-1]  # (batch, T-1, hidden)
        tgt = cache.input_ids[:, 1:][tm]  # (N,)
        lp = torch.log_softmax(topk.head_logits(h[tm]).float(), dim=-1).gather(-1, tgt[:, None]).squeeze(-1)
        return lp.new_zeros(tm.shape).masked_scatter(tm, lp)


def token_logps_from_cache(topk: TopK, cache: TrunkCache, *, target_mask: torch.Tensor | None = None) -> torch.Tensor:
    """log p(x_{t+1} | x_<=t) of the cached batch, (batch, T-1) in float32, 0 where ``target_mask`` is False.

    `target_mask` (batch, T-1) defaults to pairs of real tokens (``mask[:, 1:] & mask[:, :-1]``); pass a
    `ResponseBatch.target_mask` to keep response tokens only (then `preference.logps_from_token_logps` gives sums).
    """
    logits = topk(cache)  # (batch, T, vocab)
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, cache.input_ids[:, 1:, None]).squeeze(-1)
    if target_mask is None:
        m = cache.attention_mask.bool()
        target_mask = m[:, 1:] & m[:, :-1]
    if target_mask.shape != lp.shape:
        raise ValueError(f"target_mask has shape {tuple(target_mask.shape)}, expected {tuple(lp.shape)}")
    return torch.where(target_mask.bool(), lp, torch.zeros_like(lp))


def _block_state(topk: TopK) -> list[dict[str, torch.Tensor]]:
    """Each top block's plain state dict, with a LoRA merged into a copy (the TopK itself is left as is)."""
    layers: nn.Module = topk.layers
    if topk.lora is not None:
        layers = copy.deepcopy(topk.lora).merge_and_unload()
    return [{name: t.detach().clone() for name, t in block.state_dict().items()} for block in layers]


def merge_back(model: Any, topk: TopK) -> Any:
    """Write the trained top blocks (LoRA merged), final norm and, if trained, the head into `model`, in place.

    `model` must have the architecture the trunk came from. It is modified and returned; pass a copy
    (``copy.deepcopy(model)``) while the trunk's reference, which shares the original blocks, is still in use.
    """
    layers, norm, head = _parts(model)
    if len(layers) != topk.n_layers:
        raise ValueError(f"model has {len(layers)} blocks, the TopK was made from a model with {topk.n_layers}")
    states = _block_state(topk)
    n = len(layers)
    with torch.no_grad():
        for j, state in enumerate(states):
            target = layers[n - topk.k + j]
            missing, unexpected = target.load_state_dict(state, strict=False)
            if missing or unexpected:
                raise ValueError(
                    f"block {n - topk.k + j} does not match the TopK's block {j}: missing {missing}, "
                    f"unexpected {unexpected}"
                )
        norm.load_state_dict(topk.norm.state_dict())
        if topk.train_head:
            head.load_state_dict(topk.head.state_dict())
    return model


def trainable_names(topk: TopK) -> Sequence[str]:
    """Names of the parameters that train (for logs and tests)."""
    return [name for name, p in topk.named_parameters() if p.requires_grad and not topk.frozen]


def policy_model(model: Any, topk: TopK) -> Any:
    """A full HF model whose top k blocks (and final norm) are `topk`'s, sharing every other module with `model`.

    Memory-light: the embeddings, the lower blocks and the LM head are the very modules of `model` (a
    ``copy.deepcopy`` with them pre-seeded in its memo), only the top blocks and norm are new. For decoding a trained
    policy (``generate``, `lmlab.core.inference.generation.decode_batch`) and ``save_pretrained``; `model` is not
    modified.
    """
    layers, _, head = _parts(model)
    n = len(layers)
    if topk.n_layers != n:
        raise ValueError(f"the TopK was made from a model with {topk.n_layers} blocks, this one has {n}")
    memo: dict[int, Any] = {}
    keep = [model.get_input_embeddings(), head, *layers[: n - topk.k]]
    keep += [m for name, m in model.model.named_children() if name not in ("layers", "norm")]  # rotary, ...
    for mod in keep:
        for sub in mod.modules():
            memo[id(sub)] = sub
        for t in [*mod.parameters(), *mod.buffers()]:
            memo[id(t)] = t
    clone = copy.deepcopy(model, memo)
    return merge_back(clone, topk).eval()


def _take(x: Any, rows: torch.Tensor, b: int, name: str = "") -> Any:
    if name == "cache_position":  # (T,): positions, not rows
        return x
    if isinstance(x, torch.Tensor):
        return x.index_select(0, rows) if x.ndim >= 1 and x.shape[0] == b else x  # size-1 dims broadcast
    if isinstance(x, tuple):
        return tuple(_take(v, rows, b) for v in x)
    if isinstance(x, list):
        return [_take(v, rows, b) for v in x]
    if isinstance(x, dict):
        return {k: _take(v, rows, b, k) for k, v in x.items()}
    return x


def slice_cache(cache: TrunkCache, rows: Any) -> TrunkCache:
    """The `TrunkCache` of a subset of its rows: every per-row tensor (hidden states (b, T, hidden), masks, rotary
    tables, ids (b, T)) indexed along its batch dimension, so the top blocks see exactly what they would in the full
    batch."""
    b = cache.hidden.shape[0]
    rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
    if rows.numel() == 0 or int(rows.min()) < 0 or int(rows.max()) >= b:
        raise ValueError(f"rows must be a non-empty set of indices in [0, {b}), got {rows.tolist()[:8]}")
    return TrunkCache(
        cache.hidden.index_select(0, rows),
        [_take(kw, rows, b) for kw in cache.layer_kwargs],
        cache.input_ids.index_select(0, rows),
        cache.attention_mask.index_select(0, rows),
        cache.position_ids.index_select(0, rows),
        cache.k,
        cache.n_layers,
        [_take(a, rows, b) for a in cache.layer_args],
    )


def _stash_model_caches(model: Any) -> dict[str, Any]:
    """Remove the per-model caches (fast engines, flop count) that `copy.deepcopy` would otherwise carry over."""
    return {k: model.__dict__.pop(k) for k in ("_lmlab_engines", "_lmlab_flop_params") if k in model.__dict__}


def truncated_model(model: Any, n_layers: int) -> Any:
    """A model with only the first `n_layers` blocks (plus the final norm and the LM head), sharing their weights.

    The embeddings, kept blocks, norm, rotary embedding and head are the very modules of `model` (a deep copy with
    them pre-seeded in its memo, as `policy_model` does); `model` is not modified. Used by the response-cache zoo's
    ``smol-trunc{10,20}`` variants and lensllm's truncated candidates.
    """
    layers = model.model.layers
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= len(layers):
        raise ValueError(f"layers must be an int in [1, {len(layers)}] (the blocks of the model), got {n_layers!r}")
    memo: dict[int, Any] = {}
    keep = [model.get_input_embeddings(), model.get_output_embeddings(), *layers]
    keep += [m for name, m in model.model.named_children() if name not in ("layers",)]
    for mod in keep:
        for sub in mod.modules():
            memo[id(sub)] = sub
        for t in [*mod.parameters(), *mod.buffers()]:
            memo[id(t)] = t
    saved = _stash_model_caches(model)
    try:
        clone = copy.deepcopy(model, memo)
    finally:
        model.__dict__.update(saved)
    clone.model.layers = torch.nn.ModuleList(list(clone.model.layers)[:n_layers])
    clone.config.num_hidden_layers = n_layers
    if getattr(clone.config, "layer_types", None):
        clone.config.layer_types = list(clone.config.layer_types)[:n_layers]
    return clone.eval()
