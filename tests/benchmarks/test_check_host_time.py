"""``benchmarks/check_host_time.py``: on the CPU with a tiny model, plain training and the check's loop give a
wall time and a training-thread CPU time per step for every round (the spinning-event variant is CUDA's only), the
check's classes are back afterwards, and the spinning variant drops ``blocking`` from the events it makes."""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import check_host_time  # noqa: E402
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
    assert all(row["train_ms"] > 0 for row in r["rounds"]["check"])
    printed = capsys.readouterr().out
    assert printed.count("round ") == 4 and "training thread CPU" in printed
    assert train.Progress is progress


def test_per_step_needs_steps_after_the_skipped_ones():
    marks = [(float(i), 0.5 * i) for i in range(check_host_time.SKIP + 3)]
    assert check_host_time._per_step(marks) == (1000.0, 500.0)
    with pytest.raises(ValueError, match="--steps"):
        check_host_time._per_step(marks[:check_host_time.SKIP + 1])


def test_spinning_events_drop_blocking(monkeypatch):
    made = []
    monkeypatch.setattr(torch.cuda, "Event", lambda *args, **kwargs: made.append(kwargs) or "event")
    fake = torch.cuda.Event
    with check_host_time._spinning_events():
        assert torch.cuda.Event(blocking=True, enable_timing=False) == "event"
    assert made == [{"enable_timing": False}] and torch.cuda.Event is fake
