"""LoRA particles on one base model: train an expert, read its state, swap states in, score multiple choice.

Pure (no I/O): models, tensors and examples in, values out. A particle's state dict is keyed
``<module>.lora_A`` / ``<module>.lora_B`` with ``<module>`` the LoRA layer's path inside the top blocks of a
`lmlab.core.training.partial.TopK` (``"0.self_attn.q_proj"`` = the first of the top k blocks); `peft_state` renames it
to
peft's ``adapter_model.safetensors`` keys of the full model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmlab.methods.adaptation.model_swarms.method import StateDict


def _lora_modules(topk: Any) -> dict[str, Any]:
    from peft.tuners.lora import Linear as LoraLinear

    mods = {name: m for name, m in topk.layers.named_modules() if isinstance(m, LoraLinear)}
    if not mods:
        raise ValueError("the TopK holds no peft LoRA layer; build it with trunk.top_k(lora=LoraConfig(...))")
    return mods


def lora_state(topk: Any, adapter: str = "default") -> StateDict:
    """The LoRA tensors of a `TopK` built with ``lora=``: ``{"<module>.lora_A": (r, in), "<module>.lora_B": (out, r)}``
    as float32 CPU copies."""
    out: StateDict = {}
    for name, m in _lora_modules(topk).items():
        out[f"{name}.lora_A"] = m.lora_A[adapter].weight.detach().float().cpu().clone()
        out[f"{name}.lora_B"] = m.lora_B[adapter].weight.detach().float().cpu().clone()
    return out


def peft_state(state: StateDict, first_block: int) -> StateDict:
    """`state` under peft's saved-adapter keys of the full model (``base_model.model.model.layers.<L>...weight``),
    block indices shifted by `first_block` (= n_layers - k)."""
    out = {}
    for k, t in state.items():
        j, rest = k.split(".", 1)
        module, kind = rest.rsplit(".", 1)
        out[f"base_model.model.model.layers.{int(j) + first_block}.{module}.{kind}.weight"] = t.contiguous()
    return out


def from_peft_state(peft_sd: StateDict, first_block: int, adapter: str | None = None) -> StateDict:
    """The inverse of `peft_state`: a saved peft adapter's tensors (``adapter_model.safetensors`` of a LoRA on the
    full model, keys ``...layers.<L>.<module>.lora_A[.<adapter>].weight``) of blocks ``L >= first_block``, keyed for
    a `TopK` of the top blocks. Tensors of lower blocks are dropped (the cached trunk below is frozen)."""
    import re

    out = {}
    pat = re.compile(r"layers\.(\d+)\.(.+)\.(lora_[AB])(?:\.([^.]+))?\.weight$")
    for k, t in peft_sd.items():
        m = pat.search(k)
        if m is None or (adapter is not None and m.group(4) not in (None, adapter)):
            continue
        layer = int(m.group(1))
        if layer >= first_block:
            out[f"{layer - first_block}.{m.group(2)}.{m.group(3)}"] = t.detach().float().clone()
    if not out:
        raise ValueError(f"no LoRA tensor of a block >= {first_block} in the adapter state (keys like "
                         "'base_model.model.model.layers.<L>.self_attn.q_proj.lora_A.weight' expected)")  # fmt: skip
    return out


def train_lora_expert(
    trunk: Any,
    lora_config: Any,
    cache: Any,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    init_seed: int | None = None,
    max_grad_norm: float | None = 1.0,
) -> tuple[StateDict, list[float]]:
    """A fresh LoRA (peft's init, drawn after ``torch.manual_seed(init_seed)``, default `seed`) on the top blocks,
    trained `steps` AdamW steps (constant `lr`, batch order from `seed`) on the answer NLL of a
    `lmlab.core.training.lora.PaddedCache` of (prompt, answer) sequences. Returns (its state dict, the step losses).

    Experts that share `init_seed` share their initial A (B starts at 0), so their A and B stay comparable tensor by
    tensor, which is what Model Swarms' separate A / B algebra assumes."""
    from lmlab.core.training.lora import index_batches, train_steps
    from lmlab.core.training.partial import response_token_logps
    from lmlab.core.training.preference import weighted_sft_loss

    torch.manual_seed(seed if init_seed is None else init_seed)
    policy = trunk.top_k(train_norm=False, lora=lora_config)

    def loss_fn(model: Any, rows: list[int]) -> torch.Tensor:
        sub, tm = cache.batch(rows)
        lp = response_token_logps(model, sub, tm)  # (b, T-1), 0 off the answer
        return weighted_sft_loss(lp, tm, reduction="mean")

    losses = train_steps(policy, loss_fn, index_batches(cache.n, steps, batch, seed), lr, max_grad_norm=max_grad_norm)
    state = lora_state(policy)
    del policy
    return state, losses


class ChoiceSet:
    """Multiple-choice items (``choices`` + ``meta["answer_index"]``) cached through the frozen trunk once: every
    option is a (prompt, " " + option) sequence of one `PaddedCache`."""

    def __init__(self, trunk: Any, tokenizer: Any, examples: Sequence[Any]) -> None:
        from lmlab.core.inference.scoring import _pad_id
        from lmlab.core.training.lora import PaddedCache
        from lmlab.core.training.sft import encode_sequences
        from lmlab.data.taskbank import choice_requests

        if not examples:
            raise ValueError("ChoiceSet needs at least one example")
        pairs, self.spans, self.gold = [], [], []
        for ex in examples:
            req = choice_requests(ex)
            self.spans.append((len(pairs), len(pairs) + len(req)))
            self.gold.append(int(ex.meta["answer_index"]))
            pairs += req
        self.ids = [ex.id for ex in examples]
        self.traps = [ex.meta.get("trap_index") for ex in examples]  # composite targets: the case trap's position
        self.cache = PaddedCache(trunk, encode_sequences(tokenizer, [p for p, _ in pairs], [c for _, c in pairs]),
                                 _pad_id(tokenizer))  # fmt: skip

    def __len__(self) -> int:
        return len(self.ids)

    def picks(self, topk: Any) -> list[int]:
        """Per item, the option with the highest summed log-likelihood under `topk` (first on ties)."""
        from lmlab.core.training.lora import answer_scores

        nll, _ = answer_scores(topk, self.cache)
        out = []
        for a, b in self.spans:
            scores = [-v for v in nll[a:b]]
            out.append(scores.index(max(scores)))
        return out

    def correct(self, topk: Any) -> list[float]:
        """1.0 per item whose gold option has the highest summed log-likelihood under `topk` (first on ties)."""
        return self.score(self.picks(topk))

    def score(self, picks: Sequence[int]) -> list[float]:
        """1.0 per item whose pick is its gold option."""
        return [1.0 if p == gold else 0.0 for p, gold in zip(picks, self.gold)]

    def trap_rate(self, picks: Sequence[int]) -> list[float] | None:
        """1.0 per item whose pick is its case trap (the right capital, not in uppercase); None without traps."""
        if any(t is None for t in self.traps):
            return None
        return [1.0 if p == t else 0.0 for p, t in zip(picks, self.traps)]


class LoraSlot:
    """One copy of the top blocks with a LoRA into which particles are swapped (``load``), and one plain copy whose
    base weights take dense deltas W0 + ΔW (``load_dense``: TIES / DARE merges of the task vectors)."""

    def __init__(self, trunk: Any, lora_config: Any) -> None:
        self.lora = trunk.top_k(train_norm=False, lora=lora_config)
        self.plain = trunk.top_k(train_norm=False)
        for m in (self.lora, self.plain):
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)
        self.modules = _lora_modules(self.lora)
        self.scaling = float(next(iter(self.modules.values())).scaling["default"])
        self.base = {name: self.plain.layers.get_submodule(name).weight.detach().clone() for name in self.modules}
        self.first_block = trunk.n_layers - trunk.k

    @torch.no_grad()
    def load(self, state: StateDict) -> Any:
        """Copy a particle into the LoRA copy; returns that `TopK`."""
        for name, m in self.modules.items():
            for kind, layer in (("lora_A", m.lora_A["default"]), ("lora_B", m.lora_B["default"])):
                t = state.get(f"{name}.{kind}")
                if t is None or t.shape != layer.weight.shape:
                    got = None if t is None else tuple(t.shape)
                    raise ValueError(f"particle has {name}.{kind} of shape {got}, expected "
                                     f"{tuple(layer.weight.shape)} (same rank and target modules)")  # fmt: skip
                layer.weight.copy_(t.to(layer.weight.dtype))
        return self.lora

    @torch.no_grad()
    def load_dense(self, deltas: dict[str, torch.Tensor]) -> Any:
        """Set every target weight of the plain copy to W0 + ΔW; returns that `TopK`."""
        for name, w0 in self.base.items():
            w = self.plain.layers.get_submodule(name).weight
            d = deltas.get(name)
            w.copy_(w0 if d is None else (w0.float() + d.float()).to(w.dtype))
        return self.plain
