"""The committed results (``--results-json PATH``, e.g. ``docs/results/bench_h200.json``): every run of the bench
kept in one JSON file, newest first, and the markdown section of one run for ``docs/performance.md``
(``--render PATH``).

File format: ``{"format": RESULTS_FORMAT, "runs": [bench.json of a run, newest first]}``; a run is the
``bench.json`` structure without the per-parameter gradient digests (their SHA-256 over all, ``grads_sha256``,
stays). A run is identified by ``meta["run_id"]``: writing a run again (the suite does after every shape)
replaces its earlier entry in place.
"""
from __future__ import annotations

import copy
import json
import os
from typing import List

from ..files import atomic_write_bytes
from .report import format_table
from .requirements import BenchError
from .timing import finalize_ratios

RESULTS_FORMAT = "ordered-ssd bench results v1"


def compact_run(results: dict) -> dict:
    """A copy of ``results`` (``bench.json``) for the results file: per-parameter digests left out."""
    run = copy.deepcopy(results)
    for shape_result in run.get("shapes", []):
        for row in shape_result.get("rows", {}).values():
            row.pop("digests", None)
    return run


def load_runs(path: str, option: str = "--results-json") -> List[dict]:
    """The runs of a results file, newest first; ``[]`` if ``path`` does not exist.

    Raises:
        BenchError: ``path`` cannot be read, is not JSON, or is not a results file (names ``option``, the path and
            why).
    """
    if not os.path.exists(path):
        return []
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise BenchError(f"{option}: cannot read {path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT or not isinstance(data.get("runs"), list):
        raise BenchError(f"{option}: {path} is not a bench results file (expected a JSON object with "
                         f"format {RESULTS_FORMAT!r} and a 'runs' list)")
    return data["runs"]


def merge_run(path: str, results: dict) -> List[dict]:
    """Put ``results`` first in the results file ``path`` (created if absent, with its folder), replacing an
    earlier entry of the same ``meta["run_id"]`` and keeping every other run in its order. Writes atomically;
    returns the runs written.

    Raises:
        BenchError: as :func:`load_runs`; ``results`` has no ``meta["run_id"]``.
        OSError: the file cannot be written.
    """
    run_id = results.get("meta", {}).get("run_id")
    if not run_id:
        raise BenchError("--results-json: the results have no meta.run_id")
    runs = [r for r in load_runs(path) if r.get("meta", {}).get("run_id") != run_id]
    runs.insert(0, compact_run(results))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = {"format": RESULTS_FORMAT, "runs": runs}
    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True, default=str) + "\n").encode())
    return runs


def render_run(run: dict) -> str:
    """The markdown section of one run for ``docs/performance.md`` (section "Results", newest first): a ``###``
    heading with the GPU, the date and the commit (of a merge: its newest run's), the pinned fingerprint (or, when
    the merged runs differ in it, a line saying so; each run's is under "Merged from"), then
    :func:`report.format_table` without its title. Ratios and targets are those of the current rules
    (:func:`~ordered_ssd.apps.bench.timing.finalize_ratios` on a copy: the run is not changed)."""
    run = copy.deepcopy(run)
    for shape_result in run.get("shapes", []):
        finalize_ratios(shape_result)
    meta = run.get("meta", {})
    gpu = (meta.get("gpu") or meta.get("device") or "?").split(" (")[0]
    title = f"### {gpu}, {meta.get('date', '?')}" + (f" (commit {meta['commit']})" if meta.get("commit") else "")
    fingerprint = meta.get("pinned_configs")
    setup = [f"Pinned table fingerprint: `{fingerprint}`."] if isinstance(fingerprint, str) else []
    if "pinned_configs" in meta.get("sources_differ_in", ()):
        setup = ["Pinned table fingerprints: the merged runs differ, each is named under \"Merged from\"."]
    return "\n".join([title, ""] + setup + ([""] if setup else []) + [format_table(run, heading=False)])


def render(path: str, index: int = 0) -> str:
    """:func:`render_run` of run ``index`` (0 the newest) of the results file ``path``.

    Raises:
        BenchError: as :func:`load_runs`; the file has no run ``index``.
    """
    runs = load_runs(path, "--render")
    if not 0 <= index < len(runs):
        raise BenchError(f"--render-run: {path} has {len(runs)} run(s), no run {index}")
    return render_run(runs[index])
