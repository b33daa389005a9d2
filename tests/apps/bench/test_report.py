"""The bench's table, JSON, chart and merge (:mod:`ordered_ssd.apps.bench.report`), on synthetic results."""
import json
import os

import pytest

from ordered_ssd.apps import bench

PNG = b"\x89PNG\r\n\x1a\n"


def _synthetic():
    res = {"meta": {"gpu": "NVIDIA H200 (sm_90)", "date": "2026-01-01 00:00 UTC", "precision": "fp32 params",
                    "timer": "torch.cuda.Event per step", "command": "ordered-ssd bench",
                    "versions": {"torch": "2.11.0", "triton": "3.6.0", "mamba-ssm": "2.3.2.post1",
                                 "causal-conv1d": "1.7.0", "ordered-ssd": "0.1"},
                    "settings": {"repeats": 20, "warmup": 5, "bit_repeats": 10}}, "shapes": []}
    for i, name in enumerate(["S1", "S2"]):
        rows = {
            "native": {"mode": "native", "ms": 10.0 + i, "peak_mib": 1000.0, "bitwise": False, "bit_repeats": 10,
                       "distinct_digest_sets": 7},
            "upstream-det": {"mode": "upstream-det", "ms": 15.0, "peak_mib": 1100.0, "bitwise": True,
                             "bit_repeats": 10, "child_native": {"ms": 12.0, "peak_mib": 1000.0}},
            "literal": {"mode": "literal", "ms": 30.0, "peak_mib": 1500.0, "bitwise": True, "bit_repeats": 10,
                        "same_bits_as_ordered": True},
            "ordered": {"mode": "ordered", "ms": 10.5, "peak_mib": 1050.0, "bitwise": True, "bit_repeats": 10},
        }
        res["shapes"].append({"name": name, "dims": bench.SHAPES[name].dims(), "rows": rows})
    res["shapes"][1]["rows"]["literal"] = {"mode": "literal", "error": "timing: OutOfMemoryError: CUDA out of memory"}
    for sr in res["shapes"]:
        bench.finalize_ratios(sr)
    return res


def test_ratios_and_table():
    res = _synthetic()
    r = res["shapes"][0]["rows"]
    assert r["native"]["ratio_ms"] == 1.0 and r["ordered"]["ratio_ms"] == pytest.approx(1.05)
    assert r["ordered"]["ratio_mem"] == pytest.approx(1.05)
    assert r["upstream-det"]["ratio_ms"] == pytest.approx(1.5) and r["upstream-det"]["ratio_ms_child"] == 1.25
    assert r["upstream-det"]["ratio_mem_child"] == pytest.approx(1.1)
    md = bench.format_table(res)
    assert "| shape | dims | mode | ms/step | × native | × native (child) | peak MiB | × native | bitwise |" in md
    assert "| S1 | B2 L2048 d1024 N128 G1 P64 cs256 | ordered | 10.500 | 1.050 |  | 1050 | 1.050 | yes (10/10) |" in md
    assert "| upstream-det | 15.000 | 1.500 | 1.250 (mem 1.100) | 1100 | 1.100 | yes (10/10) |" in md
    assert "| native | 10.000 | 1.000 |  | 1000 | 1.000 | **no** (7 distinct of 10) |" in md
    assert "yes (10/10), = ordered" in md
    assert "| S2 | B8 L4096 d2048 N128 G1 P64 cs256 | literal | — | — | — | — | — | error¹ |" in md
    assert "¹ S2 literal: timing: OutOfMemoryError" in md
    assert "NVIDIA H200 (sm_90) · torch 2.11.0" in md


def test_write_results_table_json_png(tmp_path):
    res = _synthetic()
    paths = bench.write_results(str(tmp_path), res)
    assert paths["png_note"] is None
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(json.dumps(res))
    assert (tmp_path / "bench.md").read_text() == bench.format_table(res)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def test_merge(tmp_path, capsys):
    a, b = _synthetic(), _synthetic()
    b["shapes"] = [dict(b["shapes"][1], dims="replaced"), {"name": "X1", "dims": "x", "rows": {}}]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = tmp_path / "m"
    assert bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out)]) == 0
    m = json.loads((out / "bench.json").read_text())
    assert [s["name"] for s in m["shapes"]] == ["S1", "S2", "X1"] and m["shapes"][1]["dims"] == "replaced"
    assert "| S1 |" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    assert bench.main(["--merge", str(tmp_path / "bad.json"), "--out", str(out)]) == 2
