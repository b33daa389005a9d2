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


def test_paired_ratio_to_upstream_det_goes_through_native_in_each_process():
    """ordered / upstream-det paired: (ordered / native, this process) / (upstream-det / native, fresh processes);
    only where the fresh-process native ran; the targets stay on the direct ratio."""
    rows = {"native": {"mode": "native", "ms": 6.0, "peak_mib": 100.0},
            "upstream-det": {"mode": "upstream-det", "ms": 4.0, "peak_mib": 100.0,
                             "child_native": {"ms": 5.0, "peak_mib": 100.0}},
            "ordered": {"mode": "ordered", "ms": 6.6, "peak_mib": 100.0}}
    sr = {"name": "X", "rows": rows}
    bench.finalize_ratios(sr)
    o = sr["rows"]["ordered"]
    assert abs(o["ratio_ms"] - 1.1) < 1e-12 and abs(o["ratio_ms_det"] - 1.65) < 1e-12
    assert abs(sr["rows"]["upstream-det"]["ratio_ms_child"] - 0.8) < 1e-12
    assert abs(o["ratio_ms_det_paired"] - 1.1 / 0.8) < 1e-12
    assert o["targets"]["upstream_det"] is False and o["targets"]["time"] is False
    del rows["upstream-det"]["child_native"]
    for r in rows.values():
        r.pop("ratio_ms_det_paired", None)
    bench.finalize_ratios(sr)
    assert "ratio_ms_det_paired" not in sr["rows"]["ordered"]
