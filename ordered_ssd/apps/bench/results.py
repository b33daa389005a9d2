"""The committed results (``--results-json PATH``, e.g. ``docs/results/bench_h200.json``): the current row of every
shape, each with the provenance of the run that measured it, and their markdown table for ``docs/performance.md``
(``--render PATH``).

File format (:data:`RESULTS_FORMAT`)::

    {"format": "ordered-ssd bench results v2",
     "runs": [{"meta": {...}, "shapes": [shape result, ...]}, ...]}

``runs`` lists the runs that still hold a current row, newest first. A run's ``meta`` is its provenance as the
run recorded it: ``run_id``, ``date``, ``commit``, ``tree``, ``pinned_configs`` (the pinned table fingerprint),
``gpu``, ``versions``, ``command``, ``elapsed_s``, the harness (``settings``, ``grid_settings``, ``precision``,
``timer``, ``parent_env``, ...), and ``precompile_wall_s`` / ``precompile_failed`` for its precompile phase. Its
``shapes`` are the ``bench.json`` shape results of the shapes whose newest measured row it holds (without the
per-parameter gradient digests; their SHA-256 over all, ``grads_sha256``, stays). Each shape name is in exactly one
run; a run left without shapes is dropped. The file therefore holds at most one row per shape and one run per
shape, however many runs were merged into it: its size does not grow with the history (that is in git).

Merging a run (:func:`merge_run`; the suite does after every shape, with the same ``meta["run_id"]``) puts it
first with the shapes it measured, a shape counting as measured once one of its rows is not skipped (an error such
as out-of-memory is a measurement; ``skipped: ...`` and no rows are not); those shapes leave the runs that held
them, and every other shape keeps its row and its run's provenance. Writing a run again replaces its earlier
entry (keeping the rows of that entry it did not measure again). A ``--merge`` result is split into the runs it was
merged from (``meta["sources"]``), each with the shapes it contributed and its own command, commit, tree, date,
versions and fingerprint, and the merge's harness fields (those of its first file); a source without a ``run_id``
gets one derived from its command, date, commit and tree. Shapes are keyed by name (``--shape`` rows are named X1,
X2, ... unless named: a later X1 replaces an earlier one).

The older format, ``"ordered-ssd bench results v1"`` (every run whole, newest first), is read as the current rows
of its runs (the newest measured row of every shape) and written in the current format by the next merge; to
rewrite such a file at once: ``write_runs(path, load_runs(path))``.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from typing import List, Optional

from ..errors import plural
from ..files import atomic_write_bytes
from .report import format_table, measured
from .requirements import BenchError
from .shapes import ALL_NAMED, LAYER_NAMES, LAYERS, result_layer
from .timing import finalize_ratios

RESULTS_FORMAT = "ordered-ssd bench results v2"
#: the format before v2: every merged run kept whole, newest first (read, converted to the current rows)
RESULTS_FORMAT_V1 = "ordered-ssd bench results v1"

#: what a run of a ``--merge`` takes from the merge's meta (the harness; its first file's): everything else of its
#: provenance is its own (``meta["sources"]``)
_HARNESS = ("device", "precision", "timer", "settings", "grid_settings", "parent_env", "allow_tf32",
            "deterministic_algorithms")
#: a merge's own keys: not a run's provenance
_MERGE_KEYS = ("sources", "merged_from", "sources_differ_in")
#: what the rendered table's "Merged from" lines name of each run (:func:`report.format_table`)
_SOURCE_KEYS = ("command", "date", "commit", "tree", "gpu", "versions", "pinned_configs", "elapsed_s",
                "precompile_wall_s", "precompile_failed")


def compact_run(results: dict) -> dict:
    """A copy of ``results`` (``bench.json``) for the results file: per-parameter digests left out."""
    run = copy.deepcopy(results)
    for shape_result in run.get("shapes", []):
        for row in shape_result.get("rows", {}).values():
            row.pop("digests", None)
    return run


_NAMED_ORDER = {name: i for i, name in enumerate(ALL_NAMED)}


def _order(name: str):
    """Sort key of a shape name: S1-S5, G1-G13, M1-M6 in their order, then any other by name."""
    return (0, _NAMED_ORDER[name], "") if name in _NAMED_ORDER else (1, 0, name)


def _derived_run_id(source: dict) -> str:
    key = json.dumps({k: source.get(k) for k in ("command", "date", "commit", "tree")}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def split_runs(results: dict) -> List[dict]:
    """The runs of ``results`` (a ``bench.json``, a ``--merge`` of several, or a v1 file's run) as results-file
    runs, newest first: ``{"meta": provenance, "shapes": [its measured shape results]}``, digests left out; a run
    that measured no shape is left out. See the module's docstring."""
    results = compact_run(results)
    meta = results.get("meta", {})
    shapes = [s for s in results.get("shapes", []) if measured(s)]
    sources = meta.get("sources") if isinstance(meta.get("sources"), list) else []
    if not sources:
        own = {k: v for k, v in meta.items() if k not in _MERGE_KEYS}
        pre = results.get("precompile")
        if isinstance(pre, dict):
            own.update(precompile_wall_s=pre.get("wall_s"), precompile_failed=pre.get("failed"))
        run = {"meta": own, "shapes": sorted(shapes, key=lambda s: _order(s["name"]))}
        for k in ("modes", "children"):
            if k in results:
                run[k] = results[k]
        return [run] if shapes else []
    by_name = {s["name"]: s for s in shapes}
    harness = {k: meta[k] for k in _HARNESS if k in meta}
    runs, taken = [], set()
    for src in reversed(sources):  # newest first; a shape belongs to the newest source that lists it
        names = sorted((n for n in src.get("shapes", ()) if n in by_name and n not in taken), key=_order)
        if not names:
            continue
        taken.update(names)
        own = {**harness, **{k: v for k, v in src.items() if k != "shapes"}}
        own.setdefault("run_id", _derived_run_id(src))
        runs.append({"meta": own, "shapes": [by_name[n] for n in names]})
    rest = sorted((n for n in by_name if n not in taken), key=_order)
    if rest:  # listed by no source (a hand-made file): the merge's own provenance
        runs.insert(0, {"meta": {k: v for k, v in meta.items() if k not in _MERGE_KEYS},
                        "shapes": [by_name[n] for n in rest]})
    return runs


def merge_runs(runs: List[dict], new: List[dict]) -> List[dict]:
    """``new`` (results-file runs, newest first) merged into ``runs``: each goes first, replacing an earlier entry of
    its ``run_id`` (whose rows it did not measure again it keeps); the shapes it holds leave every other run; runs
    left without shapes are dropped."""
    for run in reversed(new):
        run_id = run["meta"].get("run_id")
        names = {s["name"] for s in run["shapes"]}
        again = [s for old in runs if old["meta"].get("run_id") == run_id for s in old["shapes"]
                 if s["name"] not in names]
        run = dict(run, shapes=sorted(run["shapes"] + again, key=lambda s: _order(s["name"])))
        names.update(s["name"] for s in again)
        kept = []
        for old in runs:
            shapes = [s for s in old["shapes"] if s["name"] not in names]
            if shapes and old["meta"].get("run_id") != run_id:
                kept.append(dict(old, shapes=shapes))
        runs = ([run] if run["shapes"] else []) + kept
    return runs


def load_runs(path: str, option: str = "--results-json") -> List[dict]:
    """The runs of a results file, newest first, each with the shapes whose current row it holds (a v1 file read
    as its current rows); ``[]`` if ``path`` does not exist.

    Raises:
        BenchError: ``path`` cannot be read, is not JSON, or is not a results file of a known format (names
            ``option``, the path, the format found and the one expected).
    """
    if not os.path.exists(path):
        return []
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise BenchError(f"{option}: cannot read {path}: {e}") from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt not in (RESULTS_FORMAT, RESULTS_FORMAT_V1) or not isinstance(data.get("runs"), list):
        found = f"format {fmt!r}" if fmt is not None else "no format"
        raise BenchError(f"{option}: {path} is not a bench results file ({found}; expected a JSON object with "
                         f"format {RESULTS_FORMAT!r} (or the older {RESULTS_FORMAT_V1!r}) and a 'runs' list)")
    if fmt == RESULTS_FORMAT:
        if not all(isinstance(r, dict) and isinstance(r.get("meta"), dict) and isinstance(r.get("shapes"), list)
                   for r in data["runs"]):
            raise BenchError(f"{option}: {path}: every run of format {RESULTS_FORMAT!r} must be an object with a "
                             f"'meta' object and a 'shapes' list")
        return data["runs"]
    runs: List[dict] = []
    for run in reversed(data["runs"]):  # oldest first, so that the newest measured row of each shape stays
        runs = merge_runs(runs, split_runs(run))
    return runs


def write_runs(path: str, runs: List[dict]) -> None:
    """Write ``runs`` to the results file ``path`` in the current format (atomically; the folder created).

    Raises:
        OSError: the file cannot be written.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = {"format": RESULTS_FORMAT, "runs": runs}
    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True, default=str) + "\n").encode())


def merge_run(path: str, results: dict) -> List[dict]:
    """Merge ``results`` (a ``bench.json``, or a ``--merge`` of several) into the results file ``path`` (created if
    absent, with its folder; a v1 file is rewritten in the current format): its measured shapes replace theirs, it
    replaces an earlier entry of its ``meta["run_id"]``, every other shape keeps its row and run
    (:func:`split_runs`, :func:`merge_runs`). Writes atomically; returns the runs written.

    Raises:
        BenchError: as :func:`load_runs`; ``results`` has no ``meta["run_id"]``.
        OSError: the file cannot be written.
    """
    run_id = results.get("meta", {}).get("run_id")
    if not run_id:
        raise BenchError("--results-json: the results have no meta.run_id")
    runs = merge_runs(load_runs(path), split_runs(results))
    write_runs(path, runs)
    return runs


def current(runs: List[dict]) -> dict:
    """The current table of ``runs`` as one ``bench.json``-like result: every run's shapes (S1-S5, G1-G13, then
    the others by name); ``meta`` the newest run's, with ``sources`` (each run's command, commit, tree, date,
    versions, fingerprint, precompile, and the shapes it holds; oldest first, as :func:`report.merge_results`
    writes them) and ``sources_differ_in`` (which of the GPU, the versions and the fingerprint differ)."""
    shapes = sorted((s for r in runs for s in r["shapes"]), key=lambda s: _order(s["name"]))
    meta = {k: v for k, v in (runs[0]["meta"] if runs else {}).items() if k not in _MERGE_KEYS}
    sources = [{**{k: r["meta"].get(k) for k in _SOURCE_KEYS}, "shapes": [s["name"] for s in r["shapes"]]}
               for r in reversed(runs)]
    meta["sources"] = sources
    differ = [k for k in ("gpu", "versions", "pinned_configs")
              if len({json.dumps(s.get(k), sort_keys=True) for s in sources}) > 1]
    if differ:
        meta["sources_differ_in"] = differ
    return {"meta": meta, "shapes": shapes}


def render_run(run: dict) -> str:
    """The markdown section of ``run`` (a ``bench.json``-like result, e.g. :func:`current`'s) for
    ``docs/performance.md``: a ``###`` heading with the GPU, the date and the commit (of several runs: the newest
    one's), the pinned fingerprint (or, when the runs differ in it, a line saying so; each run's is under "Merged
    from"), then :func:`report.format_table` without its title. Ratios and targets are those of the current rules
    (:func:`~ordered_ssd.apps.bench.timing.finalize_ratios` on a copy: the run is not changed). A run of Mamba-3
    rows only has ``Mamba-3:`` in its heading (the Mamba-2 heading is as it always was)."""
    run = copy.deepcopy(run)
    for shape_result in run.get("shapes", []):
        finalize_ratios(shape_result)
    meta = run.get("meta", {})
    gpu = (meta.get("gpu") or meta.get("device") or "?").split(" (")[0]
    layers = {result_layer(s) for s in run.get("shapes", [])}
    layer = f"{LAYER_NAMES['mamba3']}: " if layers == {"mamba3"} else ""
    title = (f"### {layer}{gpu}, {meta.get('date', '?')}"
             + (f" (commit {meta['commit']})" if meta.get("commit") else ""))
    fingerprint = meta.get("pinned_configs")
    setup = [f"Pinned table fingerprint: `{fingerprint}`."] if isinstance(fingerprint, str) else []
    if "pinned_configs" in meta.get("sources_differ_in", ()):
        setup = ["Pinned table fingerprints: the merged runs differ, each is named under \"Merged from\"."]
    return "\n".join([title, ""] + setup + ([""] if setup else []) + [format_table(run, heading=False)])


def layer_runs(runs: List[dict], layer: str) -> List[dict]:
    """``runs`` with only their shapes of ``layer`` (:func:`~ordered_ssd.apps.bench.shapes.result_layer`; rows
    written before Mamba-3 was benched are Mamba-2's), the runs left without shapes dropped."""
    out = []
    for run in runs:
        shapes = [s for s in run["shapes"] if result_layer(s) == layer]
        if shapes:
            out.append(dict(run, shapes=shapes))
    return out


def render(path: str, index: Optional[int] = None, layer: Optional[str] = None) -> str:
    """:func:`render_run` of the current table of the results file ``path`` (every shape's current row, each
    run named with its shapes under "Merged from"), or with ``index`` of run ``index`` alone (0 the newest) with
    the rows it holds: one section per layer (Mamba-2 first; its runs, provenance and rows are those of the
    Mamba-2 rows alone, so Mamba-3 rows leave its section as it was), a blank line between; with ``layer`` only
    that layer's.

    Raises:
        BenchError: as :func:`load_runs`; the file has no run ``index``; ``layer`` is given and the file (or run
            ``index``) has no row of it.
    """
    runs = load_runs(path, "--render")
    if index is not None:
        if not 0 <= index < len(runs):
            raise BenchError(f"--render-run: {path} has {plural(len(runs), 'run')}, no run {index}")
        runs = runs[index:index + 1]
    sections = [(name, layer_runs(runs, name)) for name in LAYERS if layer is None or name == layer]
    sections = [(name, part) for name, part in sections if part]
    if layer is not None and not sections:
        where = f"run {index} of {path}" if index is not None else path
        raise BenchError(f"--render: {where} has no {LAYER_NAMES[layer]} row (--layer {layer})")
    if not sections:  # no row at all: the empty table, as before
        return render_run(current(runs))
    return "\n".join(render_run(current(part)) for _, part in sections)
