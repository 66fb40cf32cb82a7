"""The honest proxy of a VLM: 5x5 digit glyphs as soft tokens of a text LM, probes, LoRA fine-tunes, scoring.

Pure (no I/O): models, tensors and items in, values out.

* A `Item` is a prompt of text pieces and images (25-pixel bitmaps from `lmlab.data.taskbank.glyph`) plus the gold
  digit. An image enters as ``<img>`` + the `GlyphProjector`'s soft tokens + ``</img>``; in a *text* item the digit
  itself stands where the image was (``"(3 + 5) mod 10 ="``).
* Probes (`build_items`): ``perception`` ("Digit <img> is"), ``mm_reason`` ("(<img> + <img>) mod 10 =", the
  multimodal reasoning probe: the skill of the text model on the modality of the VLM), ``text_reason`` (the same
  question with the digits as text: "(3 + 5) mod 10 =") and ``text_read`` (the VLM's text replay: "Digit 7 is").
* Scoring (`DigitScorer`): log-likelihood over the ten digit answers ``" 0"`` .. ``" 9"`` (they share the leading
  space token, so one forward pass per item scores all ten at the digit position): accuracy (argmax = gold) and the
  gold answer's log-probability renormalised over the ten (the knockout analysis's continuous score).
* `train_lora`: a peft LoRA on every decoder layer (and, for the VLM-proxy, the projector) trained on the gold digit's
  cross-entropy; returns the LoRA factors, from which `dense_task_vector` gives τ = s · B A per weight.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

PROBES: tuple[str, ...] = ("perception", "mm_reason", "text_reason", "text_read")
IMG_OPEN, IMG_CLOSE = "<img>", "</img>"


@dataclass(frozen=True)
class Item:
    """One prompt: ``pieces`` are text (str) or images (tuple of 25 ints); ``answer`` is the gold digit 0-9."""

    id: str
    probe: str
    pieces: tuple[Any, ...]
    answer: int
    digits: tuple[int, ...]


def _pieces(probe: str, digits: Sequence[int], images: Sequence[Sequence[int]] | None) -> tuple[Any, ...]:
    def slot(i: int) -> Any:
        return str(digits[i]) if images is None else tuple(int(b) for b in images[i])

    # short prompts: every token costs a full-depth forward and backward on CPU
    if probe in ("perception", "text_read"):
        return ("Digit ", slot(0), " is")
    return ("(", slot(0), " + ", slot(1), ") mod 10 =")


def build_items(examples: Sequence[Any], probe: str) -> list[Item]:
    """Items of `probe` from task-bank glyph examples (``read`` for perception / text_read, ``sum_mod10`` for the
    reasoning probes): the bitmaps of ``meta["bitmaps"]``, or the digits as text for the text probes."""
    if probe not in PROBES:
        raise ValueError(f"probe must be one of {', '.join(PROBES)}, got {probe!r}")
    if not examples:
        raise ValueError(f"no examples for the {probe} probe; expected at least one task-bank glyph example")
    out = []
    for ex in examples:
        digits = [int(d) for d in ex.meta["digits"]]
        need = 1 if probe in ("perception", "text_read") else 2
        if len(digits) != need:
            raise ValueError(f"the {probe} probe needs glyph examples with {need} digit(s), got {ex.id}")
        images = None if probe.startswith("text") else ex.meta["bitmaps"]
        answer = digits[0] if need == 1 else (digits[0] + digits[1]) % 10
        out.append(Item(f"{probe}/{ex.id}", probe, _pieces(probe, digits, images), answer, tuple(digits)))
    return out


def all_pair_items(probe: str = "text_reason") -> list[Item]:
    """The 100 digit pairs as text items of `probe` (``text_reason``): the reasoning fine-tune's full pool."""
    out = []
    for a in range(10):
        for b in range(10):
            out.append(Item(f"{probe}/pair/{a}-{b}", probe, _pieces(probe, [a, b], None), (a + b) % 10, (a, b)))
    return out


def digit_token_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(the shared prefix of the continuations ``" 0"`` .. ``" 9"``, the ten digit token ids after it); ValueError
    when a digit is not one token after the shared prefix (the one-forward scoring needs that)."""
    conts = [tokenizer(f" {d}", add_special_tokens=False)["input_ids"] for d in range(10)]
    prefix = conts[0][:-1]
    for d, c in enumerate(conts):
        if c[:-1] != prefix:
            raise ValueError(f"the tokenizer splits ' {d}' as {c}; expected a shared prefix {prefix} and one digit "
                             "token (a llama-style digit-splitting tokenizer)")  # fmt: skip
    last = [c[-1] for c in conts]
    if len(set(last)) != 10:
        raise ValueError(f"digit tokens {last} are not distinct; expected one token per digit")
    return prefix, last


class DigitScorer:
    """Embeds items (text through the LM's embedding table, images through a projector) and scores the ten digits.

    Args:
        model: a llama-style causal LM (``model.model`` returns hidden states, ``model.lm_head`` the logits).
        tokenizer: its tokenizer.
        batch_size (`int`, defaults to 32): items per forward pass.
    """

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 32) -> None:
        if not hasattr(model, "model") or not hasattr(model, "lm_head"):
            raise ValueError(f"expected a causal LM with .model and .lm_head (llama / gemma style), got "
                             f"{type(model).__name__}")  # fmt: skip
        self.model, self.tok, self.batch_size = model, tokenizer, int(batch_size)
        self.prefix, self.digit_ids = digit_token_ids(tokenizer)
        self._ids: dict[str, list[int]] = {}
        self.open = self._encode(IMG_OPEN)
        self.close = self._encode(IMG_CLOSE)
        self.bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []

    def _encode(self, text: str) -> list[int]:
        if text not in self._ids:
            self._ids[text] = self.tok(text, add_special_tokens=False)["input_ids"]
        return self._ids[text]

    def embed(self, items: Sequence[Item], projector: Any | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs_embeds (B, T, d) right-padded, attention_mask (B, T), index of each item's last token (B,))."""
        emb = self.model.get_input_embeddings()
        images = [p for it in items for p in it.pieces if isinstance(p, tuple)]
        if images and projector is None:
            raise ValueError("items hold images but no projector was given; expected the VLM-proxy's GlyphProjector")
        soft = projector(torch.tensor(images, dtype=torch.float32)) if images else None  # (n_img, k, d)
        rows, j = [], 0
        for it in items:
            parts: list[torch.Tensor] = []
            ids: list[int] = list(self.bos)
            for p in it.pieces:
                if isinstance(p, tuple):
                    ids += self.open
                    parts.append(emb(torch.tensor(ids, dtype=torch.long)))
                    parts.append(soft[j].to(parts[-1].dtype))
                    j += 1
                    ids = list(self.close)
                else:
                    ids += self._encode(p)
            ids += self.prefix
            parts.append(emb(torch.tensor(ids, dtype=torch.long)))
            rows.append(torch.cat(parts, dim=0))  # (T_i, d)
        width = max(r.shape[0] for r in rows)
        d = rows[0].shape[1]
        x = rows[0].new_zeros((len(rows), width, d))
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            x[i, : r.shape[0]] = r
            mask[i, : r.shape[0]] = 1
        return x, mask, mask.sum(-1) - 1

    def digit_logits(self, items: Sequence[Item], projector: Any | None) -> torch.Tensor:
        """(B, 10) log-probabilities of the ten digit tokens (over the whole vocabulary) at the answer position."""
        x, mask, last = self.embed(items, projector)
        h = self.model.model(inputs_embeds=x, attention_mask=mask).last_hidden_state  # (B, T, d)
        h_last = h[torch.arange(h.shape[0]), last]  # (B, d)
        logp = torch.log_softmax(self.model.lm_head(h_last).float(), dim=-1)  # (B, vocab)
        return logp[:, self.digit_ids]  # (B, 10)

    @torch.no_grad()
    def score(self, items: Sequence[Item], projector: Any | None = None) -> tuple[list[float], list[float]]:
        """Per item: 1.0 when the gold digit has the highest likelihood of the ten (first on ties), and the gold
        digit's log-probability renormalised over the ten."""
        if not items:
            raise ValueError("no items to score")
        correct, gold_lp = [], []
        for s in range(0, len(items), self.batch_size):
            chunk = items[s : s + self.batch_size]
            lp = self.digit_logits(chunk, projector)  # (b, 10)
            norm = torch.log_softmax(lp, dim=-1)
            gold = torch.tensor([it.answer for it in chunk])
            correct += (lp.argmax(-1) == gold).float().tolist()
            gold_lp += norm[torch.arange(len(chunk)), gold].tolist()
        return correct, gold_lp


# ---------------------------------------------------------------------------------------------------------------
# LoRA fine-tunes and task vectors


def _lora_modules(model: Any) -> dict[str, Any]:
    from peft.tuners.lora import Linear as LoraLinear

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


def train_lora(
    model: Any,
    scorer: DigitScorer,
    items: Sequence[Item],
    lora_config: Any,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    projector: Any | None = None,
    projector_lr: float | None = None,
    max_grad_norm: float | None = 1.0,
) -> tuple[dict[str, Any], list[float]]:
    """Fine-tune a fresh peft LoRA (and `projector`, when given) on the gold digit's cross-entropy, then remove it.

    `model` is modified in place while training and restored (``unload``) before returning, so the caller's weights
    are the base again. Returns ({"lora": {module: (A, B)}, "scaling": s, "projector": state or None}, step losses).
    """
    from peft import get_peft_model

    from lmlab.core.training.lora import index_batches

    if not items:
        raise ValueError("no training items; expected at least one")
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, lora_config)
    try:
        lora_params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": lora_params, "lr": lr}]
        if projector is not None:
            for p in projector.parameters():
                p.requires_grad_(True)
            groups.append({"params": list(projector.parameters()), "lr": projector_lr or lr})
        opt = torch.optim.AdamW(groups, weight_decay=0.0)
        params = [p for g in groups for p in g["params"]]
        rng_batches = index_batches(len(items), steps, batch, seed)
        losses = []
        model.train()
        for rows in rng_batches:
            chunk = [items[i] for i in rows]
            opt.zero_grad(set_to_none=True)
            lp = scorer.digit_logits(chunk, projector)  # (b, 10), log-probs over the vocabulary
            gold = torch.tensor([it.answer for it in chunk])
            loss = -lp[torch.arange(len(chunk)), gold].mean()
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            opt.step()
            losses.append(float(loss.detach()))
        model.eval()
        mods = _lora_modules(model)
        state = {
            "lora": {name: (m.lora_A["default"].weight.detach().float().clone(),
                            m.lora_B["default"].weight.detach().float().clone()) for name, m in mods.items()},
            "scaling": float(next(iter(mods.values())).scaling["default"]),
            "projector": None if projector is None else {k: v.detach().clone()
                                                         for k, v in projector.state_dict().items()},
        }  # fmt: skip
    finally:
        peft_model.unload()
        model.eval()
        if projector is not None:
            for p in projector.parameters():
                p.requires_grad_(False)
    return state, losses


def dense_task_vector(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """τ of a LoRA fine-tune: ``{"<module>.weight": s · B A}`` (out, in) per LoRA module."""
    s = float(state["scaling"])
    return {f"{name}.weight": s * (b @ a) for name, (a, b) in state["lora"].items()}


@torch.no_grad()
def apply_task_vector(model: Any, base: dict[str, torch.Tensor], tau: dict[str, torch.Tensor]) -> None:
    """Set every weight named in `base` to ``base + tau`` (tau missing: the base), in place."""
    for k, w0 in base.items():
        p = model.get_parameter(k)
        t = tau.get(k)
        p.copy_(w0 if t is None else (w0.float() + t).to(p.dtype))


def shuffled(items: Sequence[Item], seed: int) -> list[Item]:
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


__all__ = [
    "PROBES",
    "DigitScorer",
    "Item",
    "all_pair_items",
    "apply_task_vector",
    "build_items",
    "dense_task_vector",
    "digit_token_ids",
    "shuffled",
    "train_lora",
]
