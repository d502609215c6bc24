"""README and BENCHMARKS.md carry one headline, computed from the result files, and every link into
BENCHMARKS.md names a heading it has.

``benchmarks/headline.py --check`` fails when either file's table differs from what the result files
give; the figures are checked here against the result files read independently (the geometric mean
of the paired repeats), and a reference to BENCHMARKS.md (``BENCHMARKS.md#anchor`` or
``BENCHMARKS.md, "Heading"``) anywhere in README, docs/, the library or benchmarks/ must resolve.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from _scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
headline = load_script("headline")


def test_readme_and_benchmarks_carry_the_headline_the_result_files_give():
    assert headline.main(["--check"]) == 0, "run python benchmarks/headline.py"


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _cells(text):
    """The headline's rows in ``text``: {what: figure}."""
    block = text[text.index(headline.START) : text.index(headline.END)]
    rows = [line.split(" | ") for line in block.splitlines() if line.startswith("| ")]
    return {r[0].lstrip("| "): r[1] for r in rows[1:]}


@pytest.mark.parametrize("name", ["README.md", "BENCHMARKS.md"])
def test_the_served_and_vllm_rows_are_the_paired_repeats_geometric_means(name):
    cells = _cells((ROOT / name).read_text(encoding="utf-8"))
    served = json.loads((RESULTS / "host-served-trees.json").read_text())["summary"]
    expected = " / ".join(
        f"{_geomean(served[lv]['configs']['default']['vs_plain']['per_repeat']):.2f}x"
        for lv in ("1", "2", "4", "8")
    )
    row = next(v for k, v in cells.items() if k.startswith("Served (`adaptspec serve`)"))
    assert row == expected
    grid = json.loads((RESULTS / "vllm-bench-grid-turnover.json").read_text())["summary"]["adaptive"]
    expected = " / ".join(
        f"{_geomean(grid[lv]['vs_plain']['per_repeat']):.2f}x" for lv in ("1", "2", "4", "8")
    )
    row = next(
        v for k, v in cells.items() if k.endswith("against vLLM without speculation, 1 / 2 / 4 / 8 clients")
    )
    assert row == expected


def test_check_fails_on_a_stale_table_and_the_rewrite_mends_it(tmp_path, capsys):
    for name in headline.TARGETS:
        shutil.copy(ROOT / name, tmp_path / name)
    readme = tmp_path / "README.md"
    text = readme.read_text(encoding="utf-8")
    figure = next(iter(_cells(text).values()))
    readme.write_text(text.replace(figure, "9.99x", 1), encoding="utf-8")
    assert headline.main(["--check", "--root", str(tmp_path)]) == 1
    assert "README.md" in capsys.readouterr().err
    assert headline.main(["--root", str(tmp_path)]) == 0
    assert readme.read_text(encoding="utf-8") == text
    assert headline.main(["--check", "--root", str(tmp_path)]) == 0


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_slug_is_githubs():
    assert slug("Two weight copies: the dtype `mixed`") == "two-weight-copies-the-dtype-mixed"
    assert slug("adaptspec serve against vLLM without speculation") == (
        "adaptspec-serve-against-vllm-without-speculation"
    )
    assert slug("The AVX2-capped host: speculation does not pay, so plain decoding") == (
        "the-avx2-capped-host-speculation-does-not-pay-so-plain-decoding"
    )


def _headings():
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    return [line.lstrip("#").strip() for line in lines if line.startswith("#")]


def _sources():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield from sorted((ROOT / "adaptspec").rglob("*.py"))
    yield from sorted((ROOT / "benchmarks").glob("*.py"))


def test_every_link_into_benchmarks_names_a_heading_it_has():
    headings = _headings()
    anchors = {slug(h) for h in headings}
    quoted = re.compile(r'BENCHMARKS\.md(?:,\s*|\s*\(|\s+)"([^"]+)"')
    broken = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for anchor in re.findall(r"BENCHMARKS\.md#([\w-]+)", text):
            if anchor not in anchors:
                broken.append(f"{path.relative_to(ROOT)}: #{anchor}")
        for name in quoted.findall(text):
            name = " ".join(name.split()).rstrip(".,")
            if not any(h.lower().startswith(name.lower()) for h in headings):
                broken.append(f'{path.relative_to(ROOT)}: "{name}"')
    assert not broken, "links into BENCHMARKS.md without a heading:\n" + "\n".join(broken)


def test_benchmarks_headings_carry_no_issue_numbers_or_dates():
    for h in _headings():
        assert not re.search(r"issue \d+|\d{4}-\d{2}-\d{2}", h, re.IGNORECASE), h
