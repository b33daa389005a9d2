"""docs/api.md lists exactly the public names: one section per public module (``ordered_ssd`` and its submodules
that do not start with an underscore, but for the command-line applications ``ordered_ssd.apps``), one line per
name of that module's ``__all__``, no name missing, none extra, none twice."""
import importlib
import pathlib
import pkgutil
import re

import pytest

import ordered_ssd

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"
#: Not API: the command-line applications (documented by their flags) and ``python -m ordered_ssd``.
NOT_LISTED = {"apps", "__main__"}
_SECTION = re.compile(r"^## `(ordered_ssd(?:\.\w+)*)`$")
_ENTRY = re.compile(r"^- `(\w+)`: \S")


def documented() -> dict:
    """``{module: [names in the order of the page]}`` from docs/api.md."""
    sections, current = {}, None
    for line in DOC.read_text().splitlines():
        m = _SECTION.match(line)
        if m:
            current = m.group(1)
            assert current not in sections, f"docs/api.md: two sections for {current}"
            sections[current] = []
        elif line.startswith("- `"):
            e = _ENTRY.match(line)
            assert e and current is not None, f"docs/api.md: an entry not of the form '- `name`: text': {line!r}"
            sections[current].append(e.group(1))
    return sections


def public_modules() -> list:
    return ["ordered_ssd"] + [f"ordered_ssd.{m.name}" for m in pkgutil.iter_modules(ordered_ssd.__path__)
                              if not m.name.startswith("_") and m.name not in NOT_LISTED]


def test_every_public_module_has_a_section_and_no_other():
    assert sorted(documented()) == sorted(public_modules())


@pytest.mark.parametrize("module", public_modules())
def test_section_lists_exactly_the_names_of_all(module):
    names = documented()[module]
    exported = importlib.import_module(module).__all__
    assert len(names) == len(set(names)), f"{module}: a name listed twice"
    assert sorted(names) == sorted(exported)


def test_the_check_fails_on_an_added_or_removed_name(monkeypatch):
    """What the test above compares can fail: a name added to an ``__all__``, or one removed."""
    import ordered_ssd.digest as digest

    assert sorted(documented()["ordered_ssd.digest"]) == ["bit_view", "tensor_sha256"]
    monkeypatch.setattr(digest, "__all__", [*digest.__all__, "new_name"])
    with pytest.raises(AssertionError):
        test_section_lists_exactly_the_names_of_all("ordered_ssd.digest")
    monkeypatch.setattr(digest, "__all__", ["tensor_sha256"])
    with pytest.raises(AssertionError):
        test_section_lists_exactly_the_names_of_all("ordered_ssd.digest")
