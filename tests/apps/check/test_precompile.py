"""The native control's precompile workers (:mod:`ordered_ssd.apps.check.precompile`, ``Launcher.precompile``) on
the CPU: the slice syntax, a worker's one step (mamba-ssm's autotuners restricted to its slice, a forward and
backward of the spec's model, nothing written), a failed worker named in one line without stopping anything, the
control's runs starting only after the workers, a hung worker killed at its timeout, and ``stop()`` ending the
workers. What they fill is Triton's cache
on a GPU; their effect on the wall time is measured there (docs/check.md)."""
import json
import time
from concurrent.futures import Future

import pytest
import torch

from ordered_ssd.apps.check import precompile as pre
from ordered_ssd.apps.check.launch import Launcher
from ordered_ssd.apps.check.spec import spec_from_args
from ordered_ssd.apps.cli import build_parser
from tests.apps.check.test_run import _sleepers, _sleeping_runs
from tests.apps.helpers import TINY_CHECK


@pytest.mark.parametrize("text, expected", [("0/1", (0, 1)), ("3/8", (3, 8))])
def test_parse_slice(text, expected):
    assert pre.parse_slice(text) == expected


@pytest.mark.parametrize("text, message", [
    ("1/1", "--precompile: expected 0 <= I < K, got '1/1'"),
    ("-1/4", "--precompile: expected 0 <= I < K, got '-1/4'"),
    ("a/4", "--precompile: expected I/K (two integers), got 'a/4'"),
    ("2", "--precompile: expected I/K (two integers), got '2'"),
])
def test_parse_slice_refuses(text, message):
    with pytest.raises(ValueError) as info:
        pre.parse_slice(text)
    assert str(info.value) == message


@pytest.mark.parametrize("cores, jobs", [(1, 2), (2, 2), (6, 3), (16, 8), (64, 8)])
def test_default_jobs_follow_the_cores(monkeypatch, cores, jobs):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert pre.default_jobs() == jobs


def _spec(*extra):
    spec = spec_from_args(build_parser().parse_args(["check", *TINY_CHECK, "--batch", "2", *extra]))
    return dict(spec, mixer="ordered")


def test_warm_step_restricts_the_autotuners_then_runs_a_forward_and_backward(monkeypatch):
    from ordered_ssd.apps.bench import precompile as bench_pre
    from ordered_ssd.apps.check import train

    calls, models = [], []
    monkeypatch.setattr(bench_pre, "restrict_native_autotuners",
                        lambda index, count, layers: calls.append((index, count, tuple(layers))) or 0)
    build = train.build_model

    def recording(spec, device):
        model, opt = build(spec, device)
        models.append(model)
        return model, opt
    monkeypatch.setattr(train, "build_model", recording)
    pre.warm_step(_spec("--layer", "mamba3", "--d-state", "16"), 2, 4)
    assert calls == [(2, 4, ("mamba3",))]
    grads = [p.grad for p in models[0].parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_a_failed_worker_is_named_in_one_line(tmp_path):
    """Without mamba-ssm (CI) every worker fails at the import: each failure is one line with its reason, and the
    future still gives the seconds and the failures (it never raises)."""
    try:
        import mamba_ssm  # noqa: F401
        pytest.skip("mamba-ssm is installed: the workers would succeed")
    except ImportError:
        pass
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(_spec()))
    seconds, failures = Launcher(str(tmp_path), False, None).precompile(str(spec_path), 2).result(timeout=120)
    assert seconds > 0 and len(failures) == 2
    for i, line in enumerate(failures):
        assert line.startswith(f"precompile-{i}: run precompile {i}/2 (a fresh process) failed with exit code 1: ")
        assert "mamba_ssm" in line and "\n" not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precompile-0.log", "precompile-1.log", "spec.json"]


def test_the_controls_runs_start_after_the_workers(tmp_path, monkeypatch):
    """A chain given ``after`` starts only once that future is done (the control after its workers)."""
    _sleeping_runs(monkeypatch, {"native-1"}, seconds=0.1)
    launch = Launcher(str(tmp_path), False, None)
    gate: Future = Future()
    (future,) = launch.alongside([[("s", "native-1", "native-1", [])]], after=gate)
    time.sleep(1.0)
    assert not future.done() and not (tmp_path / "native-1.log").exists()
    gate.set_result((0.0, []))
    future.result(timeout=60)
    assert (tmp_path / "native-1.log").exists() and launch.wall_s["native-1"] > 0


def test_stop_ends_the_workers_and_the_control_never_starts(tmp_path, monkeypatch):
    _sleeping_runs(monkeypatch, {"precompile 0/2", "precompile 1/2"}, seconds=90)
    launch = Launcher(str(tmp_path), False, None)
    t0 = time.perf_counter()
    workers = launch.precompile("s", 2)
    (control,) = launch.alongside([[("s", "native-1", "native-1", [])]], after=workers)
    time.sleep(1.0)
    launch.stop()
    seconds, failures = workers.result(timeout=60)
    control.result(timeout=60)
    assert len(failures) == 2 and time.perf_counter() - t0 < 45, failures
    assert launch._children == {} and _sleepers(90) == [] and not (tmp_path / "native-1.log").exists()


def test_a_hung_worker_is_killed_at_its_timeout_and_the_control_starts(tmp_path, monkeypatch):
    """A worker that never ends (here it sleeps, and has started a process that holds its output open) is killed
    after ``worker_timeout_s`` with what it started: the future names it in one line, the other worker's success
    stands, and the control's chain then starts."""
    from ordered_ssd.apps.check import launch as launch_mod

    hung = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(37)']); "
            "print('compiling', flush=True); time.sleep(91)")
    monkeypatch.setattr(launch_mod, "_train_command", lambda spec_path, record_path, label, extra, progress: [
        "-c", hung if label == "precompile 0/2" else "print('done')"])
    launch = Launcher(str(tmp_path), False, None)
    launch.worker_timeout_s = 5.0
    t0 = time.perf_counter()
    workers = launch.precompile("s", 2)
    (control,) = launch.alongside([[("s", "native-1", "native-1", [])]], after=workers)
    seconds, failures = workers.result(timeout=60)
    waited = time.perf_counter() - t0
    assert 5.0 <= seconds < 25 and waited < 25, (seconds, waited)
    log = tmp_path / "precompile-0.log"
    assert failures == [f"precompile-0: run precompile 0/2 (a fresh process) was killed after 5 s, still running "
                        f"(full output: {log})"]
    assert log.read_text() == "compiling\n" and (tmp_path / "precompile-1.log").read_text() == "done\n"
    deadline = time.monotonic() + 10  # a killed process is gone from /proc once reaped
    while (_sleepers(91) or _sleepers(37)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sleepers(91) == [] and _sleepers(37) == []
    control.result(timeout=60)  # the control's chain (a stand-in that prints) ran after the workers
    assert (tmp_path / "native-1.log").read_text() == "done\n" and launch._children == {}


def test_workers_run_without_triton_autotuning_cache(tmp_path, monkeypatch):
    """A worker's restricted, untimed choices must never be written for the control to read: its environment lacks
    TRITON_CACHE_AUTOTUNING (here each worker fails with exit code 3 if it sees it)."""
    from ordered_ssd.apps.check import launch as launch_mod

    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    monkeypatch.setattr(launch_mod, "_train_command", lambda spec_path, record_path, label, extra, progress: [
        "-c", "import os, sys; sys.exit(3 if 'TRITON_CACHE_AUTOTUNING' in os.environ else 0)"])
    seconds, failures = Launcher(str(tmp_path), False, None).precompile("s", 2).result(timeout=60)
    assert failures == [] and seconds > 0


def test_the_check_with_the_control_starts_it_after_its_workers(tmp_path, monkeypatch):
    """run_check with the control on one GPU's schedule (on the CPU: the workers sleep, and the control's runs train
    the ordered spec as stand-ins): the workers start with b and c after a's first step, the control's chains are
    given the workers' future, and their line is printed."""
    import os

    from ordered_ssd.apps.check import launch as launch_mod
    from ordered_ssd.apps.check.launch import Launcher as L
    from ordered_ssd.apps.check.run import run_check
    from tests.apps.check.test_run import _concurrent

    started = _concurrent(monkeypatch)
    afters = []
    alongside = L.alongside

    def recording(self, chains, after=None):
        afters.append(after)
        return alongside(self, chains, after)
    monkeypatch.setattr(L, "alongside", recording)  # inside the spy of _concurrent, which calls L.alongside
    command = launch_mod._train_command

    def cmd(spec_path, record_path, label, extra, progress):
        if label.startswith("precompile"):
            return ["-c", "import time; time.sleep(0.5)"]
        if label.startswith("native"):  # stand-ins: the ordered spec beside the native one
            spec_path = os.path.join(os.path.dirname(spec_path), "spec.json")
        return command(spec_path, record_path, label, extra, progress)
    monkeypatch.setattr(launch_mod, "_train_command", cmd)
    from ordered_ssd.apps.check import run as run_mod

    monkeypatch.setattr(run_mod, "default_jobs", lambda: 2)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY_CHECK]))
    lines = []
    out = tmp_path / "o"
    assert run_check(spec, str(out), stop_at=3, native=True, progress=False, print_fn=lines.append) == 0
    assert started == [["b"], ["c1", "c2"], ["native-1"], ["native-2"]]
    assert afters[0] is None and afters[1] is not None and afters[1].done()
    assert any(line.startswith("native control: 2 precompile workers ran for ") for line in lines), lines
    assert sorted(p.name for p in (out / "runs").iterdir() if p.name.startswith("precompile")) == [
        "precompile-0.log", "precompile-1.log"]
