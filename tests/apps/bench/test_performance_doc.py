"""``docs/performance.md`` shows the committed results as they are: the table between its bench-table markers is
exactly what ``ordered-ssd bench --render docs/results/bench_h200.json`` prints, so neither can change alone; and
the sections that code and docs cite by name (``docs/performance.md``, "Method") are there."""
import os
import re

import pytest

from ordered_ssd.apps.bench.results import render

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DOC = os.path.join(ROOT, "docs", "performance.md")
#: (marker name, committed results file): each table of the doc between its markers
TABLES = (("bench-table", "bench_h200.json"), ("bench-table-mamba3", "bench_mamba3.json"))


def _markers(name: str):
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def _doc() -> str:
    with open(DOC, encoding="utf-8") as fh:
        return fh.read()


def _between_markers(text: str, name: str) -> str:
    begin, end = _markers(name)
    assert text.count(begin) == 1 and text.count(end) == 1, f"{DOC}: one {begin} and one {end}"
    start, stop = text.index(begin) + len(begin), text.index(end)
    assert start < stop, f"{DOC}: {begin} must come before {end}"
    return text[start:stop]


def _check_table(doc: str, name: str, results: str) -> None:
    path = os.path.join(ROOT, "docs", "results", results)
    assert _between_markers(doc, name) == "\n\n" + render(path) + "\n", (
        f"docs/performance.md's table differs from the committed results: paste the output of "
        f"`python -m ordered_ssd bench --render docs/results/{results}` between the {name} markers "
        f"(a blank line after the first, one before the second)")


@pytest.mark.parametrize("name, results", TABLES)
def test_the_table_is_the_rendered_committed_results(name, results):
    _check_table(_doc(), name, results)


@pytest.mark.parametrize("name, results", TABLES)
def test_a_stale_table_is_seen(name, results):
    """The comparison above can fail: one number changed in the doc's table, or the markers gone, is reported."""
    doc = _doc()
    row = next(line for line in _between_markers(doc, name).splitlines() if "| ordered |" in line)
    with pytest.raises(AssertionError, match="differs from the committed results"):
        _check_table(doc.replace(row, row.replace("| ordered | ", "| ordered | 9", 1)), name, results)
    begin, end = _markers(name)
    with pytest.raises(AssertionError, match=f"one {begin}"):
        _check_table(doc.replace(end, ""), name, results)


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

