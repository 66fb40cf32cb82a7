"""The fast decode engine on tiny models: exactness against transformers, the int4 path, the static cache,
batched decode, GGUF 4-bit blocks, and the HF fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.engine import (
    EngineUnsupported,
    FastEngine,
    Int4Codes,
    Int4Linear,
    codes_from_gguf,
    default_engine,
    get_engine,
    parse_engine,
    quantize,
    set_default_engine,
    unsupported_reason,
)
from lmlab.core.inference.generation import (
    DecodeState,
    Rewind,
    decode,
    decode_batch,
    decode_many,
    hf_generate,
    resolve_engine,
)
from lmlab.core.inference.tiny import make_tiny_model

PROMPTS = ["Hello world", "The quick brown fox", "x", "A prompt longer than the sliding window"]


@pytest.fixture(params=["llama", "gemma3"])
def arch(request):
    return request.param


@pytest.fixture()
def model(arch, tiny_llama, tiny_gemma):
    return tiny_llama if arch == "llama" else tiny_gemma


def hf_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


# --- fp32 engine: the same numbers as transformers ------------------------------------------------------------


CHUNKINGS = [(40,), (25, 1, 1, 13), (1,) * 40, (10, 20, 10), (15, 1, 1, 23)]


@pytest.fixture(scope="module")
def sdpa_models():
    """The tiny models with transformers' default attention (SDPA, what SmolLM2 / Gemma load with), not eager."""
    return {arch: make_tiny_model(0, arch=arch, attn_implementation="sdpa") for arch in ("llama", "gemma3")}


def _ids(n: int = 40, seed: int = 1) -> list[int]:
    return torch.randint(4, 260, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine_chunks(e, ids, chunks, capacity=7):
    cache = e.new_cache(1, capacity=capacity)  # small on purpose: the cache grows
    got, at = [], 0
    for n in chunks:
        got.append(e.forward(torch.tensor([ids[at : at + n]]), cache, all_logits=True)[0])
        at += n
    assert cache.get_seq_length() == at
    return torch.cat(got)


@torch.no_grad()
def _hf_chunks(model, ids, chunks):
    from transformers import DynamicCache

    from lmlab.core.inference.generation import cache_kwargs

    cache = DynamicCache(config=model.config)
    got, at = [], 0
    for n in chunks:
        got.append(model(input_ids=torch.tensor([ids[at : at + n]]), **cache_kwargs(model, cache)).logits[0])
        at += n
    return torch.cat(got)


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_fp32_logits_bitwise_equal_hf_fed_the_same_chunks(sdpa_models, arch, chunks):
    """The documented claim: fp32 engine logits are bitwise transformers' (SDPA, same thread count) when HF is fed
    the same chunks with its DynamicCache, for any chunking, incl. gemma's sliding window of 16 being reached and
    crossed inside a chunk and token by token (the ring read in time order; HF's packed-GQA single-query path)."""
    model = sdpa_models[arch]
    ids = _ids()
    got = _engine_chunks(get_engine(model, "fp32"), ids, chunks)
    ref = _hf_chunks(model, ids, chunks)
    assert torch.equal(got, ref), float((got - ref).abs().max())


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_fp32_logits_close_to_hf_in_any_other_chunking_or_attention(model, sdpa_models, arch, chunks):
    """Not bitwise, and why: against HF's one-piece forward (a GEMM over 1 row rounds differently from one over 40)
    and against HF's eager attention (matmul + softmax instead of the fused SDPA kernel) the logits differ by
    rounding only (measured <= 1.2e-4 on the tiny llama, whose logits reach ~40; <= 3e-6 on the tiny gemma)."""
    ids = _ids()
    for m in (model, sdpa_models[arch]):  # eager (the session fixture) and SDPA
        got = _engine_chunks(get_engine(m, "fp32"), ids, chunks)
        torch.testing.assert_close(got, hf_logits(m, ids), atol=2e-4, rtol=0)


def test_decode_fast_equals_hf_engine_and_generate(model, tiny_tokenizer, arch):
    for prompt in PROMPTS:
        fast = decode(model, tiny_tokenizer, prompt, max_new_tokens=24, engine="fast")
        hf = decode(model, tiny_tokenizer, prompt, max_new_tokens=24, engine="hf")
        assert fast.token_ids == hf.token_ids
        assert fast.entropies == pytest.approx(hf.entropies, abs=1e-4)
        assert fast.token_logprobs == pytest.approx(hf.token_logprobs, abs=1e-4)
        assert (fast.n_forward_calls, fast.n_forward_tokens) == (hf.n_forward_calls, hf.n_forward_tokens)
        gen = hf_generate(model, tiny_tokenizer, [prompt], max_new_tokens=24)[0]
        assert fast.token_ids == gen.token_ids


def test_fp32_engine_shares_the_model_weights(tiny_tokenizer):
    """Zero-copy: an in-place change of the HF weights is seen by the fp32 engine at once."""
    m = make_tiny_model(3)
    e = get_engine(m, "fp32")
    before = decode(m, tiny_tokenizer, "Hello", max_new_tokens=6, engine="fast").token_ids
    with torch.no_grad():
        m.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
        m.lm_head.weight.add_(0.3)
    after = decode(m, tiny_tokenizer, "Hello", max_new_tokens=6, engine="fast")
    assert after.token_ids == decode(m, tiny_tokenizer, "Hello", max_new_tokens=6, engine="hf").token_ids
    assert after.token_ids != before
    assert get_engine(m, "fp32") is not e  # in-place edits bumped the version counters: rebuilt
    import copy

    twin = copy.deepcopy(m)  # carries the cached engines along: they must not serve the copy
    with torch.no_grad():
        twin.lm_head.weight.mul_(-1.0)
    assert get_engine(twin, "fp32").model is twin
    assert decode(twin, tiny_tokenizer, "Hello", max_new_tokens=6, engine="fast").token_ids == (
        decode(twin, tiny_tokenizer, "Hello", max_new_tokens=6, engine="hf").token_ids
    )


def test_rewind_and_callbacks_on_fast_engine(model, tiny_tokenizer, arch):
    base = decode(model, tiny_tokenizer, PROMPTS[0], max_new_tokens=20, engine="fast")
    fired = []

    def cb(state: DecodeState):
        if state.step == 8 and not fired:
            fired.append(1)
            return Rewind(5)
        return None

    out = decode(model, tiny_tokenizer, PROMPTS[0], max_new_tokens=20, engine="fast", step_callback=cb)
    assert fired and out.token_ids == base.token_ids
    hf = decode(model, tiny_tokenizer, PROMPTS[0], max_new_tokens=20, engine="hf", step_callback=_rewind_once(8, 5))
    assert out.n_forward_tokens == hf.n_forward_tokens  # the same cache contract (crop / re-prefill) as HF's


def _rewind_once(step, k):
    fired = []

    def cb(state):
        if state.step == step and not fired:
            fired.append(1)
            return Rewind(k)
        return None

    return cb


def test_meter_counts_like_hf(tiny_llama, tiny_tokenizer):
    counts = {}
    for engine in ("fast", "hf"):
        meter = ComputeMeter()
        decode(tiny_llama, tiny_tokenizer, PROMPTS[1], max_new_tokens=9, engine=engine, meter=meter, meter_name="m")
        c = meter.models["m"]
        counts[engine] = (c.forward_calls, c.prefill_tokens, c.decode_tokens, c.flops)
        assert c.wall_s > 0
    assert counts["fast"] == counts["hf"]


# --- the static KV cache ---------------------------------------------------------------------------------------


def test_cache_crop_is_o1_and_clone_is_private(tiny_llama):
    e = get_engine(tiny_llama, "fp32")
    ids = list(range(10, 40))
    cache = e.new_cache(1, 64)
    e.forward(torch.tensor([ids]), cache)
    buffer = cache.k[0]
    fork = cache.clone()
    assert cache.crop(12) and cache.get_seq_length() == 12 and cache.k[0] is buffer  # no copy: only the length
    logits = e.forward_tokens(ids[12:20], cache)
    fresh = e.new_cache(1, 8)
    torch.testing.assert_close(logits, e.forward_tokens(ids[:20], fresh), atol=1e-5, rtol=0)
    assert fork.get_seq_length() == 30
    ref = e.forward_tokens(ids + [5], e.new_cache(1, 4))
    torch.testing.assert_close(e.forward_tokens([5], fork), ref, atol=1e-4, rtol=0)
    assert not cache.crop(25)  # cannot crop forward


def test_sliding_ring_follows_hf_crop_contract(tiny_gemma):
    e = get_engine(tiny_gemma, "fp32")
    assert e.window == 16 and e.has_sliding
    cache = e.new_cache(1, 64)
    e.forward(torch.tensor([list(range(10, 25))]), cache)  # 15 < 16 columns: still croppable
    assert cache.crop(10)
    e.forward(torch.tensor([list(range(30, 40))]), cache)  # 20 columns: the ring has dropped early keys
    assert not cache.crop(10) and cache.get_seq_length() == 20
    hf_cache, held = cache.to_hf(tiny_gemma, 10)
    assert held == 0 and hf_cache.get_seq_length() == 0


def test_gemma3_without_sliding_layers():
    """A gemma3 whose layers are all full attention has no sliding rope table (HF builds one per layer type present):
    the engine used to look it up and crash with AttributeError."""
    m = make_tiny_model(0, arch="gemma3", n_layers=1, attn_implementation="sdpa")
    assert m.config.layer_types == ["full_attention"]
    e = get_engine(m, "fp32")
    assert not e.has_sliding
    ids = _ids(20)
    assert torch.equal(_engine_chunks(e, ids, (12, 1, 7)), _hf_chunks(m, ids, (12, 1, 7)))


def test_sliding_crop_at_the_wrap_boundary(sdpa_models):
    """window - 1 = 15 columns fill the ring without dropping any: still croppable; the 16th drops column 0."""
    model = sdpa_models["gemma3"]
    e = get_engine(model, "fp32")
    ids = _ids(30)
    cache = e.new_cache(1, 64)
    e.forward(torch.tensor([ids[:15]]), cache)
    assert cache.can_crop(3) and cache.crop(3)
    torch.testing.assert_close(e.forward_tokens(ids[3:20], cache), e.forward_tokens(ids[:20], e.new_cache(1, 4)))
    cache = e.new_cache(1, 64)
    e.forward(torch.tensor([ids[:16]]), cache)
    assert not cache.can_crop(15) and not cache.crop(15) and cache.get_seq_length() == 16
    assert cache.can_crop(16) and cache.crop(16)  # a no-op is always possible


@pytest.mark.parametrize("length", [15, 16, 17, 30, 31, 45])
def test_to_hf_after_the_sliding_window_wrapped_continues_like_the_engine(sdpa_models, length):
    """Decode past the sliding window (16) in the engine, hand the cache to HF with `to_hf`, continue in HF: the
    logits equal the engine's own continuation bitwise (the ring handed over in time order, HF's position count at
    `length`). The old slot-order hand-over scrambled the window once it wrapped (length >= 16)."""
    model = sdpa_models["gemma3"]
    e = get_engine(model, "fp32")
    ids = _ids(length + 6, seed=3)
    cache = e.new_cache(1, 8)
    e.forward(torch.tensor([ids[:5]]), cache)
    for t in ids[5:length]:  # token by token past the window: the ring wraps (several times for 45)
        e.forward(torch.tensor([[t]]), cache)
    hf_cache, held = cache.to_hf(model, length)
    assert held == length and hf_cache.get_seq_length() == length
    from lmlab.core.inference.generation import cache_kwargs

    rest = ids[length:]
    with torch.no_grad():
        hf_step = model(input_ids=torch.tensor([rest[:1]]), **cache_kwargs(model, hf_cache)).logits[0]
        hf_more = model(input_ids=torch.tensor([rest[1:]]), **cache_kwargs(model, hf_cache)).logits[0]
    eng = cache.clone()
    eng_step = e.forward(torch.tensor([rest[:1]]), eng, all_logits=True)[0]
    eng_more = e.forward(torch.tensor([rest[1:]]), eng, all_logits=True)[0]
    assert torch.equal(hf_step, eng_step) and torch.equal(hf_more, eng_more)
    # and both equal HF decoding the whole sequence itself in the same chunks
    ref = _hf_chunks(model, ids, (5,) + (1,) * (length - 5) + (1, len(rest) - 1))
    assert torch.equal(ref[length:], torch.cat((eng_step, eng_more)))


# --- batched decode --------------------------------------------------------------------------------------------


def test_decode_batch_equals_decode_many(model, tiny_tokenizer):
    outs = decode_batch(model, tiny_tokenizer, PROMPTS, max_new_tokens=12, batch_size=3)
    ref = decode_many(model, tiny_tokenizer, PROMPTS, max_new_tokens=12, engine="hf")
    for o, r in zip(outs, ref):
        assert o.prompt_ids == r.prompt_ids
        assert o.token_ids == r.token_ids
        assert o.entropies == pytest.approx(r.entropies, abs=1e-4)
        assert o.token_logprobs == pytest.approx(r.token_logprobs, abs=1e-4)
        assert o.text == r.text and o.stop_reason == r.stop_reason


def test_decode_batch_sampling_and_stops(tiny_llama, tiny_tokenizer):
    kw = dict(max_new_tokens=10, do_sample=True, seed=4)
    outs = decode_batch(tiny_llama, tiny_tokenizer, PROMPTS[:3], batch_size=2, **kw)
    ref = decode_many(tiny_llama, tiny_tokenizer, PROMPTS[:3], **kw)
    assert [o.token_ids for o in outs] == [r.token_ids for r in ref]
    base = decode(tiny_llama, tiny_tokenizer, "The", max_new_tokens=20)
    assert base.text.startswith("ssss")
    stopped = decode_batch(tiny_llama, tiny_tokenizer, ["The", "Hello world"], max_new_tokens=20, stop_strings=["sss"])
    assert (
        stopped[0].stop_reason == "stop_string"
        and stopped[0].text == ""
        and stopped[0].token_ids == base.token_ids[:3]
    )
    i = next(j for j in range(1, 20) if base.token_ids[j] not in base.token_ids[:j])  # a token seen first at j
    eos = decode_batch(tiny_llama, tiny_tokenizer, ["The"], max_new_tokens=20, eos_token_id=[base.token_ids[i]])
    assert eos[0].stop_reason == "eos" and eos[0].token_ids == base.token_ids[: i + 1]
    with pytest.raises(ValueError, match="batch_size"):
        decode_batch(tiny_llama, tiny_tokenizer, ["x"], batch_size=0)


# --- int4 ------------------------------------------------------------------------------------------------------


def test_int4_linear_matches_its_dequantized_weight():
    torch.manual_seed(0)
    w = torch.randn(96, 128)
    for group in (32, 64, 128):
        codes = quantize(w, group)
        assert codes.q.min() >= 0 and codes.q.max() <= 15
        deq = codes.dequantize()
        assert (deq - w).abs().max() <= codes.scale.max() / 2 + 1e-6  # round to nearest
        lin = Int4Linear(codes)
        x = torch.randn(3, 128)
        y = lin(x.to(torch.bfloat16)).float()
        ref = x.to(torch.bfloat16).float() @ lin.dequantize().t()
        torch.testing.assert_close(y, ref, atol=0.05 * float(ref.abs().max()), rtol=0)
        torch.testing.assert_close(lin.dequantize(), deq, atol=0.01 * float(deq.abs().max()), rtol=0)
    with pytest.raises(ValueError, match="group"):
        quantize(w, 48)


def _q4_1_bytes(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Pack codes [N, K] with per-32 d, m (float16) into ggml Q4_1 blocks, uint8 [N, K / 32 * 20]."""
    n, k = q.shape
    blocks = q.reshape(n, k // 32, 32).astype(np.uint8)
    qs = blocks[..., :16] | (blocks[..., 16:] << 4)
    dm = np.stack([d.astype(np.float16), m.astype(np.float16)], -1).view(np.uint8).reshape(n, k // 32, 4)
    return np.concatenate([dm, qs], -1).reshape(n, -1)


def test_gguf_block_decoders_match_gguf_reference():
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    n, k = 16, 256
    q = rng.integers(0, 16, (n, k))
    d = rng.uniform(0.01, 0.1, (n, k // 32)).astype(np.float16)
    m = rng.uniform(-0.5, 0.0, (n, k // 32)).astype(np.float16)
    raw = _q4_1_bytes(q, d, m)
    c = codes_from_gguf("Q4_1", raw, k)
    assert torch.equal(c.q, torch.from_numpy(q.astype(np.int32)))
    np.testing.assert_allclose(c.dequantize().numpy(), dequantize(raw, T.Q4_1), atol=1e-6)
    q40 = np.concatenate([raw.reshape(n, k // 32, 20)[..., :2], raw.reshape(n, k // 32, 20)[..., 4:]], -1)
    np.testing.assert_allclose(
        codes_from_gguf("Q4_0", q40.reshape(n, -1), k).dequantize().numpy(),
        dequantize(q40.reshape(n, -1), T.Q4_0),
        atol=1e-6,
    )
    # Q4_K: random 6-bit scales/mins and codes, finite float16 super-block scales
    sb = k // 256
    blk = rng.integers(0, 256, (n, sb, 144)).astype(np.uint8)
    blk[..., 0:2] = np.full((n, sb, 1), 0.02, np.float16).view(np.uint8)
    blk[..., 2:4] = np.full((n, sb, 1), 0.01, np.float16).view(np.uint8)
    raw_k = blk.reshape(n, -1)
    np.testing.assert_allclose(
        codes_from_gguf("Q4_K", raw_k, k).dequantize().numpy(), dequantize(raw_k, T.Q4_K), atol=1e-5
    )
    with pytest.raises(ValueError, match="4-bit"):
        codes_from_gguf("Q8_0", raw, k)


def _snap_to_q4_1(w: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """Round `w` [N, K] onto a Q4_1 grid with float16 d, m; return (dequantized fp32, q, d, m) like ggml stores."""
    c = quantize(w, 32)
    d = c.scale.numpy().astype(np.float16)
    m = (c.zero - 8 * c.scale).numpy().astype(np.float16)
    q = c.q.numpy()
    deq = torch.from_numpy(
        (d.astype(np.float32)[..., None] * q.reshape(*d.shape, 32) + m.astype(np.float32)[..., None]).reshape(w.shape)
    )
    return deq.float(), q, d, m


def test_int4_engine_runs_gguf_q4_1_blocks_exactly(tmp_path, tiny_tokenizer):
    """A tiny llama whose weights are a Q4_1 GGUF's blocks dequantized: the int4 engine takes the codes from the
    file (undoing llama.cpp's q/k row permutation) and reproduces the fp32 model to bf16-activation precision."""
    import gguf

    m = make_tiny_model(5)
    cfg = m.config
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}  # fmt: skip
    for i, layer in enumerate(m.model.layers):
        for hf_name, g_name in names.items():
            mod = getattr(layer.self_attn, hf_name, None) or getattr(layer.mlp, hf_name)
            deq, q, d, mm = _snap_to_q4_1(mod.weight.detach())
            with torch.no_grad():
                mod.weight.copy_(deq)
            if hf_name in ("q_proj", "k_proj"):  # llama.cpp stores q/k rows permuted for its rope layout
                heads = cfg.num_attention_heads if hf_name == "q_proj" else cfg.num_key_value_heads
                n = q.shape[0]
                perm = np.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(n)
                q, d, mm = q[perm], d[perm], mm[perm]
            writer.add_tensor(
                f"blk.{i}.{g_name}.weight", _q4_1_bytes(q, d, mm), raw_dtype=gguf.GGMLQuantizationType.Q4_1
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    e = FastEngine(m, "int4", min_int4_weights=0, gguf_path=str(path))
    assert len(e.gguf_used) == 14 and e.quantized == []
    assert e.describe()["projections"]["qkv"] == "int4"
    ids = tiny_tokenizer("The quick brown fox jumps")["input_ids"]
    ref = hf_logits(m, ids)
    got = e.forward(torch.tensor([ids]), e.new_cache(1, 32), all_logits=True)[0]
    lp, lq = F.log_softmax(ref, -1), F.log_softmax(got, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    # only activation and scale rounding (bf16) differ; the tiny random model's logits are very peaked (std 0.5
    # weights), so this is a loose bound: on SmolLM2 the same path gives KL ~1e-3 (lmlab bench decode)
    assert float(kl.mean()) < 0.02 and float(kl.max()) < 0.1
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8
    # a model whose weights do not match the file: those matrices are quantized from fp32 instead
    with torch.no_grad():
        m.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    e2 = FastEngine(m, "int4", min_int4_weights=0, gguf_path=str(path))
    assert "layers.0.up" in e2.quantized and len(e2.gguf_used) == 13


def test_int4_engine_on_tiny_model_decodes(tiny_tokenizer):
    m = make_tiny_model(0)
    e = get_engine(m, "int4", min_int4_weights=0)
    assert e.describe()["projections"]["gate_up"] == "int4"
    assert e.weight_bytes_per_token() < get_engine(m, "fp32").weight_bytes_per_token()
    cache = e.new_cache(1, 16)
    out = e.forward_tokens(tiny_tokenizer("Hello")["input_ids"], cache)
    assert out.shape == (260,) and torch.isfinite(out).all()
    # the default thresholds keep a tiny model's small matrices in fp32: fast-int4 then equals fast exactly
    a = decode(m, tiny_tokenizer, "Hello", max_new_tokens=8, engine="fast-int4")
    b = decode(m, tiny_tokenizer, "Hello", max_new_tokens=8, engine="fast")
    assert a.token_ids == b.token_ids


# --- engine choice and fallback ----------------------------------------------------------------------------------


def test_engine_names_and_default(monkeypatch):
    assert parse_engine("FAST") == "fast" and parse_engine("int4") == "fast-int4" and parse_engine("hf") == "hf"
    with pytest.raises(ValueError, match="engine must be one of"):
        parse_engine("vllm")
    monkeypatch.delenv("LMLAB_ENGINE", raising=False)
    assert default_engine() == "fast"
    monkeypatch.setenv("LMLAB_ENGINE", "hf")
    assert default_engine() == "hf"
    set_default_engine("fast-int4")
    try:
        assert default_engine() == "fast-int4"
    finally:
        set_default_engine(None)


def test_fallback_to_hf_with_a_reason(tiny_llama, tiny_tokenizer, caplog):
    handle = tiny_llama.model.layers[0].register_forward_hook(lambda *a: None)
    try:
        assert "hook" in unsupported_reason(tiny_llama)
        with pytest.raises(EngineUnsupported, match="hook"):
            get_engine(tiny_llama)
        with caplog.at_level("WARNING"):
            assert resolve_engine(tiny_llama, "fast") is None
        assert any("HF forward" in r.message for r in caplog.records)
        out = decode(tiny_llama, tiny_tokenizer, "Hello", max_new_tokens=5)  # still decodes, through HF
    finally:
        handle.remove()
    assert out.token_ids == decode(tiny_llama, tiny_tokenizer, "Hello", max_new_tokens=5, engine="hf").token_ids
    assert resolve_engine(tiny_llama, "hf") is None
    bf16 = make_tiny_model(0).to(torch.bfloat16)
    assert "float32" in unsupported_reason(bf16)


def test_int4_codes_concatenate():
    a, b = quantize(torch.randn(16, 64)), quantize(torch.randn(32, 64))
    c = Int4Codes.cat([a, b])
    assert c.q.shape == (48, 64)
    torch.testing.assert_close(c.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(ValueError, match="group"):
        Int4Codes.cat([a, quantize(torch.randn(16, 64), 64)])


# --- the CLI (the benchmark: test_bench_decode.py) -------------------------------------------------------------------


def test_cli_engine_and_bench_arguments(capsys, monkeypatch):
    from lmlab.cli import build_parser, main
    from lmlab.registry import get_method
    from lmlab.runner import run_method

    assert main(["bench", "decode", "--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err
    assert build_parser().parse_args(["run", "rsd", "--engine", "fast-int4"]).engine == "fast-int4"
    seen = []

    def fake_experiment(cfg, ctx):
        seen.append(default_engine())
        return ctx.finish([])

    spec = get_method("rsd")
    monkeypatch.setattr(type(spec), "run_function", lambda self: fake_experiment)
    result = run_method("rsd", preset="smoke", write=False, engine="hf")
    assert seen == ["hf"] and result.run_info["engine"] == "hf"
    assert default_engine() == "fast"  # restored after the run


def test_int4_disk_cache_roundtrip(tiny_tokenizer):
    m = make_tiny_model(7)
    built = FastEngine(m, "int4", min_int4_weights=0, disk_cache=True)
    loaded = FastEngine(m, "int4", min_int4_weights=0, disk_cache=True)
    assert not built.loaded_from_disk and loaded.loaded_from_disk
    ids = torch.tensor([tiny_tokenizer("Hello there")["input_ids"]])
    torch.testing.assert_close(
        built.forward(ids, built.new_cache(1, 16)), loaded.forward(ids, loaded.new_cache(1, 16))
    )
    with torch.no_grad():
        m.model.layers[1].mlp.up_proj.weight[0, 0] += 1.0  # any weight change: another cache key
    assert not FastEngine(m, "int4", min_int4_weights=0, disk_cache=True).loaded_from_disk
