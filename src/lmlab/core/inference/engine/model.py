"""A llama / gemma3 decoder written directly in torch over a static KV cache, with fp32 or int4 weights.

The engine wraps a loaded Hugging Face model (`LlamaForCausalLM`, e.g. SmolLM2; `Gemma3ForCausalLM`, e.g.
Gemma-3-270M) and recomputes its forward pass with fewer, larger ops:

- **KV cache**: pre-allocated per layer as ``[batch, kv_heads, capacity, head_dim]`` (grown by doubling when a
  sequence outgrows it); appending is a slice copy, rewinding (`KVCache.crop`) just sets the length: O(1).
  Gemma's sliding-window layers keep a ring of the last ``window - 1`` positions (HF's own sliding-cache contract,
  so memory stays bounded; like HF's, such a layer cannot be cropped once it has seen ``window`` positions, and the
  caller re-prefills). Column ``c`` lives in slot ``c % (window - 1)``; attention reads the ring unrolled into time
  order (oldest first), exactly the key sequence HF's `DynamicSlidingWindowLayer` holds.
- **fp32 weights** (``weights="fp32"``): the HF modules' own weight tensors are used in place (no copy, so a model
  modified in place is seen at once), one `F.linear` per HF projection, the keys in HF's order and SDPA: the same
  ops on the same shapes as transformers' SDPA forward, so the logits are bitwise equal to HF's when HF is fed the
  same chunks (same thread count; `tests/core/test_engine.py`). They are not bitwise equal to HF fed the tokens in
  other chunks (a GEMM over 1 row rounds differently from one over 40: ~1e-5 relative), nor to HF's ``eager``
  attention (matmul + softmax instead of the fused SDPA kernel).
- **int4 weights** (``weights="int4"``): large matrices run through torch's CPU int4 kernel
  (`lmlab.core.inference.engine.quant`), with q/k/v fused into one matrix and gate/up into another. Codes come straight
  from the GGUF's Q4_0 / Q4_1 / Q4_K blocks when the model's fp32 weights are those blocks dequantized (checked
  tensor by tensor); otherwise they are quantized from the fp32 weights (round-to-nearest, asymmetric, group 32).
  Matrices smaller than `min_int4_weights` (250k weights) stay fp32. Measured here, one thread: in isolation
  (weights hot in cache) int4 vs fp32 is ~1x at 576x576, ~1.9x at 960x576 (fused qkv), ~3x at 3072x576 (fused
  gate/up), ~2.8x at 576x1536, ~5x at 49152x576; inside the model, where every weight comes from DRAM, SmolLM2's
  576x576 o_proj in int4 made the whole step 1.18x faster than keeping it fp32 (interleaved A/B), so every
  SmolLM2 / Gemma matrix runs int4 and only tiny test models' matrices stay fp32. Activations enter the kernel
  in bf16 (its only fast path); the residual stream, norms, RoPE, attention and KV cache stay fp32.
  The LM head (tied to the embedding, which the GGUF stores at 8 bits) is quantized as int4 plus an int4
  residual (``head="int4x2"``): plain int4 costs KL ~0.05 nats/token on SmolLM2, int4x2 ~5e-4.

Anything else (other architectures, PEFT-wrapped or hooked modules, rope scaling other than the default) is
refused by `unsupported_reason`, and the caller falls back to the HF forward.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.inference.engine.quant import Int4Codes, Int4Linear, codes_from_gguf, int4_available, quantize

logger = logging.getLogger(__name__)

ARCHS = {"LlamaForCausalLM": "llama", "Gemma3ForCausalLM": "gemma3"}
WEIGHTS = ("fp32", "int4")


class EngineUnsupported(RuntimeError):
    """The fast engine cannot run this model (the message says why); use the HF path."""


def unsupported_reason(model: Any) -> str | None:
    """None if the fast engine can run `model`, else a one-line reason."""
    name = type(model).__name__
    arch = ARCHS.get(name)
    if arch is None:
        return f"architecture {name} is not supported by the fast engine (llama and gemma3 are)"
    cfg = model.config
    try:
        p = next(model.parameters())
    except StopIteration:
        return "model has no parameters"
    if p.device.type != "cpu":
        return f"the fast engine runs on CPU; the model is on {p.device}"
    if p.dtype != torch.float32:
        return f"the fast engine needs a float32 model, got {p.dtype}"
    if model.training:
        return "model is in training mode"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "attention/MLP biases are not supported"
    if arch == "llama" and getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} is not supported"
    if arch == "gemma3":
        if getattr(cfg, "attn_logit_softcapping", None) is not None:
            return "attention logit soft-capping is not supported"
        if getattr(cfg, "use_bidirectional_attention", False):
            return "bidirectional attention is not supported"
        if "sliding_attention" in (getattr(cfg, "layer_types", None) or []) and int(cfg.sliding_window) < 2:
            return f"a sliding window of {cfg.sliding_window} is not supported (needs >= 2)"
    rope = getattr(cfg, "rope_parameters", None) or {}
    ropes = rope.values() if arch == "gemma3" and isinstance(next(iter(rope.values()), None), dict) else [rope]
    for r in ropes:
        if r and r.get("rope_type", "default") != "default":
            return f"rope type {r.get('rope_type')!r} is not supported (only 'default')"
    inner = model.model
    for mod in model.modules():
        if mod._forward_hooks or mod._forward_pre_hooks:
            return f"a forward hook is registered on {type(mod).__name__}; hooks only run in the HF forward"
    from torch.nn.modules import module as _m

    if _m._global_forward_hooks or _m._global_forward_pre_hooks:
        return "a global forward hook is registered"
    for layer in inner.layers:
        for lin in (
            layer.self_attn.q_proj,
            layer.self_attn.k_proj,
            layer.self_attn.v_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_proj,
            layer.mlp.up_proj,
            layer.mlp.down_proj,
        ):
            if type(lin) is not torch.nn.Linear or lin.bias is not None:
                return f"module {type(lin).__name__} is not a plain bias-free nn.Linear (adapters are not supported)"
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return "the LM head is not a plain nn.Linear"
    return None


def _signature(model: Any) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------------
# Projections


class _Fp32Proj:
    """Separate HF linears, weights read from the modules at call time (zero-copy)."""

    kind = "fp32"

    def __init__(self, modules: Sequence[torch.nn.Linear]) -> None:
        self.modules = list(modules)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [F.linear(x, m.weight) for m in self.modules]

    @property
    def nbytes(self) -> int:
        return sum(m.weight.numel() * 4 for m in self.modules)


class _Int4Proj:
    """One fused int4 matrix; output split back into the parts."""

    kind = "int4"

    def __init__(self, codes: Int4Codes | None, splits: list[int], lin: Int4Linear | None = None) -> None:
        self.lin = lin if lin is not None else Int4Linear(codes)
        self.splits = splits

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        y = self.lin(x.to(torch.bfloat16)).float()
        return list(y.split(self.splits, dim=-1)) if len(self.splits) > 1 else [y]

    @property
    def nbytes(self) -> int:
        return self.lin.nbytes


# ----------------------------------------------------------------------------------------------------------------
# KV cache


class KVCache:
    """Static per-layer K/V buffers for `batch` rows (left padding: row b's tokens start at column ``pad[b]``).

    `length` is the number of filled columns (shared by all rows). Crop is O(1). A sliding layer's ring of
    ``window - 1`` slots holds the columns ``[max(0, length - window + 1), length)``, column ``c`` in slot
    ``c % (window - 1)``: in time order until it wraps, a rotation of time order after (`ring_parts`).
    """

    def __init__(self, engine: FastEngine, batch: int, capacity: int, pad: Sequence[int] | None = None) -> None:
        self.engine = engine
        self.batch = batch
        self.capacity = max(1, int(capacity))
        self.length = 0
        self.pad_list = [int(p) for p in pad] if pad is not None else [0] * batch
        self.pad = torch.tensor(self.pad_list, dtype=torch.long)
        self.padded = any(self.pad_list)
        e = engine
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        for t in e.layer_types:
            size = e.window - 1 if t == "sliding" else self.capacity
            self.k.append(torch.zeros(batch, e.n_kv, size, e.head_dim))
            self.v.append(torch.zeros(batch, e.n_kv, size, e.head_dim))

    def get_seq_length(self) -> int:
        return self.length

    def _grow(self, needed: int) -> None:
        new_cap = max(needed, 2 * self.capacity)
        for i, t in enumerate(self.engine.layer_types):
            if t == "sliding":
                continue
            for store in (self.k, self.v):
                old = store[i]
                buf = torch.zeros(old.shape[0], old.shape[1], new_cap, old.shape[3])
                buf[:, :, : self.length] = old[:, :, : self.length]
                store[i] = buf
        self.capacity = new_cap

    def ensure(self, needed: int) -> None:
        if needed > self.capacity:
            self._grow(needed)

    def can_crop(self, length: int) -> bool:
        """True if the cache can be cut back to its first `length` columns with every key the next step needs.

        A step at column `length` needs, in a sliding layer, the columns ``[length - window + 1, length)``; the
        ring holds ``[self.length - window + 1, self.length)``. So once ``self.length >= window`` (the ring has
        dropped column 0) only ``length == self.length`` (a no-op) is possible; at ``self.length == window - 1``
        the ring is full but has dropped nothing, and any shorter length is fine. This is HF's
        `DynamicSlidingWindowLayer.crop` contract (it refuses once ``cumulative_length >= sliding_window``).
        """
        if not 0 <= length <= self.length:
            return False
        if length == self.length:
            return True
        return not (self.engine.has_sliding and self.length >= self.engine.window)

    def crop(self, length: int) -> bool:
        """Keep the first `length` columns. False (cache unchanged) if a sliding layer cannot go back that far."""
        if not self.can_crop(length):
            return False
        # a ring that has not wrapped holds column c in slot c: cutting the length is enough
        self.length = length
        return True

    def ring_parts(self, store: torch.Tensor, length: int | None = None) -> tuple[torch.Tensor, ...]:
        """A sliding layer's ring `store` ([batch, kv_heads, window - 1, head_dim]) as views in time order.

        Their concatenation holds the columns ``[max(0, length - window + 1), length)``, oldest first: one view
        (``store[:, :, :length]``) until the ring wraps, two after (the slots from ``length % (window - 1)`` on,
        then the ones before). `length` defaults to ``self.length``; a shorter one must satisfy `can_crop`.
        """
        length = self.length if length is None else length
        size = store.shape[2]  # window - 1
        if length <= size:
            return (store[:, :, :length],)
        start = length % size  # slot of the oldest column held, length - size
        return (store[:, :, start:], store[:, :, :start]) if start else (store,)

    def clone(self) -> KVCache:
        """An independent copy (only the filled columns are copied)."""
        other = KVCache.__new__(KVCache)
        other.engine, other.batch, other.capacity, other.length = self.engine, self.batch, self.capacity, self.length
        other.pad_list, other.pad, other.padded = list(self.pad_list), self.pad.clone(), self.padded
        other.k, other.v = [], []
        for i, t in enumerate(self.engine.layer_types):
            for src, dst in ((self.k, other.k), (self.v, other.v)):
                if t == "sliding":
                    dst.append(src[i].clone())
                else:
                    buf = torch.zeros_like(src[i])
                    buf[:, :, : self.length] = src[i][:, :, : self.length]
                    dst.append(buf)
        return other

    def __deepcopy__(self, memo: dict) -> KVCache:
        return self.clone()

    def to_hf(self, model: Any, length: int) -> tuple[Any, int]:
        """A transformers `DynamicCache` holding the first `length` positions (row 0), and how many it holds.

        A sliding layer hands over what HF's `DynamicSlidingWindowLayer` would hold after `length` positions: the
        last ``window - 1`` keys in time order (the ring unrolled), with its position count at `length` (so HF's
        masks and rope positions continue from there). When `length` is shorter than the cache and a sliding layer
        is past its window (`can_crop` is False), the early keys are gone: an empty cache, 0 (the caller feeds the
        prefix itself), as HF's own cache gives after a failed crop.
        """
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        if length == 0 or not self.can_crop(length) or self.batch != 1 or self.padded:
            return cache, 0
        e = self.engine
        layers = getattr(cache, "layers", None)
        for i, t in enumerate(e.layer_types):
            if t == "sliding":
                hf_layer = layers[i] if layers is not None and i < len(layers) else None
                held = min(length, e.window - 1)
                if held < length and getattr(hf_layer, "sliding_window", None) != e.window:
                    return DynamicCache(config=model.config), 0  # not a sliding HF layer: it would keep the zeros
                k = torch.cat(self.ring_parts(self.k[i], length), dim=2)  # [1, kv_heads, held, head_dim]
                v = torch.cat(self.ring_parts(self.v[i], length), dim=2)
                if held < length:
                    # HF counts positions by the keys it was given and keeps the last window - 1: lead with zeros
                    # for the dropped columns, which its update discards at once
                    pad = k.new_zeros(k.shape[0], k.shape[1], length - held, k.shape[3])
                    k, v = torch.cat((pad, k), dim=2), torch.cat((pad, v), dim=2)
            else:
                k, v = self.k[i][:, :, :length].clone(), self.v[i][:, :, :length].clone()
            cache.update(k, v, i)
        return cache, length


# ----------------------------------------------------------------------------------------------------------------
# The engine


@dataclass
class _Layer:
    qkv: Any
    o: Any
    gate_up: Any
    down: Any
    norms: tuple  # module refs: llama (input, post_attn); gemma (input, post_attn, pre_ff, post_ff, q_norm, k_norm)
    sliding: bool


class FastEngine:
    """The fast decoder over a loaded HF model. Build it with `get_engine(model, weights)` (cached on the model).

    Args:
        model: `LlamaForCausalLM` or `Gemma3ForCausalLM`, float32, CPU, eval mode.
        weights (`str`): ``"fp32"`` (the model's own tensors) or ``"int4"``.
        group (`int`, defaults to 32): group size when quantizing from fp32 (32-128).
        min_int4_weights (`int`, defaults to 250_000): matrices (after fusion) smaller than this stay fp32.
        head (`str`, defaults to ``"int4x2"``): the LM head in int4 mode: ``"int4x2"`` (int4 codes plus an int4
            residual: two kernel calls, ~8-bit accuracy; KL to fp32 ~5e-4 on SmolLM2), ``"int4"`` (KL ~0.05: the
            head is the one matrix the GGUF keeps at 8 bits) or ``"fp32"``.
        gguf_path (`str`, *optional*): a GGUF file whose Q4_* blocks to use when they match the model's weights.
        disk_cache (`bool`, *optional*): keep the packed int4 weights under ``$LMLAB_CACHE/engines/``, keyed by a
            hash of the model's weights and these settings (a rebuild takes ~5-45 s, a load ~1 s). Default: on for
            int4 engines of lmlab's named models (`load_model` aliases), off otherwise.
    """

    def __init__(
        self,
        model: Any,
        weights: str = "fp32",
        *,
        group: int = 32,
        min_int4_weights: int = 250_000,
        head: str = "int4x2",
        gguf_path: str | None = None,
        disk_cache: bool | None = None,
    ) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise EngineUnsupported(reason)
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
        if weights == "int4" and not int4_available():
            raise EngineUnsupported("this torch build has no CPU int4 kernel (aten._weight_int4pack_mm_for_cpu)")
        self.model = model
        self.weights = weights
        self.arch = ARCHS[type(model).__name__]
        cfg = model.config
        self.cfg = cfg
        self.n_layers = cfg.num_hidden_layers
        self.hidden = cfg.hidden_size
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden // self.n_heads
        self.vocab = cfg.vocab_size
        inner = model.model
        self.embed = inner.embed_tokens
        self.final_norm = inner.norm
        self.head = model.get_output_embeddings()
        if self.arch == "gemma3":
            self.layer_types = ["sliding" if t == "sliding_attention" else "full" for t in cfg.layer_types]
            self.window = int(cfg.sliding_window)
            self.scaling = cfg.query_pre_attn_scalar**-0.5
            self.softcap = getattr(cfg, "final_logit_softcapping", None)
            rot = inner.rotary_emb
            # HF builds a rope table only per layer type present (a gemma3 without sliding layers has none)
            self._inv_freq = {
                t: (
                    getattr(rot, f"{t}_attention_inv_freq").float(),
                    float(getattr(rot, f"{t}_attention_attention_scaling")),
                )
                for t in sorted(set(self.layer_types))
            }
        else:
            self.layer_types = ["full"] * self.n_layers
            self.window = 0
            self.scaling = self.head_dim**-0.5
            self.softcap = None
            rot = inner.rotary_emb
            self._inv_freq = {"full": (rot.inv_freq.float(), float(getattr(rot, "attention_scaling", 1.0)))}
        self.has_sliding = "sliding" in self.layer_types
        self._rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rope_len = 0
        self.group = group
        self.min_int4_weights = min_int4_weights
        self.gguf_used: list[str] = []
        self.quantized: list[str] = []
        if disk_cache is None:
            disk_cache = weights == "int4" and bool(getattr(model, "lmlab_spec", None))
        cache_file = self._cache_file(head, gguf_path) if (disk_cache and weights == "int4") else None
        saved = _load_state(cache_file)
        gguf = _GGUFCodes(gguf_path, self) if (weights == "int4" and gguf_path and saved is None) else None
        self.layers: list[_Layer] = []
        for i, layer in enumerate(inner.layers):
            a, m = layer.self_attn, layer.mlp
            if self.arch == "gemma3":
                norms = (
                    layer.input_layernorm,
                    layer.post_attention_layernorm,
                    layer.pre_feedforward_layernorm,
                    layer.post_feedforward_layernorm,
                    a.q_norm,
                    a.k_norm,
                )
            else:
                norms = (layer.input_layernorm, layer.post_attention_layernorm)
            groups = {
                "qkv": [("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj)],
                "o": [("o", a.o_proj)],
                "gate_up": [("gate", m.gate_proj), ("up", m.up_proj)],
                "down": [("down", m.down_proj)],
            }
            if saved is not None:
                projs = {
                    name: _Fp32Proj([mod for _, mod in parts])
                    if saved["layers"][i][name] is None
                    else _Int4Proj(
                        None, saved["layers"][i][name]["splits"], Int4Linear.from_state(saved["layers"][i][name])
                    )
                    for name, parts in groups.items()
                }
            else:
                projs = {name: self._proj(i, parts, gguf) for name, parts in groups.items()}
            self.layers.append(_Layer(**projs, norms=norms, sliding=self.layer_types[i] == "sliding"))
        if head not in ("fp32", "int4", "int4x2"):
            raise ValueError(f"head must be one of fp32, int4, int4x2, got {head!r}")
        self.head_int4: list[Int4Linear] = []
        hn, hk = self.head.weight.shape
        if saved is not None:
            self.head_int4 = [Int4Linear.from_state(h) for h in saved["head"]]
            self.gguf_used, self.quantized = list(saved["gguf_used"]), list(saved["quantized"])
        elif weights == "int4" and head != "fp32" and hn * hk >= min_int4_weights and hn % 16 == 0 and hk % group == 0:
            w = self.head.weight.detach()
            codes = quantize(w, group)
            self.head_int4.append(Int4Linear(codes))
            if head == "int4x2":
                self.head_int4.append(Int4Linear(quantize(w - codes.dequantize(), group)))
            self.quantized.append("lm_head")
        self.head_mode = head if self.head_int4 else "fp32"
        self.signature = _signature(model)
        self.loaded_from_disk = saved is not None
        if cache_file is not None and saved is None:
            _save_state(cache_file, self._state())

    def _cache_file(self, head: str, gguf_path: str | None) -> Path:
        import hashlib

        from lmlab.core.inference.models import cache_root

        h = hashlib.blake2b(digest_size=16)
        h.update(
            repr((torch.__version__, self.arch, self.group, self.min_int4_weights, head, bool(gguf_path))).encode()
        )
        for name, p in self.model.named_parameters():
            h.update(f"{name}{tuple(p.shape)}".encode())
            h.update(memoryview(p.detach().contiguous().numpy()).cast("B"))
        return cache_root() / "engines" / f"{type(self.model).__name__}-int4-{h.hexdigest()}.pt"

    def _state(self) -> dict:
        def proj(p: Any) -> dict | None:
            return None if isinstance(p, _Fp32Proj) else {**p.lin.state(), "splits": list(p.splits)}

        layers = [{n: proj(getattr(layer, n)) for n in ("qkv", "o", "gate_up", "down")} for layer in self.layers]
        return {"layers": layers, "head": [h.state() for h in self.head_int4], "gguf_used": self.gguf_used,
                "quantized": self.quantized}  # fmt: skip

    # --- construction helpers --------------------------------------------------------------------------------

    def _proj(self, layer: int, parts: list[tuple[str, torch.nn.Linear]], gguf: _GGUFCodes | None) -> Any:
        mods = [m for _, m in parts]
        n = sum(m.weight.shape[0] for m in mods)
        k = mods[0].weight.shape[1]
        if self.weights == "fp32" or n * k < self.min_int4_weights or k % self.group or n % 16:
            return _Fp32Proj(mods)
        codes = []
        for name, mod in parts:
            c = gguf.codes(layer, name, mod.weight) if gguf is not None else None
            if c is None:
                c = quantize(mod.weight.detach(), self.group)
                self.quantized.append(f"layers.{layer}.{name}")
            else:
                self.gguf_used.append(f"layers.{layer}.{name}")
            codes.append(c)
        if len({c.group for c in codes}) != 1:  # mixed GGUF / quantized groups: requantize all for one kernel call
            codes = [quantize(m.weight.detach(), self.group) for m in mods]
        return _Int4Proj(Int4Codes.cat(codes), [m.weight.shape[0] for m in mods])

    def is_stale(self) -> bool:
        """True if the model's parameters were replaced or modified in place since the engine was built."""
        return _signature(self.model) != self.signature

    def describe(self) -> dict[str, Any]:
        """What runs where: per-projection precision, GGUF-sourced vs quantized matrices, weight bytes per token."""
        kinds: dict[str, str] = {}
        for name in ("qkv", "o", "gate_up", "down"):
            kinds[name] = getattr(self.layers[0], name).kind
        kinds["lm_head"] = self.head_mode
        return {
            "arch": self.arch,
            "weights": self.weights,
            "projections": kinds,
            "gguf_matrices": len(self.gguf_used),
            "quantized_matrices": len(self.quantized),
            "group": self.group,
            "min_int4_weights": self.min_int4_weights,
            "weight_bytes_per_token": self.weight_bytes_per_token(),
        }

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (all projections and the head; the embedding row is negligible)."""
        total = 0
        for layer in self.layers:
            total += sum(p.nbytes for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
        total += sum(h.nbytes for h in self.head_int4) if self.head_int4 else self.head.weight.numel() * 4
        return total

    # --- rope ----------------------------------------------------------------------------------------------------

    def _rope_tables(self, needed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if needed > self._rope_len:
            n = max(needed, 2 * self._rope_len, 256)
            pos = torch.arange(n, dtype=torch.float32)
            for t, (inv, scale) in self._inv_freq.items():
                freqs = pos[:, None] * inv[None, :]
                emb = torch.cat((freqs, freqs), dim=-1)
                sin = emb.sin() * scale
                half = sin.shape[-1] // 2
                self._rope[t] = (emb.cos() * scale, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))
            self._rope_len = n
        return self._rope

    # --- cache ---------------------------------------------------------------------------------------------------

    def new_cache(self, batch: int = 1, capacity: int = 256, pad: Sequence[int] | None = None) -> KVCache:
        return KVCache(self, batch, capacity, pad)

    # --- forward -------------------------------------------------------------------------------------------------

    def _norm(self, mod: Any, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm computes x * rsqrt(mean(x^2) + eps) * w in float32: bitwise HF's Llama/Gemma3 RMSNorm here
        if self.arch == "gemma3":
            return F.rms_norm(x.float(), x.shape[-1:], 1.0 + mod.weight.float(), mod.eps)
        return F.rms_norm(x, x.shape[-1:], mod.weight, mod.variance_epsilon)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """HF's ``x * cos + rotate_half(x) * sin`` as ``x * cos + roll(x, d/2) * [-sin1, sin2]``: same products."""
        return x * cos + torch.roll(x, x.shape[-1] // 2, -1) * sin_signed

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: KVCache, *, all_logits: bool = False) -> torch.Tensor:
        """Feed `tokens` ([batch, L] ids, appended at column ``cache.length``); float32 logits of the last position
        ([batch, vocab]) or of every position (``all_logits``: [batch, L, vocab])."""
        B, L = tokens.shape
        if B != cache.batch:
            raise ValueError(f"tokens have batch {B} but the cache was made for batch {cache.batch}")
        s = cache.length
        end = s + L
        cache.ensure(end)
        ropes = self._rope_tables(end)
        x = F.embedding(tokens, self.embed.weight)
        if self.arch == "gemma3":
            x = x * self.embed.embed_scale.to(x.dtype)
        cols = torch.arange(s, end)
        if cache.padded:
            pos = (cols[None, :] - cache.pad[:, None]).clamp_min(0)  # [B, L]
            rope = {t: (c[pos][:, :, None], sn[pos][:, :, None]) for t, (c, sn) in ropes.items()}  # [B, L, 1, D]
        else:
            rope = {t: (c[s:end, None], sn[s:end, None]) for t, (c, sn) in ropes.items()}  # [L, 1, D]
        # masks (True = attend)
        qcol = cols[None, :, None]  # [1, L, 1]
        full_mask = None
        if cache.padded or L > 1:
            kcol = torch.arange(end)[None, None, :]
            full_mask = kcol <= qcol
            if cache.padded:
                full_mask = full_mask & (kcol >= cache.pad[:, None, None])
                full_mask = full_mask | (kcol == qcol)  # a pad query attends to itself only (no NaN rows)
            full_mask = full_mask[:, None]  # [B or 1, 1, L, end]
        slide_mask = None
        pack_gqa = False
        if self.has_sliding:
            W = self.window
            # keys: the ring unrolled into time order (columns [lo, s)), then the new ones: HF's key sequence
            lo = max(0, s - (W - 1))
            if cache.padded or L > 1:
                kcol = torch.arange(lo, end)[None, None, :]
                slide_mask = (kcol <= qcol) & (kcol > qcol - W)
                if cache.padded:
                    slide_mask = (slide_mask & (kcol >= cache.pad[:, None, None])) | (kcol == qcol)
                slide_mask = slide_mask[:, None]  # [B or 1, 1, L, end - lo]
            # (one unpadded new token sees all of [s - W + 1, s]: no mask, as for full layers)
            pack_gqa = L == 1 and not cache.padded and s >= W - 1 and self.n_kv != self.n_heads
            n_keep = min(L, W - 1)
            write_slots = torch.arange(end - n_keep, end) % (W - 1)
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        gemma = self.arch == "gemma3"
        for i, layer in enumerate(self.layers):
            h = self._norm(layer.norms[0], x).view(B * L, -1)
            q, k, v = layer.qkv(h)
            cos, sin = rope["sliding" if layer.sliding else "full"]
            if gemma:  # per-head q/k norms first, then rope: [B, L, H, D] layout
                q = self._rotate(self._norm(layer.norms[4], q.view(B, L, nh, hd)), cos, sin).transpose(1, 2)
                k = self._rotate(self._norm(layer.norms[5], k.view(B, L, nkv, hd)), cos, sin).transpose(1, 2)
            else:  # one rope over q and k together
                qk = self._rotate(torch.cat((q, k), dim=-1).view(B, L, nh + nkv, hd), cos, sin).transpose(1, 2)
                q, k = qk[:, :nh], qk[:, nh:]
            v = v.view(B, L, nkv, hd).transpose(1, 2)
            if layer.sliding:
                keys = torch.cat((*cache.ring_parts(cache.k[i], s), k), dim=2)  # [B, kv, end - lo, D]
                vals = torch.cat((*cache.ring_parts(cache.v[i], s), v), dim=2)
                mask = slide_mask
                cache.k[i][:, :, write_slots] = k[:, :, L - n_keep :]
                cache.v[i][:, :, write_slots] = v[:, :, L - n_keep :]
            else:
                cache.k[i][:, :, s:end] = k
                cache.v[i][:, :, s:end] = v
                keys = cache.k[i][:, :, :end]
                vals = cache.v[i][:, :, :end]
                mask = full_mask
            if layer.sliding and pack_gqa:
                # one query against a full window: HF keeps its (all-True) mask there, and with a mask it packs
                # each kv group's query heads as rows, [B, kv, nh / kv, D], instead of enable_gqa's [B, nh, 1, D];
                # the kernel rounds the two layouts differently, so use HF's (the all-True mask changes nothing)
                attn = F.scaled_dot_product_attention(q.reshape(B, nkv, nh // nkv, hd), keys, vals, scale=self.scaling)
                attn = attn.reshape(B, nh, 1, hd)
            else:
                attn = F.scaled_dot_product_attention(
                    q, keys, vals, attn_mask=mask, scale=self.scaling, enable_gqa=nkv != nh
                )
            attn = attn.transpose(1, 2).reshape(B * L, nh * hd)
            (o,) = layer.o(attn)
            if gemma:
                o = self._norm(layer.norms[1], o)
            x = x + o.view(B, L, -1)
            h = self._norm(layer.norms[2] if gemma else layer.norms[1], x).view(B * L, -1)
            g, u = layer.gate_up(h)
            act = F.gelu(g, approximate="tanh") if gemma else F.silu(g)
            (d,) = layer.down(act * u)
            if gemma:
                d = self._norm(layer.norms[3], d)
            x = x + d.view(B, L, -1)
        cache.length = end
        if not all_logits:
            x = x[:, -1]
        x = self._norm(self.final_norm, x)
        if self.head_int4:
            shape = x.shape
            xb = x.reshape(-1, shape[-1]).to(torch.bfloat16)
            logits = self.head_int4[0](xb).float()
            for extra in self.head_int4[1:]:
                logits = logits + extra(xb).float()
            logits = logits.view(*shape[:-1], -1)
        else:
            logits = F.linear(x, self.head.weight)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def forward_tokens(self, tokens: Sequence[int], cache: KVCache) -> torch.Tensor:
        """One sequence (batch-1 cache): feed `tokens`, return the last position's logits, (vocab,) float32."""
        return self.forward(torch.tensor([list(tokens)], dtype=torch.long), cache)[0]


# ----------------------------------------------------------------------------------------------------------------
# GGUF 4-bit codes for the engine's matrices

_GGUF_NAMES = {
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
}


class _GGUFCodes:
    """Q4_0 / Q4_1 / Q4_K tensors of a GGUF file, used for a matrix only if they dequantize to the model's weight."""

    def __init__(self, path: str, engine: FastEngine) -> None:
        from lmlab.core.inference.engine.gguf_file import GGUFIndex

        self.index = GGUFIndex(path)
        self.engine = engine
        self.mismatches = 0

    def codes(self, layer: int, name: str, weight: torch.Tensor) -> Int4Codes | None:
        t = self.index.tensors.get(f"blk.{layer}.{_GGUF_NAMES[name]}.weight")
        if t is None or t.kind not in ("Q4_0", "Q4_1", "Q4_K"):
            return None
        n, k = weight.shape
        if t.shape != (k, n):
            return None
        codes = codes_from_gguf(t.kind, self.index.blocks(t.name), k)
        e = self.engine
        if e.arch == "llama" and name in ("q", "k"):  # undo llama.cpp's rope row permutation (as HF does)
            heads = e.n_heads if name == "q" else e.n_kv
            perm = torch.arange(n).view(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)
            codes = codes.rows(perm)
        w = weight.detach()
        tol = 1e-5 * max(float(w.abs().max()), 1e-6)
        if float(codes.dequantize().sub_(w).abs_().max()) > tol:
            self.mismatches += 1
            return None
        return codes


def _load_state(path: Path | None) -> dict | None:
    if path is None or not path.is_file():
        return None
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged cache file is rebuilt
        logger.warning("engine cache %s unreadable (%s); rebuilding it", path, e)
        return None


def _save_state(path: Path, state: dict) -> None:
    import os
    import uuid

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("could not write the engine cache %s: %s", path, e)


# ----------------------------------------------------------------------------------------------------------------
# Engine cache on the model


def gguf_source(model: Any) -> str | None:
    """The GGUF file a packaged model was dequantized from (SmolLM2, Gemma-3), if installed; else None."""
    spec = getattr(model, "lmlab_spec", None)
    try:
        if spec == "smollm2-135m":
            from lmlab.core.inference.models import smollm2_gguf

            return str(smollm2_gguf())
        if spec == "gemma3-270m":
            from lmlab.core.inference.models import assemble_gemma3_gguf

            return str(assemble_gemma3_gguf())
    except Exception as e:  # noqa: BLE001 - a missing package only means: quantize from fp32
        logger.info("no GGUF source for %s (%s): int4 weights are quantized from fp32", spec, e)
    return None


def get_engine(model: Any, weights: str = "fp32", **kwargs: Any) -> FastEngine:
    """The engine for `model` (built once and cached on the model; rebuilt if its parameters changed).

    Raises `EngineUnsupported` with the reason when the model cannot run on the fast engine.
    """
    reason = unsupported_reason(model)
    if reason:
        raise EngineUnsupported(reason)
    store = model.__dict__.setdefault("_lmlab_engines", {})
    key = (weights, tuple(sorted(kwargs.items())))
    engine = store.get(key)
    if engine is not None and engine.model is model and not engine.is_stale():  # (a deep copy carries the dict)
        return engine
    if weights == "int4" and "gguf_path" not in kwargs:
        kwargs = {**kwargs, "gguf_path": gguf_source(model)}
    engine = FastEngine(model, weights, **kwargs)
    store[key] = engine
    return engine


def weight_bytes_fp32(model: Any) -> int:
    """Bytes an fp32 decode step reads: all non-embedding weights plus the head (tied: counted once)."""
    from lmlab.core.inference.models import flop_params

    return int(flop_params(model)) * 4
