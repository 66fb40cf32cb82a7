"""The edge LM side of LoRA-Gen: its structure, a forward split at the top blocks that carry LoRA, and scoring.

- Structure: the decoder blocks (`decoder_layers`), the last `n_top` of them (`top_layer_ids`) and the LoRA target
  linears inside those (`target_modules`).
- `EdgeTop`: the bottom blocks run once over the examples (prompt + answer + terminator, `pack` -> `Packed`) and
  their hidden states are cached (`EdgeTop.trunk`); the top blocks and the LM head then run at every training step
  (`EdgeTop.answer_logits`). With a system prompt in context, each prompt runs once and its examples continue it
  (`EdgeTop.trunk_with_prefix`, `EdgeTop.answer_logits_with_prefix`).
- Teacher-forced scoring in one pass: greedy exact match and answer NLL (`score_logits`, `score_top`,
  `score_with_prefix`), with the stop tokens of `stop_token_ids`; `answer_loss`, the training loss of every system.

Equivalence used by the tests: the shared-prefix top pass equals the full forward of prompt + continuation (logits
and LoRA gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

# -- the edge model's structure ------------------------------------------------------------------------------------


def _base(model: Any) -> Any:
    """The decoder stack of a causal LM (``model.model`` for llama / gemma), or the model itself."""
    return getattr(model, "model", model)


def decoder_layers(model: Any) -> nn.ModuleList:
    base = _base(model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layer list at .model.layers")
    return layers


def top_layer_ids(model: Any, n_top: int) -> list[int]:
    """Indices of the last `n_top` decoder blocks (all of them when the model is shallower)."""
    if n_top < 1:
        raise ValueError(f"n_top must be >= 1, got {n_top}")
    n = len(decoder_layers(model))
    return list(range(max(0, n - n_top), n))


def target_modules(model: Any, layer_ids: Sequence[int], targets: Sequence[str]) -> dict[str, nn.Linear]:
    """``{module name: nn.Linear}`` of the `targets` (e.g. ``gate_proj``) inside the blocks `layer_ids`, in order.

    Embeddings and the (tied) LM head are never targets: LoRA on them would also change the input embedding.
    """
    wanted = set(layer_ids)
    found: dict[str, nn.Linear] = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        if not isinstance(module, nn.Linear) or parts[-1] not in targets or "layers" not in parts:
            continue
        layer = int(parts[parts.index("layers") + 1])
        if layer in wanted:
            found[name] = module
    missing = [t for t in targets if not any(n.endswith("." + t) for n in found)]
    if missing:
        raise ValueError(f"target module(s) {missing} not found in blocks {list(layer_ids)} of {type(model).__name__}")
    order = {t: i for i, t in enumerate(targets)}
    return dict(sorted(found.items(), key=lambda kv: (_layer_of(kv[0]), order[kv[0].split(".")[-1]])))


def _layer_of(name: str) -> int:
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1])


# -- the edge side: trunk caching and teacher-forced scoring ----------------------------------------------------


class _Stop(Exception):
    pass


@dataclass
class Packed:
    """Right-padded sequences prompt + answer + terminator, and the positions that predict answer tokens.

    ids (N, T); `pos_b`, `pos_t`: flat indices of the predicting positions; `target`: the token each predicts; `row`:
    which example each belongs to; `is_stop`: True at the terminator position (the one after the answer).
    """

    ids: torch.Tensor
    pos_b: torch.Tensor
    pos_t: torch.Tensor
    target: torch.Tensor
    is_stop: torch.Tensor
    prompt_len: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return self.ids.shape[0]

    def subset(self, rows: Sequence[int]) -> Packed:
        """The rows `rows` in that order, repeats allowed (a batch draws one example twice when its task has fewer
        examples than the batch wants): row b of the result is ``rows[b]``, with all of its positions."""
        rows = list(rows)
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        if len(set(rows)) == len(rows):  # positions keep their packed order
            remap = torch.full((self.n,), -1, dtype=torch.long)
            remap[rows_t] = torch.arange(len(rows_t))
            keep = remap[self.pos_b] >= 0
            new_b, idx = remap[self.pos_b[keep]], keep.nonzero().flatten()
        else:  # a repeated row gets its positions once per occurrence
            sel = [torch.nonzero(self.pos_b == r).flatten() for r in rows]
            idx = torch.cat(sel)
            new_b = torch.cat([torch.full((len(p),), b, dtype=torch.long) for b, p in enumerate(sel)])
        return Packed(
            self.ids[rows_t],
            new_b,
            self.pos_t[idx],
            self.target[idx],
            self.is_stop[idx],
            [self.prompt_len[r] for r in rows],
        )


def pack(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, stop_id: int) -> Packed:
    """Pack (prompt ids, answer ids) pairs as prompt + answer + [stop_id], right-padded with `pad_id`."""
    seqs = [list(p) + list(a) + [stop_id] for p, a in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    pb, pt, tg, st = [], [], [], []
    for b, ((p, a), s) in enumerate(zip(examples, seqs)):
        if not p:
            raise ValueError("every prompt needs at least one token")
        ids[b, : len(s)] = torch.tensor(s)
        for j in range(len(a) + 1):
            pb.append(b)
            pt.append(len(p) - 1 + j)
            tg.append(s[len(p) + j])
            st.append(j == len(a))
    return Packed(
        ids,
        torch.tensor(pb),
        torch.tensor(pt),
        torch.tensor(tg),
        torch.tensor(st, dtype=torch.bool),
        [len(p) for p, _ in examples],
    )


class EdgeTop:
    """Run an edge LM split at block `start`: the bottom blocks once (cached), the top blocks and head many times.

    Args:
        model: a llama-style causal LM (``model.model.layers``, ``model.model.norm``, output embeddings).
        n_top (`int`): number of top blocks (those that carry LoRA); ``start = n_layers - n_top``.
    """

    def __init__(self, model: Any, n_top: int) -> None:
        self.model = model
        self.layers = decoder_layers(model)
        self.top_ids = top_layer_ids(model, n_top)
        self.start = self.top_ids[0]
        self._kwargs: dict[int, list[dict[str, Any]]] = {}

    @torch.no_grad()
    def trunk(self, ids: torch.Tensor, *, batch_size: int = 32) -> torch.Tensor:
        """Hidden states entering block `start` for right-padded `ids` (N, T) -> (N, T, d)."""
        box: list[torch.Tensor] = []

        def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
            box.append((args[0] if args else kwargs["hidden_states"]).detach())
            raise _Stop  # the blocks above `start` are not needed

        handle = self.layers[self.start].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            for i in range(0, ids.shape[0], batch_size):
                try:
                    _base(self.model)(input_ids=ids[i : i + batch_size], use_cache=False)
                except _Stop:
                    pass
        finally:
            handle.remove()
        return torch.cat(box)

    @torch.no_grad()
    def layer_kwargs(self, width: int) -> list[dict[str, Any]]:
        """The keyword arguments (mask, rotary embeddings, positions) each top block gets at sequence length `width`,
        captured from a batch-1 forward (they broadcast over any batch of right-padded sequences)."""
        if width not in self._kwargs:
            captured: dict[int, dict[str, Any]] = {}

            def make(i: int) -> Callable[..., None]:
                def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
                    captured[i] = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "cache")}

                return grab

            handles = [self.layers[i].register_forward_pre_hook(make(i), with_kwargs=True) for i in self.top_ids]
            try:
                _base(self.model)(input_ids=torch.zeros((1, width), dtype=torch.long), use_cache=False)
            finally:
                for h in handles:
                    h.remove()
            self._kwargs[width] = [captured[i] for i in self.top_ids]
        return self._kwargs[width]

    def top(self, hidden: torch.Tensor) -> torch.Tensor:
        """Top blocks + final norm: (B, T, d) -> (B, T, d)."""
        h = hidden
        for i, kw in zip(self.top_ids, self.layer_kwargs(hidden.shape[1])):
            h = self.layers[i](h, **kw)
            if isinstance(h, tuple):
                h = h[0]
        return _base(self.model).norm(h)

    def answer_logits(self, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Logits at the answer-predicting positions of `packed` (M, vocab), from cached `hidden` (N, T, d)."""
        h = self.top(hidden)
        return self.model.get_output_embeddings()(h[packed.pos_b, packed.pos_t])

    # -- a shared prefix (the system prompt in context) ------------------------------------------------------------

    @torch.no_grad()
    def trunk_with_prefix(
        self, prefix: Sequence[int], ids: torch.Tensor, *, batch_size: int = 32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states entering block `start` for the sequences ``prefix + ids[i]``, the prefix run once.

        Returns the prefix's (Tp, d) and the continuations' (N, T, d) (right-padded `ids` (N, T), positions shifted
        by Tp). The bottom blocks' KV cache of the prefix is repeated over each chunk, as in `score_with_prefix`.
        """
        from transformers import DynamicCache

        box: list[torch.Tensor] = []

        def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
            box.append((args[0] if args else kwargs["hidden_states"]).detach())
            raise _Stop

        pre = torch.tensor([list(prefix)], dtype=torch.long)

        def run_prefix() -> Any:
            cache = DynamicCache(config=self.model.config)
            try:  # the prefix fills the cache of blocks < start, then the hook stops the forward
                _base(self.model)(input_ids=pre, cache=cache, use_cache=True)
            except _Stop:
                pass
            return cache

        handle = self.layers[self.start].register_forward_pre_hook(grab, with_kwargs=True)
        parts = []
        try:
            run_prefix()
            prefix_h = box.pop()[0]  # (Tp, d)
            for i in range(0, ids.shape[0], batch_size):
                chunk = ids[i : i + batch_size]
                if self.start > 0:  # a fresh prefix cache per chunk, repeated over its rows
                    cache = run_prefix()
                    box.pop()
                    cache.batch_repeat_interleave(chunk.shape[0])
                    # positions continue after the prefix; the chunk attends to the cached prefix keys
                    kw: dict[str, Any] = {"cache": cache, "use_cache": True}
                else:  # the trunk is the embedding output: it does not depend on the prefix
                    kw = {"use_cache": False}
                try:
                    _base(self.model)(input_ids=chunk, **kw)
                except _Stop:
                    pass
                parts.append(box.pop())
        finally:
            handle.remove()
        return prefix_h, torch.cat(parts)

    def top_with_prefix(
        self, prefix_hidden: torch.Tensor, prefix_len: torch.Tensor, owner: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """Top blocks + final norm for continuations of shared prefixes, each prefix run once (gradients flow
        through the prefix's keys and values, so a LoRA on the top blocks learns from the prompt in context).

        Args:
            prefix_hidden: (P, Tp, d) right-padded prefix trunks; prefix_len: (P,) their lengths.
            owner: (B,) which prefix each continuation follows; hidden: (B, T, d) continuation trunks.
        Returns: (B, T, d), equal to the full forward of ``prefix[owner[b]] + continuation[b]`` at its positions.
        """
        n_p, t_p = prefix_hidden.shape[:2]
        n_b, t_q = hidden.shape[:2]
        neg = torch.finfo(hidden.dtype).min
        ar_p, ar_q = torch.arange(t_p), torch.arange(t_q)
        # prefix pass: causal (its right padding is never attended to by a real prefix token)
        mask_p = torch.zeros(n_p, 1, t_p, t_p, dtype=hidden.dtype)
        mask_p.masked_fill_(ar_p[None, :] > ar_p[:, None], neg)
        pos_p = ar_p.expand(n_p, t_p)
        # continuation pass: keys [prefix (t_p); own tokens (t_q)]; the owner's prefix up to its length, causal after
        lens = prefix_len[owner]  # (B,)
        allowed = torch.cat(
            [
                (ar_p[None, None, :] < lens[:, None, None]).expand(n_b, t_q, t_p),
                (ar_q[None, :] <= ar_q[:, None]).expand(n_b, t_q, t_q),
            ],
            -1,
        )  # (B, t_q, t_p + t_q)
        mask_q = torch.zeros(n_b, 1, t_q, t_p + t_q, dtype=hidden.dtype).masked_fill_(~allowed[:, None], neg)
        pos_q = lens[:, None] + ar_q[None, :]  # (B, t_q)
        rotary = _base(self.model).rotary_emb
        kv = _PrefixKV()
        hp, hq = prefix_hidden, hidden
        for i in self.top_ids:
            layer = self.layers[i]
            kv.owner = None
            hp = layer(hp, attention_mask=mask_p, position_ids=pos_p, position_embeddings=rotary(hp, pos_p), cache=kv)
            hp = hp[0] if isinstance(hp, tuple) else hp
            kv.owner = owner
            hq = layer(hq, attention_mask=mask_q, position_ids=pos_q, position_embeddings=rotary(hq, pos_q), cache=kv)
            hq = hq[0] if isinstance(hq, tuple) else hq
        return _base(self.model).norm(hq)

    def answer_logits_with_prefix(
        self,
        prefix_hidden: torch.Tensor,
        prefix_len: torch.Tensor,
        owner: torch.Tensor,
        hidden: torch.Tensor,
        packed: Packed,
    ) -> torch.Tensor:
        """`answer_logits` for continuations of shared prefixes (`top_with_prefix`): (M, vocab)."""
        h = self.top_with_prefix(prefix_hidden, prefix_len, owner, hidden)
        return self.model.get_output_embeddings()(h[packed.pos_b, packed.pos_t])


class _PrefixKV:
    """A minimal stand-in for a transformers `Cache` (attention calls only ``update``): in the prefix pass
    (``owner is None``) it keeps each block's prefix keys / values (P, kv_heads, Tp, hd) and returns them; in the
    continuation pass it prepends the owner prefix's ones to the continuation's (B, kv_heads, Tp + T, hd)."""

    def __init__(self) -> None:
        self.store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.owner: torch.Tensor | None = None

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.owner is None:
            self.store[layer_idx] = (key, value)
            return key, value
        pk, pv = self.store[layer_idx]
        return torch.cat([pk[self.owner], key], 2), torch.cat([pv[self.owner], value], 2)


def answer_loss(logits: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens (and the terminator) over all predicted positions."""
    return F.cross_entropy(logits.float(), packed.target)


@dataclass
class Scores:
    """Per-example greedy exact match (1.0 / 0.0) and answer NLL (nats per answer token), and the argmax tokens."""

    exact: list[float]
    nll: list[float]
    predicted: list[list[int]]


def score_logits(logits: torch.Tensor, packed: Packed, stop_ids: set[int]) -> Scores:
    """Greedy exact match: every answer token is the argmax and the argmax after the answer is a stop token.

    Equivalent to greedy decoding producing exactly the answer and then stopping (lm-eval's ``is_greedy`` plus a
    stop check), computed in one teacher-forced pass.
    """
    pred = logits.argmax(-1)
    logp = torch.log_softmax(logits.float(), -1)
    tok_nll = -logp.gather(-1, packed.target[:, None])[:, 0]
    stop = torch.tensor([int(p) in stop_ids for p in pred.tolist()], dtype=torch.bool)
    ok = torch.where(packed.is_stop, stop, pred == packed.target)
    n = packed.n
    exact = [1.0] * n
    nll_sum, count = [0.0] * n, [0] * n
    predicted: list[list[int]] = [[] for _ in range(n)]
    for b, good, is_stop, v, p in zip(
        packed.pos_b.tolist(), ok.tolist(), packed.is_stop.tolist(), tok_nll.tolist(), pred.tolist()
    ):
        if not good:
            exact[b] = 0.0
        if not is_stop:
            nll_sum[b] += v
            count[b] += 1
            predicted[b].append(p)
    return Scores(exact, [s / max(c, 1) for s, c in zip(nll_sum, count)], predicted)


@torch.no_grad()
def score_top(top: EdgeTop, hidden: torch.Tensor, packed: Packed, stop_ids: set[int], *, chunk: int = 64) -> Scores:
    """`score_logits` for the edge model as it is now (merged weights, hooks or peft layers), from cached trunks."""
    parts = []
    for i in range(0, packed.n, chunk):
        rows = list(range(i, min(packed.n, i + chunk)))
        sub = packed.subset(rows)
        parts.append(score_logits(top.answer_logits(hidden[rows], sub), sub, stop_ids))
    return Scores(
        [x for p in parts for x in p.exact], [x for p in parts for x in p.nll], [x for p in parts for x in p.predicted]
    )


@torch.no_grad()
def score_with_prefix(
    model: Any, prefix: Sequence[int], packed: Packed, stop_ids: set[int], *, chunk: int = 32
) -> Scores:
    """`score_logits` for prompts that all start with the same `prefix` (the system prompt in context): the prefix
    is run once per chunk and its KV cache shared, the rows of `packed` continue it (their positions shift by it)."""
    pre = torch.tensor([list(prefix)], dtype=torch.long)
    parts = []
    for i in range(0, packed.n, chunk):
        rows = list(range(i, min(packed.n, i + chunk)))
        sub = packed.subset(rows)
        out = model(input_ids=pre, use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.batch_repeat_interleave(len(rows))
        logits = model(input_ids=sub.ids, cache=cache, use_cache=True).logits
        parts.append(score_logits(logits[sub.pos_b, sub.pos_t], sub, stop_ids))
    return Scores(
        [x for p in parts for x in p.exact], [x for p in parts for x in p.nll], [x for p in parts for x in p.predicted]
    )


def stop_token_ids(tokenizer: Any) -> set[int]:
    """Tokens that end an answer: EOS and every token whose text starts with a newline."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for tok, i in tokenizer.get_vocab().items():
        text = tokenizer.convert_tokens_to_string([tok])
        if text.startswith("\n"):
            ids.add(int(i))
    return ids


__all__ = [
    "EdgeTop",
    "Packed",
    "Scores",
    "answer_loss",
    "decoder_layers",
    "pack",
    "score_logits",
    "score_top",
    "score_with_prefix",
    "stop_token_ids",
    "target_modules",
    "top_layer_ids",
]
