"""The state-tracking task (Li, Guo & Andreas, ICML 2025): the group S_n, stories of actions, the tracker vocabulary.

Task ([code] ``permutation_task.py``). States and actions are permutations of {1..n} in one-line notation. The state
starts at the identity and each action updates it by ``new_state[j] = state[action[j] - 1]`` (`apply_action`), so
after actions a_1..a_t the state is the function composition s_t = a_1 ∘ a_2 ∘ ... ∘ a_t. ``compute_parity`` is
the inversion count mod 2 (`parity`). `Stories` hold batches of action indices with the state sequence they produce
(`rollout`); `TrackerVocab` maps actions, states and parities to token ids (one token per permutation).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

GROUPS = {"S3": 3, "S5": 5}
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
# vocabulary


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


__all__ = [
    "GROUPS",
    "N_SPECIALS",
    "PermGroup",
    "Stories",
    "TrackerVocab",
    "apply_action",
    "check_model",
    "group_of",
    "make_stories",
    "parity",
    "perm_group",
    "rollout",
    "stories_from_examples",
]
