"""How LMs track state while composing permutations (Li, Guo & Andreas, ICML 2025): data, trackers, diagnostics.

Paper: https://arxiv.org/abs/2503.02854 ; code: https://github.com/belindal/state-tracking.

Task ([code] ``permutation_task.py``). States and actions are permutations of {1..n} in one-line notation. The state
starts at the identity and each action updates it by ``new_state[j] = state[action[j] - 1]`` (`apply_action`), so
after actions a_1..a_t the state is the function composition s_t = a_1 ∘ a_2 ∘ ... ∘ a_t. ``compute_parity`` is
the inversion count mod 2; parity is a homomorphism, so parity(s_t) = sum_k parity(a_k) mod 2.

Tokens: one token per permutation (one per action, one per state) and two parity tokens. A story is
``[BOS, a_1, ..., a_T]`` and the hidden state at the token of a_k predicts s_k ([code] ``direct_state``
supervision: labels are the state sequence, and HF's label shift makes the token of a_k predict s_k).

Candidate mechanisms (paper Sec. 3-4): AA, an associative scan (a tree of pairwise products, depth ~ log t, in
which parity and state emerge together), and PAA, which first computes the prefix parity (a sum mod 2, cheap in
early layers), prunes the output to that coset, then refines with an associative scan. Their signatures, all
computed here:

* probes (`probe_grid`): linear probes for state and parity per layer x prefix length; PAA decodes parity in early
  layers for long prefixes long before the state; AA decodes both together.
* parity-controlled activation patching (`patch_grid`, [code] ``activation_patching_interpreter.py``): replace the
  first action by a random action of the same or of a different parity, patch the residual stream of layer l at
  position p from the counterfactual run into the base run, and read the normalised logit difference at the last
  token, ``clip((LD_patched - LD_base) / (LD_new - LD_base), 0, 1)`` with ``LD = log p(new answer) - log p(base
  answer)``. PAA: patching the final token's residual in early layers already moves the answer for a
  different-parity substitution (the prefix parity is there), not for a same-parity one; AA: neither.
* length generalisation (`generalisation_curve`): accuracy against prefix length beyond the training length; a PAA
  model's errors keep the right parity (they stay in the pruned coset), an AA model's do not.

`mechanism_indices` turns the three signatures into above-chance indices and `classify` labels a run AA or PAA.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

GROUPS = {"S3": 3, "S5": 5}
CONDITIONS = ("plain", "parity_cur", "topic")
N_SPECIALS = 4  # lmlab.core.inference.tiny.TINY_SPECIALS: <pad> 0, <s> 1, </s> 2, <unk> 3


# ----------------------------------------------------------------------------------------------------------------
# the group


def apply_action(state: Sequence[int], action: Sequence[int]) -> tuple[int, ...]:
    """``new_state[j] = state[action[j] - 1]`` (1-based one-line notation), the repository's update rule."""
    if len(state) != len(action):
        raise ValueError(f"state and action must have the same length, got {len(state)} and {len(action)}")
    return tuple(state[a - 1] for a in action)


def parity(perm: Sequence[int]) -> int:
    """Inversion count mod 2 (0 even, 1 odd), as the repository's ``compute_parity``."""
    p = list(perm)
    return sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j]) % 2


@dataclass(frozen=True)
class PermGroup:
    """S_n with its states indexed in ``itertools.permutations`` order (index 0 is the identity).

    Attributes:
        n: number of items.
        perms: the permutations, 1-based one-line notation.
        table: (G, G) long tensor, ``table[s, a]`` = index of `apply_action` (perms[s], perms[a]).
        parity: (G,) long tensor of parities.
    """

    n: int
    perms: tuple[tuple[int, ...], ...]
    table: torch.Tensor
    parity: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.perms)

    def index(self, perm: Sequence[int]) -> int:
        try:
            return self._index[tuple(int(x) for x in perm)]
        except KeyError:
            raise ValueError(f"{list(perm)} is not a permutation of 1..{self.n}") from None

    @functools.cached_property
    def _index(self) -> dict[tuple[int, ...], int]:
        return {p: i for i, p in enumerate(self.perms)}

    def name(self, i: int) -> str:
        return "".join(map(str, self.perms[i]))


@functools.lru_cache(maxsize=8)
def perm_group(n: int) -> PermGroup:
    """The group S_n for n in 2..6 (cached)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 6:
        raise ValueError(f"n must be an int in 2..6 (S_n with n! one-token states), got {n!r}")
    perms = tuple(itertools.permutations(range(1, n + 1)))
    index = {p: i for i, p in enumerate(perms)}
    table = torch.tensor([[index[apply_action(s, a)] for a in perms] for s in perms], dtype=torch.long)
    par = torch.tensor([parity(p) for p in perms], dtype=torch.long)
    return PermGroup(n, perms, table, par)


def group_of(name: str) -> PermGroup:
    if name not in GROUPS:
        raise ValueError(f"group must be one of {', '.join(GROUPS)}, got {name!r}")
    return perm_group(GROUPS[name])


# ----------------------------------------------------------------------------------------------------------------
# stories


@dataclass
class Stories:
    """A batch of stories: action indices and the state sequence they produce.

    Attributes:
        group: the `PermGroup`.
        actions: (N, T) long, indices into ``group.perms``.
        states: (N, T + 1) long, ``states[:, 0]`` is the identity, ``states[:, k]`` the state after k actions.
    """

    group: PermGroup
    actions: torch.Tensor
    states: torch.Tensor

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def length(self) -> int:
        return int(self.actions.shape[1])

    @property
    def parities(self) -> torch.Tensor:
        """(N, T + 1) parity of each state."""
        return self.group.parity[self.states]

    def prefix(self, length: int) -> Stories:
        return Stories(self.group, self.actions[:, :length], self.states[:, : length + 1])

    def subset(self, idx: Any) -> Stories:
        return Stories(self.group, self.actions[idx], self.states[idx])

    def text(self, i: int) -> str:
        """Story `i` as the repository writes it: space-separated digit strings."""
        return " ".join(self.group.name(int(a)) for a in self.actions[i])


def rollout(group: PermGroup, actions: torch.Tensor) -> torch.Tensor:
    """(N, T) action indices -> (N, T + 1) state indices, starting at the identity (index 0)."""
    if actions.dim() != 2:
        raise ValueError(f"actions must be (N, T), got shape {tuple(actions.shape)}")
    cur = torch.zeros(actions.shape[0], dtype=torch.long)
    out = [cur]
    for t in range(actions.shape[1]):
        cur = group.table[cur, actions[:, t]]
        out.append(cur)
    return torch.stack(out, dim=1)


def make_stories(n: int, num_stories: int, length: int, seed: int) -> Stories:
    """`num_stories` uniformly random stories of `length` actions in S_n (seeded; duplicates are not dropped)."""
    if num_stories < 1 or length < 1:
        raise ValueError(f"num_stories and length must be >= 1, got {num_stories} and {length}")
    group = perm_group(n)
    gen = torch.Generator().manual_seed(int(seed))
    actions = torch.randint(0, group.size, (num_stories, length), generator=gen)
    return Stories(group, actions, rollout(group, actions))


def stories_from_examples(examples: Sequence[Any], group: PermGroup) -> Stories:
    """Stories from the lmlab ``permutations`` suite (``meta["perms"]``: the actions, 1-based one-line)."""
    if not examples:
        raise ValueError("stories_from_examples needs at least one example, got none")
    lengths = {len(e.meta["perms"]) for e in examples}
    if len(lengths) != 1:
        raise ValueError(f"examples must all have the same length, got lengths {sorted(lengths)}")
    actions = torch.tensor([[group.index(p) for p in e.meta["perms"]] for e in examples], dtype=torch.long)
    return Stories(group, actions, rollout(group, actions))


# ----------------------------------------------------------------------------------------------------------------
# vocabulary and model


@dataclass(frozen=True)
class TrackerVocab:
    """Token ids of a state tracker: one per action, one per state, two parity tokens, an optional BOS.

    The default layout (`TrackerVocab.default`) follows `lmlab.core.inference.tiny`'s specials, then G action tokens, G
    state
    tokens and the parity tokens. Pass your own ids to analyse a model with another tokenizer (each permutation must
    be one token).
    """

    n: int
    action_ids: tuple[int, ...]
    state_ids: tuple[int, ...]
    parity_ids: tuple[int, int]
    bos_id: int | None = 1
    vocab_size: int = 0

    def __post_init__(self) -> None:
        g = math.factorial(self.n)
        if len(self.action_ids) != g or len(self.state_ids) != g:
            raise ValueError(
                f"S{self.n} needs {g} action and {g} state ids, got {len(self.action_ids)} and {len(self.state_ids)}"
            )

    @classmethod
    def default(cls, n: int) -> TrackerVocab:
        g = math.factorial(n)
        actions = tuple(range(N_SPECIALS, N_SPECIALS + g))
        states = tuple(range(N_SPECIALS + g, N_SPECIALS + 2 * g))
        par = (N_SPECIALS + 2 * g, N_SPECIALS + 2 * g + 1)
        return cls(n, actions, states, par, 1, N_SPECIALS + 2 * g + 2)

    @property
    def offset(self) -> int:
        """Sequence position of the first action (1 with a BOS)."""
        return 0 if self.bos_id is None else 1

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """(N, T) action indices -> (N, offset + T) input ids."""
        ids = torch.tensor(self.action_ids, dtype=torch.long)[actions]
        if self.bos_id is None:
            return ids
        return torch.cat([torch.full((ids.shape[0], 1), self.bos_id, dtype=torch.long), ids], dim=1)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "action_ids": list(self.action_ids), "state_ids": list(self.state_ids),
                "parity_ids": list(self.parity_ids), "bos_id": self.bos_id, "vocab_size": self.vocab_size}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrackerVocab:
        return cls(int(d["n"]), tuple(d["action_ids"]), tuple(d["state_ids"]), tuple(d["parity_ids"]),
                   d.get("bos_id"), int(d.get("vocab_size", 0)))  # fmt: skip

    @classmethod
    def of(cls, model: Any) -> TrackerVocab:
        """The vocabulary stored by `make_tracker` in ``model.config.state_tracking``."""
        d = getattr(model.config, "state_tracking", None)
        if not isinstance(d, dict):
            raise ValueError(
                "model.config has no 'state_tracking' vocabulary (saved by make_tracker); pass a TrackerVocab with "
                "your tokenizer's ids instead"
            )
        return cls.from_dict(d)


def check_model(model: Any, vocab: TrackerVocab) -> None:
    """A one-line error unless `model` is a decoder-only causal LM whose vocabulary holds `vocab`'s ids."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise ValueError(f"expected a Hugging Face causal LM with an output head, got {type(model).__name__}")
    if getattr(cfg, "is_encoder_decoder", False):
        raise ValueError(f"expected a decoder-only causal LM, got the encoder-decoder {type(model).__name__}")
    size = int(model.get_output_embeddings().weight.shape[0])
    top = max([*vocab.action_ids, *vocab.state_ids, *vocab.parity_ids, vocab.bos_id or 0])
    if top >= size:
        raise ValueError(f"the tracker vocabulary needs token id {top} but the model's head has {size} rows")


def make_tracker(
    n: int = 3,
    *,
    n_layers: int = 3,
    hidden: int = 48,
    seed: int = 0,
    init_std: float = 0.02,
    attn_implementation: str = "eager",
) -> Any:
    """A from-scratch tiny llama (`lmlab.core.inference.tiny.tiny_config`: 4 heads, SwiGLU MLP of 2x width, RoPE) with
    the
    `TrackerVocab.default` vocabulary stored in ``config.state_tracking``, seeded, fp32, eval mode."""
    from transformers import LlamaForCausalLM

    from lmlab.core.inference.tiny import tiny_config

    if hidden % 8:
        raise ValueError(f"hidden must be a multiple of 8 (4 heads of even RoPE width), got {hidden}")
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    vocab = TrackerVocab.default(n)
    cfg = tiny_config("llama", n_layers=n_layers, hidden=hidden, vocab_size=vocab.vocab_size)
    cfg.initializer_range = init_std
    cfg._attn_implementation = attn_implementation  # eager: attention patterns are hookable
    cfg.state_tracking = vocab.to_dict()
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(int(seed))
        model = LlamaForCausalLM(cfg).to(torch.float32)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()


# ----------------------------------------------------------------------------------------------------------------
# training


@dataclass
class TrainHistory:
    """What `train_tracker` measured.

    Attributes:
        losses: training loss per step (all phases in order).
        phases: ``[(name, steps)]`` in order (``parity`` / ``topic`` before ``state``).
        eval_steps: state-phase steps at which the validation accuracy was measured.
        eval_acc: validation state accuracy at the training length (mean over positions 1..T).
        steps_to_threshold: first state-phase eval step with accuracy >= threshold (None: never).
        seconds: wall time of the training.
    """

    losses: list[float] = field(default_factory=list)
    phases: list[tuple[str, int]] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_acc: list[float] = field(default_factory=list)
    steps_to_threshold: int | None = None
    seconds: float = 0.0


def topic_documents(n: int, num_docs: int, length: int, seed: int, *, topics: int = 4, alpha: float = 0.3,
                    beta: float = 0.3) -> torch.Tensor:  # fmt: skip
    """(num_docs, length) action indices from the repository's LDA-like topic model.

    ``make_topic_training_data.py``: topic-word distributions ~ Dir(beta) over the action vocabulary, one per
    topic; per document, topic weights ~ Dir(alpha); each word draws a topic, then a word of that topic.
    """
    rng = np.random.default_rng(int(seed))
    g = math.factorial(n)
    topic_word = rng.dirichlet([beta] * g, size=topics)  # (topics, G)
    doc_topic = rng.dirichlet([alpha] * topics, size=num_docs)  # (docs, topics)
    word_dist = doc_topic @ topic_word  # (docs, G): the mixture a word is drawn from
    cum = np.cumsum(word_dist, axis=1)
    u = rng.random((num_docs, length, 1))
    words = (u > cum[:, None, :]).sum(-1).clip(max=g - 1)
    return torch.as_tensor(words, dtype=torch.long)


def _position_logits(model: Any, ids: torch.Tensor, offset: int) -> torch.Tensor:
    """(N, S) ids -> (N, T, V) logits at the action positions."""
    return model(input_ids=ids, use_cache=False).logits[:, offset:]


def state_accuracy(model: Any, stories: Stories, vocab: TrackerVocab | None = None) -> torch.Tensor:
    """(T,) accuracy of the predicted state after each prefix length 1..T (argmax over the state tokens)."""
    pred = predict_states(model, stories, vocab)
    return (pred == stories.states[:, 1:]).float().mean(0)


@torch.no_grad()
def predict_states(model: Any, stories: Stories, vocab: TrackerVocab | None = None, batch: int = 512) -> torch.Tensor:
    """(N, T) predicted state indices: argmax over the state tokens at each action's token."""
    vocab = vocab or TrackerVocab.of(model)
    sid = torch.tensor(vocab.state_ids)
    out = []
    for i in range(0, len(stories), batch):
        ids = vocab.encode(stories.actions[i : i + batch])
        out.append(_position_logits(model, ids, vocab.offset)[..., sid].argmax(-1))
    return torch.cat(out)


def train_tracker(
    model: Any,
    group: PermGroup,
    *,
    condition: str = "plain",
    steps: int = 700,
    pre_steps: int = 0,
    batch_size: int = 128,
    length: int = 6,
    lr: float = 6e-3,
    warmup_frac: float = 0.1,
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    seed: int = 0,
    val: Stories | None = None,
    eval_every: int = 50,
    threshold: float = 0.9,
    vocab: TrackerVocab | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainHistory:
    """Train `model` in place on ``direct_state`` supervision, after an optional intermediate phase.

    Loss: cross-entropy over the full vocabulary of the label token at every action position (the repository's HF
    LM loss on state labels). `condition`:

    * ``plain``: `steps` steps of state supervision.
    * ``parity_cur``: `pre_steps` steps with the states' parity tokens as labels ([code] ``--is_parity_cur``), then
      `steps` steps of state supervision from that checkpoint (``--from_checkpoint``).
    * ``topic``: `pre_steps` of next-token prediction on `topic_documents` ([code] ``next_token`` on
      ``make_topic_training_data.py`` data, the pretrained-vs-scratch proxy), then `steps` of state supervision.

    The state-phase data stream depends on `seed` only, so runs of different conditions with one seed see the same
    state stories in the same order. Each phase: AdamW, linear warm-up over `warmup_frac` of its steps, cosine
    decay to 10%, gradient clipping at `grad_clip` ([code] ``max_grad_norm=1.0``).
    """
    from lmlab.core.training.pretrain import cosine_lr

    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    if steps < 1 or batch_size < 1 or length < 1:
        raise ValueError(f"steps, batch_size and length must be >= 1, got {steps}, {batch_size}, {length}")
    vocab = vocab or TrackerVocab.of(model)
    check_model(model, vocab)
    hist = TrainHistory()
    sid, pid = torch.tensor(vocab.state_ids), torch.tensor(vocab.parity_ids)
    t0 = time.perf_counter()

    def phase(name: str, n_steps: int, stream_seed: int, evaluate: bool) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.ndim >= 2]},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # fmt: skip
        opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
        gen = torch.Generator().manual_seed(int(stream_seed))
        warm = max(1, int(warmup_frac * n_steps))
        model.train()
        for step in range(n_steps):
            for g in opt.param_groups:
                g["lr"] = lr * cosine_lr(step, steps=n_steps, warmup=warm, min_ratio=0.1)
            if name == "topic":
                docs = topic_documents(group.n, batch_size, length + 1, int(torch.randint(0, 2**31, (1,),
                                       generator=gen)))  # fmt: skip
                ids = vocab.encode(docs)  # next-token prediction over action tokens
                logits = model(input_ids=ids[:, :-1], use_cache=False).logits
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            else:
                actions = torch.randint(0, group.size, (batch_size, length), generator=gen)
                states = rollout(group, actions)[:, 1:]  # (B, T): s_k is the label at a_k's token
                labels = pid[group.parity[states]] if name == "parity" else sid[states]
                logits = _position_logits(model, vocab.encode(actions), vocab.offset)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            hist.losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(len(hist.losses), hist.losses[-1])
            last = step == n_steps - 1
            if evaluate and val is not None and ((step + 1) % eval_every == 0 or last):
                model.eval()
                acc = float(state_accuracy(model, val, vocab).mean())
                model.train()
                hist.eval_steps.append(step + 1)
                hist.eval_acc.append(acc)
                if hist.steps_to_threshold is None and acc >= threshold:
                    hist.steps_to_threshold = step + 1
        hist.phases.append((name, n_steps))

    if condition != "plain" and pre_steps > 0:
        phase("parity" if condition == "parity_cur" else "topic", pre_steps, seed + 1, evaluate=False)
    phase("state", steps, seed, evaluate=True)
    model.eval()
    hist.seconds = time.perf_counter() - t0
    return hist


# ----------------------------------------------------------------------------------------------------------------
# diagnostics: generalisation


@dataclass
class GenCurve:
    """Accuracy against prefix length (1..T) and the parity of the errors.

    Attributes:
        acc: (T,) state accuracy per prefix length.
        parity_acc: (T,) accuracy of the parity of the predicted state.
        err_parity_ok: (T,) among wrong predictions, the fraction with the right parity (NaN where none).
        chance_err_parity: that fraction for uniformly random wrong states, (G/2 - 1) / (G - 1).
        per_story: (N, T) 0/1 correctness.
        per_story_parity: (N, T) 0/1 correctness of the predicted state's parity.
        n_states: G.
    """

    acc: np.ndarray
    parity_acc: np.ndarray
    err_parity_ok: np.ndarray
    chance_err_parity: float
    per_story: np.ndarray
    per_story_parity: np.ndarray
    n_states: int


def generalisation_curve(model: Any, stories: Stories, vocab: TrackerVocab | None = None) -> GenCurve:
    """Accuracy vs prefix length on `stories` (one causal forward covers every length), with error parities."""
    g = stories.group
    pred = predict_states(model, stories, vocab)
    true = stories.states[:, 1:]
    ok = (pred == true).numpy()
    par_ok = (g.parity[pred] == g.parity[true]).numpy()
    wrong = ~ok
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.where(wrong.sum(0) > 0, (par_ok & wrong).sum(0) / np.maximum(1, wrong.sum(0)), np.nan)
    chance = (g.size / 2 - 1) / (g.size - 1)
    return GenCurve(ok.mean(0), par_ok.mean(0), err, chance, ok.astype(float), par_ok.astype(float), g.size)


# ----------------------------------------------------------------------------------------------------------------
# diagnostics: probes


def layer_names(model: Any) -> list[str]:
    """``hook_embed`` then ``blocks.{l}.hook_resid_post`` for every block (the residual stream after layer l)."""
    return ["hook_embed"] + [f"blocks.{i}.hook_resid_post" for i in range(model.config.num_hidden_layers)]


@torch.no_grad()
def residual_stream(model: Any, stories: Stories, vocab: TrackerVocab | None = None) -> torch.Tensor:
    """(L + 1, N, T, d) residual stream at the action tokens: the embeddings, then after each block."""
    from lmlab.core.inference.hooks import run_with_cache

    vocab = vocab or TrackerVocab.of(model)
    names = layer_names(model)
    _, cache = run_with_cache(model, vocab.encode(stories.actions), names)
    return torch.stack([cache[n][:, vocab.offset :] for n in names])


@dataclass
class ProbeGrid:
    """Held-out linear-probe accuracy per layer x prefix length, with the majority-class baseline.

    Attributes:
        target: ``state`` or ``parity``.
        acc: (L + 1, P) accuracy on the held-out stories (row 0 = embeddings, row l + 1 = after block l).
        baseline: (P,) accuracy of the majority class of the probe-training labels.
        chance: 1 / number of classes (1/G for state, 1/2 for parity).
        lengths: the P prefix lengths (1-based).
        n_train, n_test: stories on each side.
    """

    target: str
    acc: np.ndarray
    baseline: np.ndarray
    chance: float
    lengths: list[int]
    n_train: int
    n_test: int

    def above_chance(self) -> np.ndarray:
        """``(acc - base) / (1 - base)`` with base = max(baseline, chance): 0 at the baseline, 1 when perfect."""
        base = np.maximum(self.baseline, self.chance)[None, :]
        return (self.acc - base) / np.maximum(1e-9, 1.0 - base)


def probe_split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """First half of the stories trains the probes, the rest tests them (one story: both, flagged by the caller)."""
    k = max(1, n // 2)
    train = np.arange(k)
    test = np.arange(k, n) if n > k else train
    return train, test


def probe_grid(
    model: Any,
    stories: Stories,
    target: str = "state",
    *,
    layers: Sequence[int] | None = None,
    prefix_lengths: Sequence[int] | None = None,
    vocab: TrackerVocab | None = None,
    acts: torch.Tensor | None = None,
    max_iter: int = 500,
    C: float = 1.0,
) -> ProbeGrid:
    """Linear probes (scikit-learn ``LogisticRegression``, as [code] ``probing_interpreter.py``) for the state or
    its parity, one per layer x prefix length, trained on the first half of `stories` and tested on the rest.

    Args:
        target: ``"state"`` (the state after t actions) or ``"parity"`` (its parity).
        layers: rows of `residual_stream` (0 = embeddings); default all.
        prefix_lengths: 1-based prefix lengths t (the activation at a_t's token); default 1..T.
        acts: a precomputed `residual_stream` (L + 1, N, T, d).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    if target not in ("state", "parity"):
        raise ValueError(f"target must be 'state' or 'parity', got {target!r}")
    if len(stories) < 1:
        raise ValueError("probe_grid needs at least one story, got none")
    acts = residual_stream(model, stories, vocab) if acts is None else acts
    layers = list(range(acts.shape[0])) if layers is None else list(layers)
    lengths = list(range(1, stories.length + 1)) if prefix_lengths is None else list(prefix_lengths)
    for t in lengths:
        if not 1 <= t <= stories.length:
            raise ValueError(f"prefix lengths must be in 1..{stories.length}, got {t}")
    labels = (stories.states if target == "state" else stories.parities).numpy()  # (N, T + 1)
    n_classes = stories.group.size if target == "state" else 2
    tr, te = probe_split(len(stories))
    acc = np.zeros((len(layers), len(lengths)))
    base = np.zeros(len(lengths))
    import warnings

    for j, t in enumerate(lengths):
        y_tr, y_te = labels[tr, t], labels[te, t]
        major = np.bincount(y_tr, minlength=n_classes).argmax()
        base[j] = float((y_te == major).mean())
        for i, layer in enumerate(layers):
            x = acts[layer, :, t - 1].double().numpy()  # (N, d): the token of a_t
            if len(np.unique(y_tr)) < 2:  # one class seen: the probe can only predict it
                acc[i, j] = base[j]
                continue
            # standardised on the probe-training stories: same linear family, ~10x fewer lbfgs iterations
            mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-6
            clf = LogisticRegression(max_iter=max_iter, C=C)
            with warnings.catch_warnings():  # lbfgs cap reached; S5: 120 classes on few stories (sklearn warns)
                warnings.simplefilter("ignore", ConvergenceWarning)
                warnings.simplefilter("ignore", UserWarning)
                clf.fit((x[tr] - mu) / sd, y_tr)
            acc[i, j] = float(clf.score((x[te] - mu) / sd, y_te))
    return ProbeGrid(target, acc, base, 1.0 / n_classes, lengths, len(tr), len(te))


# ----------------------------------------------------------------------------------------------------------------
# diagnostics: activation patching


@dataclass
class PatchGrid:
    """Normalised logit-difference effect of patching each layer x sequence position.

    Attributes:
        counterfactual: ``same_parity`` or ``diff_parity``.
        mode: ``substitute`` (counterfactual activations) or ``delete`` (zeros).
        effect: (L + 1, S) mean over the valid stories of the clipped normalised LD (row 0 = embeddings).
        per_story: (N, L + 1, S), NaN for stories left out: substitute, unless the model answers both runs right
            (the two answers then differ); delete, unless it answers the base run right.
        full: (N,) effect of patching every position of the embeddings (substitute: the counterfactual run itself,
            so 1 by construction wherever defined).
        n_valid: stories with a defined metric.
    """

    counterfactual: str
    mode: str
    effect: np.ndarray
    per_story: np.ndarray
    full: np.ndarray
    n_valid: int


def counterfactual_actions(stories: Stories, kind: str, position: int = 1, seed: int = 0) -> Stories:
    """Replace action `position` (1-based) of each story by a random *other* action of the same parity or of the
    other parity ([code] ``generate_prompt_pairs``: the first action, ``item_to_replace = 0``)."""
    if kind not in ("same_parity", "diff_parity"):
        raise ValueError(f"counterfactual must be 'same_parity' or 'diff_parity', got {kind!r}")
    if not 1 <= position <= stories.length:
        raise ValueError(f"position must be in 1..{stories.length}, got {position}")
    g = stories.group
    rng = np.random.default_rng(int(seed))
    acts = stories.actions.clone()
    par = g.parity.numpy()
    for i in range(len(stories)):
        a = int(acts[i, position - 1])
        want = par[a] if kind == "same_parity" else 1 - par[a]
        pool = [b for b in range(g.size) if par[b] == want and b != a]
        acts[i, position - 1] = int(rng.choice(pool))
    return Stories(g, acts, rollout(g, acts))


def _normalised_ld(lp: torch.Tensor, new: torch.Tensor, base: torch.Tensor, ld_base: torch.Tensor,
                   ld_new: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """clip((LD - LD_base) / (LD_new - LD_base), 0, 1) with LD = lp[new] - lp[base]; lp (..., G) log-probs."""
    ld = lp.gather(-1, new[..., None])[..., 0] - lp.gather(-1, base[..., None])[..., 0]
    return ((ld - ld_base) / (ld_new - ld_base)).clamp(0.0, 1.0)


@torch.no_grad()
def patch_grid(
    model: Any,
    base: Stories,
    counterfactual: str = "diff_parity",
    *,
    mode: str = "substitute",
    position: int = 1,
    seed: int = 0,
    vocab: TrackerVocab | None = None,
    only_correct: bool = True,
) -> PatchGrid:
    """Activation patching of the residual stream at every layer x position, read at the last token.

    ``substitute``: the base run with the residual of layer l at one position replaced by the counterfactual run's
    (`counterfactual_actions`); metric ``clip((LD_p - LD_b) / (LD_n - LD_b), 0, 1)``, ``LD = log p(new answer) -
    log p(base answer)`` over the log-softmax of the full vocabulary ([code] ``get_metric_from_logits``), answers
    being the argmax state of each run. ``delete``: the residual zeroed, ``LD = log p(base answer) - max_other log
    p``, metric ``clip((LD_p - LD_b) / (0 - LD_b), 0, 1)``. Stories whose two runs predict the same final state (no
    difference to explain) get NaN and are left out of the mean.
    """
    from lmlab.core.inference.hooks import hooks, run_with_cache

    if mode not in ("substitute", "delete"):
        raise ValueError(f"mode must be 'substitute' or 'delete', got {mode!r}")
    if len(base) < 1:
        raise ValueError("patch_grid needs at least one story, got none")
    vocab = vocab or TrackerVocab.of(model)
    sid = torch.tensor(vocab.state_ids)
    cf = counterfactual_actions(base, counterfactual, position, seed)
    ids_b, ids_c = vocab.encode(base.actions), vocab.encode(cf.actions)
    names = layer_names(model)
    n, seq = ids_b.shape

    def final_lp(logits: torch.Tensor) -> torch.Tensor:  # (B, S, V) -> (B, G) log-probs of the states, last token
        return torch.log_softmax(logits[:, -1].double(), -1)[:, sid]

    lg_b, _ = run_with_cache(model, ids_b, [])
    lg_c, cache_c = run_with_cache(model, ids_c, names)
    lp_b, lp_c = final_lp(lg_b), final_lp(lg_c)
    ans_b, ans_c = lp_b.argmax(-1), lp_c.argmax(-1)
    # only pairs the model gets right on both sides: a wrong answer's logit difference is noise, and its ratio
    # (clipped to [0, 1]) would bias the mean upwards
    right = (ans_b == base.states[:, -1]) & (ans_c == cf.states[:, -1])
    if not only_correct:
        right = torch.ones_like(right)
    if mode == "substitute":
        ld_b = lp_b.gather(-1, ans_c[:, None])[:, 0] - lp_b.gather(-1, ans_b[:, None])[:, 0]
        ld_n = lp_c.gather(-1, ans_c[:, None])[:, 0] - lp_c.gather(-1, ans_b[:, None])[:, 0]
        valid = right & (ans_b != ans_c)
    else:
        others = lp_b.clone()
        others.scatter_(-1, ans_b[:, None], -math.inf)
        ld_b = lp_b.gather(-1, ans_b[:, None])[:, 0] - others.max(-1).values
        ld_n = torch.zeros_like(ld_b)
        valid = (ans_b == base.states[:, -1] if only_correct else torch.ones_like(right)) & (ld_b.abs() > 1e-9)
    per = np.full((n, len(names), seq), np.nan)
    rows = torch.arange(n * seq)
    pos = torch.arange(seq).repeat(n)  # batch row k = story k // seq patched at position k % seq
    for li, name in enumerate(names):
        src = cache_c[name].repeat_interleave(seq, dim=0)  # (n * seq, S, d)

        def patch(t: torch.Tensor, *, hook: Any, src: torch.Tensor = src) -> torch.Tensor:
            out = t.clone()
            out[rows, pos] = 0.0 if mode == "delete" else src[rows, pos].to(t.dtype)
            return out

        with hooks(model, [(name, patch)]):
            lp = final_lp(model(input_ids=ids_b.repeat_interleave(seq, dim=0), use_cache=False).logits)
        lp = lp.view(n, seq, -1)
        if mode == "substitute":
            m = _normalised_ld(lp, ans_c[:, None].expand(n, seq), ans_b[:, None].expand(n, seq), ld_b[:, None],
                               ld_n[:, None])  # fmt: skip
        else:
            oth = lp.clone()
            oth.scatter_(-1, ans_b[:, None, None].expand(n, seq, 1), -math.inf)
            ld = lp.gather(-1, ans_b[:, None, None].expand(n, seq, 1))[..., 0] - oth.max(-1).values
            m = ((ld - ld_b[:, None]) / (ld_n - ld_b)[:, None]).clamp(0.0, 1.0)
        per[:, li, :] = m.numpy()
    per[~valid.numpy()] = np.nan
    # patching every position of the embeddings: the counterfactual's (or a zero) input in full
    full_src = cache_c[names[0]]

    def patch_all(t: torch.Tensor, *, hook: Any) -> torch.Tensor:
        return torch.zeros_like(t) if mode == "delete" else full_src.to(t.dtype)

    with hooks(model, [(names[0], patch_all)]):
        lp_full = final_lp(model(input_ids=ids_b, use_cache=False).logits)
    if mode == "substitute":
        full = _normalised_ld(lp_full, ans_c, ans_b, ld_b, ld_n).numpy()
    else:
        oth = lp_full.clone()
        oth.scatter_(-1, ans_b[:, None], -math.inf)
        ld = lp_full.gather(-1, ans_b[:, None])[:, 0] - oth.max(-1).values
        full = ((ld - ld_b) / (ld_n - ld_b)).clamp(0.0, 1.0).numpy()
    full = np.where(valid.numpy(), full, np.nan)
    n_valid = int(valid.sum())
    effect = np.nanmean(per, axis=0) if n_valid else np.zeros((len(names), seq))
    return PatchGrid(counterfactual, mode, effect, per, full, n_valid)


# ----------------------------------------------------------------------------------------------------------------
# mechanism


def early_layers(n_layers: int) -> list[int]:
    """Blocks l < L / 2 (the spec's "early layers"), as rows of `residual_stream` (block l -> row l + 1)."""
    return [layer + 1 for layer in range(n_layers) if layer < n_layers / 2]


def long_prefixes(length: int) -> list[int]:
    """Prefix lengths t > T / 2 (1-based): long enough that a log-depth scan has not finished in early layers."""
    return [t for t in range(1, length + 1) if t > length / 2]


@dataclass
class Mechanism:
    """A run's three AA-vs-PAA indices (0 ~ AA, 1 ~ PAA), their mean, and the label.

    Attributes:
        probe_index: mean over early layers x long prefixes of (parity - state) probe accuracy above chance.
        patch_index: mean over early layers of (diff-parity - same-parity) patching effect at the last token.
        gen_index: among wrong predictions on the `frontier` of the generalisation curve (lengths where the
            tracker fails but is above chance), the right-parity share above chance, ``(f - f0) / (1 - f0)`` (0 when
            there are no errors: no evidence either way).
        score: mean of the three indices.
        label: ``PAA`` when score > threshold, else ``AA``.
    """

    probe_index: float
    patch_index: float
    gen_index: float
    score: float
    label: str

    def votes(self, thresholds: tuple[float, float, float]) -> dict[str, str]:
        """Each index's own AA/PAA call at its threshold (agreement between signatures)."""
        vals = (self.probe_index, self.patch_index, self.gen_index)
        return {k: "PAA" if v > th else "AA" for k, v, th in zip(("probe", "patch", "gen"), vals, thresholds)}


def probe_index(state: ProbeGrid, par: ProbeGrid, rows: Sequence[int], lengths: Sequence[int]) -> float:
    """Mean over `rows` x `lengths` of parity minus state probe accuracy, both in above-chance units."""
    cols = [state.lengths.index(t) for t in lengths]
    d = par.above_chance()[np.ix_(list(rows), cols)] - state.above_chance()[np.ix_(list(rows), cols)]
    return float(d.mean()) if d.size else 0.0


def patch_index(same: PatchGrid, diff: PatchGrid, rows: Sequence[int]) -> float:
    """Mean over `rows` of (diff-parity - same-parity) effect of patching the last token's residual."""
    if not rows or not same.n_valid or not diff.n_valid:
        return 0.0
    return float(np.mean([diff.effect[r, -1] - same.effect[r, -1] for r in rows]))


def frontier(curve: GenCurve, margin: float = 0.1) -> list[int]:
    """Prefix lengths (1-based) where the tracker is failing but still tracks something: chance + `margin` < acc < 1.

    Chance is 1/G. Where the accuracy is 1 there are no errors to read; where it is at chance (far beyond the
    training length, where the position encoding breaks everything) the errors say nothing about the mechanism.
    """
    chance = 1.0 / curve.n_states
    return [t + 1 for t, a in enumerate(curve.acc) if chance + margin < a < 1.0]


def gen_index(curve: GenCurve, lengths: Sequence[int]) -> float:
    """Right-parity share of the errors at `lengths` (1-based) above its chance level; 0 without errors.

    ``(f - f0) / (1 - f0)``: f the share of wrong predictions whose parity is right, f0 = (G/2 - 1) / (G - 1) that
    share for a uniformly random wrong state. PAA keeps the parity when it fails (the output was pruned to the right
    coset): ~1; AA's errors do not: ~0.
    """
    cols = [t - 1 for t in lengths]
    if not cols:
        return 0.0
    wrong = 1.0 - curve.per_story[:, cols]  # (N, P)
    n_wrong = float(wrong.sum())
    if n_wrong == 0:
        return 0.0
    f = float((wrong * curve.per_story_parity[:, cols]).sum()) / n_wrong
    f0 = curve.chance_err_parity
    return float((f - f0) / (1.0 - f0))


def classify(indices: Sequence[float], threshold: float = 0.4) -> Mechanism:
    """`Mechanism` from (probe, patch, gen) indices: PAA when their mean exceeds `threshold`."""
    p, q, g = (float(x) for x in indices)
    score = (p + q + g) / 3.0
    return Mechanism(p, q, g, score, "PAA" if score > threshold else "AA")


def mechanism_score(state: ProbeGrid, par: ProbeGrid, same: PatchGrid, diff: PatchGrid, curve: GenCurve,
                    *, n_layers: int, threshold: float = 0.4, margin: float = 0.1) -> Mechanism:  # fmt: skip
    """The three indices of one tracker and its label (see `Mechanism`): probes over early layers x long prefixes of
    the probe stories, patching over early layers, error parities on the `frontier` of the generalisation curve."""
    rows = early_layers(n_layers)
    return classify(
        (
            probe_index(state, par, rows, long_prefixes(state.lengths[-1])),
            patch_index(same, diff, rows),
            gen_index(curve, frontier(curve, margin)),
        ),
        threshold,
    )


def steps_to_threshold(hist: TrainHistory, steps: int) -> tuple[int, bool]:
    """(steps, censored): the first eval step at the threshold, or `steps` (a lower bound) when never reached."""
    if hist.steps_to_threshold is None:
        return steps, True
    return hist.steps_to_threshold, False
