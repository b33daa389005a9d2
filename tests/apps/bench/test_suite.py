"""The suite on the CPU (:mod:`ordered_ssd.apps.bench.suite`): usage errors, a tiny smoke run of the harness
(reference path; no timing assertions), the time budget."""
import json

import pytest
import torch

from ordered_ssd.apps import bench

TINY = "2,64,32,16,1,16,32"
SMOKE = ["--device", "cpu", "--shape", TINY, "--repeats", "3", "--warmup", "1", "--bit-repeats", "2", "--quiet"]
PNG = b"\x89PNG\r\n\x1a\n"


def test_usage_errors_exit_2(tmp_path, capsys):
    assert bench.main(["--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "give a small --shape" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert bench.main([*SMOKE, "--out", str(blocker / "sub")]) == 2
    assert "--out" in capsys.readouterr().err
    assert bench.main([*SMOKE, "--breakdown", "--breakdown-shape", "1,2", "--out", str(tmp_path)]) == 2
    assert "--breakdown-shape" in capsys.readouterr().err


def test_cpu_smoke_run(tmp_path, capsys):
    out = tmp_path / "out"
    rc = bench.main([*SMOKE, "--modes", "ordered,literal", "--out", str(out), "--breakdown", "--breakdown-shape",
                     TINY, "--breakdown-steps", "1"])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "| X1 | B2 L64 d32 N16 G1 P16 cs32 fp32 | ordered |" in stdout and "yes (2/2)" in stdout
    res = json.loads((out / "bench.json").read_text())
    assert res["meta"]["settings"] == {"repeats": 3, "warmup": 1, "bit_repeats": 2, "seed": 0, "host_steps": 5,
                                       "launch_steps": 2}
    assert "precompile" not in res  # off on the CPU unless asked for
    (sr,) = res["shapes"]
    assert sr["spec"] == "2,64,32,16,1,16,32" and set(sr["rows"]) == {"ordered", "literal"}
    assert sr["dtype"] == "fp32" and sr["settings"] == res["meta"]["settings"]
    for m in ("ordered", "literal"):
        r = sr["rows"][m]
        assert r.get("error") is None and r["n"] == 3 and len(r["ms_all"]) == 3 and r["ms"] > 0
        assert r["bitwise"] is True and r["bit_repeats"] == 2
        assert r["host_steps"] == 5 and len(r["host_ms_all"]) == 5 and r["host_ms"] > 0 and r["enqueue_ms"] > 0
        assert r["launches"] is None and r["launch_steps"] == 2  # the CPU launches no GPU work
        assert set(r["digests"]) == {n for n, _ in bench.LayerRunner(
            bench.parse_shape(TINY), ["ordered"], torch.device("cpu"), 0).params} | {"input"}
    assert sr["rows"]["literal"]["same_bits_as_ordered"] is True
    assert (out / "bench.png").read_bytes()[:8] == PNG
    assert (out / "bench.md").read_text().startswith("# ordered-ssd bench")
    bd = json.loads((out / "breakdown.json").read_text())
    assert bd["modes"]["ordered"]["error"] is None and bd["modes"]["ordered"]["kernels"]
    assert (out / "breakdown.md").read_text().startswith("# Per-kernel breakdown")


def test_time_budget_marks_skipped_work(tmp_path, capsys):
    rc = bench.main([*SMOKE, "--time-budget", "1e-9", "--out", str(tmp_path)])
    assert rc == 1
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["shapes"][0]["rows"]["ordered"]["error"] == "skipped: time budget"
    assert "error¹" in capsys.readouterr().out


def test_precompile_phase_on_the_cpu(tmp_path):
    """--precompile-jobs on the CPU (reference path; a smoke test of the plumbing): one worker process per shape
    ran its untimed steps before the timing, the first shape of each kernel key first; its result and log are
    recorded, and the measured rows are unaffected."""
    second = "1,64,32,16,1,16,32"  # the same kernel key as TINY: after the first shape of the fp16 key
    out = tmp_path / "out"
    rc = bench.main([*SMOKE, "--shape", second, "--shape", TINY + ",fp16", "--precompile-jobs", "2",
                     "--launch-steps", "0", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "bench.json").read_text())
    pre = res["precompile"]
    assert pre["jobs"] == 2 and pre["failed"] == 0 and pre["excluded_from_measurements"] is True
    assert [(t["name"], t["shapes"]) for t in pre["tasks"]] == [("plain-X1", ["X1"]), ("plain-X3", ["X3"]),
                                                              ("plain-X2", ["X2"])]
    for t in pre["tasks"]:
        assert t["returncode"] == 0 and t["error"] is None and t["wall_s"] > 0
        assert [(s["name"], sorted(s["modes"])) for s in t["steps"]] == [(n, ["ordered"]) for n in t["shapes"]]
        assert all(r["error"] is None and r["s"] >= 0 for s in t["steps"] for r in s["modes"].values())
        assert (out / "precompile" / f"{t['name']}.log").exists()
    assert [sorted(sr["rows"]) for sr in res["shapes"]] == [["ordered"]] * 3
    assert all(r.get("error") is None and r["bitwise"] for sr in res["shapes"] for r in sr["rows"].values())
    assert "launches" not in res["shapes"][0]["rows"]["ordered"]  # --launch-steps 0 skips the phase


def test_time_budget_keeps_a_share_for_the_upstream_det_child(tmp_path, monkeypatch):
    """With --time-budget and upstream-det, this process starts no shape after 65 % of the budget, and the child
    gets only the shapes this process measured (stand-ins for the measurement, the child and the clock: no
    timing)."""
    from ordered_ssd.apps.bench import suite

    clock = [0.0]
    sent = []

    class Clock:
        @staticmethod
        def monotonic():
            return clock[0]

    def fake_bench_shape(shape, modes, settings, device, log):
        clock[0] += 40.0
        return {"rows": {m: {"mode": m, "ms": 1.0, "peak_mib": None, "bitwise": True,
                             "digests": {"w": "d0" if shape.name == "X1" else "d1"}} for m in modes},
                "settings": settings}

    def fake_run_child(kind, shapes, settings, device, extra_modes, deadline, log):
        sent.append((kind, [s.name for s in shapes], tuple(extra_modes), deadline))
        ordered = {"mode": "ordered", "ms": 1.5, "ratio_ms_paired": 0.75, "host_ms": 1.0, "bitwise": True,
                   "digests": {"w": "d0"}}
        return {"returncode": 0, "meta": {"deterministic_mode": True}, "error": None, "wall_s": 1.0,
                "shapes": {s.name: {"rows": {"native": {"mode": "native", "ms": 2.0},
                                             **({"ordered": ordered} if extra_modes else {})}} for s in shapes}}

    monkeypatch.setattr(suite, "time", Clock)
    monkeypatch.setattr(suite, "missing_requirements", lambda device, modes, **kw: None)
    monkeypatch.setattr(suite, "bench_shape", fake_bench_shape)
    monkeypatch.setattr(suite, "run_child", fake_run_child)
    rc = bench.main([*SMOKE, "--shape", "1,64,32,16,1", "--shape", "3,64,32,16,1", "--modes", "ordered,upstream-det",
                     "--no-native-child", "--time-budget", "100", "--out", str(tmp_path)])
    assert rc == 1  # X3 skipped
    # X2 started at 40 s < 65 s (35 % kept for the children), X3 at 80 s did not; the child runs ordered beside
    # upstream-det
    assert sent == [("upstream-det", ["X1", "X2"], ("ordered",), 100.0)]
    res = json.loads((tmp_path / "bench.json").read_text())
    rows = {sr["name"]: sr["rows"] for sr in res["shapes"]}
    assert rows["X3"] == {"ordered": {"mode": "ordered", "error": "skipped: time budget"},
                          "upstream-det": {"mode": "upstream-det", "error": "skipped: time budget"}}
    assert rows["X1"]["upstream-det"]["ms"] == 2.0 and rows["X1"]["ordered"]["ratio_ms_det"] == 0.5
    # ordered in the upstream-det process: its ratio to upstream-det there decides the target; its bits compared
    assert rows["X1"]["ordered"]["in_det_process"] == {"ms": 1.5, "ratio_per_round": 0.75, "host_ms": 1.0,
                                                       "bitwise": True, "same_bits": True}
    assert rows["X2"]["ordered"]["in_det_process"]["same_bits"] is False  # d1 here, d0 in the child
    assert rows["X1"]["ordered"]["ratio_ms_det_same_process"] == 0.75  # 1.5 / 2.0, the medians in the child
    assert rows["X1"]["ordered"]["targets"]["upstream_det_ratio"] == "ratio_ms_det_same_process"
    assert rows["X2"]["ordered"]["launches_error"] == "skipped: time budget"  # the launch phase came after 75 s


def test_both_children_run_ordered_beside_their_native_layer(tmp_path, monkeypatch):
    """The upstream-det child and the fresh native child each time ordered interleaved with their native layer (so
    that upstream-det / native (child) compares two children that did the same); the fresh native's row becomes
    upstream-det's ``child_native``; without ordered in the run neither child runs it."""
    from ordered_ssd.apps.bench import suite

    sent = []

    def fake_bench_shape(shape, modes, settings, device, log):
        return {"rows": {m: {"mode": m, "ms": 1.0, "peak_mib": None, "bitwise": True} for m in modes},
                "settings": settings}

    def fake_run_child(kind, shapes, settings, device, extra_modes, deadline, log):
        sent.append((kind, tuple(extra_modes)))
        ms = 2.0 if kind == "upstream-det" else 4.0
        return {"returncode": 0, "meta": {"deterministic_mode": kind == "upstream-det"}, "error": None,
                "wall_s": 1.0, "shapes": {s.name: {"rows": {"native": {"mode": "native", "ms": ms},
                                                            "ordered": {"mode": "ordered", "ms": 1.0}}}
                                          for s in shapes}}

    monkeypatch.setattr(suite, "missing_requirements", lambda device, modes, **kw: None)
    monkeypatch.setattr(suite, "bench_shape", fake_bench_shape)
    monkeypatch.setattr(suite, "run_child", fake_run_child)
    bench.main([*SMOKE, "--shape", "1,64,32,16,1", "--modes", "ordered,upstream-det", "--out", str(tmp_path)])
    assert sent == [("upstream-det", ("ordered",)), ("native", ("ordered",))]
    rows = json.loads((tmp_path / "bench.json").read_text())["shapes"][0]["rows"]
    assert rows["upstream-det"]["child_native"]["ms"] == 4.0 and rows["upstream-det"]["ratio_ms_child"] == 0.5
    assert rows["ordered"]["in_det_process"]["ms"] == 1.0 and rows["ordered"]["ratio_ms_det_same_process"] == 0.5
    sent.clear()
    bench.main([*SMOKE, "--shape", "1,64,32,16,1", "--modes", "native,upstream-det", "--out", str(tmp_path / "n")])
    assert sent == [("upstream-det", ()), ("native", ())]


def test_precompile_gets_its_own_share_of_the_budget(tmp_path, monkeypatch):
    """The precompile phase is stopped at 40 % of --time-budget (not at the 75 % of the in-process share), so a slow
    one still leaves the timed shapes time; the upstream-det row carries no paired ratio from inside the child."""
    from ordered_ssd.apps.bench import suite

    got = {}

    def fake_precompile(shapes, modes, device, jobs, seed, log_dir, deadline=None, log=None):
        got["deadline"] = deadline
        return {"jobs": jobs, "tasks": [], "failed": 0, "wall_s": 0.0}

    def fake_bench_shape(shape, modes, settings, device, log):
        return {"rows": {m: {"mode": m, "ms": 1.0, "peak_mib": None, "bitwise": True} for m in modes},
                "settings": settings}

    def fake_run_child(kind, shapes, settings, device, extra_modes, deadline, log):
        return {"returncode": 0, "meta": {"deterministic_mode": True}, "error": None, "wall_s": 1.0,
                "shapes": {s.name: {"rows": {"native": {"mode": "native", "ms": 2.0, "ratio_ms_paired": 1.0}}}
                           for s in shapes}}

    class Clock:
        @staticmethod
        def monotonic():
            return 0.0

    monkeypatch.setattr(suite, "time", Clock)
    monkeypatch.setattr(suite, "missing_requirements", lambda device, modes, **kw: None)
    monkeypatch.setattr(suite, "run_precompile", fake_precompile)
    monkeypatch.setattr(suite, "bench_shape", fake_bench_shape)
    monkeypatch.setattr(suite, "run_child", fake_run_child)
    bench.main([*SMOKE, "--shape", "1,64,32,16,1", "--modes", "ordered,upstream-det", "--no-native-child",
                "--time-budget", "100", "--precompile-jobs", "2", "--out", str(tmp_path)])
    assert got["deadline"] == suite.PRECOMPILE_SHARE * 100 == 40.0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert "ratio_ms_paired" not in res["shapes"][0]["rows"]["upstream-det"]


def test_tree_is_the_tree_a_commit_of_the_checkout_would_have(tmp_path):
    """``meta.tree``: a dirty checkout's tree id equals that of the commit made from it afterwards (so a run marked
    ``+dirty`` can be matched to a commit), a clean one's is HEAD's tree; the real index and files are untouched."""
    import shutil
    import subprocess

    from ordered_ssd.apps.bench import suite

    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*a):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *a],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "b.txt").write_text("two\n")
    git("add", "a.txt", "b.txt")
    git("commit", "-qm", "first")
    assert suite._tree(str(tmp_path)) == git("rev-parse", "HEAD^{tree}")
    (tmp_path / "a.txt").write_text("changed\n")
    (tmp_path / "b.txt").unlink()
    (tmp_path / "untracked.txt").write_text("not part of a commit\n")
    status_before = git("status", "--porcelain")
    tree = suite._tree(str(tmp_path))
    assert git("status", "--porcelain") == status_before  # the index was not touched
    assert tree != git("rev-parse", "HEAD^{tree}")
    git("commit", "-qam", "second")
    assert tree == git("rev-parse", "HEAD^{tree}")
    assert suite._tree(str(tmp_path / "no-such-dir")) is None


def test_pinned_records_each_kernels_configuration_source_and_speed(monkeypatch):
    """``bench.json``'s per-shape ``pinned``: describe_launch's config and source per kernel, and ``speed`` only
    where the bit-neutral parameters were chosen for speed (e.g. ``native-autotune-v1``); None off CUDA."""
    import csrc_bindings

    from ordered_ssd.apps.bench import suite
    from ordered_ssd.apps.bench.shapes import named_or_parsed_shape
    seen = {}

    def describe(**kw):
        seen.update(kw)
        return {"kernels": {"chunk_scan_fwd": {"config": {"BLOCK_SIZE_M": 64}, "source": "table",
                                               "speed": "native-autotune-v1"},
                            "chunk_state_bwd_db": {"config": {"BLOCK_SIZE_M": 32}, "source": "rule"}}}
    monkeypatch.setattr(csrc_bindings, "describe_launch", describe)
    shape = named_or_parsed_shape("G11")
    got = suite._pinned(shape, torch.device("cuda"))
    assert got == {"chunk_scan_fwd": {"config": {"BLOCK_SIZE_M": 64}, "source": "table", "speed": "native-autotune-v1"},
                   "chunk_state_bwd_db": {"config": {"BLOCK_SIZE_M": 32}, "source": "rule"}}
    assert (seen["chunk_size"], seen["headdim"], seen["dstate"], seen["ngroups"]) == (64, 128, 64, 8)
    assert seen["dtype"] == torch.float16
    assert suite._pinned(shape, torch.device("cpu")) is None


def test_fold_variants_lists_the_timed_choices_of_the_shape(monkeypatch):
    """``bench.json``'s per-shape ``fold_variants``: rule gemm-timed-v2's choices for the shape's two projections
    (batch, length, dtype and [M, N] the shape's), sorted by (M, N); others left out, among them another shape's
    projections at the same batch, length and dtype (S5 and G1: bf16, B64, L512)."""
    from ordered_ssd.apps.bench import suite
    from ordered_ssd.apps.bench.shapes import named_or_parsed_shape
    from ordered_ssd.fold import gemm

    shape = named_or_parsed_shape("S5")  # B64 L512 d768 N64 G1 P64 bf16: in_proj [3224, 768], out_proj [768, 1536]
    cfg = (128, 128, 64, 8, 8, 4)
    s = ((1, 1, 1), (1, 1, 1), False)
    monkeypatch.setattr(gemm, "_gemm_timed", {
        (0, torch.bfloat16, 64, 512, 3224, 768, *s): ("partials", cfg),
        (0, torch.bfloat16, 64, 512, 768, 1536, *s): ("nest", cfg),
        (0, torch.float16, 64, 512, 768, 1536, *s): ("chain", cfg),  # another dtype
        (0, torch.bfloat16, 32, 512, 768, 1536, *s): ("nest", cfg),  # another batch
        (0, torch.bfloat16, 64, 512, 1072, 256, *s): ("nest", cfg),  # G1's in_proj
    })
    assert suite._fold_variants(shape) == [
        {"M": 768, "N": 1536, "variant": "nest", "config": list(cfg)},
        {"M": 3224, "N": 768, "variant": "partials", "config": list(cfg)}]
    assert suite._fold_variants(named_or_parsed_shape("G1")) == [
        {"M": 1072, "N": 256, "variant": "nest", "config": list(cfg)}]
    monkeypatch.setattr(gemm, "_gemm_timed", {})
    assert suite._fold_variants(shape) == []


def test_pinned_fingerprint_of_a_mamba3_run_names_its_kernels_table():
    import csrc_bindings

    from ordered_ssd.apps.bench.suite import pinned_fingerprint
    from ordered_ssd.ops.mamba3_siso import mamba3_fingerprint

    assert pinned_fingerprint("mamba2") == csrc_bindings.fingerprint()
    assert pinned_fingerprint("mamba3") == f"{csrc_bindings.fingerprint()} mamba3={mamba3_fingerprint()}"
    assert mamba3_fingerprint().startswith("mamba3-v1 kernels=")
