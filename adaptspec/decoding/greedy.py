"""Plain greedy decoding of a transformers causal LM: the baseline speculation must beat.

No drafter, no block verification, transformers' own kernels and KV cache: the first token
comes from the prefill, every other one from one forward pass. Timing covers the decode
loop only (prefill excluded), like :attr:`adaptspec.speculator.Outcome.decode_s`.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2)
>>> model = LlamaForCausalLM(cfg).eval()
>>> tokens, seconds = plain_greedy(model, [1, 2, 3], max_new_tokens=6)
>>> tokens == model.generate(torch.tensor([[1, 2, 3]]), do_sample=False, max_new_tokens=6)[0, 3:].tolist()
True
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

import torch


@torch.inference_mode()
def plain_greedy(
    model,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos: Iterable[int] = (),
    logits_out: list | None = None,
) -> tuple[list[int], float]:
    """Greedy tokens (at most ``max_new_tokens``, stopping after an EOS) and decode seconds.

    ``logits_out``, when given, receives the logits each token was chosen from (untimed use:
    near-tie analysis).
    """
    from transformers import DynamicCache

    from .target import cache_keyword

    device = next(model.parameters()).device
    eos = set(eos)
    cache = DynamicCache()
    logits = model(
        torch.tensor([list(prompt_ids)], device=device), **{cache_keyword(): cache}, use_cache=True
    ).logits
    tokens = [int(logits[0, -1].argmax())]
    if logits_out is not None:
        logits_out.append(logits[0, -1].float())
    _sync(device)
    start = time.perf_counter()
    while len(tokens) < max_new_tokens and tokens[-1] not in eos:
        logits = model(
            torch.tensor([[tokens[-1]]], device=device), **{cache_keyword(): cache}, use_cache=True
        ).logits
        tokens.append(int(logits[0, -1].argmax()))
        if logits_out is not None:
            logits_out.append(logits[0, -1].float())
    _sync(device)
    return tokens, time.perf_counter() - start


def divergence(
    model, prompt_ids: Sequence[int], tokens: list[int], plain_tokens: list[int]
) -> tuple[int, float] | None:
    """Where ``tokens`` first leaves plain greedy decoding, and by how much: ``(position, gap)``,
    ``gap`` being how far (in logits) the chosen token lay below plain decoding's argmax there.

    None when one output is a prefix of the other (no divergence).

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                   num_attention_heads=4, num_key_value_heads=2)
    >>> model = LlamaForCausalLM(cfg).eval()
    >>> plain, _ = plain_greedy(model, [1, 2, 3], 6)
    >>> other = plain[:2] + [(plain[2] + 1) % 64] + plain[3:]
    >>> pos, gap = divergence(model, [1, 2, 3], other, plain)
    >>> pos, gap > 0
    (2, True)
    """
    pos = next((i for i, (a, b) in enumerate(zip(tokens, plain_tokens)) if a != b), None)
    if pos is None:
        return None
    logits: list = []
    plain_greedy(model, prompt_ids, pos + 1, logits_out=logits)
    row = logits[pos]
    return pos, float(row[plain_tokens[pos]] - row[tokens[pos]])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: Largest logit gap at a fast-mode divergence that counts as a near-tie: bfloat16 logits of
#: 16-64 carry a rounding step of 0.125-0.25, and a multi-row verify pass rounds every layer
#: differently; the largest gap measured on the public benchmark prompts was 0.5 (BENCHMARKS.md).
TIE_GAP = 0.5


class PlainGreedy:
    """The baseline of a :class:`~adaptspec.decoding.TargetModel`: its weights decoded greedily with
    transformers' own kernels (a :func:`~adaptspec.decoding.batch_invariant.standard_copy` when the
    target runs the batch-invariant ones), and the losslessness check against it.

    ``plain(ids, max_new) -> (tokens, decode seconds)``; ``plain.verdict(tokens, plain_tokens, ids,
    max_new)`` says whether a speculative output is the target's own greedy output: ``"yes"``
    when it equals the plain tokens; ``"yes*"`` (exact verification) when it differs from them
    only because standard bfloat16 kernels round differently (it equals the greedy output under
    the exact kernels the decoder runs); ``"tie"`` (fast verification) when it first differs
    where plain decoding's two best logits lay within :data:`TIE_GAP` (rounding of the verify
    pass, the fast mode's documented divergence); else ``"NO"``.
    """

    def __init__(self, target) -> None:
        from .batch_invariant import is_batch_invariant, standard_copy

        self.target = target
        self.model = standard_copy(target.model) if is_batch_invariant(target.model) else target.model
        self.eos = target.eos_token_ids

    def __call__(self, prompt_ids: Sequence[int], max_new_tokens: int) -> tuple[list[int], float]:
        return plain_greedy(self.model, prompt_ids, max_new_tokens, self.eos)

    def verdict(
        self, tokens: list[int], plain_tokens: list[int], prompt_ids: Sequence[int], max_new_tokens: int
    ) -> str:
        if tokens == plain_tokens:
            return "yes"
        if self.model is not self.target.model:  # exact verification
            same = tokens == plain_greedy(self.target.model, prompt_ids, max_new_tokens, self.eos)[0]
            return "yes*" if same else "NO"
        d = divergence(self.model, prompt_ids, tokens, plain_tokens)
        return "tie" if d is not None and d[1] <= TIE_GAP else "NO"
