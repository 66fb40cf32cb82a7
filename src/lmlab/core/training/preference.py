"""Preference-learning losses in plain PyTorch, and the response log-probs they are computed from.

Every loss takes per-example tensors of shape ``(batch,)`` and an optional per-example ``weight`` (same shape) and
returns ``mean(weight * loss)`` (``reduction="none"`` gives the weighted per-example vector). Per-example weights
are why these losses are written here instead of taken from TRL: TRL's ``DPOTrainer`` has no dataset weight column
(huggingface/trl#5613), and PLE, RLTHF and M_AP all gate or weight examples one by one.

Losses (each docstring gives the equation and the paper):

- `dpo_loss`: DPO sigmoid, with cDPO label smoothing;
- `simpo_loss`: SimPO, length-normalised and reference-free, with target margin gamma;
- `ranking_loss`: listwise PRO (Plackett-Luce) or pairwise RRHF hinge over length-normalised log-probs;
- `weighted_sft_loss`: reward-weighted negative log-likelihood of responses (RAFT / PLE's weighted SFT);
- `bradley_terry_loss`: the reward-model loss;
- `implicit_prm_ce_loss` and `implicit_step_rewards`: the implicit PRM of Yuan et al. (2024).

Log-probs: `seq_logprobs` scores responses after prompts with one padded forward pass (right or left padding) and
returns per-token, summed and mean log-probs (`SeqLogps`); `pair_logps` scores chosen and rejected responses of
the same prompts in one batch, ``[chosen; rejected]`` as TRL concatenates them. `build_response_batch` exposes the
tokenised batch so the cached-trunk path (`lmlab.core.training.partial`) scores exactly the same tokens.

Prompt/response boundary: the response's tokens are ``enc(prompt + response)[len(enc(prompt)):]``, and when BPE
merges the last prompt token with the first response characters, the merged token belongs to the response. That is
TRL's ``build_tokenized_answer`` (``trl/experimental/cpo/cpo_trainer.py:427``, the same code SimPO's trainer uses),
implemented by `lmlab.core.inference.scoring.split_pair` as the longest common prefix of ``enc(prompt + response)`` and
``enc(prompt)`` (identical results when the merge touches one token, the case TRL handles).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.inference.scoring import chat_prompt, has_chat_template, split_pair

_REDUCTIONS = ("mean", "none")


# --------------------------------------------------------------------------------------------------- reductions


def _check_same_shape(**tensors: torch.Tensor) -> torch.Size:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if any(s != first for s in shapes.values()):
        raise ValueError(f"per-example tensors must share one shape, got {shapes}")
    if len(first) != 1:
        raise ValueError(f"per-example tensors must be 1-D (batch,), got shape {first}")
    return torch.Size(first)


def _reduce(loss: torch.Tensor, weight: torch.Tensor | None, reduction: str) -> torch.Tensor:
    """``mean(weight * loss)``: an unnormalised weighted mean, so weight 0 removes an example's gradient."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if weight is not None:
        weight = torch.as_tensor(weight, dtype=loss.dtype, device=loss.device)
        if weight.shape != loss.shape:
            raise ValueError(f"weight has shape {tuple(weight.shape)}, expected the batch shape {tuple(loss.shape)}")
        loss = weight * loss
    return loss.mean() if reduction == "mean" else loss


def _check_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5), got {label_smoothing}")


# ------------------------------------------------------------------------------------------------------- losses


def dpo_margin(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
) -> torch.Tensor:
    """The DPO log-ratio margin ``(pc - rc) - (pr - rr)`` (not yet scaled by beta), shape (batch,)."""
    _check_same_shape(pc=policy_chosen, pr=policy_rejected, rc=ref_chosen, rr=ref_rejected)
    return (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """DPO sigmoid loss: ``-(1-eps) logsig(beta*m) - eps logsig(-beta*m)``, ``m = (pc - rc) - (pr - rr)``.

    Rafailov et al. 2023, "Direct Preference Optimization" (arXiv 2305.18290), Eq. 7; the label-smoothed form with
    ``eps > 0`` is cDPO (Mitchell 2023, "A note on DPO with noisy preferences"), as in TRL's CPO ``sigmoid`` loss
    (``trl/experimental/cpo/cpo_trainer.py:724``). With ``eps = 0`` it equals TRL 1.16 ``DPOTrainer``'s
    ``loss_type="sigmoid"`` (``trl/trainer/dpo_trainer.py:1388``).

    Gradient (``eps = 0``): ``dL/dpc = -beta * sigmoid(-beta*m) * w / B = -dL/dpr``; it never vanishes at ``m = 0``
    (it is ``-beta/2`` there); what vanishes is the gradient through the model when chosen and rejected are the same
    response, because ``pc - pr`` is then identically 0.

    Args:
        policy_chosen, policy_rejected, ref_chosen, ref_rejected (`torch.Tensor`, shape (batch,)):
            summed response log-probs under the policy and the frozen reference.
        beta (`float`, *optional*, defaults to `0.1`): inverse temperature of the implicit reward (DPO paper 0.1).
        label_smoothing (`float`, *optional*, defaults to `0.0`): cDPO's assumed label-flip rate, in [0, 0.5).
        weight (`torch.Tensor`, *optional*): per-example weights, shape (batch,).
        reduction (`str`, *optional*, defaults to `"mean"`): ``"mean"`` (of weight * loss) or ``"none"``.
    """
    _check_smoothing(label_smoothing)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    z = beta * dpo_margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    loss = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return _reduce(loss, weight, reduction)


def dpo_rewards(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO's implicit rewards ``beta * (pc - rc)`` and ``beta * (pr - rr)`` (detached), as TRL logs them."""
    _check_same_shape(pc=policy_chosen, pr=policy_rejected, rc=ref_chosen, rr=ref_rejected)
    return (beta * (policy_chosen - ref_chosen)).detach(), (beta * (policy_rejected - ref_rejected)).detach()


def simpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    chosen_len: torch.Tensor,
    rejected_len: torch.Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 1.0,
    label_smoothing: float = 0.0,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """SimPO: ``-logsig(beta/|yw| * logp(yw) - beta/|yl| * logp(yl) - gamma)``, no reference model.

    Meng, Xia and Chen 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward" (arXiv 2405.14734),
    Eq. 6. With label smoothing as in TRL's CPO ``loss_type="simpo"`` (``trl/experimental/cpo/cpo_trainer.py:715``),
    which computes ``logits = mean_c - mean_r - gamma/beta`` and ``-logsig(beta*logits)``, the same quantity.
    Defaults: beta 2.0 and gamma/beta 0.5, the SimPO repository's Llama-3 setting (its Mistral one uses 0.8).

    Args:
        policy_chosen, policy_rejected (`torch.Tensor`, shape (batch,)): *summed* response log-probs.
        chosen_len, rejected_len (`torch.Tensor`, shape (batch,)): response lengths in tokens (> 0).
        beta (`float`, *optional*, defaults to `2.0`): reward scale.
        gamma (`float`, *optional*, defaults to `1.0`): target reward margin.
    """
    _check_smoothing(label_smoothing)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    _check_same_shape(pc=policy_chosen, pr=policy_rejected, lc=chosen_len, lr=rejected_len)
    if bool((chosen_len <= 0).any() or (rejected_len <= 0).any()):
        raise ValueError("response lengths must be > 0 tokens; an empty response has no length-normalised log-prob")
    z = beta * (policy_chosen / chosen_len - policy_rejected / rejected_len) - gamma
    loss = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return _reduce(loss, weight, reduction)


def ranking_loss(
    scores: torch.Tensor,
    *,
    kind: str = "pro",
    beta: float = 1.0,
    mask: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Ranking loss over candidates ordered best first; ``scores`` are length-normalised log-probs, (batch, n).

    ``kind="pro"`` (listwise, Plackett-Luce): ``-sum_{k<n} log( exp(beta s_k) / sum_{i>=k} exp(beta s_i) )``,
    Song et al. 2024, "Preference Ranking Optimization for Human Alignment" (PRO, AAAI, arXiv 2306.17492), Eq. 5
    with ``s = (1/|y|) log pi(y|x)``. For n = 2 it is ``-logsig(beta (s_1 - s_2))``, a reference-free, margin-free
    DPO on length-normalised log-probs: the pairwise reading that PLE's ranking loss calls for.

    ``kind="rrhf"`` (pairwise hinge): ``sum_{i<j} max(0, s_j - s_i)``, Yuan et al. 2023, "RRHF: Rank Responses to
    Align Language Models with Human Feedback" (arXiv 2304.05302), Eq. 2 (beta unused). Both papers add an SFT
    term on the best candidate; add `weighted_sft_loss` for it.

    Args:
        scores (`torch.Tensor`, shape (batch, n)): candidate scores, column 0 the best, column n-1 the worst.
        mask (`torch.Tensor`, *optional*, shape (batch, n)): 1 for real candidates (rows with fewer than n).
    """
    if scores.ndim != 2 or scores.shape[1] < 2:
        raise ValueError(f"scores must have shape (batch, n >= 2), got {tuple(scores.shape)}")
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    mask = mask.to(torch.bool)
    if mask.shape != scores.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(scores.shape)}")
    if kind == "pro":
        z = (beta * scores).masked_fill(~mask, float("-inf"))  # (batch, n)
        # log sum_{i >= k} exp(z_i): reverse cumulative logsumexp
        tail = torch.logcumsumexp(z.flip(-1), dim=-1).flip(-1)  # (batch, n)
        terms = tail - z  # -log softmax of candidate k among candidates k..n
        # the last real candidate's term is log 1 = 0; padded ones are dropped
        last = mask & ~torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
        keep = mask & ~last
        loss = torch.where(keep, terms, torch.zeros_like(terms)).sum(-1)
    elif kind == "rrhf":
        diff = scores[:, None, :] - scores[:, :, None]  # [b, i, j] = s_j - s_i
        n = scores.shape[1]
        upper = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)  # i < j: i ranked above j
        pair = upper[None] & mask[:, :, None] & mask[:, None, :]
        loss = torch.where(pair, diff.clamp_min(0), torch.zeros_like(diff)).sum((-1, -2))
    else:
        raise ValueError(f"kind must be 'pro' or 'rrhf', got {kind!r}")
    return _reduce(loss, weight, reduction)


def weighted_sft_loss(
    token_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    normalize: str = "tokens",
    reduction: str = "mean",
) -> torch.Tensor:
    """Reward-weighted SFT: ``mean_i w_i * NLL_i``, ``NLL_i = -(1/|y_i|) sum_t log pi(y_it | x_i, y_i<t)``.

    The weighted-likelihood objective of RAFT (Dong et al. 2023, arXiv 2304.06767; weights 0/1 for the kept best
    sample) and of PLE's weighted SFT branch (Liu et al., ICML 2025, Algorithm 1; weights from normalised rewards).

    Args:
        token_logps (`torch.Tensor`, shape (batch, T)): per-token log-probs of the responses (any padding value).
        mask (`torch.Tensor`, shape (batch, T)): 1 on response tokens.
        normalize (`str`, *optional*, defaults to `"tokens"`): ``"tokens"`` divides each NLL by its length,
            ``"sum"`` keeps the summed NLL.
    """
    if token_logps.shape != mask.shape or token_logps.ndim != 2:
        raise ValueError(f"token_logps {tuple(token_logps.shape)} and mask {tuple(mask.shape)} must be equal (B, T)")
    mask = mask.to(token_logps.dtype)
    nll = -(token_logps * mask).sum(-1)  # (batch,)
    if normalize == "tokens":
        n = mask.sum(-1)
        if bool((n == 0).any()):
            raise ValueError("a response has no tokens; weighted_sft_loss needs at least one response token per row")
        nll = nll / n
    elif normalize != "sum":
        raise ValueError(f"normalize must be 'tokens' or 'sum', got {normalize!r}")
    return _reduce(nll, weight, reduction)


def bradley_terry_loss(
    reward_chosen: torch.Tensor,
    reward_rejected: torch.Tensor,
    *,
    margin: torch.Tensor | float | None = None,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Bradley-Terry reward-model loss ``-logsig(r_c - r_r - margin)``.

    Bradley and Terry 1952; as the RLHF reward-model objective, Ouyang et al. 2022 (InstructGPT, arXiv 2203.02155),
    Eq. 1; the optional margin is Llama 2's (Touvron et al. 2023, Eq. 2). Equals TRL 1.16 ``RewardTrainer``'s loss
    (``trl/trainer/reward_trainer.py:790``) without ``center_rewards_coefficient``.
    """
    _check_same_shape(rc=reward_chosen, rr=reward_rejected)
    z = reward_chosen - reward_rejected
    if margin is not None:
        z = z - torch.as_tensor(margin, dtype=z.dtype, device=z.device)
    return _reduce(-F.logsigmoid(z), weight, reduction)


def implicit_reward(policy_logps: torch.Tensor, ref_logps: torch.Tensor, *, beta: float) -> torch.Tensor:
    """The implicit outcome reward ``r = beta * (log pi(y|x) - log pi_ref(y|x))`` of summed log-probs, (batch,)."""
    _check_same_shape(policy=policy_logps, ref=ref_logps)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    return beta * (policy_logps - ref_logps)


def implicit_prm_ce_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    *,
    beta: float = 0.05,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Implicit-PRM cross-entropy ``-(l log sig(r) + (1-l) log(1 - sig(r)))``, ``r = beta (log pi - log pi_ref)``.

    Yuan et al. 2024, "Free Process Rewards without Process Labels" (ICML 2025, arXiv 2412.01981), the CE objective
    of its README / Sec. 3: response-level labels ``l`` in {0, 1} (final answer correct) train the log-ratio, whose
    per-step partial sums are then process rewards (`implicit_step_rewards`). beta 0.05 is the paper's setting
    [verify]. Class-balanced variants: pass balancing weights as ``weight``.
    """
    r = implicit_reward(policy_logps, ref_logps, beta=beta)
    labels = torch.as_tensor(labels, dtype=r.dtype, device=r.device)
    if labels.shape != r.shape:
        raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(r.shape)}")
    if bool(((labels < 0) | (labels > 1)).any()):
        raise ValueError("labels must lie in [0, 1] (1 = correct outcome)")
    # log(1 - sig(r)) = logsig(-r), the numerically stable form
    loss = -(labels * F.logsigmoid(r) + (1 - labels) * F.logsigmoid(-r))
    return _reduce(loss, weight, reduction)


def implicit_step_rewards(
    policy_token_logps: torch.Tensor,
    ref_token_logps: torch.Tensor,
    step_ends: Sequence[int],
    beta: float,
) -> torch.Tensor:
    """Process rewards of an implicit PRM: step s gets ``beta * sum_{t in step s} (log pi(y_t) - log pi_ref(y_t))``.

    Yuan et al. 2024 (arXiv 2412.01981), Proposition 3.1: ``q_t = sum_{i<=t} beta log(pi/pi_ref)(y_i | y_<i)`` is a
    soft Q-value, so the step reward ``r_s = q_{end(s)} - q_{end(s-1)}``. Steps tile the response, so the step
    rewards sum to the outcome reward ``beta * (log pi(y) - log pi_ref(y))``.

    Args:
        policy_token_logps, ref_token_logps (`torch.Tensor`, shape (T,)): per-token log-probs of one response.
        step_ends (`Sequence[int]`): exclusive token end of each step, strictly increasing, the last equal to T
            (build them from character offsets with `step_token_ends`).
        beta (`float`): the PRM's beta.

    Returns:
        `torch.Tensor` of shape (n_steps,).
    """
    if policy_token_logps.ndim != 1 or policy_token_logps.shape != ref_token_logps.shape:
        raise ValueError(
            f"token log-probs must be two equal 1-D (T,) vectors, got {tuple(policy_token_logps.shape)} and "
            f"{tuple(ref_token_logps.shape)}"
        )
    t = policy_token_logps.shape[0]
    ends = [int(e) for e in step_ends]
    if not ends or any(b <= a for a, b in zip([0, *ends], ends, strict=False)) or ends[-1] != t:
        raise ValueError(f"step_ends must be strictly increasing positive token ends ending at T={t}, got {ends}")
    q = beta * torch.cumsum(policy_token_logps - ref_token_logps, dim=0)  # (T,) soft Q-values
    q_ends = q[torch.tensor(ends, device=q.device) - 1]  # (n_steps,)
    return torch.diff(q_ends, prepend=q_ends.new_zeros(1))


def step_token_ends(offsets: Sequence[tuple[int, int]], step_char_ends: Sequence[int]) -> list[int]:
    """Token ends of steps given each token's character span (``return_offsets_mapping``) and each step's char end.

    A token belongs to the step that contains its first character, so a BPE token that merges a step's trailing
    newline with the next step's first word goes to the step where it starts (the alignment doc's pitfall). Steps
    that receive no token are an error: their reward would be undefined.
    """
    char_ends = [int(c) for c in step_char_ends]
    if not char_ends or any(b <= a for a, b in zip(char_ends, char_ends[1:], strict=False)):
        raise ValueError(f"step_char_ends must be a non-empty strictly increasing list, got {char_ends}")
    ends: list[int] = []
    step = 0
    for i, (start, _) in enumerate(offsets):
        while step < len(char_ends) - 1 and start >= char_ends[step]:
            ends.append(i)
            step += 1
    ends.append(len(offsets))
    while len(ends) < len(char_ends):  # trailing steps past the last token
        ends.append(len(offsets))
    if any(b <= a for a, b in zip([0, *ends], ends, strict=False)):
        raise ValueError(f"a step holds no token (token ends {ends} for step char ends {char_ends})")
    return ends


# --------------------------------------------------------------------------------------------------- log-probs


@dataclass
class ResponseBatch:
    """A tokenised, padded batch of prompt + response sequences.

    Attributes:
        input_ids (`torch.LongTensor`, (batch, T)); attention_mask (`torch.LongTensor`, (batch, T));
        position_ids (`torch.LongTensor`, (batch, T)): ``cumsum(mask) - 1``, correct for either padding side;
        response_mask (`torch.BoolTensor`, (batch, T)): True on response tokens;
        padding_side (`str`): ``"right"`` or ``"left"``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    padding_side: str

    @property
    def target_mask(self) -> torch.Tensor:
        """(batch, T-1) bool: position t-1 predicts response token t."""
        return self.response_mask[:, 1:]

    def to(self, device: torch.device | str) -> ResponseBatch:
        return ResponseBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.position_ids.to(device),
            self.response_mask.to(device),
            self.padding_side,
        )


def _as_list(x: str | Sequence[str], name: str) -> list[str]:
    if isinstance(x, str):
        return [x]
    out = list(x)
    if not all(isinstance(s, str) for s in out):
        raise ValueError(f"{name} must be a string or a sequence of strings")
    return out


def _chat_texts(tokenizer: Any, prompt: str, response: str) -> tuple[str, str]:
    """(templated prompt, response text including the template's end-of-turn), as M_AP's ``cal_logps.py`` builds
    them from ``apply_chat_template(messages[:-1])`` and ``apply_chat_template(messages)``."""
    head = chat_prompt(tokenizer, prompt)
    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], tokenize=False
    )
    if not full.startswith(head):
        raise ValueError(
            "the chat template's text for [user, assistant] does not start with its text for [user] + generation "
            "prompt; score with chat=False on pre-formatted text"
        )
    return head, full[len(head) :]


def build_response_batch(
    tokenizer: Any,
    prompts: str | Sequence[str],
    responses: str | Sequence[str],
    *,
    chat: bool = False,
    padding_side: str = "right",
    max_length: int | None = None,
) -> ResponseBatch:
    """Tokenise (prompt, response) pairs with the boundary rule of the module docstring and pad them.

    Args:
        chat (`bool`, *optional*, defaults to `False`): wrap each prompt as a user turn and the response as the
            assistant turn with the tokenizer's chat template (the response then includes the end-of-turn token);
            needs a chat template. Templated text is tokenised without adding special tokens (the template wrote
            them), plain text with them (Gemma's BOS).
        padding_side (`str`, *optional*, defaults to `"right"`): ``"right"`` (TRL's) or ``"left"`` (generation's;
            lets the scorer run the LM head on the last positions only).
        max_length (`int`, *optional*): refuse sequences longer than this (no silent truncation).
    """
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    ps, rs = _as_list(prompts, "prompts"), _as_list(responses, "responses")
    if len(ps) != len(rs):
        raise ValueError(f"got {len(ps)} prompts but {len(rs)} responses")
    if not ps:
        raise ValueError("empty batch: need at least one (prompt, response) pair")
    if chat and not has_chat_template(tokenizer):
        raise ValueError("chat=True needs a tokenizer with a chat template; this one has none (use chat=False)")
    rows: list[tuple[list[int], list[int]]] = []
    for i, (p, r) in enumerate(zip(ps, rs, strict=True)):
        if chat:
            p, r = _chat_texts(tokenizer, p, r)
        ctx, cont = split_pair(tokenizer, p, r, add_special_tokens=not chat)
        if not ctx:
            raise ValueError(
                f"pair {i}: the prompt has no token before the response; the first response token needs a context"
            )
        if not cont:
            raise ValueError(f"pair {i}: the response {r!r} has no token of its own")
        if max_length is not None and len(ctx) + len(cont) > max_length:
            raise ValueError(f"pair {i} has {len(ctx) + len(cont)} tokens, more than max_length={max_length}")
        rows.append((ctx, cont))
    width = max(len(c) + len(x) for c, x in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (ctx, cont) in enumerate(rows):
        n = len(ctx) + len(cont)
        start = 0 if padding_side == "right" else width - n
        ids[i, start : start + n] = torch.tensor(ctx + cont)
        mask[i, start : start + n] = 1
        resp[i, start + len(ctx) : start + n] = True
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    return ResponseBatch(ids, mask, position_ids, resp, padding_side)


@dataclass
class SeqLogps:
    """Response log-probs of a batch.

    Attributes:
        token_logps (`torch.Tensor`, (batch, T-1)): log p of the token at t+1 given the prefix, 0 off the response.
        mask (`torch.BoolTensor`, (batch, T-1)): True where ``token_logps`` is a response token's log-prob.
        sum (`torch.Tensor`, (batch,)); mean (`torch.Tensor`, (batch,)); n_tokens (`torch.LongTensor`, (batch,)).
    """

    token_logps: torch.Tensor
    mask: torch.Tensor
    sum: torch.Tensor
    mean: torch.Tensor
    n_tokens: torch.Tensor

    def per_token(self, i: int) -> torch.Tensor:
        """Row i's response log-probs in order, shape (n_tokens[i],)."""
        return self.token_logps[i][self.mask[i]]

    def __len__(self) -> int:
        return int(self.sum.shape[0])


def logps_from_token_logps(token_logps: torch.Tensor, mask: torch.Tensor) -> SeqLogps:
    """`SeqLogps` from (batch, T-1) per-position log-probs and the (batch, T-1) response-target mask."""
    mask = mask.to(torch.bool)
    token_logps = torch.where(mask, token_logps, torch.zeros_like(token_logps))
    n = mask.sum(-1)
    total = token_logps.sum(-1)
    return SeqLogps(token_logps, mask, total, total / n.clamp_min(1).to(total.dtype), n)


def target_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[target]`` in float32: (batch, T, V) logits and (batch, T) targets -> (batch, T)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def _forward_token_logps(model: Any, batch: ResponseBatch) -> torch.Tensor:
    """(batch, T-1) log p(x_{t+1} | x_<=t) under `model` (0 where unused)."""
    b, t = batch.input_ids.shape
    if batch.padding_side == "left":
        # Responses end every row, so only the last `keep` positions need the LM head (its cost is ~8 SmolLM2
        # layers per token).
        first = int(batch.response_mask.float().argmax(-1).min())  # earliest response token over the batch
        keep = t - first + 1  # logits at positions first-1 .. T-1
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=keep,
            use_cache=False,
        ).logits  # (batch, keep, V)
        lp = target_logps(logits[:, :-1], batch.input_ids[:, first:])  # (batch, keep-1): predicts tokens first..T-1
        return torch.cat([lp.new_zeros(b, t - 1 - lp.shape[1]), lp], dim=1)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits  # (batch, T, V)
    return target_logps(logits[:, :-1], batch.input_ids[:, 1:])


def batch_logps(model: Any, batch: ResponseBatch, *, batch_size: int | None = None) -> SeqLogps:
    """`SeqLogps` of a prepared `ResponseBatch`, forwarding `batch_size` rows at a time (all rows if None).

    Gradients flow unless the caller wraps the call in ``torch.no_grad()`` (the reference model should be).
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    n = batch.input_ids.shape[0]
    step = n if batch_size is None else int(batch_size)
    if step < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    parts = []
    for s in range(0, n, step):
        sub = ResponseBatch(
            batch.input_ids[s : s + step],
            batch.attention_mask[s : s + step],
            batch.position_ids[s : s + step],
            batch.response_mask[s : s + step],
            batch.padding_side,
        )
        parts.append(_forward_token_logps(model, sub))
    return logps_from_token_logps(torch.cat(parts, dim=0), batch.target_mask)


def seq_logprobs(
    model: Any,
    tokenizer: Any,
    prompt: str | Sequence[str],
    response: str | Sequence[str],
    *,
    chat: bool = False,
    padding_side: str = "right",
    batch_size: int | None = None,
    max_length: int | None = None,
) -> SeqLogps:
    """Log-probs of each response after its prompt: per-token vector, sum and mean (a `SeqLogps` of the batch).

    One string pair gives a batch of one. The boundary follows TRL's ``build_tokenized_answer`` (module docstring).
    Gradients flow unless called under ``torch.no_grad()``.

    Example:
        >>> s = seq_logprobs(model, tok, ["Q: 2+2=", "Q: 3+3="], [" 4", " 6"], padding_side="left")
        >>> s.sum, s.mean, s.per_token(0)
    """
    batch = build_response_batch(
        tokenizer, prompt, response, chat=chat, padding_side=padding_side, max_length=max_length
    )
    return batch_logps(model, batch, batch_size=batch_size)


@dataclass
class PairLogps:
    """Log-probs of chosen and rejected responses of the same prompts (`SeqLogps` each, batch-aligned)."""

    chosen: SeqLogps
    rejected: SeqLogps


def build_pair_batch(
    tokenizer: Any,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    *,
    chat: bool = False,
    padding_side: str = "right",
    max_length: int | None = None,
) -> ResponseBatch:
    """One `ResponseBatch` of rows ``[chosen_0..chosen_{B-1}, rejected_0..rejected_{B-1}]`` (TRL's order).

    Each row takes its own prompt/response boundary. TRL 1.16's ``DPOTrainer`` takes one per example, the shorter
    of the chosen's and the rejected's common prefix with the prompt (``trl/trainer/dpo_trainer.py:1106``); the two
    differ only when exactly one of the two responses merges with the prompt's last token.
    """
    ps, cs, rs = _as_list(prompts, "prompts"), _as_list(chosen, "chosen"), _as_list(rejected, "rejected")
    if not len(ps) == len(cs) == len(rs):
        raise ValueError(f"got {len(ps)} prompts, {len(cs)} chosen and {len(rs)} rejected responses")
    return build_response_batch(
        tokenizer, ps + ps, cs + rs, chat=chat, padding_side=padding_side, max_length=max_length
    )


def split_pair_logps(seq: SeqLogps) -> PairLogps:
    """Split the `SeqLogps` of a `build_pair_batch` batch into its chosen and rejected halves."""
    if len(seq) % 2:
        raise ValueError(f"a pair batch has an even number of rows, got {len(seq)}")
    h = len(seq) // 2

    def half(sl: slice) -> SeqLogps:
        return SeqLogps(seq.token_logps[sl], seq.mask[sl], seq.sum[sl], seq.mean[sl], seq.n_tokens[sl])

    return PairLogps(half(slice(0, h)), half(slice(h, None)))


def pair_logps(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    *,
    chat: bool = False,
    padding_side: str = "right",
    batch_size: int | None = None,
    max_length: int | None = None,
) -> PairLogps:
    """Chosen and rejected log-probs of preference pairs from one padded forward batch ``[chosen; rejected]``.

    Example:
        >>> pol = pair_logps(policy, tok, prompts, chosen, rejected)
        >>> with torch.no_grad():
        ...     ref = pair_logps(reference, tok, prompts, chosen, rejected)
        >>> loss = dpo_loss(pol.chosen.sum, pol.rejected.sum, ref.chosen.sum, ref.rejected.sum, beta=0.1)
    """
    batch = build_pair_batch(
        tokenizer, prompts, chosen, rejected, chat=chat, padding_side=padding_side, max_length=max_length
    )
    return split_pair_logps(batch_logps(model, batch, batch_size=batch_size))
