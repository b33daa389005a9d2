"""The whole bench suite on small shapes (GPU; :mod:`ordered_ssd.apps.bench`)."""
import json

import torch

from ordered_ssd.apps import bench


def test_gpu_smoke_every_mode(tmp_path):
    """The whole suite on one small shape (GPU only; no timing assertions): the precompile workers (default on
    CUDA) succeed, every mode measured (host time, launches), the ordered and literal gradients repeatable and
    equal, the child really in upstream's deterministic mode, the breakdown sees the fold kernels."""
    small = "2,256,256,64,1,64,64"
    rc = bench.main(["--shape", small, "--repeats", "3", "--warmup", "2", "--bit-repeats", "3", "--quiet",
                     "--breakdown", "--breakdown-shape", small, "--breakdown-steps", "1", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "bench.json").read_text())
    rows = res["shapes"][0]["rows"]
    assert rc == 0, {m: r.get("error") for m, r in rows.items()}
    pre = res["precompile"]
    # one key: native's candidates in k slices (plain tasks, slice [i, k]), then one upstream-det task
    kinds = [t["kind"] for t in pre["tasks"]]
    k = len(kinds) - 1
    assert pre["failed"] == 0 and k >= 1 and kinds == ["plain"] * k + ["upstream-det"], pre
    if k > 1:
        assert [t["name"].rsplit("-", 1)[1] for t in pre["tasks"][:k]] == [f"slice{i}of{k}" for i in range(k)], pre
    assert pre["tasks"][-1]["deterministic_mode"] is True
    assert all(t["deterministic_mode"] is False for t in pre["tasks"][:k])
    for m in bench.MODES:
        r = rows[m]
        assert r["ms"] > 0 and r["peak_mib"] > 0 and isinstance(r["bitwise"], bool), m
        assert r["host_ms"] > 0 and r["launches"] > 10 and (r["launches"] * r["launch_steps"]).is_integer(), m
        assert sum(r["launches_by_category"].values()) == r["launches"], m
    assert rows["ordered"]["launches_by_category"]["fold (ordered-ssd)"] > 0
    assert rows["ordered"]["bitwise"] and rows["literal"]["bitwise"] and rows["literal"]["same_bits_as_ordered"]
    assert rows["upstream-det"]["deterministic_mode"] is True
    assert rows["upstream-det"]["child_native"]["ms"] > 0 and rows["upstream-det"]["ratio_ms_child"] > 0
    assert rows["ordered"]["ratio_ms_det"] == rows["ordered"]["ms"] / rows["upstream-det"]["ms"]
    assert set(rows["ordered"]["targets"]) == {"time", "memory", "upstream_det", "met", "upstream_det_ratio"}
    assert all(isinstance(rows["ordered"]["targets"][k], bool) for k in ("time", "memory", "upstream_det", "met"))
    # ordered ran beside upstream-det in its process too, with the same bits: that ratio decides the target
    same = rows["ordered"]["in_det_process"]
    assert same["same_bits"] is True and same["bitwise"] is True and same["ratio_per_round"] > 0, same
    assert rows["ordered"]["ratio_ms_det_same_process"] == same["ms"] / rows["upstream-det"]["ms"]
    assert rows["ordered"]["ratio_ms_det_paired"] > 0  # the fresh native ran
    assert rows["ordered"]["targets"]["upstream_det_ratio"] == "ratio_ms_det_same_process"
    bd = json.loads((tmp_path / "breakdown.json").read_text())
    cats = bd["modes"]["ordered"]["categories"]
    assert cats.get("fold (ordered-ssd)", 0) > 0 and cats.get("SSD (mamba-ssm Triton)", 0) > 0, cats
    assert bd["modes"]["native"]["categories"].get("SSD (mamba-ssm Triton)", 0) > 0


def test_gpu_fp16_row_and_results_file(tmp_path):
    """An fp16 shape runs every mode in fp16 (u, dout and their gradient fp16, the pinned configurations
    described for float16) with bitwise-repeatable ordered gradients; --results-json gets the run and --render
    prints it."""
    shape = bench.parse_shape("2,512,256,32,2,32,128,fp16")
    runner = bench.LayerRunner(shape, ["native", "ordered"], torch.device("cuda"), 0)
    for m in ("native", "ordered"):
        runner.step(m)
        assert runner.u.dtype == torch.float16 and runner.u.grad.dtype == torch.float16, m
    del runner
    results_json = tmp_path / "results" / "bench.json"
    rc = bench.main(["--shape", shape.spec(), "--modes", "native,upstream-det,ordered", "--repeats", "3",
                     "--warmup", "2", "--bit-repeats", "3", "--no-native-child", "--precompile-jobs", "2", "--quiet",
                     "--out", str(tmp_path / "out"), "--results-json", str(results_json)])
    res = json.loads((tmp_path / "out" / "bench.json").read_text())
    sr = res["shapes"][0]
    assert rc == 0, {m: r.get("error") for m, r in sr["rows"].items()}
    assert sr["dtype"] == "fp16" and sr["dims"].endswith(" fp16") and "error" not in sr["pinned"]
    assert sr["rows"]["ordered"]["bitwise"] is True and sr["rows"]["upstream-det"]["bitwise"] is True
    (run,) = bench.load_runs(str(results_json))
    assert run["meta"]["run_id"] == res["meta"]["run_id"]
    assert "| X1 | B2 L512 d256 N32 G2 P32 cs128 fp16 | ordered |" in bench.render(str(results_json))


def test_gpu_mamba3_smoke(tmp_path):
    """``--layer mamba3`` on one small shape (GPU only; no timing assertions): native Mamba3, OrderedMamba3 and its
    literal mode measured in bf16 without autocast, the precompile workers' slices of native's candidates succeed,
    the ordered and literal gradients repeatable and equal, native's rows with a peak memory, the targets time and
    memory only, the table the Mamba-3 one."""
    small = "2,256,256,32,1,32,32"
    runner = bench.LayerRunner(bench.parse_shape(small, name="T", layer="mamba3"), ["native", "ordered"],
                               torch.device("cuda"), 0)
    for m in ("native", "ordered"):
        runner.step(m)
        assert runner.u.dtype == torch.bfloat16 and runner.u.grad.dtype == torch.bfloat16, m
        assert runner.layers[m].in_proj.weight.dtype == torch.bfloat16 and runner.autocast is False, m
    del runner
    rc = bench.main(["--layer", "mamba3", "--shape", small, "--repeats", "3", "--warmup", "2", "--bit-repeats", "3",
                     "--precompile-jobs", "2", "--quiet", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "bench.json").read_text())
    sr = res["shapes"][0]
    rows = sr["rows"]
    assert rc == 0, {m: r.get("error") for m, r in rows.items()}
    assert res["meta"]["layer"] == "mamba3" and sr["layer"] == "mamba3" and sr["name"] == "MX1"
    assert res["precompile"]["failed"] == 0, res["precompile"]
    assert sorted(rows) == ["literal", "native", "ordered"]
    for m, r in rows.items():
        assert r["ms"] > 0 and r["peak_mib"] > 0 and r["host_ms"] > 0 and r["launches"] > 0, m
    assert rows["ordered"]["bitwise"] and rows["literal"]["bitwise"] and rows["literal"]["same_bits_as_ordered"]
    assert set(rows["ordered"]["targets"]) == {"time", "memory", "met"}
    assert "| MX1 | B2 L256 d256 N32 G1 P32 cs32 bf16 | ordered |" in (tmp_path / "bench.md").read_text()
