"""``ordered-ssd check`` end to end on the CPU (:mod:`ordered_ssd.apps.check.run`): 1 process and 2 (gloo)."""
import json
import os

import pytest

from ordered_ssd.apps.check import CheckError, run_check
from ordered_ssd.apps.check.spec import spec_from_args
from ordered_ssd.apps.cli import build_parser
from ordered_ssd.distributed import TEST_SKEW_ENV
from tests.apps.helpers import TINY_CHECK, cli_env, run_cli

TINY = TINY_CHECK + ["--batch", "4"]


def test_check_is_reproducible_and_reports(check_run):
    res, out = check_run
    assert res.returncode == 0, res.stderr + res.stdout
    assert "verdict: REPRODUCIBLE: 6 steps" in res.stdout
    assert "byte-level Mamba-2 LM (1 layer, d_model 32) on cpu, 6 steps of batch 2 x 24 bytes" in res.stdout
    assert "b (fresh process) vs a:               identical" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["verdict"] == "REPRODUCIBLE"
    assert report["stop_at"] == 3 and report["spec"]["steps"] == 6
    assert "standard library" in report["data_source"]
    runs = report["runs"]
    assert set(runs) == {"a", "b", "c"}
    assert runs["a"]["losses"] == runs["b"]["losses"] == runs["c"]["losses"]
    assert len(runs["a"]["losses"]) == 6
    losses = [float.fromhex(h) for h in runs["a"]["losses"]]
    assert 4.0 < losses[0] < 6.5  # about log(256) = 5.55 nats for an untrained byte model
    assert runs["a"]["final"] == runs["c"]["final"] and len(runs["a"]["final"]) == len(report["per_step"][0]["grads"])
    assert all(len(h) == 64 for h in report["per_step"][0]["grads"].values())
    for key in ("b_vs_a", "c_vs_a"):
        c = report["comparisons"][key]
        assert c["identical"] and c["loss_equal_steps"] == 6 and c["first_grad_diff"] is None
    assert report["plot"] == "loss.png" and (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # what loss.png draws: b and c against a, identical bits at every step (the records hold every step's gradient
    # and parameter digests and norms)
    diffs = report["differences"]
    assert diffs["grads_measure"] == "norm" and diffs["params_measure"] == "norm"
    assert list(diffs["pairs"]) == ["b vs a", "c vs a"]
    for pair in diffs["pairs"].values():
        assert pair["steps"] == list(range(6))
        assert pair["loss"] == pair["grads"] == pair["params"] == ["identical bits"] * 6
    assert (out / "runs" / "checkpoint-step3.pt").exists()
    assert not [p for p in os.listdir(out) if p.startswith(".tmp-")]
    # where each run's time went: set-up, first step, training, validation, and the run's wall time (a fresh
    # process's start-up included); c sums its two processes
    for label, run in runs.items():
        t = run["timings"]
        assert set(t) == {"setup_s", "first_step_s", "train_s", "val_s"}, label
        assert all(v is not None and v >= 0 for v in t.values()), label
        assert t["first_step_s"] <= t["train_s"] <= run["wall_s"], label
        assert t["setup_s"] + t["train_s"] + t["val_s"] <= run["wall_s"], label
    assert runs["b"]["wall_s"] > runs["b"]["timings"]["train_s"] + runs["b"]["timings"]["setup_s"]  # start-up
    assert report["wall_s"] >= sum(run["wall_s"] for run in runs.values()) * 0.999
    # one intra-op thread count in every run (the CPU default: OMP_NUM_THREADS where set, else 1), recorded
    default = int(os.environ.get("OMP_NUM_THREADS") or 1)
    assert report["threads"] == report["spec"]["threads"] == default
    assert {run["threads"] for run in runs.values()} == {default}
    assert f"threads: {default} intra-op thread" in res.stdout


def test_threads_reach_every_process_and_the_report(tmp_path):
    """--threads 2: run a (this check's process), b (a fresh process) and both processes of c train with 2 intra-op
    threads (their fingerprints record torch.get_num_threads()), and report.json records the count."""
    out = tmp_path / "o"
    env = cli_env()
    env.pop("OMP_NUM_THREADS", None)
    res = run_cli("check", *TINY_CHECK, "--batch", "2", "--threads", "2", "--out", str(out), env=env)
    assert res.returncode == 0, res.stderr + res.stdout
    assert ("threads: 2 intra-op threads in every training process (--threads; the CPU's bits depend on the count, "
            "so every run uses the same)") in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["threads"] == 2 and report["spec"]["threads"] == 2
    assert {lab: run["threads"] for lab, run in report["runs"].items()} == {"a": 2, "b": 2, "c": 2}
    records = {name: json.loads((out / "runs" / f"{name}.json").read_text()) for name in ("a", "b", "c1", "c2")}
    assert {name: rec["fingerprint_info"]["threads"] for name, rec in records.items()} == {
        "a": 2, "b": 2, "c1": 2, "c2": 2}
    assert json.loads((out / "runs" / "spec.json").read_text())["threads"] == 2


def test_the_thread_count_and_its_notes(monkeypatch):
    """The CPU default is OMP_NUM_THREADS where set, else 1; a bad OMP_NUM_THREADS is one line; the check notes
    threads that need more than the usable cores, or a busy machine, only where a process has more than one."""
    import torch

    from ordered_ssd.apps.check import run as run_module
    from ordered_ssd.apps.check.spec import check_threads
    from ordered_ssd.apps.lm import DataError

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert check_threads(None, cpu) == 1 and check_threads(3, cpu) == 3
    assert check_threads(None, cuda) is None and check_threads(2, cuda) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert check_threads(None, cpu) == 4 and check_threads(1, cpu) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    with pytest.raises(DataError, match=r"^OMP_NUM_THREADS: expected a positive integer \(the check's default "
                                        r"--threads on the CPU\), got 'many'; unset it or pass --threads N$"):
        check_threads(None, cpu)

    monkeypatch.setattr(run_module, "usable_cores", lambda: 4)
    monkeypatch.setattr(run_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    line = ("threads: 1 intra-op thread in every training process (--threads; the CPU's bits depend on the count, "
            "so every run uses the same)")
    assert run_module.thread_lines(None, 1) == []
    assert run_module.thread_lines(1, 8) == [line]  # one thread a process: no note, however many processes
    assert run_module.thread_lines(2, 2) == [line.replace("1 intra-op thread", "2 intra-op threads")]
    assert run_module.thread_lines(4, 2)[1] == (
        "note: 2 processes x 4 threads at once need more than the 4 usable cores: the threads wait for each other, "
        "and the check may take many times longer; --threads 2 would fit")
    monkeypatch.setattr(run_module.os, "getloadavg", lambda: (3.2, 1.0, 0.5))
    assert run_module.thread_lines(1, 1) == [line]
    assert run_module.thread_lines(2, 1)[1] == (
        "note: the machine is busy (load average 3.2 over the last minute, 4 usable cores): with 2 threads per "
        "process the check may take many times longer; --threads 1 does not slow down so")


def test_check_on_a_user_directory(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"part{i}.txt").write_text(("The quick brown fox jumps over the lazy dog. %d\n" % i) * 300)
    out = tmp_path / "out"
    res = run_cli("check", *TINY_CHECK, "--batch", "2", "--data", str(corpus), "--out", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] and report["data_source"].startswith(f"directory {corpus} (3 files")


def test_ddp_check_is_reproducible_and_reports(ddp_check):
    res, out = ddp_check
    assert res.returncode == 0, res.stderr + res.stdout
    assert "on cpu x 2 processes (gloo, DistributedDataParallel, ordered gradient hook)" in res.stdout
    assert "global batch 4 (2 rows per rank)" in res.stdout
    assert "b (fresh processes) vs a:             identical" in res.stdout
    assert "ranks agree (loss, gradient and parameter bits on every rank): yes, in every run" in res.stdout
    assert "verdict: REPRODUCIBLE: 6 steps, world size 2," in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["world_size"] == 2 and report["backend"] == "gloo"
    assert report["ranks_agree"] is True
    assert report["fingerprint_info"]["world_size"] == 2
    assert report["spec"]["nproc"] == 2 and report["spec"]["ddp"]["bucket_cap_mb"] == 25.0
    runs = report["runs"]
    assert set(runs) == {"a", "b", "c"}
    assert runs["a"]["losses"] == runs["b"]["losses"] == runs["c"]["losses"] and len(runs["a"]["losses"]) == 6
    assert runs["a"]["final"] == runs["b"]["final"] == runs["c"]["final"]
    assert runs["a"]["val_loss"] == runs["b"]["val_loss"] == runs["c"]["val_loss"]
    for lab in ("a", "b", "c"):
        assert runs[lab]["world_size"] == 2 and runs[lab]["ranks_agree"] is True
        assert runs[lab]["ranks_disagreeing"] == []
        assert len(runs[lab]["rank_s_per_step"]) == 2 and all(t > 0 for t in runs[lab]["rank_s_per_step"])
    for key in ("b_vs_a", "c_vs_a"):
        c = report["comparisons"][key]
        assert c["identical"] and c["loss_equal_steps"] == 6 and c["first_grad_diff"] is None
    # per-step gradient digests (after the hook's reduction) for every parameter
    names = json.loads((out / "runs" / "a.json").read_text())["param_names"]
    assert len(report["per_step"]) == 6 and all(sorted(s["grads"]) == sorted(names) for s in report["per_step"])
    assert all(len(h) == 64 for h in report["per_step"][0]["grads"].values())
    # the parameters moved, and the same way in every run
    assert report["per_step"][0]["grads"] != report["per_step"][1]["grads"]
    assert not [p for p in os.listdir(out) if p.startswith(".tmp-")]
    assert not [p for p in os.listdir(out / "runs") if p.startswith(".tmp-")]


def test_rank_fingerprint_mismatch_stops_every_rank(tmp_path):
    out = tmp_path / "o"
    res = run_cli("check", *TINY, "--nproc", "2", "--out", str(out), env=cli_env(**{TEST_SKEW_ENV: "1:threads=99"}))
    assert res.returncode == 2, res.stdout + res.stderr
    err = res.stderr
    assert err.count("\n") == 1, err
    assert err.startswith("ordered-ssd check: error: run a (2 processes under torchrun) failed with exit code")
    assert "the 2 ranks do not share one determinism fingerprint: rank 1 (" in err
    assert ") differs from rank 0 (" in err and "'threads': (" in err and "'99')" in err
    assert "they would not compute the same bits, stopping" in err
    assert not (out / "report.json").exists() and not (out / "runs" / "a.json").exists()


def test_run_check_rejects_uneven_batch_before_writing(tmp_path):
    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    with pytest.raises(CheckError, match=r"--batch: the global batch 4 is not divisible by --nproc 3"):
        run_check(spec, str(tmp_path / "o"), stop_at=3, native=False, progress=False, nproc=3)
    assert not (tmp_path / "o").exists()


def _concurrent(monkeypatch, events=None):
    """The GPU's schedule on the CPU: the fresh runs start alongside run a (``concurrent_runs`` True); returns the
    list the chains that were started are appended to. ``events`` (a list) gets ``"a: first step"`` when run a's
    first step has finished and ``"fresh runs started"`` when the chains start."""
    from ordered_ssd.apps.check import run as run_mod
    from ordered_ssd.apps.check.launch import Launcher

    started = []
    events = [] if events is None else events
    alongside = Launcher.alongside
    train_run = run_mod.train_run

    def spy(self, chains, after=None):
        events.append("fresh runs started")
        started.extend([name for _, name, _, _ in chain] for chain in chains)
        return alongside(self, chains, after)

    def train_a(*args, after_first_step=None, **kwargs):
        def first():
            events.append("a: first step")
            after_first_step()
        return train_run(*args, after_first_step=first, **kwargs)
    monkeypatch.setattr(run_mod, "concurrent_runs", lambda spec: True)
    monkeypatch.setattr(run_mod, "train_run", train_a)
    monkeypatch.setattr(Launcher, "alongside", spy)
    return started


def test_fresh_runs_alongside_a_give_the_same_verdict(tmp_path, monkeypatch):
    events = []
    started = _concurrent(monkeypatch, events)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    lines = []
    assert run_check(spec, str(tmp_path / "o"), stop_at=3, native=False, progress=False, print_fn=lines.append) == 0
    assert started == [["b"], ["c1", "c2"]]
    assert events == ["a: first step", "fresh runs started"]  # a's first step compiles; theirs find the cache
    assert any(line.startswith("verdict: REPRODUCIBLE: 6 steps") for line in lines), lines
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    runs = report["runs"]
    assert runs["a"]["losses"] == runs["b"]["losses"] == runs["c"]["losses"] and len(runs["a"]["losses"]) == 6
    assert all(runs[r]["wall_s"] > 0 for r in "abc")
    assert report["comparisons"]["c_vs_a"]["identical"] and report["comparisons"]["b_vs_a"]["identical"]


def test_a_failed_run_alongside_a_stops_the_check_with_its_reason(tmp_path, monkeypatch):
    from ordered_ssd.apps.check import launch as launch_mod

    _concurrent(monkeypatch)
    command = launch_mod._train_command

    def broken_c1(spec_path, record_path, label, extra, progress):  # run c:1 is given an option _train refuses
        return command(spec_path, record_path, label, extra + (["--no-such-flag"] if label == "c:1" else []),
                       progress)
    monkeypatch.setattr(launch_mod, "_train_command", broken_c1)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    out = tmp_path / "o"
    with pytest.raises(CheckError, match=r"^run c:1 \(a fresh process\) failed with exit code 2: .*--no-such-flag"):
        run_check(spec, str(out), stop_at=3, native=False, progress=False, print_fn=lambda line: None)
    assert not (out / "runs" / "c2.json").exists() and not (out / "runs" / "c2.log").exists()  # c2 never started
    assert not (out / "report.json").exists()


def _sleeping_runs(monkeypatch, labels, seconds=60):
    """Runs of these labels sleep for ``seconds`` instead of training (a long run); others train as usual."""
    from ordered_ssd.apps.check import launch as launch_mod

    command = launch_mod._train_command

    def cmd(spec_path, record_path, label, extra, progress):
        if label in labels:
            return ["-c", f"import time; time.sleep({seconds})"]
        return command(spec_path, record_path, label, extra, progress)
    monkeypatch.setattr(launch_mod, "_train_command", cmd)


def test_stop_ends_a_background_run_and_keeps_later_ones_from_starting(tmp_path, monkeypatch):
    import time

    from ordered_ssd.apps.check.launch import Launcher

    _sleeping_runs(monkeypatch, {"b", "c:1", "c:2"})
    launch = Launcher(str(tmp_path), False, None)
    t0 = time.perf_counter()
    futures = launch.alongside([[("s", "b", "b", [])], [("s", "c1", "c:1", []), ("s", "c2", "c:2", [])]])
    time.sleep(1.0)  # b and c1 have started (or are starting): stop() must end them, and c2 must never start
    launch.stop()
    for future in futures:
        err = future.exception(timeout=30)
        assert err is None or isinstance(err, CheckError), err
    assert time.perf_counter() - t0 < 20 and launch._children == {}
    assert not (tmp_path / "c2.log").exists()
    immediately = Launcher(str(tmp_path / "x"), False, None)  # stop() before the child has even started
    (tmp_path / "x").mkdir()
    t0 = time.perf_counter()
    futures = immediately.alongside([[("s", "b", "b", [])]])
    immediately.stop()
    futures[0].exception(timeout=30)
    assert time.perf_counter() - t0 < 20 and immediately._children == {}


def test_a_failed_run_stops_the_runs_still_going(tmp_path, monkeypatch):
    """c:1 fails at once while b would run for a minute: the check stops b and fails with c:1's reason as soon as
    run a is done, not after b."""
    import time

    from ordered_ssd.apps.check import launch as launch_mod

    _concurrent(monkeypatch)
    _sleeping_runs(monkeypatch, {"b"}, seconds=120)
    command = launch_mod._train_command

    def broken_c1(spec_path, record_path, label, extra, progress):
        return command(spec_path, record_path, label, extra + (["--no-such-flag"] if label == "c:1" else []),
                       progress)
    monkeypatch.setattr(launch_mod, "_train_command", broken_c1)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    t0 = time.perf_counter()
    with pytest.raises(CheckError, match=r"^run c:1 \(a fresh process\) failed with exit code 2: "):
        run_check(spec, str(tmp_path / "o"), stop_at=3, native=False, progress=False, print_fn=lambda line: None)
    assert time.perf_counter() - t0 < 90 and _sleepers(120) == []


def test_runs_that_would_not_fit_together_follow_one_another(tmp_path, monkeypatch):
    """With room for one run but not for three at once, the runs follow one another, with a note; with room for
    three they go together; with room for none the run is refused (the estimate's usual error)."""
    from ordered_ssd.apps.check import memory
    from ordered_ssd.apps.check.run import prepared_run
    from ordered_ssd.apps.lm import DataError

    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    one = memory.training_bytes(spec, spec["batch"], 60000)["total"]
    for room, alongside in ((2 * one, False), (3 * one, True)):
        monkeypatch.setattr(memory, "device_available", lambda device, processes, room=room: (room, "test"))
        with prepared_run(spec, str(tmp_path / str(room)), 3, rows=spec["batch"], processes=1, together=(3,)) as run:
            assert run.alongside is alongside and run.together == (3 if alongside else 0)
            assert (run.notes[-1] == "the runs follow one another: 3 at once would not fit in the GPU's free "
                                     "memory") is not alongside, run.notes
    monkeypatch.setattr(memory, "device_available", lambda device, processes: (one // 2, "test"))
    with pytest.raises(DataError, match="expected a training that fits"):
        with prepared_run(spec, str(tmp_path / "none"), 3, rows=spec["batch"], processes=1, together=(3,)):
            pass


def test_the_control_gets_as_many_precompile_workers_as_fit(tmp_path, monkeypatch):
    """With the control, the counts tried are a, b, c plus 8, 7, ... 2 workers: room for 6 processes gives 3
    workers; room for 4 none at all, and the runs follow one another (the note names 5, the fewest tried)."""
    from ordered_ssd.apps.check import memory
    from ordered_ssd.apps.check.run import prepared_run

    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    one = memory.training_bytes(spec, spec["batch"], 60000)["total"]
    counts = tuple(3 + jobs for jobs in range(8, 1, -1))
    for room, together in ((6, 6), (11, 11), (40, 11), (4, 0)):
        monkeypatch.setattr(memory, "device_available", lambda device, processes, room=room: (room * one, "test"))
        with prepared_run(spec, str(tmp_path / str(room)), 3, rows=spec["batch"], processes=1,
                          together=counts) as run:
            assert run.together == together and run.alongside is (together > 0)
            if not together:
                assert run.notes[-1] == "the runs follow one another: 5 at once would not fit in the GPU's free memory"


def test_sigterm_during_runs_alongside_a_stops_them_all(tmp_path, monkeypatch):
    """SIGTERM to the check while its runs go alongside a acts as Ctrl-C: KeyboardInterrupt, every background run
    stopped (b would sleep for two minutes), and SIGTERM's handler put back afterwards."""
    import os
    import signal
    import time

    from ordered_ssd.apps.check import run as run_mod

    _concurrent(monkeypatch)
    _sleeping_runs(monkeypatch, {"b", "c:1"}, seconds=120)
    train_run = run_mod.train_run

    def terminated_after_first_step(*args, after_first_step=None, **kwargs):
        def first():
            after_first_step()
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)
        return train_run(*args, after_first_step=first, **kwargs)
    monkeypatch.setattr(run_mod, "train_run", terminated_after_first_step)
    before = signal.getsignal(signal.SIGTERM)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        run_check(spec, str(tmp_path / "o"), stop_at=3, native=False, progress=False, print_fn=lambda line: None)
    assert time.perf_counter() - t0 < 60
    assert signal.getsignal(signal.SIGTERM) is before
    logs = sorted(p.name for p in (tmp_path / "o" / "runs").iterdir() if p.suffix == ".log")
    assert logs == ["b.log", "c1.log"]  # both had started; c2 never did
    assert _sleepers(120) == []  # and neither is still running


def _sleepers(seconds):
    """The pids of this test's sleeping children still alive (Linux: their command lines in /proc)."""
    import os

    mine = f"time.sleep({seconds})".encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if mine in fh.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids
