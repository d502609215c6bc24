"""Docstrings and comments in adaptspec/ say what the code does; measured speed-ups live in BENCHMARKS.md.

A measured figure in a docstring goes stale the day the code or the host changes, so the library
quotes none: it names the BENCHMARKS.md section instead ("see BENCHMARKS.md, <section>"). What is
flagged is a speed-up ratio with decimals (``1.43x``) in a docstring or a comment. Not flagged:
doctest lines (``>>>`` and their ``...`` continuations: code, checked by running it), a ratio
computed on the line (``1.4 / 1.3 = 1.08x``), a margin or bar the code sets (a line naming the
margin or bar), and a figure a cited paper reports.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import adaptspec

PKG = Path(adaptspec.__file__).parent
RATIO = re.compile(r"(?<![\w.])\d+\.\d+ ?x(?![\w])")
COMPUTED = re.compile(r"=\s*$")
NOT_MEASURED = ("margin", "bar ", "must clear", "reports")


def text_lines(source: str) -> list[tuple[int, str]]:
    """(line number, text) of every docstring line and every comment of a module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    first = body[0].lineno
                    out += [(first + i, line) for i, line in enumerate(body[0].value.value.splitlines())]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def quoted_figures(line: str) -> list[str]:
    """The measured speed-ups ``line`` quotes (empty for doctests, computations, margins, citations)."""
    stripped = line.strip().lstrip("#").strip()
    if stripped.startswith((">>>", "...")) or any(w in line for w in NOT_MEASURED):
        return []
    return [m.group() for m in RATIO.finditer(line) if not COMPUTED.search(line[: m.start()])]


def test_the_pattern_tells_a_measurement_from_what_is_not_one():
    assert quoted_figures("    the default measured 1.43x plain at 4 clients") == ["1.43x"]
    assert quoted_figures("# a 4-token verify costs 2.4 x a 1-token one") == ["2.4 x"]
    assert quoted_figures(">>> best_block_size(flat)   # 1.67/1.2 = 1.39x plain") == []
    assert quoted_figures("    B = 2: 1.4 / 1.3 = 1.08x plain") == []
    assert quoted_figures("    speculation must clear 1.10x plain") == []
    assert quoted_figures("    on an x86 host, 16x16 tiles, shape (2, 3), version 0.32") == []
    assert quoted_figures('    see BENCHMARKS.md, "The served default under load"') == []


def test_no_docstring_or_comment_in_the_library_quotes_a_measured_speed_up():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for lineno, line in text_lines(source):
            for figure in quoted_figures(line):
                found.append(f"{path.relative_to(PKG.parent)}:{lineno}: {figure}: {line.strip()}")
    assert not found, "measured figures belong in BENCHMARKS.md (link there instead):\n" + "\n".join(found)
