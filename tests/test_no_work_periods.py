"""No file of the project refers to the numbered work periods in which it was written.

Documents, comments, tests and data describe the project as it is; where provenance matters they cite a date, a
commit or a table hash, which a reader can look up, never a work period of the people who wrote it (a numbered
session, or one pointed at as this, that or the last one), which a reader cannot. The scan covers every text file
git tracks but this one, which has to name what it looks for.

The patterns name such periods only: pytest's session scope (``scope=`` followed by the quoted word), a
``requests``-style ``Session`` class or a "pytest session" are real API and do not match.
"""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELF = os.path.relpath(os.path.abspath(__file__), ROOT).replace(os.sep, "/")

#: A work period named by its number (the word, singular or plural, then a number, with a space or a hyphen), by a
#: determiner that points at one ("this", "that", "last", "an earlier", "older" ... before the word), by a
#: possessive ("the ...'s starting .git"), or called one. Searched over the whole text, so a phrase broken across
#: two lines is found too (reported at its first line).
_WORD = r"sessions?(?:'s?)?"
PATTERNS = [
    re.compile(r"\b" + _WORD + r"[\s-]+\d+", re.IGNORECASE),
    re.compile(r"\b(?:this|that|these|those|last|previous|earlier|older|next|later|same|first|second|third|own|"
               r"another|an?\s+(?:earlier|later|previous|new|separate))\s+" + _WORD + r"\b", re.IGNORECASE),
    re.compile(r"\b(?:device|gpu|work)\s+" + _WORD + r"\b", re.IGNORECASE),
    re.compile(r"\bthe\s+session's|\bof\s+the\s+session\b", re.IGNORECASE),
    re.compile(r"\bwork[\s-]+periods?\b", re.IGNORECASE),
]


def _tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def _text(path):
    """The file's text, or None for a binary or unreadable file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def work_period_references(root=ROOT, files=None):
    """``["file:line: text", ...]`` for every line of the given tracked ``files`` (default: ``git ls-files``) that
    names a work period."""
    hits = []
    for rel in files if files is not None else _tracked_files():
        text = _text(os.path.join(root, rel))
        if text is None:
            continue
        lines = text.splitlines()
        found = sorted({text.count("\n", 0, m.start()) + 1 for p in PATTERNS for m in p.finditer(text)})
        hits.extend(f"{rel}:{n}: {lines[n - 1].strip()[:160]}" for n in found)
    return hits


def test_no_tracked_file_refers_to_a_work_period():
    files = _tracked_files()
    if files is None:
        pytest.skip("not a git checkout (git ls-files failed)")
    hits = work_period_references(files=[f for f in files if f != SELF])
    assert not hits, ("references to work periods (cite a date, a commit or a table hash instead):\n"
                      + "\n".join(hits))


S = "sess" + "ion"


@pytest.mark.parametrize("line", [
    f"On the H200 ({S} 27, table 7258b66b39eca5ed): both cases passed.",
    f"measured in {S}s 17 and 18",
    f"performance.md: {S}-24 section",
    f"Not run at the default 200 steps in this {S} (device time).",
    f"the GPU time of that {S} went to the test suite",
    f"rows on older {S}s' code",
    f"the fastest at G11's in_proj in an earlier {S}",
    f"the last {S}'s results",
    f"the device {S} ended",
    f"the device copy keeps the {S}'s starting `.git`",
    f"not run: the last device call of the {S} ran out",
    f"the GPU time of that\n{S} went elsewhere",
    f"benched again on this table on the H200 ({S}\n24, ...)",
    "a work " + "period ago",
])
def test_the_patterns_find_work_periods(line, tmp_path):
    (tmp_path / "f.md").write_text(line + "\n")
    assert work_period_references(str(tmp_path), ["f.md"]) == [f"f.md:1: {line.splitlines()[0]}"]


@pytest.mark.parametrize("line", [
    '@pytest.fixture(scope="session")',
    "s = requests.Session()",
    "once per pytest session",
    "class Session:",
    "a session-scoped fixture",
    "sessionmaker(bind=engine)",
])
def test_the_patterns_leave_api_uses_alone(line, tmp_path):
    (tmp_path / "f.py").write_text(line + "\n")
    assert work_period_references(str(tmp_path), ["f.py"]) == []


def test_binary_files_are_skipped(tmp_path):
    (tmp_path / "b.bin").write_bytes(b"\0" + f"{S} 3".encode() + b"\0")
    assert work_period_references(str(tmp_path), ["b.bin"]) == []
