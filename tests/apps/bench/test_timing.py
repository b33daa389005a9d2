"""Timing and ratios (:mod:`ordered_ssd.apps.bench.timing`)."""
import torch

from ordered_ssd.apps import bench


def test_ratios_without_native_are_empty():
    sr = {"name": "X", "rows": {"ordered": {"mode": "ordered", "ms": 3.0, "peak_mib": None, "bitwise": True}}}
    bench.finalize_ratios(sr)
    assert sr["rows"]["ordered"]["ratio_ms"] is None and sr["rows"]["ordered"]["ratio_mem"] is None


def test_interleaving_rotates_the_order():
    calls = []
    times = bench.time_interleaved(calls.append, ["a", "b", "c"], 4, torch.device("cpu"))
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {m: len(t) for m, t in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for ts in times.values() for t in ts)
