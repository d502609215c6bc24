"""Continuous batching: every active request's draft/verify round in one target pass.

The engine holds up to ``max_rows`` active requests (rows), each with its own block size, or
its own draft tree: a tree arm ``-N`` or a :class:`~adaptspec.decoding.tree_budget.TreeBudget`
as its block size (:attr:`BatchEngine.draft_trees`; docs/decoding.md, "Draft trees").
One round (:meth:`BatchEngine.step`):

1. requests that were cancelled leave; waiting requests join while there are free rows: their
   prompts ride in the rounds' target passes in chunks, at most ``chunk_tokens`` prompt tokens a
   pass while rows decode (:mod:`~adaptspec.batching.packed_pass`, :mod:`~adaptspec.batching.fills`;
   exact verification never cuts a prompt), and a request whose prompt has run starts its row
   after that pass (its first token chosen from the prompt's last logits, its keys/values copied
   into a free KV slot); with ``chunk_tokens=None`` each prompt is prefilled alone, batch 1, by
   :meth:`TargetModel.prefill <adaptspec.decoding.TargetModel.prefill>`, while every row waits;
2. the drafter drafts ``B_i - 1`` tokens for every row ``i`` whose block ``B_i > 1`` (with a
   ``draft_length`` ``D``: ``D - 1`` tokens, of which the row verifies its first ``B_i - 1``): one
   pass for all greedy rows in fast verification (:mod:`~adaptspec.batching.draft_pass`),
   else one pass per row, so that a row's drafts, and with them its rounds, do not depend on
   the batch (``batched_draft`` overrides); a sampled row proposes its keyed samples
   (:mod:`~adaptspec.decoding.sampling`); a tree row drafts its tree's ``depth + 1`` positions in
   the same pass or call and builds the best-first tree its budget allows, at most
   ``token_budget // rows - 1`` nodes (:mod:`~adaptspec.decoding.tree_round`, the decoder's steps);
3. one target pass verifies every row's block ``[last_i, drafts_i]``, padded to the round's
   widest block (:mod:`~adaptspec.batching.target_pass`), with the joining prompts' chunks in
   it when there are some; ``B_i = 1`` is a plain step; a tree row's block is its root and
   nodes, each node at its depth's position seeing the row's cache and its ancestors only
   (:class:`~adaptspec.batching.kv_slots.SlotCache`);
4. each row accepts (:mod:`~adaptspec.batching.accept`) and commits ``tau_i`` tokens; its KV
   slot keeps ``tau_i`` of the positions written (:mod:`~adaptspec.batching.kv_slots`); a tree
   row walks the target's own choice down its tree, moves the accepted path's keys and values to
   a chain's places and keeps those, and reports what the tree showed of every smaller tree and
   every chain (``Round.tree_outcomes``: the controller's full information);
5. rows that reached EOS or ``max_new_tokens`` leave.

Guarantees (tests/test_batching*.py, docs/batching.md): with ``"exact"`` verification every
row is bit-identical to decoding that request alone (greedy: the target's own one-token
``generate``; ``temperature > 0``: :class:`~adaptspec.decoding.SpeculativeDecoder` with the
same seed, at any block size), whatever else is in the batch, whenever it joined and whatever
block sizes or trees its rounds verified. With ``"fast"`` verification every committed token is the
argmax (or keyed sample) of the pass that verified it (the first token: of the pass that ran the
prompt's last chunk). A request that fails (bad prompt, too long for the context, a failing
chooser, cancelled while waiting, joining or decoding) fails alone, on its handle.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from adaptspec.decoding import BlockDiffusionDrafter, TargetModel
>>> torch.manual_seed(0) and None
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
...                   num_attention_heads=4, num_key_value_heads=2, eos_token_id=None)
>>> model = LlamaForCausalLM(cfg).eval()
>>> engine = BatchEngine(TargetModel(model, verification="exact"),
...                      BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0), max_rows=4)
>>> a = engine.submit([3, 14, 15, 9, 2, 6], block_size=4, max_new_tokens=12)
>>> b = engine.submit([5, 8], block_size=1, max_new_tokens=7)
>>> engine.run_until_done()
>>> def alone(p, n):
...     return model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=n, min_new_tokens=n)[0, len(p):].tolist()
>>> a.result().tokens == alone([3, 14, 15, 9, 2, 6], 12), b.result().tokens == alone([5, 8], 7)
(True, True)
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..costs.rows_pass import RowsPassCost
from ..decoding.decoder import as_tree_budget, check_block_size, check_draft_length, first_token
from ..decoding.drafter import BlockDiffusionDrafter
from ..decoding.features import prefill_features
from ..decoding.sampling import SampleKeys, accept_keyed, draft_keyed
from ..decoding.target import TargetModel
from ..decoding.tree import DraftTree
from ..decoding.tree_budget import TreeBudget
from ..decoding.tree_outcomes import round_outcomes
from ..decoding.tree_round import committed, draft_tree, target_choices, tree_depth
from ..decoding.tree_verify import BOOLEAN_MASK
from ..errors import AdaptspecError
from ..speculator import MAX_TREE_NODES, Round, TreeOutcomes
from . import accept
from .clock import RoundClock
from .draft_pass import draft_logits_rows
from .fills import Fills
from .packed_pass import Chunk, PackedOutput, Packer
from .records import RoundRecord
from .rows import Filling, RequestHandle, Row
from .target_pass import new_store, prefill_layers, verify_rows

#: prompt tokens one target pass carries while rows decode (``BatchEngine(chunk_tokens=)``)
DEFAULT_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class _RoundPlan:
    """What each row drafts in one round (BatchEngine._plan), row by row."""

    cap: int  # the widest block a row may verify: the token budget shared among the rows
    widths: list[int]  # the positions each row verifies (1 for a tree row until its tree is built)
    drafted: list[int]  # the positions each row drafts
    noise: list  # a sampled row's Gumbel noise over its drafted positions; None for a greedy row
    budgets: list  # a tree row's TreeBudget; None for a chain row


class BatchEngine:
    """Continuous-batching speculative decoding over a target and (optionally) a drafter.

    ``max_rows`` requests decode at once; ``token_budget`` caps the positions one target pass
    computes (rows x the widest block): each row's block is cut to ``token_budget // rows``
    (at least 1). ``max_context`` (default: the model's ``max_position_embeddings``) bounds
    prompt + new tokens of a request. ``history`` round records are kept in :attr:`history`.
    ``draft_length`` (None: each row drafts the block it verifies) drafts that many positions
    for every speculating row and each row verifies its own prefix of them (exact counterfactuals,
    :attr:`prefix_drafts`); it caps the block size. ``chunk_tokens`` (default
    :data:`DEFAULT_CHUNK_TOKENS`) caps the prompt tokens of joining requests one pass carries while
    rows decode (with no row decoding, a pass takes the joining prompts whole); None prefills each
    joining prompt alone while the rows wait. The passes run on the target's prepacked weights
    (``TargetModel(prepacked=True)``, the default: :mod:`~adaptspec.decoding.prepacked`).
    """

    def __init__(
        self,
        target: TargetModel,
        drafter: BlockDiffusionDrafter | None = None,
        max_rows: int = 8,
        token_budget: int | None = None,
        max_context: int | None = None,
        capacity: int = 256,
        history: int = 10_000,
        batched_draft: bool | None = None,
        draft_length: int | None = None,
        chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
    ) -> None:
        self.target = target
        self.drafter = drafter
        if drafter is not None:
            drafter.attach(target.model)
            target.context_layers = list(drafter.config.target_layers)
        self.draft_length = check_draft_length(draft_length, drafter)
        self.max_block_size: int = self.draft_length or (
            drafter.config.max_block_size if drafter is not None else 1
        )
        #: every speculating row drafts one block of ``draft_length`` and verifies a prefix of it
        self.prefix_drafts: bool = self.draft_length is not None
        if not isinstance(max_rows, int) or max_rows < 1:
            raise AdaptspecError(f"max_rows must be an int >= 1, got {max_rows!r}")
        self.max_rows = max_rows
        self.token_budget = max_rows * self.max_block_size if token_budget is None else token_budget
        if not isinstance(self.token_budget, int) or self.token_budget < 1:
            raise AdaptspecError(f"token_budget must be an int >= 1, got {token_budget!r}")
        self.max_context = max_context or int(getattr(target.model.config, "max_position_embeddings", 4096))
        #: the most positions a row writes past its committed ones in a pass (a tree row: its nodes + 1)
        self.max_width = (
            self.max_block_size
            if drafter is None
            else max(self.max_block_size, min(self.token_budget, MAX_TREE_NODES + 1))
        )
        if chunk_tokens is not None and (
            isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1
        ):
            raise AdaptspecError(f"chunk_tokens must be an int >= 1 or None, got {chunk_tokens!r}")
        self.chunk_tokens = chunk_tokens
        #: the packed passes (rows and prompt chunks together), None when prompts are prefilled alone
        self.packer = None if chunk_tokens is None else Packer(target)
        #: the rows' share of a pass that also ran prompt chunks (:mod:`~adaptspec.costs.rows_pass`)
        self.rows_pass_cost = RowsPassCost()
        self.capacity = capacity
        self.store = new_store(target, max_rows, capacity, self.max_context + self.max_width)
        self.fills = Fills(target, max_rows, capacity, self.max_context) if chunk_tokens is not None else None
        self.rows: list[Row] = []  # row i lives in KV slot i
        self.waiting: deque[RequestHandle] = deque()
        self.history: deque[RoundRecord] = deque(maxlen=history)
        self.batched_draft = target.verification == "fast" if batched_draft is None else bool(batched_draft)
        self._next_id = 0
        #: called with a request's handle once its first token (chosen at prefill) is committed, before
        #: the request takes a row: a caller that ends it there (``handle.finish``) runs no round for it
        self.on_first_token: Callable[[RequestHandle], None] | None = None
        #: a per-round rule (None: each row verifies its request's block size): called every round,
        #: after joins, with the active rows; returns each row's block size, capped by its request's
        #: (a tree row keeps its tree)
        self.round_block_sizes: Callable[[list[Row]], Sequence[int]] | None = None

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        block_size: int | TreeBudget | Callable[[np.ndarray], int] = 1,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> RequestHandle:
        """Queue a request; it joins at the next round with a free row. Settings are checked
        here; the prompt when it joins (a bad one fails that request alone, on its handle).
        ``block_size`` may be a tree arm ``-N`` or a :class:`~adaptspec.decoding.tree_budget.TreeBudget`
        where the engine runs trees (:attr:`draft_trees`): the row verifies a draft tree every round.

        ``block_size`` may be a function of the prompt's prefill features (``TargetPrefill.features``)
        returning the block size: it is called once, when the request joins (a policy deciding
        from the prefill); what it returns is checked there."""
        choose = block_size if callable(block_size) else None
        if choose is None:
            self._check_block_size(block_size)
        else:
            block_size = 1
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise AdaptspecError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if not temperature >= 0:
            raise AdaptspecError(f"temperature must be >= 0, got {temperature}")
        handle = RequestHandle(
            self._next_id, prompt_ids, block_size, max_new_tokens, float(temperature), seed
        )
        handle.choose = choose
        self._next_id += 1
        self.waiting.append(handle)
        return handle

    def reset(self, error: AdaptspecError) -> None:
        """Fail every request not yet finished (rows and waiting) with ``error`` and start over with
        empty KV slots: after a defect left the engine's state unknown (a serving loop restarting)."""
        joining = [] if self.fills is None else [f.handle for f in self.fills.fillings]
        for handle in [row.handle for row in self.rows] + joining + list(self.waiting):
            if not handle.done:
                handle.fail(error)
        self.rows = []
        self.waiting.clear()
        self.store = new_store(self.target, self.max_rows, self.capacity, self.max_context + self.max_width)
        if self.fills is not None:
            self.fills = Fills(self.target, self.max_rows, self.capacity, self.max_context)

    def set_block_size(self, handle: RequestHandle, block_size: int | TreeBudget) -> None:
        """Change a request's block size (or tree) from its next round on."""
        handle.block_size = self._check_block_size(block_size)

    @property
    def joining(self) -> int:
        """Requests whose prompts are being prefilled in chunks (each holds a place among the rows)."""
        return 0 if self.fills is None else sum(not f.started for f in self.fills.fillings)

    @property
    def busy(self) -> bool:
        return bool(self.rows or self.waiting or self.joining)

    def run_until_done(self) -> None:
        """Run rounds until every submitted request has finished or failed."""
        while self.busy:
            self.step()

    # ------------------------------------------------------------------ one round
    @torch.inference_mode()
    def step(self) -> RoundRecord | None:
        """One round over every active row (see the module docstring); None when no row decoded
        (idle, or a pass that ran joining prompts only)."""
        clock = RoundClock(self.target.device)
        self._leave([i for i, row in enumerate(self.rows) if row.handle.cancelled], cancelled=True)
        joined = self._join()
        chunks = self._chunks()
        if not self.rows and not chunks:
            return None
        clock.mark()
        plan = self._plan()
        blocks, drafts, trees = (
            self._draft(plan.widths, plan.drafted, plan.noise, plan.budgets, plan.cap)
            if self.rows
            else (None, None, [])
        )
        clock.mark()
        with self.target.prepacked.on():
            packed = self._pass(blocks, chunks, trees) if chunks else None
            logits, hidden = (
                (packed.logits, packed.context)
                if chunks
                else verify_rows(
                    self.target, self.store, blocks, context=self.drafter is not None, trees=trees
                )
            )
        new, paths, outcomes = self._accept(logits, drafts, trees, plan)
        taus = [len(n) for n in new]
        self._keep_accepted(paths, taus, hidden)
        clock.mark()
        admit_s, draft_s, pass_s = clock.spans()
        # the rows' share of the pass: what a pass of their positions alone costs here (the rest was the prompts')
        prompt_tokens = sum(len(c.ids) for c in chunks)
        verify_s = self.rows_pass_cost.rows_share(
            pass_s, len(self.rows) * max(plan.widths, default=0), prompt_tokens
        )
        rows = list(self.rows)
        self._leave(self._log_rounds(rows, plan, taus, new, trees, outcomes, draft_s, verify_s))
        started_at = time.perf_counter()
        if chunks:  # the prompts that ended in this pass start their rows (from the next round on)
            joined += self._start_filled(self.fills.absorb(chunks, packed))
        if not rows:
            return None
        join_s = admit_s + pass_s - verify_s + time.perf_counter() - started_at
        record = RoundRecord(
            requests=tuple(row.handle.id for row in rows),
            block_sizes=tuple(plan.widths),
            taus=tuple(taus),
            draft_s=draft_s,
            verify_s=verify_s,
            round_s=max(clock.total(), join_s + draft_s + verify_s),
            joined=joined,
            join_s=join_s,
            prompt_tokens=prompt_tokens,
        )
        self.history.append(record)
        return record

    def _plan(self) -> _RoundPlan:
        """What each row drafts this round: the width it verifies, the positions it drafts, its tree
        budget and its sampling noise."""
        cap = max(1, self.token_budget // max(1, len(self.rows)))
        asked = [row.handle.block_size for row in self.rows]
        if self.round_block_sizes is not None and self.rows:  # a tree row keeps its tree
            asked = [
                a if as_tree_budget(a) is not None else max(1, min(int(b), a))
                for b, a in zip(self.round_block_sizes(self.rows), asked)
            ]
        budgets = [self._tree_budget(a, row) for a, row in zip(asked, self.rows)]
        # a tree row's width (its nodes + 1) is known once its tree is built (_draft)
        widths = [
            1 if t is not None or as_tree_budget(b) is not None else min(b, row.room, cap)
            for b, t, row in zip(asked, budgets, self.rows)
        ]
        drafted = [
            tree_depth(t, self.drafter.config.max_block_size, row.room) + 1
            if t is not None
            else b
            if b == 1 or self.draft_length is None
            else self.draft_length
            for b, t, row in zip(widths, budgets, self.rows)
        ]
        noise = [
            None
            if row.keys is None
            # sampled rows: the Gumbel noise of the drafted positions
            else row.keys.noise(len(row.handle.tokens), d, self.target.vocab_size, self.target.device)
            for row, d in zip(self.rows, drafted)
        ]
        return _RoundPlan(cap, widths, drafted, noise, budgets)

    def _accept(
        self,
        logits: torch.Tensor,
        drafts: torch.Tensor | None,
        trees: list[DraftTree | None],
        plan: _RoundPlan,
    ) -> tuple[list[list[int]], dict[int, list[int]], dict[int, TreeOutcomes]]:
        """Each row's accepted tokens; a tree row's accepted path and outcomes besides."""
        widths, noise = plan.widths, plan.noise
        new = accept.greedy(logits, drafts, widths) if self.rows else []
        paths: dict[int, list[int]] = {}
        outcomes: dict[int, TreeOutcomes] = {}
        for i, row in enumerate(self.rows):
            if trees[i] is not None:  # the target's own choice walked down the tree (decoding.tree_round)
                choices = target_choices(logits[i, : widths[i]], trees[i], row.handle.temperature, noise[i])
                paths[i], new[i] = committed(trees[i], choices)
                outcomes[i] = round_outcomes(trees[i], choices)
            elif (
                row.keys is not None
            ):  # the target's keyed samples (decoding.sampling): the batch changes nothing
                b = widths[i]
                new[i] = accept_keyed(logits[i, :b], drafts[i, : b - 1], noise[i][:b], row.handle.temperature)
        return new, paths, outcomes

    def _keep_accepted(
        self, paths: dict[int, list[int]], taus: list[int], hidden: torch.Tensor | None
    ) -> None:
        """Commits the accepted positions to the cache and the drafter's context."""
        for i, path in paths.items():  # the accepted path laid out as a chain, the rest dropped by the commit
            self.store.keep_path(i, path)
        self.store.commit(taus)
        if hidden is not None:  # copies: a view would keep the whole pass's hidden states alive
            for i, row in enumerate(self.rows):
                row.draft.append(hidden[i, [0, *paths[i]]] if i in paths else hidden[i, : taus[i]].clone())

    def _log_rounds(
        self,
        rows: list[Row],
        plan: _RoundPlan,
        taus: list[int],
        new: list[list[int]],
        trees: list[DraftTree | None],
        outcomes: dict[int, TreeOutcomes],
        draft_s: float,
        verify_s: float,
    ) -> list[int]:
        """Appends the round to each row's request and commits its tokens; the rows that finished."""
        widths, drafted = plan.widths, plan.drafted
        done = []
        for i, row in enumerate(rows):
            tree = trees[i] is not None
            row.handle.rounds.append(
                Round(
                    block_size=widths[i],
                    tau=taus[i],
                    draft_s=draft_s,
                    verify_s=verify_s,
                    drafted=drafted[i] if tree or drafted[i] != widths[i] else 0,
                    rows=len(rows),
                    tree=tree,
                    tree_outcomes=outcomes.get(i),
                )
            )
            if self._commit(row.handle, new[i]):
                done.append(i)
        return done

    def _pass(
        self, blocks: torch.Tensor | None, chunks: list[Chunk], trees: list[DraftTree | None]
    ) -> PackedOutput:
        """The rows' blocks (``trees``: the rows' draft trees, None for a chain) and the joining prompts'
        ``chunks`` in one target pass; each chunk keeps the hidden states its request needs (the
        drafter's context; the feature spec's layers for a chooser)."""
        layers = set(self.target.context_layers or []) if self.drafter is not None else set()
        if any(self.fills.fillings[c.slot].handle.choose is not None for c in chunks):
            layers |= {layer for kind, layer in self.target.feature_parts if kind in ("last", "mean")}
        context = self.target.context_layers if self.drafter is not None else None
        return self.packer.run(blocks, self.store, self.fills.store, chunks, context, sorted(layers), trees)

    def _draft(
        self,
        widths: list[int],
        drafted: list[int],
        noise: list[torch.Tensor | None],
        budgets: list[TreeBudget | None],
        cap: int,
    ) -> tuple[torch.Tensor, torch.Tensor, list[DraftTree | None]]:
        """Every row's block ``[R, T]`` (padded with its last token), its drafts ``[R, T - 1]`` (-1 where
        none) and its draft tree (None for a chain): a chain row ``i`` drafts ``drafted[i]`` positions and
        keeps the first ``widths[i]``; a tree row (``budgets[i]``) drafts ``drafted[i]`` positions and
        builds the tree its budget allows, at most ``cap - 1`` nodes (:mod:`~adaptspec.decoding.tree_round`),
        its width set to its nodes + 1 here; a sampled row drafts its keyed proposals with its ``noise``."""
        dev = self.target.device
        speculating = [i for i, (b, t) in enumerate(zip(widths, budgets)) if b > 1 or t is not None]
        together = [i for i in speculating if self.batched_draft and self.rows[i].handle.temperature == 0]
        shared = {}
        if together:  # one drafter pass for the greedy rows (fast verification)
            rows = [self.rows[i] for i in together]
            out = draft_logits_rows(
                self.drafter, [r.draft for r in rows], [r.last for r in rows], [drafted[i] for i in together]
            )
            shared = dict(zip(together, out))
        trees: list[DraftTree | None] = [None] * len(self.rows)
        chains: dict[int, torch.Tensor] = {}
        for i in speculating:
            row = self.rows[i]
            logits = (
                shared[i] if i in shared else self.drafter.draft_logits(row.draft, row.last, drafted[i])
            ).float()
            if budgets[i] is not None:
                trees[i] = draft_tree(
                    logits,
                    budgets[i],
                    self.drafter.to_target_ids,
                    row.handle.temperature,
                    noise[i],
                    self.drafter.draft_vocab,
                    max_nodes=cap - 1,
                )
                widths[i] = trees[i].nodes + 1
            elif noise[i] is None:
                chains[i] = self.drafter.to_target_ids(logits.argmax(-1)).to(dev)[: widths[i] - 1]
            else:  # proposed as SpeculativeDecoder proposes them
                idx = draft_keyed(
                    logits, noise[i][: drafted[i] - 1], row.handle.temperature, self.drafter.draft_vocab
                )
                chains[i] = self.drafter.to_target_ids(idx).to(dev)[: widths[i] - 1]
        width = max(widths)
        last = torch.tensor([row.last for row in self.rows], device=dev)
        blocks = last[:, None].repeat(1, width)
        drafts = torch.full((len(self.rows), width - 1), -1, dtype=torch.long, device=dev)
        for i, d in chains.items():
            blocks[i, 1 : widths[i]] = d
            drafts[i, : widths[i] - 1] = d
        for i, tree in enumerate(trees):
            if tree is not None and tree.nodes:
                blocks[i, 1 : widths[i]] = torch.tensor(tree.tokens, device=dev)
        return blocks, drafts, trees

    def _tree_budget(self, arm: int | TreeBudget, row: Row) -> TreeBudget | None:
        """The tree ``row`` verifies this round: its arm's budget (None for a chain, and for a tree row
        with one token left to commit, whose round is a plain step, as in the decoder)."""
        budget = as_tree_budget(arm)
        if budget is None or tree_depth(budget, self.drafter.config.max_block_size, row.room) < 1:
            return None
        return budget

    # ------------------------------------------------------------------ joining and leaving
    def _join(self) -> int:
        """Take waiting requests while rows are free (a joining request holds one): each prompt checked,
        then prefilled alone now (``chunk_tokens`` None) or given a slot of the fills (its chunks ride
        in the next passes); returns how many started rows now. Cancelled joining requests end first."""
        if self.fills is not None:
            cancelled = [i for i, f in enumerate(self.fills.fillings) if f.handle.cancelled]
            for i in cancelled:
                self.fills.fillings[i].handle.end_cancelled()
            self.fills.remove(cancelled)
        started = 0
        limit = min(self.max_rows, self.token_budget)
        while self.waiting and len(self.rows) + self.joining < limit:
            handle = self.waiting.popleft()
            if handle.cancelled:
                handle.end_cancelled()
                continue
            try:
                ids = self._prompt_ids(handle)
                if self.fills is not None:
                    self.fills.add(handle, ids)
                    continue
                tp = self.target.prefill(ids)
                row = self._start_row(
                    handle, tp.logits, tp.context_hidden, lambda: tp.features, prefill_layers(tp.cache)
                )
            except AdaptspecError as e:
                handle.fail(AdaptspecError(f"request {handle.id}: {e}"))
                continue
            started += 1
            if row is not None:
                self.rows.append(row)
        return started

    def _chunks(self) -> list[Chunk]:
        """The joining prompts' chunks of this round's pass: ``chunk_tokens`` while rows decode, else
        the prompts whole; exact verification never cuts a prompt (see :mod:`~adaptspec.batching.packed_pass`)."""
        if self.fills is None:
            return []
        return self.fills.plan(
            self.chunk_tokens if self.rows else None, whole=self.target.verification == "exact"
        )

    def _start_filled(self, ended: list[tuple[int, torch.Tensor]]) -> int:
        """Start the rows of the requests whose prompts ended in the last pass (``ended``: their fill slots
        and last logits), then free those slots; returns how many started."""
        started = 0
        for slot, logits in ended:
            f = self.fills.fillings[slot]
            f.started = True  # a chooser deciding now sees the load without it among the joining
            context = (
                None
                if self.drafter is None
                else torch.cat([f.layer(i) for i in self.target.context_layers], dim=-1)
            )
            try:
                row = self._start_row(
                    f.handle,
                    logits,
                    context,
                    lambda f=f, logits=logits: self._features(f, logits),
                    self.fills.store.layers(slot),
                )
            except AdaptspecError as e:
                f.handle.fail(AdaptspecError(f"request {f.handle.id}: {e}"))
                continue
            started += 1
            if row is not None:
                self.rows.append(row)
        self.fills.remove([slot for slot, _ in ended])
        return started

    def _features(self, f: Filling, logits: torch.Tensor) -> np.ndarray:
        """The prefill features of ``f``'s prompt from the hidden states its chunks kept (the layers the
        feature spec reads; the others stay empty and unread)."""
        unread = torch.empty(1, 0, 0)
        hidden = tuple(
            f.layer(i)[None] if i in f.hidden else unread for i in range(self.target.num_layers + 1)
        )
        return prefill_features(
            hidden, logits=logits, prompt_tokens=int(f.ids.numel()), spec=self.target.feature_spec
        )

    def _prompt_ids(self, handle: RequestHandle) -> torch.Tensor:
        """``handle``'s prompt as token ids on the target's device, checked (one line naming what is wrong)."""
        try:
            ids = torch.as_tensor(handle.prompt, dtype=torch.long).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as e:
            raise AdaptspecError(f"prompt is not a sequence of token ids ({e})") from None
        n = int(ids.numel())
        if n == 0:
            raise AdaptspecError("empty prompt: give at least one token")
        if int(ids.max()) >= self.target.vocab_size or int(ids.min()) < 0:
            raise AdaptspecError(f"prompt has token ids outside 0..{self.target.vocab_size - 1}")
        if n + handle.max_new_tokens > self.max_context:
            raise AdaptspecError(
                f"prompt of {n} tokens + max_new_tokens {handle.max_new_tokens} exceeds the context of {self.max_context}"
            )
        return ids.to(self.target.device)

    def _start_row(
        self,
        handle: RequestHandle,
        logits: torch.Tensor,
        context_hidden: torch.Tensor | None,
        features: Callable[[], np.ndarray],
        kv: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> Row | None:
        """After the prompt's prefill (its last ``logits[V]``, the drafter's ``context_hidden``, its
        ``features`` when asked, its keys/values ``kv``): the block size chosen, the first token
        committed, the row started in the next free KV slot. None when the first token ends the request."""
        if handle.choose is not None:
            try:
                b = handle.choose(features())
            except AdaptspecError:
                raise
            except Exception as e:  # a failing chooser fails its request alone
                raise AdaptspecError(f"choosing the block size failed: {type(e).__name__}: {e}") from None
            handle.block_size = self._check_block_size(b)
        keys = SampleKeys(handle.seed) if handle.temperature > 0 else None
        first = first_token(logits, handle.temperature, keys, self.target.vocab_size)
        handle.first_token_at = time.perf_counter()
        if self._commit(handle, [first]):
            handle.decode_s = 0.0
            return None
        if self.on_first_token is not None:
            self.on_first_token(handle)
            if handle.cancelled:  # ended on its first token (a stop sequence): no row, no round
                handle.end_cancelled()
                handle.decode_s = 0.0
                return None
        self.store.load(len(self.rows), kv)
        draft = self.drafter.new_state(context_hidden) if self.drafter is not None else None
        return Row(handle, draft, keys)

    def _commit(self, handle: RequestHandle, new: list[int]) -> bool:
        """Append a round's tokens (up to EOS and ``max_new_tokens``); True when the request is done."""
        eos = self.target.eos_token_ids
        for t in new[: handle.max_new_tokens - len(handle.tokens)]:
            handle.tokens.append(t)
            if t in eos:
                handle.finish_reason = "eos"
                break
        if handle.finish_reason is None and len(handle.tokens) >= handle.max_new_tokens:
            handle.finish_reason = "length"
        if handle.finish_reason is not None:
            handle.finished_at = time.perf_counter()
        return handle.finish_reason is not None

    def _leave(self, indices: list[int], cancelled: bool = False) -> None:
        """Free the rows at ``indices`` (highest first: the last row moves into each hole)."""
        for i in sorted(indices, reverse=True):
            row = self.rows[i]
            if cancelled:
                row.handle.end_cancelled()
            row.handle.decode_s = time.perf_counter() - row.started_at
            self.store.remove(i)
            self.rows[i] = self.rows[-1]
            self.rows.pop()

    @property
    def draft_trees(self) -> bool:
        """Whether a row may verify a draft tree (its block size a tree arm ``-N`` or a
        :class:`~adaptspec.decoding.tree_budget.TreeBudget`): with a drafter, on a target whose attention
        takes a boolean mask per query (``sdpa``, or exact verification's kernel)."""
        return (
            self.drafter is not None
            and getattr(self.target.model.config, "_attn_implementation", None) in BOOLEAN_MASK
        )

    def _check_block_size(self, b: int | TreeBudget) -> int | TreeBudget:
        """``b`` if it is a block size the engine can verify, or a tree arm / tree budget where it runs trees."""
        budget = as_tree_budget(b)
        if budget is None:
            return check_block_size(b, self.max_block_size, self.drafter is not None)
        if not self.draft_trees:
            attention = getattr(self.target.model.config, "_attn_implementation", None)
            raise AdaptspecError(
                f"draft trees need a drafter and a target whose attention takes a boolean mask per "
                f"query (sdpa or exact verification's); this engine has "
                f"{'no drafter' if self.drafter is None else f'{attention!r} attention'}"
            )
        if budget.max_nodes > MAX_TREE_NODES:
            raise AdaptspecError(f"a draft tree has at most {MAX_TREE_NODES} nodes, got {budget.max_nodes}")
        return b
