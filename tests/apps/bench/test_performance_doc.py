"""``docs/performance.md`` shows the committed results as they are: the table between its bench-table markers is
exactly what ``ordered-ssd bench --render docs/results/bench_h200.json`` prints, so neither can change alone; and
the sections that code and docs cite by name (``docs/performance.md``, "Method") are there."""
import os
import re

import pytest

from ordered_ssd.apps.bench.results import render

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DOC = os.path.join(ROOT, "docs", "performance.md")
RESULTS = os.path.join(ROOT, "docs", "results", "bench_h200.json")
BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def _doc() -> str:
    with open(DOC, encoding="utf-8") as fh:
        return fh.read()


def _between_markers(text: str) -> str:
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{DOC}: one {BEGIN} and one {END}"
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    assert start < end, f"{DOC}: {BEGIN} must come before {END}"
    return text[start:end]


def _check_table(doc: str) -> None:
    assert _between_markers(doc) == "\n\n" + render(RESULTS) + "\n", (
        "docs/performance.md's table differs from the committed results: paste the output of "
        "`python -m ordered_ssd bench --render docs/results/bench_h200.json` between the bench-table markers "
        "(a blank line after the first, one before the second)")


def test_the_table_is_the_rendered_committed_results():
    _check_table(_doc())


def test_a_stale_table_is_seen():
    """The comparison above can fail: one number changed in the doc's table, or the markers gone, is reported."""
    doc = _doc()
    row = next(line for line in _between_markers(doc).splitlines() if "| ordered |" in line)
    with pytest.raises(AssertionError, match="differs from the committed results"):
        _check_table(doc.replace(row, row.replace("| ordered | ", "| ordered | 9", 1)))
    with pytest.raises(AssertionError, match="one <!-- bench-table:begin -->"):
        _check_table(doc.replace(END, ""))


def _cited_sections():
    """``(section, file)`` for every ``performance.md`` followed by a quoted section name in the package, the
    bindings, the benchmarks and the docs (``docs/performance.md``, "Method"; a docstring may break the line)."""
    cite = re.compile(r'performance\.md`*,?\s*(?:#:?\s*)?"([A-Za-z][^"\n]*)"')
    found = []
    for top in ("ordered_ssd", "csrc_bindings", "benchmarks", "docs", "README.md"):
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else [
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith((".py", ".md"))]
        for f in files:
            if os.path.samefile(f, DOC):
                continue
            with open(f, encoding="utf-8") as fh:
                found += [(m.group(1), os.path.relpath(f, ROOT)) for m in cite.finditer(fh.read())]
    return found


def test_the_sections_others_cite_are_there():
    headings = {h.strip().lower() for h in re.findall(r"^#+ (.+)$", _doc(), flags=re.M)}
    cited = _cited_sections()
    assert cited, "the citations are found (the pattern still matches)"
    missing = [(section, where) for section, where in cited if section.lower() not in headings]
    assert not missing, f"sections of docs/performance.md cited but not there: {missing}"

