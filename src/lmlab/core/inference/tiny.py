"""Tiny randomly initialised models and an offline byte-level tokenizer, built locally for tests.

Nothing here touches a model hub: the tokenizer is built from the 256 byte symbols with the `tokenizers` library,
and the models from a seeded config (mergekit's "picollama" idea). They are for invariants (shapes, exactness,
equalities), never for claims.
"""

from __future__ import annotations

from typing import Any

import torch

TINY_SPECIALS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")


def make_byte_tokenizer(chat_template: bool = True) -> Any:
    """A `PreTrainedTokenizerFast` over the 256 byte symbols plus 4 specials (vocab 260), built offline.

    Ids: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3, then one id per byte. Every text round-trips exactly.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS)}
    for symbol in sorted(alphabet):
        vocab[symbol] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    if chat_template:
        # A ChatML-like template so chat code paths run on the tiny model too.
        tok.chat_template = (
            "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
        )
    return tok


def tiny_config(arch: str = "llama", *, n_layers: int = 2, hidden: int = 64, vocab_size: int = 260) -> Any:
    """Config of a tiny model of architecture `arch` (``"llama"`` or ``"gemma3"``)."""
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=hidden // 4,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            rms_norm_eps=1e-5,
        )
    if arch == "gemma3":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=hidden // 4,
            max_position_embeddings=512,
            sliding_window=16,
            layer_types=["sliding_attention"] * (n_layers - 1) + ["full_attention"],
            query_pre_attn_scalar=hidden // 4,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; expected 'llama' or 'gemma3'")


def make_tiny_model(
    seed: int = 0,
    *,
    arch: str = "llama",
    n_layers: int = 2,
    hidden: int = 64,
    attn_implementation: str = "eager",
    init_std: float | None = None,
) -> Any:
    """A seeded random causal LM (eval mode, fp32). Same seed, same weights, on every machine.

    `init_std` defaults to 0.5 (llama) or 0.2 (gemma3, which scales embeddings by sqrt(hidden)): far above HF's
    0.02, so that next-token distributions are peaked (entropy ~0.3-3 nats) and greedy choices are not decided by
    rounding noise.
    """
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, n_layers=n_layers, hidden=hidden)
    cfg.initializer_range = init_std if init_std is not None else {"llama": 0.5, "gemma3": 0.2}[arch]
    cfg._attn_implementation = attn_implementation
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=attn_implementation)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = cfg.pad_token_id
    return model.eval()


def make_tiny_llama(seed: int = 0, n_layers: int = 2, hidden: int = 64, **kwargs: Any) -> Any:
    """`make_tiny_model` with the llama architecture (SmolLM2's)."""
    return make_tiny_model(seed, arch="llama", n_layers=n_layers, hidden=hidden, **kwargs)


def make_word_tokenizer(texts: Any, *, max_vocab: int = 4096, min_count: int = 1) -> Any:
    """A word-level `PreTrainedTokenizerFast` fitted on `texts`, for tiny from-scratch models.

    Words and punctuation marks are tokens; digits are split one per token (so numbers never blow up the
    vocabulary); the `max_vocab` most frequent types are kept (ties broken alphabetically, so the vocabulary is a
    deterministic function of the texts), the rest map to ``<unk>``. Specials: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
    ``<unk>`` 3. A 49k-entry vocabulary would dominate a tiny model's parameters and time; this keeps it small.
    """
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Punctuation()]
    )
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(piece for piece, _ in pre.pre_tokenize_str(text))
    ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS)}
    for word in ranked[: max(0, max_vocab - len(vocab))]:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
