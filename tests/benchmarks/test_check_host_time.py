"""``benchmarks/check_host_time.py``: on the CPU with a tiny model, plain training and the check's loop give, per
round, a wall time and a training-thread CPU time per step over the same span (the spinning-event variant is CUDA's
only); one mark a step; bad arguments are refused before training; the check's classes are back afterwards; the
spinning variant reaches the events StepDigests makes (:func:`copy_event`), which are blocking otherwise."""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import check_host_time  # noqa: E402
import check_overhead  # noqa: E402
from tests.benchmarks.test_check_overhead import TINY  # noqa: E402


def test_rounds_are_timed_per_step(tmp_path, capsys):
    from ordered_ssd.apps.check import train

    progress = train.Progress
    path = tmp_path / "h.json"
    assert check_host_time.main([*TINY, "--steps", "8", "--rounds", "2", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert set(r["rounds"]) == {"plain", "check"} and r["steps"] == 8 and r["skip"] == check_host_time.SKIP
    for mode, rows in r["rounds"].items():
        assert len(rows) == 2
        for row in rows:
            assert row["wall_ms"] > 0 and row["thread_cpu_ms"] > 0
            assert ("train_ms" in row) == (mode == "check")
    for row in r["rounds"]["check"]:
        assert row["train_ms"] > 0 and row["submit_ms"] >= row["wait_ms"] >= 0 and row["submit_ms"] > 0
    printed = capsys.readouterr().out
    assert printed.count("round ") == 4 and "training thread CPU" in printed and "submit" in printed
    assert train.Progress is progress


def test_check_rows_are_its_train_s_and_stats_per_step(tmp_path, monkeypatch):
    def fake_checked(spec, device, steps, out):  # the marks of a loop, its train_s and StepDigests.stats
        from ordered_ssd.apps.check import train

        bar = train.Progress("a", steps, enabled=False)
        for step in range(steps):
            bar.update(step, None)
        return 0.9, {"submits": 2 * steps, "submit_s": 0.18, "wait_s": 0.045}

    monkeypatch.setattr(check_overhead, "_checked", fake_checked)
    path = tmp_path / "h.json"
    assert check_host_time.main([*TINY, "--steps", "9", "--rounds", "1", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())["rounds"]["check"]
    assert row["train_ms"] == pytest.approx(100.0) and row["submit_ms"] == pytest.approx(20.0)
    assert row["wait_ms"] == pytest.approx(5.0)


def test_step_digests_make_their_events_with_copy_event():
    from ordered_ssd.apps.check import digests

    names = digests.StepDigests.submit.__code__.co_names  # the globals and attributes submit looks up
    assert "copy_event" in names and "Event" not in names


def test_one_mark_a_step(tmp_path):
    spec, device, data = check_overhead.check_setup([*TINY, "--steps", "7"])
    assert len(check_host_time.plain(spec, data, device, 7)) == 7
    marks, train_s, stats = check_host_time.checked(spec, device, 7, str(tmp_path))
    assert len(marks) == 7 and train_s > 0 and stats["submits"] == 14


def test_per_step_is_over_the_steps_after_the_first_skip():
    skip = check_host_time.SKIP
    # marks after steps 0..skip+2: steps skip..skip+2 (three) take 10, 20 and 30 ms of wall, 1, 2 and 3 ms of CPU
    marks = [(0.0, 0.0)] * skip + [(0.01, 0.001), (0.03, 0.003), (0.06, 0.006)]
    wall, cpu = check_host_time._per_step(marks)
    assert wall == pytest.approx(20.0) and cpu == pytest.approx(2.0)
    with pytest.raises(ValueError, match="marks: expected more than"):
        check_host_time._per_step(marks[:skip])


@pytest.mark.parametrize("flags, message", [(["--rounds", "0"], "--rounds: expected >= 1, got 0"),
                                            (["--steps", "5"], "--steps: expected more than 5 .*, got 5$"),
                                            ])
def test_bad_arguments_are_refused_before_training(flags, message, monkeypatch):
    monkeypatch.setattr(check_host_time, "plain", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(ValueError, match=message):
        check_host_time.main([*TINY, "--steps", "8", *flags])


def test_copy_events_are_blocking_and_spin_in_the_variant(monkeypatch):
    from ordered_ssd.apps.check import digests

    made = []
    monkeypatch.setattr(torch.cuda, "Event", lambda *args, **kwargs: made.append(kwargs) or "event")
    fake = torch.cuda.Event
    assert digests.copy_event() == "event" and made == [{"blocking": True}]
    with check_host_time._spinning_events():
        assert digests.copy_event() == "event"
    assert made[1] == {} and torch.cuda.Event is fake


def test_the_spin_flag_spins(tmp_path, monkeypatch):
    entered = []
    real = check_host_time._spinning_events

    def recording():
        entered.append(True)
        return real()

    monkeypatch.setattr(check_host_time, "_spinning_events", recording)
    spec, device, _ = check_overhead.check_setup([*TINY, "--steps", "6"])
    check_host_time.checked(spec, device, 6, str(tmp_path))
    assert entered == []
    check_host_time.checked(spec, device, 6, str(tmp_path), spin=True)
    assert entered == [True]
