"""The whole bench suite on one small shape (GPU; :mod:`ordered_ssd.apps.bench`)."""
import json

from ordered_ssd.apps import bench


def test_gpu_smoke_every_mode(tmp_path):
    """The whole suite on one small shape (GPU only; no timing assertions): every mode measured, the ordered and
    literal gradients repeatable and equal, the child really in upstream's deterministic mode, the breakdown
    sees the fold kernels."""
    small = "2,256,256,64,1,64,64"
    rc = bench.main(["--shape", small, "--repeats", "3", "--warmup", "2", "--bit-repeats", "3", "--quiet",
                     "--breakdown", "--breakdown-shape", small, "--breakdown-steps", "1", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "bench.json").read_text())
    rows = res["shapes"][0]["rows"]
    assert rc == 0, {m: r.get("error") for m, r in rows.items()}
    for m in bench.MODES:
        assert rows[m]["ms"] > 0 and rows[m]["peak_mib"] > 0 and isinstance(rows[m]["bitwise"], bool), m
    assert rows["ordered"]["bitwise"] and rows["literal"]["bitwise"] and rows["literal"]["same_bits_as_ordered"]
    assert rows["upstream-det"]["deterministic_mode"] is True
    assert rows["upstream-det"]["child_native"]["ms"] > 0 and rows["upstream-det"]["ratio_ms_child"] > 0
    bd = json.loads((tmp_path / "breakdown.json").read_text())
    cats = bd["modes"]["ordered"]["categories"]
    assert cats.get("fold (ordered-ssd)", 0) > 0 and cats.get("SSD (mamba-ssm Triton)", 0) > 0, cats
    assert bd["modes"]["native"]["categories"].get("SSD (mamba-ssm Triton)", 0) > 0
