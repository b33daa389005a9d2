"""The committed H200 benchmark (``docs/results/bench_h200.json``: the current row of every shape, each under the run
that measured it) still describes the code: every row recorded the configurations ``csrc_bindings.describe_launch``
resolved for its shape in the bench process (the table's, the rule's or a heuristic's; the fit-stages rule may still
lower ``num_stages`` at a launch), and they must equal what it resolves for that shape on sm_90 now. A table change
at a benchmark row's key therefore fails here until that row is benched again (or the row is merged from a run on
the new table). Kernels whose configuration upstream's autotuner chose by timing in that process (``speed``
``native-autotune-v1``) are not compared."""
import json
import os

import pytest

import csrc_bindings
from ordered_ssd.apps.bench.results import RESULTS_FORMAT
from ordered_ssd.apps.bench.shapes import NAMED, torch_dtype

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "results", "bench_h200.json")
#: the committed file holds one row per shape, not the history: a few hundred KB at most
MAX_BYTES = 300_000

with open(RESULTS) as _fh:
    DATA = json.load(_fh)
#: the current row of every shape, each with its run's meta under "run_meta"
ROWS = [dict(shape, run_meta=run["meta"]) for run in DATA["runs"] for shape in run["shapes"]]


def test_the_file_is_the_current_rows_of_its_runs():
    """The current format (a run per set of current rows, no history), every run with the provenance that names
    what it measured (commit and tree, date, pinned table fingerprint, versions, command), and bounded in size."""
    assert DATA["format"] == RESULTS_FORMAT
    assert os.path.getsize(RESULTS) < MAX_BYTES
    assert DATA["runs"] and all(run["shapes"] for run in DATA["runs"])
    for run in DATA["runs"]:
        meta = run["meta"]
        for key in ("run_id", "date", "commit", "tree", "pinned_configs", "gpu", "versions", "command"):
            assert meta.get(key), (meta.get("run_id"), key)
        assert meta["pinned_configs"].startswith("csrc_bindings/") and "table=" in meta["pinned_configs"], meta
        assert meta["gpu"].startswith("NVIDIA H200"), meta["gpu"]
    assert len({run["meta"]["run_id"] for run in DATA["runs"]}) == len(DATA["runs"])


def test_the_file_holds_every_named_benchmark_shape_once():
    names = [row["name"] for row in ROWS]
    assert len(names) == len(set(names)), "a shape is in one run only"
    assert sorted(names) == sorted(NAMED), "docs/results/bench_h200.json must hold S1-S5 and G1-G13"


@pytest.mark.parametrize("row", ROWS, ids=[row["name"] for row in ROWS])
def test_each_row_was_measured(row):
    """A row skipped by a run's time budget (or failed) carries the configurations it would have run, so the test
    below alone would pass it: every mode of every row must have a step time and a bitwise verdict."""
    rows = row["rows"]
    assert sorted(rows) == ["native", "ordered", "upstream-det"], row["name"]
    for mode, r in rows.items():
        assert "error" not in r, (row["name"], mode, r.get("error"))
        assert r.get("ms", 0) > 0, (row["name"], mode)
        assert isinstance(r.get("bitwise"), bool), (row["name"], mode)
    targets = rows["ordered"].get("targets") or {}
    assert all(isinstance(targets.get(t), bool) for t in ("time", "memory", "upstream_det", "met")), (
        row["name"], targets)


def test_a_skipped_row_is_seen():
    """The check above can fail: a row the time budget skipped (as ``bench`` writes it) is reported."""
    row = next(r for r in ROWS if r["name"] == "S1")
    skipped = dict(row, rows={m: {"mode": m, "error": "skipped: time budget"} for m in row["rows"]})
    with pytest.raises(AssertionError, match="skipped: time budget"):
        test_each_row_was_measured(skipped)


@pytest.mark.parametrize("row", ROWS, ids=[row["name"] for row in ROWS])
def test_each_rows_recorded_configs_are_the_tables_now(row):
    shape = NAMED[row["name"]]
    assert row["dims"] == shape.dims(), "the row's dimensions are the named shape's"
    now = csrc_bindings.describe_launch(chunk_size=shape.chunk, headdim=shape.headdim, dstate=shape.N,
                                        nheads=shape.nheads, ngroups=shape.G, dtype=torch_dtype(shape.dtype),
                                        arch="sm_90")["kernels"]
    recorded = row["pinned"]
    assert "error" not in recorded, recorded
    compared = 0
    for kernel, was in recorded.items():
        if was.get("speed") == "native-autotune-v1":  # chosen by timing in that process, not by the table
            continue
        assert kernel in now, f"{row['name']}: kernel {kernel} recorded but no longer described"
        assert now[kernel]["config"] == was["config"], (
            f"{row['name']} ({row['dims']}): {kernel} launched at {was['config']} in the committed run "
            f"({row['run_meta'].get('commit')}, {row['run_meta'].get('date')}), the table "
            f"gives {now[kernel]['config']} now: bench this row again on the current table")
        compared += 1
    assert compared >= 10, f"{row['name']}: only {compared} kernels compared"


def test_a_changed_entry_is_seen(monkeypatch):
    """The comparison above can fail: a recorded configuration that differs from the table's is reported."""
    row = next(r for r in ROWS if r["name"] == "S1")
    kernel = next(k for k, v in row["pinned"].items() if v.get("speed") != "native-autotune-v1")
    changed = dict(row, pinned={**row["pinned"], kernel: {**row["pinned"][kernel],
                                                           "config": {"BLOCK_SIZE_M": 1, "num_warps": 1}}})
    with pytest.raises(AssertionError, match=f"{kernel} launched at"):
        test_each_rows_recorded_configs_are_the_tables_now(changed)
