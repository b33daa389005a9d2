"""The precompile phase (:mod:`ordered_ssd.apps.bench.precompile`): its tasks, the worker command and environment
(not run here), and the pool's handling of failing and overrunning workers (stand-in processes)."""
import json
import os
import sys
import time

import pytest

from ordered_ssd.apps import bench
from ordered_ssd.apps.bench import precompile
from ordered_ssd.apps.bench.children import ROOT

ALL = list(bench.SHAPES.values()) + list(bench.GRID.values())


def test_tasks_plain_per_shape_keys_interleaved_then_upstream_det_per_key():
    tasks = bench.precompile_tasks(ALL, ["native", "upstream-det", "ordered"])
    plain = [t for t in tasks if t["kind"] == "plain"]
    det = [t for t in tasks if t["kind"] == "upstream-det"]
    assert len(plain) == len(ALL) and len(det) == 7 and tasks == plain + det
    assert all(t["modes"] == ["native", "ordered"] for t in plain) and all(t["modes"] == ["native"] for t in det)
    # the first shape of each of the 7 keys first (so the first workers compile different keys), then the second
    # of each key, then the rest of S1-S4's key
    assert [t["name"] for t in plain] == ["plain-" + n for n in (
        "S1", "S5", "G1", "G3", "G8", "G10", "G12", "S2", "G7", "G2", "G4", "G9", "G11", "G13", "S3", "S4", "G5",
        "G6")]
    assert all(len(t["shapes"]) == 1 and t["shapes"][0].name == t["name"][6:] for t in plain)
    assert len({tuple(t["key"]) for t in plain[:7]}) == 7
    assert det[0]["name"] == "upstream-det-cs256-P64-N128-bf16" and det[0]["key"] == [256, 64, 128, "bf16"]
    assert [s.name for s in det[0]["shapes"]] == ["S1", "S2", "S3", "S4", "G5", "G6"]
    assert sorted(s.name for t in det for s in t["shapes"]) == sorted(s.name for s in ALL)
    for t in tasks:
        assert {tuple(s.kernel_key()) for s in t["shapes"]} == {tuple(t["key"])}
    assert bench.precompile_tasks(ALL, ["ordered", "literal"])[0]["modes"] == ["literal", "ordered"]
    assert {t["kind"] for t in bench.precompile_tasks(ALL, ["upstream-det"])} == {"upstream-det"}
    dup = bench.parse_shape("2,64,32,16,1,16,32", name="A")
    same = bench.parse_shape("2,64,32,16,1,16,32", name="B")
    assert [t["name"] for t in bench.precompile_tasks([dup, same], ["ordered"])] == ["plain-A"]


def test_worker_command_and_environment(monkeypatch, tmp_path):
    """A fresh interpreter running the bench module with the task as JSON; the deterministic switches only in an
    upstream-det worker's environment; TRITON_CACHE_AUTOTUNING never (a worker must not write autotuning
    choices timed on a shared GPU); TRITON_CACHE_DIR inherited (the one cache of every process)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    monkeypatch.setenv("MAMBA_DETERMINISTIC", "1")  # never inherited by a plain worker
    tasks = bench.precompile_tasks([bench.GRID["G8"], bench.GRID["G9"]], ["native", "upstream-det", "ordered"])
    assert [t["name"] for t in tasks] == ["plain-G8", "plain-G9", "upstream-det-cs256-P64-N128-fp16"]
    for task in tasks:
        cmd, env = bench.worker_command(task, "cuda:0", 3, str(tmp_path / "r.json"))
        assert cmd[:4] == [sys.executable, "-m", "ordered_ssd.apps.bench", "--_precompile-spec"] and len(cmd) == 5
        spec = json.loads(cmd[4])
        assert spec["kind"] == task["kind"] and spec["modes"] == task["modes"] and spec["device"] == "cuda:0"
        assert spec["seed"] == 3 and spec["steps"] == 2 and spec["result_path"] == str(tmp_path / "r.json")
        assert [bench.Shape(**f) for f in spec["shapes"]] == task["shapes"]
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache") and "TRITON_CACHE_AUTOTUNING" not in env
        assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
        det = {k: env.get(k) for k in bench.DET_ENV}
        assert det == ({k: "1" for k in bench.DET_ENV} if task["kind"] == "upstream-det"
                       else {k: None for k in bench.DET_ENV})
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"  # this process's environment is unchanged
    parsed = bench.build_parser().parse_args(cmd[3:])
    assert parsed.precompile_spec == cmd[4]


def _stand_in(code):
    def command(task, device, seed, result_path):
        return [sys.executable, "-c", code, result_path], dict(os.environ)
    return command


def test_a_failing_worker_is_reported_not_fatal(monkeypatch, tmp_path):
    shapes = [bench.parse_shape("2,64,32,16,1,16,32", name="A"), bench.parse_shape("2,64,32,16,1,16,32,fp16")]
    ok = ("import json, sys; json.dump({'shapes': [{'name': 'A', 'error': None, 'modes': {'ordered': {'s': 0.5, "
          "'error': None}}}]}, open(sys.argv[1], 'w'))")
    calls = []

    def command(task, device, seed, result_path):
        calls.append(task["name"])
        code = ok if task["key"][3] == "bf16" else "import sys; print('boom'); sys.exit(3)"
        return _stand_in(code)(task, device, seed, result_path)

    monkeypatch.setattr(precompile, "worker_command", command)
    res = bench.run_precompile(shapes, ["ordered"], "cpu", 4, 0, str(tmp_path / "pre"))
    assert calls == ["plain-A", "plain-2,64,32,16,1,16,32,fp16"]
    good, bad = res["tasks"]
    assert res["failed"] == 1 and res["jobs"] == 4 and res["wall_s"] >= 0
    assert good["returncode"] == 0 and good["error"] is None and good["steps"][0]["modes"]["ordered"]["s"] == 0.5
    assert bad["returncode"] == 3 and bad["error"].startswith("worker exited with status 3")
    assert open(bad["log"]).read() == "boom\n"
    with pytest.raises(ValueError, match="jobs"):
        bench.run_precompile(shapes, ["ordered"], "cpu", 0, 0, str(tmp_path / "pre"))


def test_workers_stop_at_the_deadline(monkeypatch, tmp_path):
    shapes = [bench.parse_shape("2,64,32,16,1,16,32"), bench.parse_shape("2,64,32,16,1,16,32,fp16")]
    monkeypatch.setattr(precompile, "worker_command", _stand_in("import time; time.sleep(60)"))
    t0 = time.monotonic()
    res = bench.run_precompile(shapes, ["ordered"], "cpu", 1, 0, str(tmp_path / "pre"), deadline=t0 + 1.0)
    assert time.monotonic() - t0 < 30
    first, second = res["tasks"]
    assert first["error"] == "killed at the time budget" and first["returncode"] != 0
    assert second["error"] == "skipped: time budget" and second["returncode"] is None and res["failed"] == 2


def test_native_candidates_in_slices_for_every_shape():
    """With 14 jobs and the 2 keys of S1-S5, every shape is 7 native slice tasks (slice 0 also runs ordered), the
    first shape of each key first."""
    shapes = list(bench.SHAPES.values())
    tasks = bench.precompile_tasks(shapes, ["native", "ordered"], jobs=14)
    assert precompile.slices_per_key(14, 2) == 7 and precompile.slices_per_key(14, 7) == 2
    assert precompile.slices_per_key(8, 7) == 2 and precompile.slices_per_key(1, 7) == 1
    assert precompile.slices_per_key(64, 1) == precompile.MAX_SLICES
    assert len(tasks) == 7 * len(shapes) and all("slice" in t for t in tasks)
    assert [t["name"] for t in tasks[:14]] == [f"plain-{n}-slice{i}of7" for n in ("S1", "S5") for i in range(7)]
    assert [t["slice"] for t in tasks[:7]] == [[i, 7] for i in range(7)]
    assert tasks[0]["modes"] == ["native", "ordered"] and all(t["modes"] == ["native"] for t in tasks[1:7])
    assert {t["shapes"][0].name for t in tasks[:7]} == {"S1"}
    spec = json.loads(bench.worker_command(tasks[3], "cuda", 0, "r.json")[0][4])
    assert spec["slice"] == [3, 7]
    # no native asked for, or a single job: nothing to slice
    assert all("slice" not in t for t in bench.precompile_tasks(shapes, ["ordered"], jobs=14))
    assert all("slice" not in t for t in bench.precompile_tasks(shapes, ["native", "ordered"], jobs=1))


def test_restrict_native_autotuners_takes_every_kth_candidate(monkeypatch):
    """On stand-in autotuners of a stand-in mamba-ssm Triton module: slice i of k keeps candidates i, i + k, ...
    (at least one), a second restriction starts again from the full list, and other modules are untouched."""
    import types

    class Autotuner:  # the name the function looks for, like triton.runtime.autotuner.Autotuner
        def __init__(self, configs):
            self.configs = list(configs)
            self._do_bench = None

    ops = types.ModuleType("mamba_ssm.ops.triton.fake_ssd")
    ops.big, ops.one = Autotuner(range(10)), Autotuner(["only"])
    other = types.ModuleType("not_mamba")
    other.tuner = Autotuner(range(10))
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.fake_ssd", ops)
    monkeypatch.setitem(sys.modules, "not_mamba", other)
    monkeypatch.setitem(sys.modules, "mamba_ssm.modules.mamba2", types.ModuleType("mamba_ssm.modules.mamba2"))
    monkeypatch.setitem(sys.modules, "mamba_ssm.modules", types.ModuleType("mamba_ssm.modules"))
    monkeypatch.setitem(sys.modules, "mamba_ssm", types.ModuleType("mamba_ssm"))
    assert precompile.restrict_native_autotuners(1, 4) == 2
    assert ops.big.configs == [1, 5, 9] and ops.one.configs == ["only"] and other.tuner.configs == list(range(10))
    precompile.restrict_native_autotuners(3, 4)
    assert ops.big.configs == [3, 7] and ops.one.configs == ["only"]
    calls = []  # each candidate is run once, not timed
    assert ops.big._do_bench(lambda: calls.append(1), quantiles=(0.5, 0.2, 0.8)) == [1.0, 1.0, 1.0] and calls == [1]
    assert other.tuner._do_bench is None
    with pytest.raises(ValueError, match="slice: expected 0 <= index < count, got index 4 of 4"):
        precompile.restrict_native_autotuners(4, 4)


def test_child_environment_never_carries_autotuning_choices(monkeypatch):
    """The upstream-det and native children, like the workers, run without TRITON_CACHE_AUTOTUNING: every process
    times its own candidates (none reads a choice another timed)."""
    from ordered_ssd.apps.bench.children import child_env

    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    for kind in ("upstream-det", "native"):
        env = child_env(kind)
        assert "TRITON_CACHE_AUTOTUNING" not in env
        assert (env.get("MAMBA_DETERMINISTIC") == "1") == (kind == "upstream-det")
