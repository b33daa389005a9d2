"""The suite on the CPU (:mod:`ordered_ssd.apps.bench.suite`): usage errors, a tiny smoke run of the harness
(reference path; no timing assertions), the time budget."""
import json

import torch

from ordered_ssd.apps import bench

TINY = "2,64,32,16,1,16,32"
SMOKE = ["--device", "cpu", "--shape", TINY, "--repeats", "3", "--warmup", "1", "--bit-repeats", "2", "--quiet"]
PNG = b"\x89PNG\r\n\x1a\n"


def test_usage_errors_exit_2(tmp_path, capsys):
    assert bench.main(["--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "give a small --shape" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert bench.main([*SMOKE, "--out", str(blocker / "sub")]) == 2
    assert "--out" in capsys.readouterr().err
    assert bench.main([*SMOKE, "--breakdown", "--breakdown-shape", "1,2", "--out", str(tmp_path)]) == 2
    assert "--breakdown-shape" in capsys.readouterr().err


def test_cpu_smoke_run(tmp_path, capsys):
    out = tmp_path / "out"
    rc = bench.main([*SMOKE, "--modes", "ordered,literal", "--out", str(out), "--breakdown", "--breakdown-shape",
                     TINY, "--breakdown-steps", "1"])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "| X1 | B2 L64 d32 N16 G1 P16 cs32 | ordered |" in stdout and "yes (2/2)" in stdout
    res = json.loads((out / "bench.json").read_text())
    assert res["meta"]["settings"] == {"repeats": 3, "warmup": 1, "bit_repeats": 2, "seed": 0}
    (sr,) = res["shapes"]
    assert sr["spec"] == "2,64,32,16,1,16,32" and set(sr["rows"]) == {"ordered", "literal"}
    for m in ("ordered", "literal"):
        r = sr["rows"][m]
        assert r.get("error") is None and r["n"] == 3 and len(r["ms_all"]) == 3 and r["ms"] > 0
        assert r["bitwise"] is True and r["bit_repeats"] == 2
        assert set(r["digests"]) == {n for n, _ in bench.LayerRunner(
            bench.parse_shape(TINY), ["ordered"], torch.device("cpu"), 0).params} | {"input"}
    assert sr["rows"]["literal"]["same_bits_as_ordered"] is True
    assert (out / "bench.png").read_bytes()[:8] == PNG
    assert (out / "bench.md").read_text().startswith("# ordered-ssd bench")
    bd = json.loads((out / "breakdown.json").read_text())
    assert bd["modes"]["ordered"]["error"] is None and bd["modes"]["ordered"]["kernels"]
    assert (out / "breakdown.md").read_text().startswith("# Per-kernel breakdown")


def test_time_budget_marks_skipped_work(tmp_path, capsys):
    rc = bench.main([*SMOKE, "--time-budget", "1e-9", "--out", str(tmp_path)])
    assert rc == 1
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["shapes"][0]["rows"]["ordered"]["error"] == "skipped: time budget"
    assert "error¹" in capsys.readouterr().out
