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


def _det_rows(ordered_ms: float, child_native_ms: float, **ordered) -> dict:
    """A shape's rows: native 6 ms here, upstream-det 4 ms in its child, the fresh native ``child_native_ms``,
    ordered ``ordered_ms`` (with ``ordered``'s extra keys); 100 MiB each."""
    return {"native": {"mode": "native", "ms": 6.0, "peak_mib": 100.0},
            "upstream-det": {"mode": "upstream-det", "ms": 4.0, "peak_mib": 100.0,
                             "child_native": {"ms": child_native_ms, "peak_mib": 100.0}},
            "ordered": {"mode": "ordered", "ms": ordered_ms, "peak_mib": 100.0, **ordered}}


def test_paired_ratio_to_upstream_det_goes_through_native_in_each_process():
    """ordered / upstream-det paired: (ordered / native, this process) / (upstream-det / native, fresh processes);
    only where the fresh-process native ran."""
    rows = _det_rows(6.6, 5.0)
    sr = {"name": "X", "rows": rows}
    bench.finalize_ratios(sr)
    o = sr["rows"]["ordered"]
    assert abs(o["ratio_ms"] - 1.1) < 1e-12 and abs(o["ratio_ms_det"] - 1.65) < 1e-12
    assert abs(sr["rows"]["upstream-det"]["ratio_ms_child"] - 0.8) < 1e-12
    assert abs(o["ratio_ms_det_paired"] - 1.1 / 0.8) < 1e-12
    assert o["targets"]["upstream_det"] is False and o["targets"]["time"] is False
    del rows["upstream-det"]["child_native"]
    bench.finalize_ratios(sr)  # a second pass drops the paired ratio that no longer applies
    assert "ratio_ms_det_paired" not in sr["rows"]["ordered"]
    assert sr["rows"]["ordered"]["targets"]["upstream_det_ratio"] == "ratio_ms_det"


def test_upstream_det_target_is_judged_on_the_paired_ratio_where_there_is_one():
    """Native runs 1.5x slower in this process than in a fresh one: ordered at 0.75 of this process's native is
    1.125x upstream-det directly, but 0.75 of upstream-det paired (upstream-det = native in fresh processes): met.
    Without the fresh-process native the direct ratio decides: missed."""
    rows = _det_rows(4.5, 4.0)
    sr = {"name": "X", "rows": rows}
    bench.finalize_ratios(sr)
    o = sr["rows"]["ordered"]
    assert abs(o["ratio_ms_det"] - 1.125) < 1e-12 and abs(o["ratio_ms_det_paired"] - 0.75) < 1e-12
    assert o["targets"] == {"time": True, "memory": True, "upstream_det": True, "met": True,
                            "upstream_det_ratio": "ratio_ms_det_paired"}
    assert "all met on 1 of 1 shape (X)" in bench.targets_summary({"shapes": [sr]})
    del rows["upstream-det"]["child_native"]
    bench.finalize_ratios(sr)
    assert o["targets"] == {"time": True, "memory": True, "upstream_det": False, "met": False,
                            "upstream_det_ratio": "ratio_ms_det"}
    assert "missed on X (det 1.125)" in bench.targets_summary({"shapes": [sr]})
    rows["upstream-det"]["child_native"] = {"ms": 2.0, "peak_mib": 100.0}  # upstream-det 2x its fresh native
    bench.finalize_ratios(sr)
    assert o["targets"]["upstream_det"] is True  # paired 0.75 / 2 = 0.375
    rows["upstream-det"]["child_native"] = {"ms": 6.0, "peak_mib": 100.0}  # paired 0.75 / (4 / 6) = 1.125
    bench.finalize_ratios(sr)
    assert o["targets"]["upstream_det"] is False
    assert "missed on X (det (paired) 1.125)" in bench.targets_summary({"shapes": [sr]})


def test_the_same_process_ratio_decides_the_upstream_det_target_before_the_paired_one():
    """ordered ran beside upstream-det in its child (``in_det_process``): its median over upstream-det's median there
    decides (a ratio of medians, as the time target), whatever the ratios across processes say; an error there
    falls back to the paired ratio; an upstream-det row that is an error, or a child not in deterministic mode,
    gives no ratio at all. The table shows every ratio, names the deciding one and notes different bits."""
    rows = _det_rows(4.5, 4.0, in_det_process={"ms": 4.2, "ratio_per_round": 0.98, "host_ms": 4.0,
                                                "bitwise": True, "same_bits": True})
    sr = {"name": "X", "dims": "x", "rows": rows}
    bench.finalize_ratios(sr)
    o = rows["ordered"]
    assert o["ratio_ms_det_paired"] == 0.75 and abs(o["ratio_ms_det_same_process"] - 1.05) < 1e-12  # 4.2 / 4.0
    assert o["targets"]["upstream_det"] is False  # not the per-round 0.98
    assert o["targets"]["upstream_det_ratio"] == "ratio_ms_det_same_process"
    assert "missed on X (det (same process) 1.050)" in bench.targets_summary({"shapes": [sr]})

    def table():
        return bench.format_table({"meta": {}, "modes": ["native", "upstream-det", "ordered"], "shapes": [sr]})
    md = table()
    assert "| 1.125 (paired 0.750) (same process 1.050) |" in md and "det **✗** (same process) |" in md
    assert "different bits" not in md and "not repeatable" not in md
    o["in_det_process"]["same_bits"] = False
    assert "X ordered: different bits in the upstream-det process" in table()
    o["in_det_process"].update(same_bits=True, bitwise=False)
    assert "X ordered: not repeatable in the upstream-det process" in table()
    o["in_det_process"] = {"error": "upstream-det child: stopped at the time budget"}
    bench.finalize_ratios(sr)
    assert o["ratio_ms_det_same_process"] is None and o["targets"]["upstream_det"] is True
    assert o["targets"]["upstream_det_ratio"] == "ratio_ms_det_paired" and "det ✓ (paired) |" in table()
    o["in_det_process"] = {"ms": 3.0}
    for bad in ({"error": "memory: OutOfMemoryError"}, {"deterministic_mode": False}):
        rows["upstream-det"].update(bad)
        bench.finalize_ratios(sr)
        assert (o["ratio_ms_det"], o["ratio_ms_det_same_process"], o.get("ratio_ms_det_paired")) == (None, None, None)
        assert o["targets"]["upstream_det"] is None and o["targets"]["upstream_det_ratio"] is None
        assert o["targets"]["met"] is None
        assert "not all measured on X" in bench.targets_summary({"shapes": [sr]})
        for k in bad:
            del rows["upstream-det"][k]
