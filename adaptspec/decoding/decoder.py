"""The draft/verify loop: lossless speculative decoding with a block-diffusion drafter.

One round: the drafter drafts ``B - 1`` tokens after the last committed token in one pass;
the target scores ``[last, d_1 .. d_{B-1}]`` in one pass; the longest acceptable prefix is
kept, plus one token from the target (the bonus), so every round commits ``tau`` tokens,
``1 <= tau <= B``. At temperature 0 a draft is acceptable when it equals the target's
argmax; at T > 0 when it equals the target's sample at its position, drawn with the Gumbel-max
trick from noise keyed by the request's seed and the position (:mod:`~adaptspec.decoding.sampling`),
so the output distribution is exactly the target's and a seed gives the same tokens whatever
the block sizes. ``B = 1`` drafts nothing: that is plain
decoding, through the same code; a request decoded at ``B = 1`` throughout runs the
target's own one-token step and never touches the drafter ("no speculation", at full plain
speed in fast verification).

What "the target's" means depends on the target's verification mode
(:data:`~adaptspec.decoding.target.VERIFICATION_MODES`): in ``"exact"`` mode the output is
bit-identical to one-token greedy decoding; in ``"fast"`` mode every committed token is the
target's argmax (or exact sample) in the pass that verified it, which can differ from
one-token greedy decoding only where two logits tie within rounding.

**Draft once, verify a prefix** (``draft_length=D``): every round that speculates drafts the
same ``D - 1`` tokens and verifies the first ``B - 1`` of them, ``B <= D`` the block the
request (or its schedule) chose; the decoder's ``max_block_size`` is then ``D``. A round's
outcome at every shorter block is then known exactly (a shorter block is a prefix of the same
draft: :mod:`adaptspec.reward.counterfactual`), and the decoder declares ``prefix_drafts``.
``None`` (the default) drafts exactly the block it verifies. The output is the same either way
(the drafts decide only how many tokens a round commits); docs/decoding.md compares the two.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> torch.manual_seed(0) and None
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
...                   num_attention_heads=4, num_key_value_heads=2, eos_token_id=None)
>>> model = LlamaForCausalLM(cfg).eval()
>>> target = TargetModel(model, verification="exact")
>>> decoder = SpeculativeDecoder(target, BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0))
>>> prompt = [3, 14, 15, 9, 2, 6]
>>> spec = decoder.generate(prompt, block_size=4, max_new_tokens=12)
>>> plain = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, min_new_tokens=12)
>>> spec.tokens == plain[0, len(prompt):].tolist()
True
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import AdaptspecError
from ..schedules.fixed import FixedBlock, as_schedule
from ..speculator import Outcome, Prefill, Round, RoundSchedule
from .drafter import BlockDiffusionDrafter, DraftState
from .sampling import SampleKeys, accept_keyed, draft_keyed, sample_keyed
from .target import TargetModel
from .tree_budget import FixedTree, TreeBudget
from .tree_outcomes import round_outcomes
from .tree_round import committed, draft_tree, target_choices, tree_depth
from .tree_verify import check_tree_target, keep_path, tree_attention, verify_tree

#: A fixed block size, a per-round schedule (:mod:`adaptspec.schedules`), or a function
#: ``(round_index, rounds_so_far) -> block size``; or a draft tree's budget
#: (:mod:`adaptspec.decoding.tree_budget`) or a tree arm (``-N``, :func:`adaptspec.speculator.tree_arm`)
#: to verify trees instead of chains.
BlockSchedule = int | RoundSchedule | Callable[[int, list[Round]], int] | TreeBudget


def as_tree_budget(block_size: Any) -> TreeBudget | None:
    """The tree budget ``block_size`` asks for: itself, ``FixedTree(N)`` for a tree arm ``-N``
    (:func:`adaptspec.speculator.tree_arm`), None for a chain's block size or schedule."""
    if isinstance(block_size, TreeBudget):
        return block_size
    if isinstance(block_size, (int, np.integer)) and not isinstance(block_size, bool) and block_size < 0:
        return FixedTree(-int(block_size))
    return None


@dataclass
class _PrefillState:
    cache: Any
    context_hidden: torch.Tensor | None
    keys: SampleKeys | None  # the request's sampling keys (temperature > 0)


class SpeculativeDecoder:
    """Implements the speculator protocol (``prefill`` / ``decode``) over a target and a drafter.

    Without a drafter only ``block_size=1`` (plain decoding) is possible. ``draft_length``
    (None: draft the block to verify) drafts that many positions every speculating round and
    verifies a prefix of them (see the module docstring); it caps the block size.
    """

    def __init__(
        self,
        target: TargetModel,
        drafter: BlockDiffusionDrafter | None = None,
        draft_length: int | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        if drafter is not None:
            drafter.attach(target.model)
            target.context_layers = list(drafter.config.target_layers)
        self.draft_length = check_draft_length(draft_length, drafter)
        self.max_block_size: int = drafter.config.max_block_size if drafter is not None else 1
        if self.draft_length is not None:
            self.max_block_size = self.draft_length
        #: the protocol's declaration: every round drafts one block and verifies a prefix of it
        self.prefix_drafts: bool = self.draft_length is not None

    #: the protocol's declaration: ``decode`` asks a :class:`~adaptspec.speculator.RoundSchedule` every round
    per_round = True

    @property
    def draft_trees(self) -> bool:
        """The protocol's declaration: ``decode`` takes tree arms (``-N``) and reports each tree
        round's :attr:`~adaptspec.speculator.Round.tree_outcomes`: with a drafter, on a target whose
        attention takes a mask per query (:mod:`adaptspec.decoding.tree_verify`)."""
        return self.drafter is not None and tree_attention(self.target)

    @property
    def feature_dim(self) -> int:
        """The length of ``Prefill.features`` (the protocol's declaration): the target's feature spec."""
        return self.target.feature_dim

    @property
    def verification(self) -> str:
        """``"fast"`` or ``"exact"``: the target's verification mode (see the module docstring)."""
        return self.target.verification

    # ------------------------------------------------------------------ protocol
    # inference mode, not just no_grad: a plain one-token step is faster without autograd's
    # version counters, and that is the speed a B = 1 request must match
    @torch.inference_mode()
    def prefill(
        self, prompt_ids: Sequence[int] | torch.Tensor, temperature: float = 0.0, seed: int | None = None
    ) -> Prefill:
        """Run the target on the prompt and choose the first token.

        At ``temperature > 0`` the first token is the sample of output position 0 keyed by
        ``seed`` (:mod:`adaptspec.decoding.sampling`); ``decode`` keeps the same keys unless given
        a seed of its own.
        """
        _check_temperature(temperature)
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)
        tp = self.target.prefill(ids)
        keys = SampleKeys(seed) if temperature > 0 else None
        first = first_token(tp.logits, temperature, keys, self.target.vocab_size)
        return Prefill(
            first_token=first,
            prompt_tokens=int(ids.numel()),
            features=tp.features,
            state=_PrefillState(tp.cache, tp.context_hidden, keys),
        )

    @torch.inference_mode()
    def decode(
        self,
        prefill: Prefill,
        block_size: BlockSchedule,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        on_round: Callable[[list[int], Round], None] | None = None,
    ) -> Outcome:
        """Draft/verify rounds after ``prefill`` until EOS or ``max_new_tokens`` new tokens.

        ``block_size`` is an int or a per-round schedule (:class:`~adaptspec.speculator.RoundSchedule`,
        :mod:`adaptspec.schedules`; or a function ``(round_index, rounds_so_far) -> block size``):
        a schedule chooses each round's block and, when it ``uses_confidence``, the prefix of the
        drafts to verify from the drafter's top-1 probabilities (then the block is drafted whole
        even near ``max_new_tokens``, and the verified prefix is cut there). With a
        ``draft_length`` every speculating round drafts that length and verifies the chosen
        block's prefix of it. A :class:`~adaptspec.decoding.tree_budget.TreeBudget` verifies a draft
        tree every round instead (:meth:`_tree_round`, docs/decoding.md "Draft trees").
        ``prefill`` is not consumed: it can be decoded again with another block size.
        ``on_round(tokens, round)`` is called after each round with the tokens it committed
        (for streaming).
        """
        state = self._decodable(prefill, temperature, max_new_tokens)
        tree = as_tree_budget(block_size)
        if tree is not None and self.drafter is None:
            raise AdaptspecError("draft trees need a drafter")
        schedule = as_schedule(1 if tree is not None else block_size)
        fixed = schedule.block_size if isinstance(schedule, FixedBlock) and tree is None else None
        if fixed is not None:  # checked once here; a schedule's choices are checked every round
            self._check_block_size(fixed)
        cache = copy.deepcopy(state.cache)
        if tree is not None:
            check_tree_target(self.target, cache)
        keys = state.keys
        if temperature > 0 and (keys is None or seed is not None):
            keys = SampleKeys(seed)
        # A request at B = 1 throughout never drafts: no drafter state, no hidden states.
        draft = None
        if self.drafter is not None and fixed != 1:
            draft = self.drafter.new_state(state.context_hidden)

        eos = self.target.eos_token_ids
        tokens = [prefill.first_token]
        rounds: list[Round] = []
        n = prefill.prompt_tokens  # positions in the target's cache
        finish = "eos" if tokens[-1] in eos else "length"
        start = _now(self.target.device)
        while finish == "length" and len(tokens) < max_new_tokens:
            room = max_new_tokens - len(tokens)
            if tree is not None:
                new, r = self._tree_round(
                    tokens[-1], n, room, cache, draft, temperature, keys, len(tokens), tree
                )
            else:
                new, r = self._chain_round(
                    tokens, n, room, cache, draft, temperature, keys, fixed, schedule, rounds
                )
            rounds.append(r)
            n += r.tau
            kept = len(tokens)
            for t in new[:room]:
                tokens.append(t)
                if t in eos:
                    finish = "eos"
                    break
            if on_round is not None:
                on_round(tokens[kept:], r)
        decode_s = _now(self.target.device) - start
        return Outcome(tokens=tokens, rounds=rounds, decode_s=decode_s, finish_reason=finish)

    def _decodable(self, prefill: Prefill, temperature: float, max_new_tokens: int) -> _PrefillState:
        """decode's settings checked; the prefill's state (made by this decoder)."""
        _check_temperature(temperature)
        if max_new_tokens < 1:
            raise AdaptspecError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        state: _PrefillState = prefill.state
        if not isinstance(state, _PrefillState):
            raise AdaptspecError("this Prefill was not made by this decoder")
        return state

    def _chain_round(
        self,
        tokens: list[int],
        n: int,
        room: int,
        cache: Any,
        draft: Any,
        temperature: float,
        keys: SampleKeys | None,
        fixed: int | None,
        schedule: Any,
        rounds: list[Round],
    ) -> tuple[list[int], Round]:
        """One round of a chain: the block size (fixed, or the schedule's, cut to the room left
        unless the schedule verifies by confidence), the block drafted (draft_length if set), the
        sampling noise at T > 0; the tokens it committed and its record."""
        b = fixed if fixed is not None else self._check_block_size(schedule.draft_size(rounds))
        if not schedule.uses_confidence:
            b = min(b, room)  # drafts past the end would be thrown away
        d = self.draft_length if self.draft_length is not None and b > 1 else b  # the block to draft
        noise = (
            None
            if temperature == 0
            else keys.noise(len(tokens), d, self.target.vocab_size, self.target.device)
        )
        return self._round(tokens[-1], n, b, d, room, cache, draft, temperature, noise, schedule, rounds)

    @torch.inference_mode()
    def teacher_forced_context(self, prefill: Prefill, tokens: Sequence[int]) -> torch.Tensor:
        """The drafter's context along a known continuation: the target's hidden states at the
        drafter's layers for the prompt and ``tokens``, ``[T + len(tokens), k*H]``, from one
        target pass after ``prefill`` (with exact verification, row for row what decoding those
        tokens computes). Dense traces (:mod:`adaptspec.collect.dense`) are built on it."""
        state: _PrefillState = prefill.state
        if not isinstance(state, _PrefillState) or state.context_hidden is None:
            raise AdaptspecError("this Prefill was not made by this decoder with a drafter")
        if not len(tokens):
            return state.context_hidden
        _, hidden = self.target.verify(
            torch.tensor(list(tokens), device=self.target.device), copy.deepcopy(state.cache)
        )
        return torch.cat([state.context_hidden, hidden])

    def generate(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        block_size: BlockSchedule,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Outcome:
        """Prefill + decode. ``block_size=1`` is plain (target-only) decoding; a
        :class:`~adaptspec.decoding.tree_budget.TreeBudget` or a tree arm verifies draft trees."""
        if isinstance(block_size, int) and as_tree_budget(block_size) is None:
            self._check_block_size(block_size)
        pre = self.prefill(input_ids, temperature=temperature, seed=seed)
        return self.decode(pre, block_size, max_new_tokens, temperature=temperature)

    # ------------------------------------------------------------------ one round
    def _round(
        self,
        last: int,
        n: int,
        b: int,
        d: int,
        room: int,
        cache: Any,
        draft: DraftState | None,
        temperature: float,
        noise: torch.Tensor | None,
        schedule: RoundSchedule,
        rounds: list[Round],
    ) -> tuple[list[int], Round]:
        dev = self.target.device
        t0 = _now(dev)
        drafts = torch.empty(0, dtype=torch.long, device=dev)
        if b > 1:  # draft d >= b positions; verify at most the first b
            logits = self.drafter.draft_logits(draft, last, d).float()
            if temperature == 0:
                idx = logits.argmax(-1)
            else:  # the keyed proposals of the block's positions (decoding.sampling)
                idx = draft_keyed(logits, noise[: d - 1], temperature, self.drafter.draft_vocab)
            drafts = self.drafter.to_target_ids(idx).to(dev)[: b - 1]
            if schedule.uses_confidence:  # verify a prefix, chosen from the drafter's top-1 probabilities
                top1 = torch.softmax(logits[: b - 1], dim=-1).amax(-1).cpu().numpy()
                v = schedule.verify_size(top1, rounds)
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= b:
                    raise AdaptspecError(f"{schedule!r}.verify_size gave {v!r}, outside 1..{b}")
                drafts = drafts[: min(int(v), room) - 1]
        drafted, b = d, len(drafts) + 1
        t1 = _now(dev)
        block = torch.cat([torch.tensor([last], device=dev), drafts])
        new = self._verify_chain(block, n, cache, draft, temperature, noise)
        t2 = _now(dev)
        return new, Round(
            block_size=b,
            tau=len(new),
            draft_s=t1 - t0,
            verify_s=t2 - t1,
            drafted=drafted if drafted != b else 0,
        )

    def _verify_chain(
        self,
        block: torch.Tensor,
        n: int,
        cache: Any,
        draft: DraftState | None,
        temperature: float,
        noise: torch.Tensor | None,
    ) -> list[int]:
        """Verify ``block = [last, drafts]`` after ``n`` cached positions; keep the committed
        part of the cache and of the drafter's context; return the committed tokens."""
        drafts = block[1:]
        logits, hidden = self.target.verify(block, cache, context=draft is not None)
        logits = logits.float()
        if temperature == 0:
            best = logits.argmax(-1)  # target's choice after each block position
            ok = (best[:-1] == drafts).int()
            j = int(ok.cumprod(0).sum())  # accepted drafts; one host sync per round
            new = drafts[:j].tolist() + [int(best[j])]
        else:
            new = accept_keyed(logits, drafts, noise[: len(drafts) + 1], temperature)
        tau = len(new)
        self.target.crop(cache, n + tau)
        if hidden is not None:
            draft.append(hidden[:tau])
        return new

    def _tree_round(
        self,
        last: int,
        n: int,
        room: int,
        cache: Any,
        draft: DraftState,
        temperature: float,
        keys: SampleKeys | None,
        position: int,
        budget: TreeBudget,
    ) -> tuple[list[int], Round]:
        """One round of a draft tree (:mod:`adaptspec.decoding.tree`): one drafter pass of
        ``depth + 1`` positions, the best-first tree its budget allows, one target pass over it with
        the ancestor-only mask, the target's own choice walked down it (the argmax at T = 0, else
        the keyed sample of each node's output position, ``position`` + its depth), the accepted
        path and the bonus committed, and only the path's cache kept. In ``"exact"`` verification
        the row-wise kernel computes each node bit for bit as the chain of its path
        (:mod:`~adaptspec.decoding.tree_verify`), so the one pass is bit-identical to greedy decoding."""
        dev, vocab = self.target.device, self.target.vocab_size
        depth = tree_depth(budget, self.drafter.config.max_block_size, room)
        noise = None if temperature == 0 else keys.noise(position, depth + 1, vocab, dev)
        t0 = _now(dev)
        if depth < 1:  # one token left to commit: a plain step
            new = self._verify_chain(torch.tensor([last], device=dev), n, cache, draft, temperature, noise)
            return new, Round(block_size=1, tau=1, draft_s=0.0, verify_s=_now(dev) - t0)
        scores = self.drafter.draft_logits(draft, last, depth + 1).float()  # [depth, V_draft]
        tree = draft_tree(
            scores, budget, self.drafter.to_target_ids, temperature, noise, self.drafter.draft_vocab
        )
        t1 = _now(dev)
        logits, hidden = verify_tree(self.target, tree, last, n, cache)
        choices = target_choices(logits, tree, temperature, noise)
        path, new = committed(tree, choices)
        keep_path(cache, n, path)
        draft.append(hidden[[0, *path]])
        t2 = _now(dev)
        return new, Round(
            block_size=tree.nodes + 1,
            tau=len(new),
            draft_s=t1 - t0,
            verify_s=t2 - t1,
            drafted=depth + 1,
            tree=True,
            tree_outcomes=round_outcomes(tree, choices),
        )

    def _check_block_size(self, b: int) -> int:
        return check_block_size(b, self.max_block_size, self.drafter is not None)


def check_block_size(b: int, max_block_size: int, has_drafter: bool) -> int:
    """``b`` if it is an int block size in ``1..max_block_size`` (1 only without a drafter)."""
    if not isinstance(b, int) or isinstance(b, bool):
        raise AdaptspecError(f"block size must be an int, got {b!r}")
    if not 1 <= b <= max_block_size:
        why = "" if has_drafter else " (no drafter: only plain decoding)"
        raise AdaptspecError(f"block size {b} outside 1..{max_block_size}{why}")
    return b


def check_draft_length(draft_length: int | None, drafter: BlockDiffusionDrafter | None) -> int | None:
    """``draft_length`` if it is None or an int in ``2..`` the drafter's ``max_block_size``."""
    if draft_length is None:
        return None
    if drafter is None:
        raise AdaptspecError("draft_length needs a drafter")
    top = drafter.config.max_block_size
    if isinstance(draft_length, bool) or not isinstance(draft_length, int) or not 2 <= draft_length <= top:
        raise AdaptspecError(
            f"draft_length must be an int in 2..{top} (the drafter's max_block_size), got {draft_length!r}"
        )
    return draft_length


def _check_temperature(t: float) -> None:
    if not t >= 0:
        raise AdaptspecError(f"temperature must be >= 0, got {t}")


def first_token(logits: torch.Tensor, temperature: float, keys: SampleKeys | None, vocab: int) -> int:
    """The token a prefill's ``logits[V]`` choose: the argmax at temperature 0, else the keyed
    sample of output position 0 (:mod:`adaptspec.decoding.sampling`)."""
    if temperature == 0:
        return int(logits.argmax(-1))
    return sample_keyed(logits[None], keys.noise(0, 1, vocab, logits.device), temperature)[0]


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
