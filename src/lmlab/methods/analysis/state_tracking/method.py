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
computed by this package (probes and patching in `diagnostics`):

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

`mechanism_score` turns the three signatures into above-chance indices and `classify` labels a run AA or PAA (an
index without evidence, e.g. error parities of a tracker that makes no error, abstains instead of voting AA).

Files: `task` holds the group, the stories and the tracker vocabulary; `diagnostics` the probes and the
activation patching; this module builds and trains trackers, measures length generalisation and turns the three
signatures into the mechanism.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmlab.methods.analysis.state_tracking.diagnostics import PatchGrid, ProbeGrid
from lmlab.methods.analysis.state_tracking.task import PermGroup, Stories, TrackerVocab, check_model, rollout

CONDITIONS = ("plain", "parity_cur", "topic")


# ----------------------------------------------------------------------------------------------------------------
# the model


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
        eval_acc_at_len: validation state accuracy at prefix length T alone (the stopping criterion).
        steps_to_threshold: first state-phase eval step with accuracy >= threshold (None: never).
        stopped_at: state-phase step at which `stop_at` was reached and training stopped (None: all steps ran).
        seconds: wall time of the training.
    """

    losses: list[float] = field(default_factory=list)
    phases: list[tuple[str, int]] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_acc: list[float] = field(default_factory=list)
    eval_acc_at_len: list[float] = field(default_factory=list)
    steps_to_threshold: int | None = None
    stopped_at: int | None = None
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
    stop_at: float | None = None,
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

    Training until the task is learned: with `stop_at` (and `val`), the state phase stops at the first evaluation
    whose validation accuracy at prefix length T (the hardest position) reaches `stop_at`; `steps` is then a cap
    and the schedule is laid out over it. Every run that stops is compared at the same in-distribution accuracy.
    """
    from lmlab.core.training.pretrain import cosine_lr

    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    if steps < 1 or batch_size < 1 or length < 1:
        raise ValueError(f"steps, batch_size and length must be >= 1, got {steps}, {batch_size}, {length}")
    if stop_at is not None and not 0.0 < stop_at <= 1.0:
        raise ValueError(f"stop_at must be in (0, 1] or None, got {stop_at}")
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
        done = 0
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
            done = step + 1
            if evaluate and val is not None and ((step + 1) % eval_every == 0 or last):
                model.eval()
                per_len = state_accuracy(model, val, vocab)  # (T,) accuracy per prefix length
                model.train()
                acc = float(per_len.mean())
                hist.eval_steps.append(step + 1)
                hist.eval_acc.append(acc)
                hist.eval_acc_at_len.append(float(per_len[-1]))
                if hist.steps_to_threshold is None and acc >= threshold:
                    hist.steps_to_threshold = step + 1
                if stop_at is not None and hist.eval_acc_at_len[-1] >= stop_at:
                    hist.stopped_at = step + 1  # learned: further steps would only move it past the matched point
                    break
        hist.phases.append((name, done))

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

    An index without evidence is NaN (it abstains) rather than 0: a 0 would vote AA, and a tracker that makes no
    errors, or whose patching pairs all fail, would be pushed toward AA by the absence of data.

    Attributes:
        probe_index: mean over early layers x long prefixes of (parity - state) probe accuracy above chance.
        patch_index: mean over early layers of (diff-parity - same-parity) patching effect at the last token (NaN
            without a valid pair).
        gen_index: among wrong predictions at the lengths read (the `frontier` of the generalisation curve, less
            the lengths of the generalisation outcome), the right-parity share above chance, ``(f - f0) / (1 - f0)``
            (NaN when the tracker makes no error there: no evidence either way).
        score: mean of the indices that are defined (NaN when none is).
        label: ``PAA`` when score > threshold, ``AA`` when not, ``abstain`` when no index is defined.
    """

    probe_index: float
    patch_index: float
    gen_index: float
    score: float
    label: str

    def votes(self, thresholds: tuple[float, float, float]) -> dict[str, str]:
        """Each index's own AA/PAA call at its threshold (agreement between signatures; ``abstain`` when NaN)."""
        vals = (self.probe_index, self.patch_index, self.gen_index)
        return {k: "abstain" if math.isnan(v) else "PAA" if v > th else "AA"
                for k, v, th in zip(("probe", "patch", "gen"), vals, thresholds)}  # fmt: skip


def probe_index(state: ProbeGrid, par: ProbeGrid, rows: Sequence[int], lengths: Sequence[int]) -> float:
    """Mean over `rows` x `lengths` of parity minus state probe accuracy, both in above-chance units (NaN if empty)."""
    cols = [state.lengths.index(t) for t in lengths]
    d = par.above_chance()[np.ix_(list(rows), cols)] - state.above_chance()[np.ix_(list(rows), cols)]
    return float(d.mean()) if d.size else float("nan")


def patch_index(same: PatchGrid, diff: PatchGrid, rows: Sequence[int]) -> float:
    """Mean over `rows` of (diff-parity - same-parity) effect of patching the last token's residual; NaN when either
    grid has no valid pair (no story answered right on both runs: nothing to read)."""
    if not rows or not same.n_valid or not diff.n_valid:
        return float("nan")
    return float(np.mean([diff.effect[r, -1] - same.effect[r, -1] for r in rows]))


def frontier(curve: GenCurve, margin: float = 0.1) -> list[int]:
    """Prefix lengths (1-based) where the tracker is failing but still tracks something: chance + `margin` < acc < 1.

    Chance is 1/G. Where the accuracy is 1 there are no errors to read; where it is at chance (far beyond the
    training length, where the position encoding breaks everything) the errors say nothing about the mechanism.
    """
    chance = 1.0 / curve.n_states
    return [t + 1 for t, a in enumerate(curve.acc) if chance + margin < a < 1.0]


def gen_index(curve: GenCurve, lengths: Sequence[int]) -> float:
    """Right-parity share of the errors at `lengths` (1-based) above its chance level; NaN without errors.

    ``(f - f0) / (1 - f0)``: f the share of wrong predictions whose parity is right, f0 = (G/2 - 1) / (G - 1) that
    share for a uniformly random wrong state. PAA keeps the parity when it fails (the output was pruned to the right
    coset): ~1; AA's errors do not: ~0. With no error (or no length) there is nothing to read: NaN, the index
    abstains (a 0 would call a tracker that never fails AA, and tie the label to its accuracy).
    """
    cols = [t - 1 for t in lengths]
    if not cols:
        return float("nan")
    wrong = 1.0 - curve.per_story[:, cols]  # (N, P)
    n_wrong = float(wrong.sum())
    if n_wrong == 0:
        return float("nan")
    f = float((wrong * curve.per_story_parity[:, cols]).sum()) / n_wrong
    f0 = curve.chance_err_parity
    return float((f - f0) / (1.0 - f0))


def classify(indices: Sequence[float], threshold: float = 0.4) -> Mechanism:
    """`Mechanism` from (probe, patch, gen) indices: PAA when the mean of the defined (non-NaN) ones exceeds
    `threshold`, AA when it does not, ``abstain`` when none is defined."""
    p, q, g = (float(x) for x in indices)
    defined = [x for x in (p, q, g) if not math.isnan(x)]
    if not defined:
        return Mechanism(p, q, g, float("nan"), "abstain")
    score = sum(defined) / len(defined)
    return Mechanism(p, q, g, score, "PAA" if score > threshold else "AA")


def mechanism_score(state: ProbeGrid, par: ProbeGrid, same: PatchGrid, diff: PatchGrid, curve: GenCurve,
                    *, n_layers: int, threshold: float = 0.4, margin: float = 0.1,
                    gen_exclude: Sequence[int] = ()) -> Mechanism:  # fmt: skip
    """The three indices of one tracker and its label (see `Mechanism`): probes over early layers x long prefixes of
    the probe stories, patching over early layers, error parities on the `frontier` of the generalisation curve
    less the lengths in `gen_exclude` (those an outcome such as ``long_acc`` is read at: the mechanism must not be
    read from the data it is compared with)."""
    rows = early_layers(n_layers)
    skip = set(gen_exclude)
    return classify(
        (
            probe_index(state, par, rows, long_prefixes(state.lengths[-1])),
            patch_index(same, diff, rows),
            gen_index(curve, [t for t in frontier(curve, margin) if t not in skip]),
        ),
        threshold,
    )


def steps_to_threshold(hist: TrainHistory, steps: int) -> tuple[int, bool]:
    """(steps, censored): the first eval step at the threshold, or `steps` (a lower bound) when never reached."""
    if hist.steps_to_threshold is None:
        return steps, True
    return hist.steps_to_threshold, False


__all__ = [
    "CONDITIONS",
    "GenCurve",
    "Mechanism",
    "TrainHistory",
    "classify",
    "early_layers",
    "frontier",
    "gen_index",
    "generalisation_curve",
    "long_prefixes",
    "make_tracker",
    "mechanism_score",
    "patch_index",
    "predict_states",
    "probe_index",
    "state_accuracy",
    "steps_to_threshold",
    "topic_documents",
    "train_tracker",
]
