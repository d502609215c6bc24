"""Prompts the target writes itself (Magpie): diverse instructions without a data set.

An aligned chat model given its chat template only up to the start of a user turn
(``<|im_start|>user\\n`` after the system turn) writes a user's instruction, drawn from what
it was aligned on. Sampled at temperature ~1, then cleaned (:func:`clean_instruction`),
deduplicated and decontaminated (:func:`Decontaminator`: no instruction that shares a
13-gram with a public benchmark prompt, so the evaluation prompts stay unseen).

>>> clean_instruction("  How do I  sort a list in Python?  ")
'How do I sort a list in Python?'
>>> clean_instruction("ok") is None   # too short
True
>>> clean_instruction("Écrivez un poème sur la mer, s'il vous plaît, en français.") is None   # not English
True
>>> distinct_ngrams(["a b c d", "a b c e"], n=2)   # 4 distinct bigrams among 6
0.6666666666666666
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Sequence

import torch

from .distill_generator import generate

EVAL_PROMPTS_DIR = Path(__file__).resolve().parent.parent / "data" / "eval-prompts"
_WORD = re.compile(r"[a-z0-9]+")


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to (and including) the opening of a user turn."""
    marker = "\x00MARK\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return list(tokenizer(text[: text.index(marker)], add_special_tokens=False)["input_ids"])


def clean_instruction(text: str, min_chars: int = 16, max_chars: int = 1200) -> str | None:
    """Whitespace-normalised instruction, or None when it is too short/long, not English-looking
    (fewer than 97% ASCII characters) or mostly repetition."""
    text = " ".join(text.split())
    if not min_chars <= len(text) <= max_chars:
        return None
    if sum(c.isascii() for c in text) < 0.97 * len(text):
        return None
    words = _WORD.findall(text.lower())
    if len(words) < 4 or len(set(words)) < 0.4 * len(words):
        return None
    return text


def normalise(text: str) -> str:
    """The key duplicates share: lower-case words only."""
    return " ".join(_WORD.findall(text.lower()))


def distinct_ngrams(texts: Iterable[str], n: int = 3) -> float:
    """Distinct ``n``-grams over all ``n``-grams (distinct-n, a standard diversity figure)."""
    total, seen = 0, set()
    for t in texts:
        w = normalise(t).split()
        grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else 0.0


class Decontaminator:
    """Flags text sharing any ``n``-gram of words with the public benchmark prompts."""

    def __init__(self, n: int = 13, paths: Sequence[Path] | None = None) -> None:
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        for path in paths if paths is not None else sorted(EVAL_PROMPTS_DIR.glob("*.jsonl")):
            for line in Path(path).read_text().splitlines():
                if line.strip():
                    self.grams.update(self._grams(json.loads(line)["prompt"]))

    def _grams(self, text: str) -> set[tuple[str, ...]]:
        w = normalise(text).split()
        return {tuple(w[i : i + self.n]) for i in range(len(w) - self.n + 1)}

    def __contains__(self, text: str) -> bool:
        return not self.grams.isdisjoint(self._grams(text))


def sample_instructions(
    model,
    tokenizer,
    n: int,
    seed: int,
    temperature: float = 1.0,
    max_new_tokens: int = 128,
    batch_size: int = 32,
) -> list[str]:
    """``n`` raw instructions sampled from the user-turn prefix (finished ones only, uncleaned)."""
    prefix = user_turn_prefix(tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eos = {end, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])}
    gen = torch.Generator().manual_seed(seed)
    out: list[str] = []
    for start in range(0, n, batch_size):
        k = min(batch_size, n - start)
        for toks in generate(
            model, [prefix] * k, max_new_tokens, eos, temperature=temperature, generator=gen
        ):
            if toks and toks[-1] in eos:  # a truncated instruction is dropped
                out.append(tokenizer.decode(toks[:-1], skip_special_tokens=True))
    return out
