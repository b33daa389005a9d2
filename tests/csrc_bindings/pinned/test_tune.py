"""The tuner of the pinned table (csrc_bindings/pinned/tune.py) on the CPU: its job list, its plumbing (fake kernels
and events) and the table it writes."""
import pytest
import torch

from csrc_bindings.pinned import tune as tuner


def test_tuner_lists_its_jobs_and_problem_sizes_without_a_gpu():
    """python -m csrc_bindings.pinned.tune --list-jobs: the (kernel, key, dtype) jobs of a layer shape and the
    sizes of the timed problems, no GPU needed; bad sizes are usage errors (exit 2) naming the option."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "csrc_bindings.pinned.tune", "--list-jobs", "--shapes", "256x64x64", "--nheads", "24", "--dtypes", "bfloat16",
           "--batch", "64", "--seqlen-chunks", "2", "--problem-nheads", "24"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tuner.PACKAGE_PARENT)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "problem: batch 64, seqlen 2 * chunk_size, nheads 24 (unless keyed), ngroups 1"
    jobs = [ln.split(" ", 1)[0] for ln in lines[:-1]]
    assert len(jobs) == len(set(jobs)) == 14  # one job per autotuned bf16 kernel (13 of training + chunk_state_varlen)
    assert "chunk_cumsum_fwd" in jobs and "chunk_scan_chunk_state_bwd_dx" in jobs
    keys = {ln.split(" ", 1)[0]: json.loads(ln.split(" ", 1)[1].rsplit(" ", 1)[0]) for ln in lines[:-1]}
    assert keys["chunk_state_fwd"] == {"chunk_size": 256, "dstate": 64, "hdim": 64}
    assert keys["chunk_cumsum_fwd"] == {"chunk_size": 256, "nheads": 24}
    res = subprocess.run(cmd + ["--kernels", "chunk_state_fwd, chunk_cumsum_bwd"], capture_output=True, text=True,
                         timeout=120, cwd=tuner.PACKAGE_PARENT)
    assert [ln.split(" ", 1)[0] for ln in res.stdout.strip().splitlines()[:-1]] == ["chunk_cumsum_bwd",
                                                                                  "chunk_state_fwd"]
    for bad, needle in ((["--batch", "0"], "--batch"), (["--ngroups", "5"], "multiple of --ngroups"),
                        (["--kernels", "chunk_state_fwd,no_such_kernel"], "got ['no_such_kernel']"),
                        (["--keep-within", "0.5"], "--keep-within: expected a ratio >= 1.0, got 0.5"),
                        (["--keep-within", "nan"], "--keep-within: expected a ratio >= 1.0, got nan"),
                        (["--keep-within", "1.1", "--speed"], "--keep-within: applies to a search of the pinned"),
                        (["--keep-within", "1.1", "--merge-from", "x.py"], "not to --speed or --merge-from")):
        res = subprocess.run(cmd[:3] + ["--list-jobs", *bad], capture_output=True, text=True, timeout=120,
                             cwd=tuner.PACKAGE_PARENT)
        assert res.returncode == 2 and needle in res.stderr, res.stderr


def test_tuner_plumbing_passes_the_problem_sizes_to_workers_and_timing(tmp_path, monkeypatch):
    """Phase 1 (compile workers, run here in-process through a fake ``Popen``) and phase 2 (timing) of the tuner
    build every problem with the requested sizes and time every valid candidate (fake kernels and events on the
    CPU: the GPU path itself runs on the GPU machine)."""
    import argparse

    import csrc_bindings._configs as cfgs
    import csrc_bindings._examples as ex
    import csrc_bindings._registry as reg

    built, ran, spawned = [], [], []

    def fake_problem(kernel, key, dtype, device, *, batch, seqlen_chunks, nheads, ngroups, on_device):
        assert on_device  # values made on the GPU (seconds faster at large sizes)
        built.append((kernel, batch, seqlen_chunks, nheads, ngroups))
        return {"x": torch.ones(3)}

    def fake_run(kernel, p, config=None):
        ran.append((kernel, config["num_warps"]))
        return (p["x"] * config["num_warps"],)

    class FakePopen:  # runs the worker in this process, from the command line phase 1 built
        def __init__(self, cmd, cwd=None):
            assert cmd[1:4] == ["-m", "csrc_bindings.pinned.tune", "--worker-compile"]
            spawned.append(cmd)
            tuner.worker_compile(cmd[4], cmd[5], float(cmd[6]))

        def wait(self):
            return 0

    class FakeEvent:
        def __init__(self, **kw):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):  # 10 launches of the candidate just run: 8 warps is the faster one
            return 10.0 if ran[-1][1] == 8 else 50.0

    monkeypatch.setattr(ex, "problem_for_key", fake_problem)
    monkeypatch.setattr(reg, "run_kernel", fake_run)
    monkeypatch.setattr(cfgs, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(tuner.subprocess, "Popen", FakePopen)
    args = argparse.Namespace(batch=8, seqlen_chunks=16, problem_nheads=64, ngroups=2, jobs=2)
    sizes = tuner.problem_sizes(args)
    key = {"chunk_size": 128, "hdim": 64, "dstate": 128}
    jobs = [("chunk_state_fwd", key, "bfloat16")]
    lists = {"chunk_state_fwd": [({"BLOCK_SIZE_M": 64}, 4, 3), ({"BLOCK_SIZE_M": 128}, 8, 2)]}
    cands = lambda kernel, key, dt: lists[kernel]  # noqa: E731
    status = tuner.phase1(jobs, cands, args, deadline=float("inf"))
    assert len(spawned) == 2 and sorted(status.values()) == ["ok", "ok"]
    assert built == [("chunk_state_fwd", 8, 16, 64, 2)]  # one problem per (kernel, key, dtype) group
    assert sorted(ran) == [("chunk_state_fwd", 4), ("chunk_state_fwd", 8)]
    built.clear()
    table, report = tuner.phase2(jobs, cands, status, float("inf"), sizes)
    assert built == [("chunk_state_fwd", 8, 16, 64, 2)]
    (row,) = report
    assert [r["ms"] for r in row["rows"]] == [5.0, 1.0] and all(r["bitwise_repeat"] for r in row["rows"])
    assert table == {reg.table_key("sm_90", "bfloat16", "chunk_state_fwd", key):
                     {"BLOCK_SIZE_M": 128, "num_warps": 8, "num_stages": 2}}  # the faster candidate
    assert tuner.describe_sizes(sizes) == "batch 8, seqlen 16 * chunk_size, nheads 64 (unless keyed), ngroups 2"
    table, report = tuner.phase2(jobs, cands, status, 0.0, sizes)  # past the deadline: the search is cut short
    assert table == {} and [r.get("timing") for r in report[0]["rows"]] == ["skipped: budget"] * 2
    for lost in ("skipped: budget", "not compiled"):  # phase 1 cut short: the faster candidate never compiled
        cut = {k: (lost if k[3] == 1 else v) for k, v in status.items()}
        if lost == "not compiled":
            cut = {k: v for k, v in status.items() if k[3] != 1}
        table, report = tuner.phase2(jobs, cands, cut, float("inf"), sizes)
        assert table == {} and "ms" in report[0]["rows"][0] and "ms" not in report[0]["rows"][1], lost


def test_tuner_table_merge_keeps_the_earlier_runs_meta(tmp_path):
    """Merging into an existing table keeps its entries and its META (under ``earlier``); replacing drops both."""
    path = tmp_path / "table.py"

    def load():
        ns = {}
        exec(path.read_text(), ns)
        return ns["META"], ns["TABLE"]

    tuner.write_table(path, {"a": {"num_warps": 4}}, {"run": 1})
    tuner.write_table(path, {"b": {"num_warps": 8}}, {"run": 2})
    meta, table = load()
    assert table == {"a": {"num_warps": 4}, "b": {"num_warps": 8}}
    assert meta == {"run": 2, "earlier": {"run": 1}}
    tuner.write_table(path, {"a": {"num_warps": 2}, "b": {"num_warps": 2}}, {"run": 3})  # nothing kept
    assert load() == ({"run": 3}, {"a": {"num_warps": 2}, "b": {"num_warps": 2}})
    tuner.write_table(path, {"c": {"num_warps": 1}}, {"run": 4}, merge=False)
    assert load() == ({"run": 4}, {"c": {"num_warps": 1}})


def test_the_table_written_reads_back_with_the_same_header(tmp_path):
    """The tuner writes the table module in the form of csrc_bindings/pinned/table.py (same header)."""
    from csrc_bindings.pinned import table
    path = tmp_path / "table.py"
    tuner.write_table(path, dict(table.TABLE), table.META, merge=False)
    assert path.read_text() == tuner.TABLE_PATH.read_text()


def _list_jobs(*extra):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "csrc_bindings.pinned.tune", "--list-jobs", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tuner.PACKAGE_PARENT)
    return res, res.stdout.strip().splitlines()[:-1]


def test_key_space_shapes_and_shards_split_the_jobs():
    """``--shapes key-space`` is chunk 64/128/256 x headdim 32/64/128 x d_state 16..256 (45 layer shapes);
    ``--shard I/N`` gives disjoint parts whose union is the whole list, in its order."""
    assert len(tuner.KEY_SPACE) == 45 and "128x128x256" in tuner.KEY_SPACE and "64x32x16" in tuner.KEY_SPACE
    kernels = ["--kernels", "chunk_scan_bwd_dz,chunk_state_bwd_db", "--dtypes", "bfloat16"]
    res, whole = _list_jobs("--shapes", "key-space", *kernels)
    assert res.returncode == 0, res.stderr
    # dz is keyed by (chunk, hdim): 9 keys; db by (chunk, dstate, hdim): 45 keys
    assert sum(ln.startswith("chunk_scan_bwd_dz ") for ln in whole) == 9
    assert sum(ln.startswith("chunk_state_bwd_db ") for ln in whole) == 45
    parts = [_list_jobs("--shapes", "key-space", *kernels, "--shard", f"{i}/3")[1] for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(whole) and sum(map(len, parts)) == len(whole)
    assert parts[1] == whole[1::3]
    for bad in ("3/3", "-1/2", "1", "a/b"):
        res, _ = _list_jobs(f"--shard={bad}")
        assert res.returncode == 2 and "--shard: expected I/N with 0 <= I < N" in res.stderr, (bad, res.stderr)


def test_merge_from_combines_shard_tables(tmp_path):
    """``--merge-from``: the shards' entries merged into --out, its own other entries kept, later sources winning,
    their META kept; a module of the other kind is refused."""
    k1, k2, k3 = ("sm_90/bfloat16/chunk_scan_bwd_dz/chunk_size=64,hdim=32", "sm_90/bfloat16/chunk_scan_bwd_dz/"
                  "chunk_size=64,hdim=64", "sm_90/bfloat16/chunk_scan_bwd_dz/chunk_size=128,hdim=32")
    cfg = {"BLOCK_SIZE_M": 32, "num_stages": 3, "num_warps": 4}
    out, a, b = tmp_path / "table.py", tmp_path / "a.py", tmp_path / "b.py"
    tuner.write_table(out, {k1: cfg}, {"run": "old"}, merge=False)
    tuner.write_table(a, {k2: cfg, k3: cfg}, {"run": "a"}, merge=False)
    tuner.write_table(b, {k3: {**cfg, "BLOCK_SIZE_M": 64}}, {"run": "b"}, merge=False)
    assert tuner.merge_tables(out, [a, b]) == 3
    ns = {}
    exec(out.read_text(), ns)
    assert ns["TABLE"] == {k1: cfg, k2: cfg, k3: {**cfg, "BLOCK_SIZE_M": 64}}
    assert [m["run"] for m in ns["META"]["merged"]] == ["a", "b"] and ns["META"]["earlier"] == {"run": "old"}
    import pytest
    with pytest.raises(ValueError, match="--merge-from: expected a module with SPEED"):
        tuner.merge_tables(tmp_path / "speed.py", [a], speed=True)


def test_pinned_writes_drop_the_speed_entries_at_their_keys(tmp_path):
    """A pinned entry written at a key drops the speed table's entry there (its neutral values were timed with other
    order parameters); other speed entries, the speed META and the pinned merge itself are kept, the pruning is
    recorded in META, and a key the speed table lacks changes nothing."""
    k1, k2, k3 = ("sm_90/bfloat16/chunk_scan_bwd_dz/chunk_size=64,hdim=32", "sm_90/bfloat16/chunk_scan_bwd_dz/"
                  "chunk_size=64,hdim=64", "sm_90/bfloat16/chunk_scan_bwd_dz/chunk_size=128,hdim=32")
    speed, out, a = tmp_path / "speed.py", tmp_path / "table.py", tmp_path / "a.py"
    tuner.write_table(speed, {k1: {"num_stages": 1}, k2: {"num_stages": 2}}, {"run": "speed"}, merge=False,
                      speed=True)
    cfg = {"BLOCK_SIZE_M": 32, "num_stages": 3, "num_warps": 4}
    tuner.write_table(a, {k1: cfg, k3: cfg}, {"run": "a"}, merge=False)
    before = speed.read_text()
    assert tuner.prune_speed([k3], speed) == [] and speed.read_text() == before  # no speed entry there
    assert tuner.merge_tables(out, [a], speed_path=speed) == 2
    ns = {}
    exec(speed.read_text(), ns)
    assert ns["SPEED"] == {k2: {"num_stages": 2}} and ns["META"]["run"] == "speed"
    assert ns["META"]["pruned"][0]["entries"] == [k1]
    assert speed.read_text().startswith('"""Bit-neutral parameters chosen for speed')
    ns = {}
    exec(out.read_text(), ns)
    assert ns["TABLE"] == {k1: cfg, k3: cfg}
    assert tuner.prune_speed([k2], speed) == [k2]
    ns = {}
    exec(speed.read_text(), ns)
    assert ns["SPEED"] == {} and [len(p["entries"]) for p in ns["META"]["pruned"]] == [1, 1]
    assert tuner.prune_speed([k1], tmp_path / "missing.py") == []



def test_only_the_package_table_prunes_and_only_at_keys_whose_entry_changed(tmp_path, monkeypatch):
    """``--merge-from`` into the package's table (paths monkeypatched to temporary files) drops the speed entries
    at the keys whose pinned entry it added or changed; merging the same entries again drops nothing; into another
    ``--out``, or with ``--speed``, nothing is pruned."""
    import sys
    k1, k2 = ("sm_90/bfloat16/chunk_scan_bwd_dz/chunk_size=64,hdim=32",
              "sm_90/bfloat16/chunk_scan_bwd_dz/chunk_size=64,hdim=64")
    cfg = {"BLOCK_SIZE_M": 32, "num_stages": 3, "num_warps": 4}
    table, speed, other, a, b = (tmp_path / n for n in ("table.py", "speed.py", "other.py", "a.py", "b.py"))
    monkeypatch.setattr(tuner, "TABLE_PATH", table)
    monkeypatch.setattr(tuner, "SPEED_PATH", speed)
    tuner.write_table(table, {k1: cfg}, {"run": "old"}, merge=False)
    tuner.write_table(a, {k1: cfg, k2: cfg}, {"run": "a"}, merge=False)
    tuner.write_table(b, {k1: {**cfg, "BLOCK_SIZE_M": 64}}, {"run": "b"}, merge=False)

    def speed_keys():
        ns = {}
        exec(speed.read_text(), ns)
        return sorted(ns["SPEED"])

    def main(*argv):
        monkeypatch.setattr(sys, "argv", ["tune", *argv])
        tuner.main()

    tuner.write_table(speed, {k1: {"num_stages": 1}, k2: {"num_stages": 2}}, {"run": "speed"}, merge=False,
                      speed=True)
    main("--merge-from", str(a), "--out", str(other))  # another module: the package's speed table is kept
    assert speed_keys() == [k1, k2]
    main("--merge-from", str(a))  # k1 unchanged, k2 new
    assert speed_keys() == [k1]
    main("--merge-from", str(a))  # the same entries again
    assert speed_keys() == [k1]
    main("--merge-from", str(b))  # k1's order configuration changed
    assert speed_keys() == []
    s = tmp_path / "s.py"
    tuner.write_table(s, {k2: {"num_stages": 4}}, {"run": "s"}, merge=False, speed=True)
    main("--merge-from", str(s), "--speed")  # a speed merge writes the speed table and prunes nothing
    assert speed_keys() == [k2]
    main("--merge-from", str(b))  # k1 again the same: nothing pruned
    assert speed_keys() == [k2]


def test_oversized_tiles_and_the_candidates_a_search_times():
    """The dx kernel's head-dim tile (``tile_bounds`` {"BLOCK_SIZE_N": "hdim"}): a tile wider than the narrowest
    candidate tile that covers ``hdim`` is oversized and not searched; other kernels search their whole list."""
    from csrc_bindings._registry import KERNELS
    from csrc_bindings._spec import oversized_tiles

    dx = KERNELS["chunk_scan_chunk_state_bwd_dx"]
    assert dict(dx.tile_bounds) == {"BLOCK_SIZE_N": "hdim"}
    key = {"chunk_size": 128, "hdim": 32, "dstate": 32}
    assert oversized_tiles(dx, key, {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}) == ("BLOCK_SIZE_N",)
    assert oversized_tiles(dx, key, {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}) == ()
    # hdim 48: the narrowest covering tile is 64; hdim 512: wider than every candidate, none is oversized
    assert oversized_tiles(dx, {**key, "hdim": 48}, {"BLOCK_SIZE_N": 64}) == ()
    assert oversized_tiles(dx, {**key, "hdim": 48}, {"BLOCK_SIZE_N": 128}) == ("BLOCK_SIZE_N",)
    assert oversized_tiles(dx, {**key, "hdim": 512}, {"BLOCK_SIZE_N": 256}) == ()
    live = {k: s.candidates for k, s in KERNELS.items() if s.candidates is not None}
    widths = {c[0]["BLOCK_SIZE_N"] for c in tuner.search_candidates("chunk_scan_chunk_state_bwd_dx", key, live)}
    assert widths == {32}
    widths = {c[0]["BLOCK_SIZE_N"]
              for c in tuner.search_candidates("chunk_scan_chunk_state_bwd_dx", {**key, "hdim": 64}, live)}
    assert widths == {32, 64}
    assert len(tuner.search_candidates("chunk_scan_chunk_state_bwd_dx", {**key, "hdim": 128}, live)) == 7
    state_key = {"chunk_size": 128, "hdim": 32, "dstate": 32}
    assert tuner.search_candidates("chunk_state_fwd", state_key, live) == list(live["chunk_state_fwd"])


def test_oversized_only_selects_the_entries_with_an_oversized_tile(monkeypatch):
    import csrc_bindings._configs as cfgs
    import csrc_bindings._registry as reg

    key32, key128 = ({"chunk_size": 128, "hdim": h, "dstate": 32} for h in (32, 128))
    table = {reg.table_key("sm_90", "float16", "chunk_scan_chunk_state_bwd_dx", key32):
             {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "num_warps": 4, "num_stages": 4},
             reg.table_key("sm_90", "float16", "chunk_scan_chunk_state_bwd_dx", key128):
             {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "num_warps": 4, "num_stages": 4}}
    monkeypatch.setattr(cfgs, "_table", lambda: table)
    jobs = [("chunk_scan_chunk_state_bwd_dx", key32, "float16"), ("chunk_scan_chunk_state_bwd_dx", key128, "float16"),
            ("chunk_scan_chunk_state_bwd_dx", key32, "bfloat16")]  # the last has no entry: nothing to re-tune
    assert tuner.oversized_jobs(jobs, "sm_90") == [jobs[0]]
    assert tuner.oversized_jobs(jobs, "sm_100") == []


def test_no_pinned_entry_has_an_oversized_tile():
    """Every entry of the committed pinned table is one a search would choose: no tile wider than its key's
    dimension needs (the dx entries re-tuned by ``tune --oversized-only``)."""
    from csrc_bindings._configs import _parse_key
    from csrc_bindings._registry import KERNELS
    from csrc_bindings._spec import oversized_tiles
    from csrc_bindings.pinned.table import TABLE

    bad, checked = [], 0
    for tkey, entry in TABLE.items():
        _arch, _dt, kernel, key_text = tkey.split("/", 3)
        spec = KERNELS[kernel]
        if not spec.tile_bounds:
            continue
        checked += 1
        if oversized_tiles(spec, _parse_key(key_text), entry):
            bad.append(tkey)
    assert checked >= 100  # the dx kernel's entries over the key space (bf16, fp16, fp32)
    assert bad == []


def test_several_problems_pick_the_candidate_that_loses_least_where_it_loses_most(monkeypatch):
    """``--also-problem``: phase 2 checks validity on the first problem, times every valid candidate on each
    problem, and picks by ``least-worst-ratio-v1``; one problem is the plain fastest (fake kernels and events on the
    CPU)."""
    import json

    import csrc_bindings._configs as cfgs
    import csrc_bindings._examples as ex
    import csrc_bindings._registry as reg

    ran = []
    # ms per launch: (problem batch, num_warps) -> 8 warps wins on the small problem, loses 10x on the large one
    ms = {(2, 4): 5.0, (2, 8): 1.0, (16, 4): 2.0, (16, 8): 20.0}

    def fake_problem(kernel, key, dtype, device, *, batch, seqlen_chunks, nheads, ngroups, on_device):
        assert on_device  # values made on the GPU (seconds faster at large sizes)
        return {"x": torch.full((3,), float(batch))}

    def fake_run(kernel, p, config=None):
        ran.append((int(p["x"][0]), config["num_warps"]))
        return (p["x"] * config["num_warps"],)

    class FakeEvent:
        def __init__(self, **kw):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):  # 10 launches of the candidate just run
            return 10 * ms[ran[-1]]

    monkeypatch.setattr(ex, "problem_for_key", fake_problem)
    monkeypatch.setattr(reg, "run_kernel", fake_run)
    monkeypatch.setattr(cfgs, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    key = {"chunk_size": 64, "hdim": 32}
    jobs = [("chunk_scan_bwd_ddAcs_stable", key, "bfloat16")]
    cands = lambda kernel, key, dt: [({"BLOCK_SIZE_M": 64}, 4, 3), ({"BLOCK_SIZE_M": 32}, 8, 3)]  # noqa: E731
    status = {(jobs[0][0], json.dumps(key, sort_keys=True), "bfloat16", i): "ok" for i in range(2)}
    small = {"batch": 2, "seqlen_chunks": 8, "nheads": 16, "ngroups": 1}
    large = {"batch": 16, "seqlen_chunks": 64, "nheads": 64, "ngroups": 4}
    tkey = reg.table_key("sm_90", "bfloat16", jobs[0][0], key)
    table, _ = tuner.phase2(jobs, cands, status, float("inf"), small)
    assert table[tkey]["num_warps"] == 8  # one problem: the fastest
    table, report = tuner.phase2(jobs, cands, status, float("inf"), [small, large])
    assert [(r["ms"], r["ms_more"]) for r in report[0]["rows"]] == [(5.0, [2.0]), (1.0, [20.0])]
    assert table[tkey]["num_warps"] == 4  # worst ratios 5 (4 warps) against 10 (8 warps)
    assert tuner.phase2(jobs, cands, status, float("inf"), [large, small])[0][tkey]["num_warps"] == 4
    # --keep-within: the entry before the search stays while its worst ratio (10, 8 warps) is within the bound
    before = {tkey: {"BLOCK_SIZE_M": 32, "num_warps": 8, "num_stages": 3}}
    for within, warps in ((10.0, 8), (9.9, 4), (None, 4)):
        table, report = tuner.phase2(jobs, cands, status, float("inf"), [small, large], current=before,
                                     keep_within=within)
        assert table[tkey]["num_warps"] == warps and report[0]["before"] == before[tkey], within
    other = {tkey: {"BLOCK_SIZE_M": 128, "num_warps": 8, "num_stages": 3}}  # not a candidate: cannot be kept
    table, _ = tuner.phase2(jobs, cands, status, float("inf"), [small, large], current=other, keep_within=100.0)
    assert table[tkey]["num_warps"] == 4
    rows = [{"ms": 1.0, "ms_more": [2.0]}, {"ms": 2.0, "ms_more": [1.0]}]
    assert tuner.least_worst_ratio(rows) is rows[0]  # a tie: the first in candidate order
    rows = [{"ms": 1.0, "ms_more": [10.0]}, {"ms": 3.0, "ms_more": [4.0]}]
    assert tuner.least_worst_ratio(rows) is rows[0]  # worst ratios 2.5 and 3 (the least total time is the other)
    # past the deadline, or a further problem no candidate runs on: the key is not written
    table, report = tuner.phase2(jobs, cands, status, 0.0, [small, large])
    assert table == {} and [r.get("timing") for r in report[0]["rows"]] == ["skipped: budget"] * 2
    ms[(16, 4)] = ms[(16, 8)] = None  # TypeError in the fake event
    table, report = tuner.phase2(jobs, cands, status, float("inf"), [small, large])
    assert table == {} and all("error_more" in r and "ms" in r for r in report[0]["rows"])

    def problems(*extra):
        import argparse
        args = argparse.Namespace(batch=4, seqlen_chunks=8, problem_nheads=16, ngroups=1, also_problem=list(extra))
        return tuner.problem_list(args)

    assert problems("16x64x64x4") == [{"batch": 4, "seqlen_chunks": 8, "nheads": 16, "ngroups": 1}, large]
    assert "least-worst-ratio-v1" in tuner.describe_sizes(problems("16x64x64x4"))
    assert tuner.describe_sizes(problems()) == tuner.describe_sizes(problems()[0])
    for bad in ("16x64x64", "16x64x63x4", "0x8x16x1", "ax8x16x1"):
        with pytest.raises(ValueError, match="--also-problem: expected BxCxHxG"):
            problems(bad)


def test_compile_workers_run_each_candidate_on_every_problem(tmp_path, monkeypatch):
    """Phase 1 runs every candidate on the first problem (its status) and the ones that ran there on each further
    problem too, so that Triton compiles the specialisations the further problems need (a candidate that fails
    on a further problem stays ``ok``: phase 2 reports it); one problem alive at a time, built once per group."""
    import json

    import csrc_bindings._examples as ex
    import csrc_bindings._registry as reg

    import gc
    import weakref

    built, ran, alive, freed = [], [], [], []

    class Problem(dict):  # a dict that a weak reference can follow
        pass

    def fake_problem(kernel, key, dtype, device, *, batch, seqlen_chunks, nheads, ngroups, on_device):
        assert on_device  # values made on the GPU (seconds faster at large sizes)
        assert all(r() is None for r in alive), "the previous problem is still referenced"
        built.append((key["hdim"], batch))
        p = Problem(batch=batch)
        alive.append(weakref.ref(p))
        return p

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(len(built)))
    gc.disable()  # only reference counts can free a problem, as soon as its last reference goes

    def fake_run(kernel, p, config=None):
        ran.append((p["batch"], config["num_warps"]))
        if config["num_warps"] == 2 or (config["num_warps"] == 8 and p["batch"] == 16):
            raise RuntimeError("out of resources")
        return ()

    monkeypatch.setattr(ex, "problem_for_key", fake_problem)
    monkeypatch.setattr(reg, "run_kernel", fake_run)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    small = {"batch": 4, "seqlen_chunks": 8, "nheads": 16, "ngroups": 1}
    large = {"batch": 16, "seqlen_chunks": 64, "nheads": 64, "ngroups": 4}
    tasks = [["chunk_state_fwd", {"chunk_size": 64, "hdim": h, "dstate": 16}, "bfloat16", i, [{}, w, 2]]
             for h in (32, 64) for i, w in enumerate((2, 4, 8))]
    tf, of = tmp_path / "tasks.json", tmp_path / "out.json"
    tf.write_text(json.dumps({"sizes": small, "more": [large], "tasks": tasks}))
    tuner.worker_compile(str(tf), str(of), float("inf"))
    status = {(t[1]["hdim"], t[3]): t[4] for t in json.loads(of.read_text())}
    assert [status[(h, i)][:12] for h in (32, 64) for i in range(3)] == ["RuntimeError", "ok", "ok"] * 2
    assert built == [(32, 4), (32, 16), (64, 4), (64, 16)]
    assert freed == [0, 1, 2, 3]  # the cached memory handed back before each new problem
    gc.enable()
    assert ran == [(4, 2), (4, 4), (4, 8), (16, 4), (16, 8)] * 2
    tuner.worker_compile(str(tf), str(of), 0.0)  # past the deadline: nothing runs, every task is cut
    assert [t[4] for t in json.loads(of.read_text())] == ["skipped: budget"] * 6

    def oom_run(kernel, p, config=None):  # the GPU full of the other workers' problems
        if config["num_warps"] == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 160.00 MiB")
        return (torch.ones(2),)

    monkeypatch.setattr(reg, "run_kernel", oom_run)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    tuner.worker_compile(str(tf), str(of), float("inf"))
    status = {(t[1]["hdim"], t[3]): t[4] for t in json.loads(of.read_text())}
    assert [status[(32, i)] for i in range(3)] == ["ok", tuner.OUT_OF_MEMORY, "ok"]
    jobs = [("chunk_state_fwd", {"chunk_size": 64, "hdim": 32, "dstate": 16}, "bfloat16")]
    cands = lambda kernel, key, dt: [t[4] for t in tasks[:3]]  # noqa: E731
    by_job = {(jobs[0][0], json.dumps(jobs[0][1], sort_keys=True), "bfloat16", i): status[(32, i)] for i in range(3)}
    monkeypatch.setattr("csrc_bindings._configs.device_arch", lambda device: "sm_90")
    table, report = tuner.phase2(jobs, cands, by_job, float("inf"), small)
    assert table == {} and "ms" in report[0]["rows"][0]  # a search that lost a candidate to memory: not written
    assert report[0]["rows"][1]["error"] == tuner.OUT_OF_MEMORY  # tried again in phase 2: out of memory again
    monkeypatch.setattr(reg, "run_kernel", lambda kernel, p, config=None: (torch.ones(2),))
    table, report = tuner.phase2(jobs, cands, by_job, float("inf"), small)  # phase 2 alone on the GPU: it runs
    assert len(table) == 1 and all("ms" in r for r in report[0]["rows"])
    monkeypatch.setattr(reg, "run_kernel", oom_run)
    by_job = {k: "ok" for k in by_job}  # out of memory on a further problem only: the key is not written either
    table, report = tuner.phase2(jobs, cands, by_job, float("inf"), [small, large])
    assert table == {} and report[0]["rows"][1]["error"] == tuner.OUT_OF_MEMORY
    monkeypatch.setattr(reg, "run_kernel", lambda kernel, p, config=None: (
        oom_run(kernel, p, config) if p["batch"] == 16 else (torch.ones(2),)))
    table, report = tuner.phase2(jobs, cands, by_job, float("inf"), [small, large])
    assert table == {} and report[0]["rows"][1]["error_more"] == tuner.OUT_OF_MEMORY


def test_phase1_hands_the_further_problems_to_its_workers(tmp_path, monkeypatch):
    """``--also-problem``: the tasks file of every compile worker names the further problems (``more``)."""
    import argparse
    import json

    specs = []

    class FakePopen:
        def __init__(self, cmd, cwd=None):
            specs.append(json.loads(open(cmd[4]).read()))

        def wait(self):
            return 0

    monkeypatch.setattr(tuner.subprocess, "Popen", FakePopen)
    args = argparse.Namespace(batch=4, seqlen_chunks=16, problem_nheads=16, ngroups=1, jobs=2,
                              also_problem=["4x32x64x4"])
    jobs = [("chunk_state_fwd", {"chunk_size": 64, "hdim": h, "dstate": 16}, "bfloat16") for h in (32, 64)]
    tuner.phase1(jobs, lambda kernel, key, dt: [({}, 4, 2)], args, deadline=float("inf"))
    assert len(specs) == 2 and all(sp["more"] == [{"batch": 4, "seqlen_chunks": 32, "nheads": 64, "ngroups": 4}]
                                   and sp["sizes"]["seqlen_chunks"] == 16 for sp in specs)


class _FakeEvent:  # CUDA events on the CPU: every launch takes 1 ms
    def __init__(self, **kw):
        pass

    def record(self):
        pass

    def elapsed_time(self, other):
        return 10.0
