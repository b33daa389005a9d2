"""The bench's table, JSON, chart and merge (:mod:`ordered_ssd.apps.bench.report`), on synthetic results."""
import json
import os

import pytest

from ordered_ssd.apps import bench

PNG = b"\x89PNG\r\n\x1a\n"


def _synthetic():
    res = {"meta": {"gpu": "NVIDIA H200 (sm_90)", "date": "2026-01-01 00:00 UTC", "precision": "fp32 params",
                    "timer": "torch.cuda.Event per step", "command": "ordered-ssd bench",
                    "versions": {"torch": "2.11.0", "triton": "3.6.0", "mamba-ssm": "2.3.2.post1",
                                 "causal-conv1d": "1.7.0", "ordered-ssd": "0.1"},
                    "settings": {"repeats": 20, "warmup": 5, "bit_repeats": 10, "host_steps": 5},
                    "grid_settings": {"repeats": 15, "warmup": 3, "bit_repeats": 5, "host_steps": 5}},
           "precompile": {"jobs": 8, "wall_s": 61.25, "tasks": [
               {"name": "plain-cs256-P64-N128-bf16", "error": None},
               {"name": "upstream-det-cs256-P64-N128-bf16", "error": "S1 native: OutOfMemoryError: x"}]},
           "shapes": []}
    host = {"host_ms": 2.5, "host_steps": 5, "launches": 61.0}
    for i, name in enumerate(["S1", "S2"]):
        rows = {
            "native": {"mode": "native", "ms": 10.0 + i, "peak_mib": 1000.0, "bitwise": False, "bit_repeats": 10,
                       "distinct_digest_sets": 7, **host},
            "upstream-det": {"mode": "upstream-det", "ms": 15.0, "peak_mib": 1100.0, "bitwise": True,
                             "bit_repeats": 10, "child_native": {"ms": 12.0, "peak_mib": 1000.0}, **host},
            "literal": {"mode": "literal", "ms": 30.0, "peak_mib": 1500.0, "bitwise": True, "bit_repeats": 10,
                        "same_bits_as_ordered": True},
            "ordered": {"mode": "ordered", "ms": 10.5, "peak_mib": 1050.0, "bitwise": True, "bit_repeats": 10,
                        "host_ms": 3.25, "host_steps": 5, "launches": 88.5},
        }
        res["shapes"].append({"name": name, "dims": bench.SHAPES[name].dims(), "rows": rows})
    grid_rows = {"native": {"mode": "native", "ms": 4.0, "peak_mib": 200.0},
                 "ordered": {"mode": "ordered", "ms": 4.1, "peak_mib": 230.0}}
    res["shapes"].append({"name": "G1", "dims": bench.GRID["G1"].dims(), "rows": grid_rows})
    res["shapes"][1]["rows"]["literal"] = {"mode": "literal", "error": "timing: OutOfMemoryError: CUDA out of memory"}
    for sr in res["shapes"]:
        bench.finalize_ratios(sr)
    return res


def test_ratios_and_table():
    res = _synthetic()
    r = res["shapes"][0]["rows"]
    assert r["native"]["ratio_ms"] == 1.0 and r["ordered"]["ratio_ms"] == pytest.approx(1.05)
    assert r["ordered"]["ratio_mem"] == pytest.approx(1.05)
    assert r["upstream-det"]["ratio_ms"] == pytest.approx(1.5) and r["upstream-det"]["ratio_ms_child"] == 1.25
    assert r["upstream-det"]["ratio_mem_child"] == pytest.approx(1.1)
    assert r["ordered"]["ratio_ms_det"] == pytest.approx(0.7) and "ratio_ms_det" not in r["native"]
    assert r["ordered"]["targets"] == {"time": True, "memory": True, "upstream_det": True, "met": True,
                                       "upstream_det_ratio": "ratio_ms_det_paired"}
    r2 = res["shapes"][1]["rows"]  # native 11 ms: 10.5 / 11 = 0.955
    assert r2["ordered"]["targets"]["met"] is True and r2["ordered"]["ratio_ms"] == pytest.approx(10.5 / 11)
    g = res["shapes"][2]["rows"]["ordered"]  # 4.1 / 4.0 = 1.025 time, 230 / 200 = 1.15 memory, no upstream-det
    assert g["ratio_ms_det"] is None
    assert g["targets"] == {"time": True, "memory": False, "upstream_det": None, "met": False,
                            "upstream_det_ratio": None}
    md = bench.format_table(res)
    assert ("| shape | dims | mode | ms/step | × native | × native (child) | × upstream-det | host ms | launches | "
            "peak MiB | × native | bitwise | targets |") in md
    assert r["ordered"]["ratio_ms_det_paired"] == pytest.approx(1.05 / 1.25)  # through native in each process
    assert ("| S1 | B2 L2048 d1024 N128 G1 P64 cs256 bf16 | ordered | 10.500 | 1.050 |  | 0.700 (paired 0.840) | "
            "3.25 | 88.5 | 1050 | 1.050 | yes (10/10) | time ✓ · mem ✓ · det ✓ (paired) |") in md
    assert "| upstream-det | 15.000 | 1.500 | 1.250 (mem 1.100) |  | 2.50 | 61 | 1100 | 1.100 | yes (10/10) |  |" in md
    assert "| native | 10.000 | 1.000 |  |  | 2.50 | 61 | 1000 | 1.000 | **no** (7 distinct of 10) |  |" in md
    assert "| literal | 30.000 | 3.000 |  |  | — | — | 1500 | 1.500 | yes (10/10), = ordered |  |" in md
    assert ("| G1 | B64 L512 d256 N16 G1 P32 cs64 bf16 | ordered | 4.100 | 1.025 |  | — | — | — | 230 | 1.150 | — | "
            "time ✓ · mem **✗** · det — |") in md
    assert "| S2 | B8 L4096 d2048 N128 G1 P64 cs256 bf16 | literal | — | — | — | — | — | — | — | — | error¹ | |" in md
    assert "¹ S2 literal: timing: OutOfMemoryError" in md
    assert "NVIDIA H200 (sm_90) · torch 2.11.0" in md
    assert "median of 20 interleaved steps per mode after 5 warm-up steps (grid rows: 15 after 3, bit check " \
           "over 5)" in md
    assert ("Targets (ordered / native ≤ 1.05 step time and ≤ 1.10 peak memory, ordered ≤ upstream-det): all met on "
            "2 of 3 shapes (S1, S2); missed on G1 (mem 1.150).") in md
    assert ("Precompile: 2 tasks in up to 8 worker processes, 61.2 s wall before any timing (excluded from every "
            "measurement); 1 failed: upstream-det-cs256-P64-N128-bf16: S1 native: OutOfMemoryError: x.") in md


def test_write_results_table_json_png(tmp_path):
    res = _synthetic()
    paths = bench.write_results(str(tmp_path), res)
    assert paths["png_note"] is None
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(json.dumps(res))
    assert (tmp_path / "bench.md").read_text() == bench.format_table(res)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def test_merge(tmp_path, capsys):
    a, b = _synthetic(), _synthetic()
    b["shapes"] = [dict(b["shapes"][1], dims="replaced"), {"name": "X1", "dims": "x", "rows": {}}]
    a["meta"]["command"], b["meta"]["command"] = "ordered-ssd bench --shapes S1,S2", "ordered-ssd bench --grid"
    b["precompile"] = {"wall_s": 61.5, "failed": 1}
    old_rule = {"time": True, "memory": True, "upstream_det": False, "met": False}  # an older file: det direct
    a["shapes"][0]["rows"]["ordered"]["targets"] = dict(old_rule)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = tmp_path / "m"
    assert bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out)]) == 0
    m = json.loads((out / "bench.json").read_text())
    assert [s["name"] for s in m["shapes"]] == ["S1", "S2", "G1", "X1"] and m["shapes"][1]["dims"] == "replaced"
    assert m["shapes"][0]["rows"]["ordered"]["targets"] == {  # judged again by this version's rule
        "time": True, "memory": True, "upstream_det": True, "met": True, "upstream_det_ratio": "ratio_ms_det_paired"}
    printed = capsys.readouterr().out
    assert "| S1 |" in printed and "Merged from:" in printed  # every run's command, not only the first's
    assert "`ordered-ssd bench --shapes S1,S2`" in printed and "`ordered-ssd bench --grid`" in printed
    assert "precompile 61.5 s, 1 failed" in printed and "the runs differ" not in printed
    assert [src["command"] for src in m["meta"]["sources"]] == ["ordered-ssd bench --shapes S1,S2",
                                                                "ordered-ssd bench --grid"]
    results_json = tmp_path / "results.json"
    assert bench.main(["--merge", str(tmp_path / "a.json"), "--out", str(out),
                       "--results-json", str(results_json)]) == 0
    assert bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out),
                       "--results-json", str(results_json)]) == 0
    runs = bench.load_runs(str(results_json))  # the runs merged, each holding the rows it contributed last
    assert [(r["meta"]["command"], [s["name"] for s in r["shapes"]]) for r in runs] == [
        ("ordered-ssd bench --grid", ["S2"]), ("ordered-ssd bench --shapes S1,S2", ["S1", "G1"])]  # X1: no rows
    assert runs[0]["shapes"][0]["dims"] == "replaced" and runs[0]["meta"]["run_id"] != runs[1]["meta"]["run_id"]
    (tmp_path / "bad.json").write_text("{}")
    assert bench.main(["--merge", str(tmp_path / "bad.json"), "--out", str(out)]) == 2


def test_merge_of_a_merge_names_each_run_its_shapes_and_a_different_pinned_table(tmp_path, capsys):
    """A merged file contributes its own runs; each run lists only the shapes it still contributes after later
    files replaced some; runs with different pinned fingerprints are flagged and each one's is printed."""
    a, b, c = _synthetic(), _synthetic(), _synthetic()
    b["shapes"] = [dict(b["shapes"][2], dims="from b")]  # G1
    c["shapes"] = [dict(c["shapes"][1], dims="from c")]  # S2
    for run, cmd, fp in ((a, "bench a", "table=aaa"), (b, "bench b", "table=aaa"), (c, "bench c", "table=ccc")):
        run["meta"]["command"], run["meta"]["pinned_configs"] = cmd, fp
    for name, run in (("a", a), ("b", b), ("c", c)):
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    ab = tmp_path / "ab"
    assert bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(ab)]) == 0
    m = json.loads((ab / "bench.json").read_text())
    assert [(src["command"], src["shapes"]) for src in m["meta"]["sources"]] == [("bench a", ["S1", "S2"]),
                                                                                 ("bench b", ["G1"])]
    assert "sources_differ_in" not in m["meta"]
    capsys.readouterr()
    abc = tmp_path / "abc"
    assert bench.main(["--merge", str(ab / "bench.json"), str(tmp_path / "c.json"), "--out", str(abc),
                       "--results-json", str(tmp_path / "results.json")]) == 0
    m = json.loads((abc / "bench.json").read_text())
    assert [s["dims"] for s in m["shapes"]][1:] == ["from c", "from b"]
    assert [(src["command"], src["shapes"], src["pinned_configs"]) for src in m["meta"]["sources"]] == [
        ("bench a", ["S1"], "table=aaa"), ("bench b", ["G1"], "table=aaa"), ("bench c", ["S2"], "table=ccc")]
    assert m["meta"]["sources_differ_in"] == ["pinned_configs"]
    printed = capsys.readouterr().out
    assert "- S1: `bench a`" in printed and "- S2: `bench c`" in printed and "pinned `table=ccc`" in printed
    assert "**the runs differ in pinned_configs**" in printed
    section = bench.render(str(tmp_path / "results.json"))
    assert "the merged runs differ" in section and "Pinned table fingerprint: `table=aaa`" not in section


def _run(i, shapes=("S1", "S2", "G1")):
    """A synthetic run ``run{i}`` (commit ``abc{i}``, date 2026-01-0{i+1}) measuring ``shapes``; the others of S1,
    S2, G1 skipped by the time budget, as the suite writes them."""
    r = _synthetic()
    r["meta"].update(run_id=f"run{i}", commit=f"abc{i}", date=f"2026-01-0{i + 1} 00:00 UTC",
                     pinned_configs="csrc_bindings/abi1 table=ff", command=f"ordered-ssd bench run{i}")
    r["precompile"]["failed"] = 1
    for sr in r["shapes"]:
        if sr["name"] not in shapes:
            sr["rows"] = {m: {"mode": m, "error": "skipped: time budget"} for m in sr["rows"]}
    r["shapes"][0]["rows"]["ordered"]["digests"] = {"in_proj.weight": "00"}
    r["shapes"][0]["rows"]["ordered"]["grads_sha256"] = "ab" * 32
    return r


def _names(runs):
    return [(r["meta"]["run_id"], [s["name"] for s in r["shapes"]]) for r in runs]


def test_results_file_keeps_the_current_row_of_each_shape_and_renders(tmp_path, capsys):
    """--results-json: a run replaces the rows of the shapes it measured (skipped rows replace nothing) and goes
    first; every other shape keeps its row and its run's provenance; a run left without shapes is dropped; writing
    the same run again replaces its entry (the suite rewrites it after every shape); per-parameter digests are left
    out; --render prints the current table (each run named with its shapes), --render-run I one run's rows."""
    path = str(tmp_path / "results" / "bench_h200.json")
    run1 = _run(1, shapes=("S1",))
    assert _names(bench.merge_run(path, _run(0))) == [("run0", ["S1", "S2", "G1"])]
    assert _names(bench.merge_run(path, run1)) == [("run1", ["S1"]), ("run0", ["S2", "G1"])]
    run1 = _run(1, shapes=("S1", "S2"))  # the same run, rewritten after another shape
    run1["shapes"][1]["rows"]["native"]["ms"] = 9.0
    assert _names(bench.merge_run(path, run1)) == [("run1", ["S1", "S2"]), ("run0", ["G1"])]
    run2 = _run(2, shapes=("G1",))
    written = bench.merge_run(path, run2)
    assert _names(written) == [("run2", ["G1"]), ("run1", ["S1", "S2"])]  # run0 holds no row: gone
    data = json.loads(open(path).read())
    assert data["format"] == "ordered-ssd bench results v2" and data["runs"] == written
    assert bench.load_runs(path) == written
    meta = written[1]["meta"]
    assert (meta["commit"], meta["date"], meta["pinned_configs"], meta["precompile_wall_s"],
            meta["precompile_failed"]) == ("abc1", "2026-01-02 00:00 UTC", "csrc_bindings/abi1 table=ff", 61.25, 1)
    assert written[1]["shapes"][1]["rows"]["native"]["ms"] == 9.0
    ordered = written[1]["shapes"][0]["rows"]["ordered"]
    assert "digests" not in ordered and ordered["grads_sha256"] == "ab" * 32
    assert "digests" in run1["shapes"][0]["rows"]["ordered"]  # the caller's results are not changed
    md = bench.render(path)
    assert md.startswith("### NVIDIA H200, 2026-01-03 00:00 UTC (commit abc2)\n\nPinned table fingerprint: "
                         "`csrc_bindings/abi1 table=ff`.\n\nNVIDIA H200 (sm_90) · torch 2.11.0")
    assert "# ordered-ssd bench" not in md and "| S1 | B2 L2048 d1024 N128 G1 P64 cs256 bf16 | ordered |" in md
    assert "- S1, S2: `ordered-ssd bench run1` (abc1, 2026-01-02 00:00 UTC; precompile 61.25 s, 1 failed)" in md
    assert "- G1: `ordered-ssd bench run2` (abc2, 2026-01-03 00:00 UTC;" in md
    assert md.index("| S1 |") < md.index("| S2 |") < md.index("| G1 |") and "skipped" not in md
    one = bench.render(path, 1)
    assert one.startswith("### NVIDIA H200, 2026-01-02 00:00 UTC (commit abc1)") and "| G1 |" not in one
    assert bench.main(["--render", path, "--render-run", "0"]) == 0
    assert capsys.readouterr().out.startswith("### NVIDIA H200, 2026-01-03 00:00 UTC (commit abc2)")
    assert bench.main(["--render", path]) == 0 and capsys.readouterr().out == md
    assert bench.main(["--render", path, "--render-run", "2"]) == 2
    assert "--render-run: " in capsys.readouterr().err
    run1 = _run(1, shapes=("S2",))  # the same run merged again without S1 measured (e.g. a later --merge file
    run1["meta"]["elapsed_s"] = 99.0  # skipped it): its S1 row stays, its provenance is the newer write's
    assert _names(bench.merge_run(path, run1)) == [("run1", ["S1", "S2"]), ("run2", ["G1"])]
    assert bench.load_runs(path)[0]["meta"]["elapsed_s"] == 99.0
    with pytest.raises(bench.BenchError, match="run_id"):
        bench.merge_run(path, {"meta": {}})


def test_results_file_is_bounded(tmp_path):
    """One row per shape whatever is merged: the same run merged twice, or new runs of the same shapes, leave the
    file as large as one run (the history is in git, not in the file)."""
    path = tmp_path / "bench_h200.json"
    bench.merge_run(str(path), _run(0))
    size = path.stat().st_size
    before = path.read_bytes()
    bench.merge_run(str(path), _run(0))
    assert path.read_bytes() == before  # the same run twice: the same file
    for i in range(1, 8):
        runs = bench.merge_run(str(path), _run(i))
        names = [s["name"] for r in runs for s in r["shapes"]]
        assert sorted(names) == ["G1", "S1", "S2"] and len(runs) == 1
        assert path.stat().st_size == size  # run ids and commits of the same length: not a byte more
    # runs of some shapes: still one row per shape, and at most one run's provenance more per shape
    meta = (len(json.dumps({"runs": [{"meta": runs[0]["meta"]}]}, indent=1, sort_keys=True))
            - len(json.dumps({"runs": [{}]}, indent=1)))  # one run's provenance, as nested in the file
    for i, shapes in enumerate((("S1",), ("S2",), ("G1",), ("S1", "G1")), 8):
        runs = bench.merge_run(str(path), _run(i, shapes))
        assert sorted(s["name"] for r in runs for s in r["shapes"]) == ["G1", "S1", "S2"]
        assert len(runs) <= 3 and path.stat().st_size <= size + (len(runs) - 1) * (meta + 64)
    assert _names(runs) == [("run11", ["S1", "G1"]), ("run9", ["S2"])]


def test_results_file_of_the_older_format_and_errors(tmp_path):
    """A v1 file (every run whole, newest first; a --merge run naming its sources) reads as the newest measured row
    of every shape, each with its own run's (or source's) provenance, and the next merge rewrites it as v2; a file
    of another format is an error naming the file and the formats."""
    from ordered_ssd.apps.bench.report import merge_results
    run0, run1 = _run(0, shapes=("S1",)), _run(1, shapes=("S2",))
    run0["meta"]["tree"] = "a" * 40
    run1["shapes"] = [run1["shapes"][1]]  # a run of S2 alone
    (tmp_path / "r0.json").write_text(json.dumps(run0))
    (tmp_path / "r1.json").write_text(json.dumps(run1))
    merged = merge_results([str(tmp_path / "r0.json"), str(tmp_path / "r1.json")])
    merged["meta"]["run_id"] = "merge"
    skipped = _run(3, shapes=())  # the newest run of the file: skipped everything, replaces nothing
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "ordered-ssd bench results v1",
                                "runs": [skipped, merged, _run(2, shapes=("S1", "G1"))]}))
    runs = bench.load_runs(str(path))
    # the merge's G1 is r0's, which skipped it: G1's newest measured row is the oldest run's
    assert [(r["meta"]["commit"], [s["name"] for s in r["shapes"]]) for r in runs] == [
        ("abc1", ["S2"]), ("abc0", ["S1"]), ("abc2", ["G1"])]
    assert runs[1]["meta"]["tree"] == "a" * 40 and runs[1]["meta"]["settings"]["repeats"] == 20  # the merge's
    assert runs[0]["meta"]["command"] == "ordered-ssd bench run1" and runs[2]["meta"]["run_id"] == "run2"
    assert len({r["meta"]["run_id"] for r in runs}) == 3
    bench.merge_run(str(path), _run(4, shapes=("G1",)))
    data = json.loads(path.read_text())
    assert data["format"] == "ordered-ssd bench results v2"
    assert _names(data["runs"])[0] == ("run4", ["G1"]) and [r["meta"]["commit"] for r in data["runs"]] == [
        "abc4", "abc1", "abc0"]
    for content, found in (({"runs": []}, "no format"), ({"format": "ordered-ssd bench results v9", "runs": []},
                                                         "format 'ordered-ssd bench results v9'")):
        (tmp_path / "other.json").write_text(json.dumps(content))
        with pytest.raises(bench.BenchError, match=f"--results-json: .*other.json is not a bench results file "
                                                   f"\\({found}; expected .*results v2"):
            bench.merge_run(str(tmp_path / "other.json"), _run(0))
    (tmp_path / "bad.json").write_text(json.dumps({"format": "ordered-ssd bench results v2", "runs": [{}]}))
    with pytest.raises(bench.BenchError, match="bad.json: every run"):
        bench.load_runs(str(tmp_path / "bad.json"))


def test_render_judges_an_older_run_by_the_current_rules(tmp_path):
    """A stored run whose det verdict came from the direct ratio (the rule before 2026-12-01) is shown with the
    verdict of the current rules (here the paired ratio), and the stored file is not changed."""
    path = str(tmp_path / "bench_h200.json")
    run = _synthetic()
    run["meta"]["run_id"] = "old"
    rows = run["shapes"][0]["rows"]
    ordered = rows["ordered"]
    ordered["ms"] = 16.0  # 16 / 15: the direct ratio misses; paired (16 / 10) / (15 / 5) = 0.533 meets
    rows["upstream-det"]["child_native"]["ms"] = 5.0
    bench.finalize_ratios(run["shapes"][0])
    ordered["targets"] = {"time": False, "memory": True, "upstream_det": False, "met": False}  # the old rule's
    bench.merge_run(path, run)
    before = open(path).read()
    md = bench.render(path)
    assert "| 1.067 (paired 0.533) |" in md and "time **✗** · mem ✓ · det ✓ (paired) |" in md
    assert open(path).read() == before


def test_merge_edge_cases_owner_stale_flag_header_and_no_paths(tmp_path):
    """An older merge file whose runs all list a shape: the shape belongs to its last run; a differing-fingerprint
    flag of an input merge is recomputed (gone once the differing run contributes nothing); the merged meta's date,
    commit, tree and fingerprint are the newest contributing run's; a file without shapes contributes no run; no
    paths is a ValueError naming the argument."""
    from ordered_ssd.apps.bench.report import merge_results
    a = _synthetic()
    a["meta"].update(command="bench a+b", commit="aaa", date="2026-01-01", pinned_configs="table=old")
    a["meta"]["sources"] = [  # an older-format merge: each run lists every shape it had, no fingerprint
        {"path": "/x/a", "command": "bench a", "commit": "aaa", "date": "2026-01-01", "shapes": ["S1", "S2", "G1"]},
        {"path": "/x/b", "command": "bench b", "commit": "bbb", "date": "2026-01-02", "shapes": ["S2"]}]
    a["meta"]["sources_differ_in"] = ["pinned_configs"]
    c = _synthetic()
    c["shapes"] = [c["shapes"][0], c["shapes"][1], c["shapes"][2]]
    c["meta"].update(command="bench c", commit="ccc", tree="f" * 40, date="2026-01-03", pinned_configs="table=new")
    empty = _synthetic()
    empty["shapes"] = []
    for name, run in (("a", a), ("c", c), ("empty", empty)):
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    m = merge_results([str(tmp_path / "a.json")])
    assert [(s["command"], s["shapes"]) for s in m["meta"]["sources"]] == [("bench a", ["S1", "G1"]),
                                                                           ("bench b", ["S2"])]
    assert "sources_differ_in" not in m["meta"]  # both runs carry the file's fingerprint
    assert m["meta"]["commit"] == "bbb" and m["meta"]["date"] == "2026-01-02"
    m = merge_results([str(tmp_path / p) for p in ("a.json", "c.json", "empty.json")])
    assert [s["command"] for s in m["meta"]["sources"]] == ["bench c"] and "sources_differ_in" not in m["meta"]
    assert (m["meta"]["commit"], m["meta"]["tree"], m["meta"]["pinned_configs"]) == ("ccc", "f" * 40, "table=new")
    with pytest.raises(ValueError, match="paths: expected at least one"):
        merge_results([])



def test_merge_keeps_a_measured_shape_that_a_later_file_skipped(tmp_path):
    """--merge: a later file's skipped row of a shape does not replace an earlier measured one (the shape keeps its
    row and its run's provenance); a later measured row replaces an earlier one, measured or skipped; of two skipped
    rows the later is kept."""
    from ordered_ssd.apps.bench.report import measured, merge_results
    runs = {0: _run(0, shapes=("S1", "S2")),  # G1 skipped
            1: _run(1, shapes=("S2", "G1")),  # S1 skipped
            2: _run(2, shapes=())}            # everything skipped
    for i, run in runs.items():
        for shape_result in run["shapes"]:
            if measured(shape_result):
                shape_result["rows"]["native"]["ms"] = 100.0 * (i + 1)  # which run a merged row comes from
        (tmp_path / f"r{i}.json").write_text(json.dumps(run))

    def merge(*order):
        m = merge_results([str(tmp_path / f"r{i}.json") for i in order])
        rows = {s["name"]: s["rows"]["native"].get("ms") for s in m["shapes"]}
        return rows, [(s["command"][-4:], s["shapes"]) for s in m["meta"]["sources"]], m["meta"]["commit"]

    # S1: r0's measurement survives r1's and r2's skips; S2: r1's replaces r0's; G1: r1's replaces r0's skip
    assert merge(0, 1, 2) == ({"S1": 100.0, "S2": 200.0, "G1": 200.0},
                              [("run0", ["S1"]), ("run1", ["S2", "G1"])], "abc1")
    # S1: skipped by r2 and r1 (the later, r1's), then measured by r0; S2: r0's replaces r1's; G1: r0 skipped it
    assert merge(2, 1, 0) == ({"S1": 100.0, "S2": 100.0, "G1": 200.0},
                              [("run1", ["G1"]), ("run0", ["S1", "S2"])], "abc0")
    # S1 skipped in both files: the later file's skipped row
    rows, sources, commit = merge(2, 1)
    assert rows == {"S1": None, "S2": 200.0, "G1": 200.0} and sources == [("run1", ["S1", "S2", "G1"])]
