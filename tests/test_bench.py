"""`ordered-ssd bench` on the CPU: argument parsing, the writers on synthetic results, the missing-CUDA exit,
and a tiny smoke run of the harness itself (reference path; no timing assertions)."""
import json
import os

import pytest
import torch

from ordered_ssd import bench
from ordered_ssd.cli import main as cli_main

TINY = "2,64,32,16,1,16,32"
SMOKE = ["--device", "cpu", "--shape", TINY, "--repeats", "3", "--warmup", "1", "--bit-repeats", "2", "--quiet"]
PNG = b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------------------------- parsing
def test_named_shapes_match_the_issue():
    s = bench.SHAPES
    assert list(s) == ["S1", "S2", "S3", "S4", "S5"]
    assert (s["S1"].B, s["S1"].L, s["S1"].d_model, s["S1"].N, s["S1"].G) == (2, 2048, 1024, 128, 1)
    assert (s["S2"].B, s["S2"].L, s["S2"].d_model, s["S2"].N, s["S2"].G) == (8, 4096, 2048, 128, 1)
    assert (s["S3"].B, s["S3"].L, s["S3"].d_model, s["S3"].N, s["S3"].G) == (4, 4096, 4096, 128, 8)
    assert (s["S4"].B, s["S4"].L, s["S4"].d_model, s["S4"].N, s["S4"].G) == (1, 65536, 1024, 128, 1)
    assert (s["S5"].B, s["S5"].L, s["S5"].d_model, s["S5"].N, s["S5"].G) == (64, 512, 768, 64, 1)
    assert all(x.headdim == 64 and x.chunk == 256 for x in s.values())
    assert s["S3"].nheads == 128


def test_parse_shape():
    s = bench.parse_shape("4, 1024, 512, 64, 2")
    assert (s.B, s.L, s.d_model, s.N, s.G, s.headdim, s.chunk) == (4, 1024, 512, 64, 2, 64, 256)
    assert s.name == "4,1024,512,64,2,64,256"
    t = bench.parse_shape(TINY, name="T")
    assert (t.name, t.headdim, t.chunk, t.nheads) == ("T", 16, 32, 4)
    assert bench.parse_shape(t.spec()) == bench.Shape(t.spec(), 2, 64, 32, 16, 1, 16, 32)
    assert bench.named_or_parsed_shape(" s2 ") is bench.SHAPES["S2"]
    assert bench.named_or_parsed_shape(TINY) == bench.parse_shape(TINY)
    with pytest.raises(ValueError, match="unknown|5 or 7"):
        bench.named_or_parsed_shape("S9")


@pytest.mark.parametrize("text,needle", [
    ("1,2", "5 or 7 comma-separated positive integers"),
    ("1,2,3,4,5,6", "5 or 7"),
    ("2,64,32,16,x", "G must be a positive integer, got 'x'"),
    ("2,0,32,16,1", "L must be a positive integer, got 0"),
    ("2,64,32,16,1,48,32", "headdim 48 must divide d_inner = 2 * d_model = 64"),
    ("2,64,64,16,3,16,32", "G 3 must divide the number of heads"),
])
def test_bad_shape_is_a_clear_error(text, needle):
    with pytest.raises(ValueError, match="--shape") as ei:
        bench.parse_shape(text)
    assert needle in str(ei.value)


def test_bad_shape_on_the_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as ei:
        cli_main(["bench", "--shape", "1,2,3"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shape: expected B,L,d_model,N,G[,headdim,chunk]" in err and "'1,2,3'" in err


def test_shape_list_and_modes():
    assert [s.name for s in bench.parse_shape_list("s3,S1,S3")] == ["S3", "S1"]
    with pytest.raises(ValueError, match="unknown shape 'S9'"):
        bench.parse_shape_list("S1,S9")
    with pytest.raises(ValueError, match="--shapes"):
        bench.parse_shape_list("S1,,S2")
    assert bench.parse_modes("ordered, native,upstream-det") == ["native", "upstream-det", "ordered"]
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        bench.parse_modes("ordered,fast")


def test_parser_defaults_and_selection():
    a = bench.build_parser().parse_args([])
    assert (a.repeats, a.warmup, a.bit_repeats, a.breakdown_shape, a.device) == (20, 5, 10, "S2", "cuda")
    assert a.shapes is None and a.shape == [] and a.modes is None
    a = bench.build_parser().parse_args(["--shapes", "S1,S3", "--shape", TINY, "--shape", "1,128,64,16,1",
                                         "--modes", "ordered,literal"])
    assert [s.name for s in bench._resolve_shapes(a)] == ["S1", "S3", "X1", "X2"]
    assert a.modes == ["literal", "ordered"]
    assert [s.name for s in bench._resolve_shapes(bench.build_parser().parse_args([]))] == list(bench.SHAPES)
    for bad in (["--repeats", "0"], ["--warmup", "-1"], ["--modes", "x"], ["--time-budget", "0"]):
        with pytest.raises(SystemExit):
            bench.build_parser().parse_args(bad)


def test_bench_subcommand_passes_its_options_through(tmp_path, capsys):
    rc = cli_main(["bench", *SMOKE, "--modes", "ordered", "--out", str(tmp_path)])
    assert rc == 0
    assert "| X1 | B2 L64 d32 N16 G1 P16 cs32 | ordered |" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- requirements
def test_bench_without_cuda_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["bench"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("ordered-ssd bench: error: no CUDA device")
    assert "pip install ordered-ssd[cuda]" in err


def test_missing_requirements_names_what_is_missing():
    def spec(missing):
        return lambda name: None if name in missing else object()

    msg = bench.missing_requirements("cuda", bench.MODES, cuda_available=True, find_spec=spec({"mamba_ssm"}))
    assert "mamba-ssm not installed" in msg and "causal-conv1d" not in msg and "pip install ordered-ssd[cuda]" in msg
    msg = bench.missing_requirements("cuda", ["native"], cuda_available=False, find_spec=spec(set()))
    assert msg.startswith("no CUDA device") and "pip install ordered-ssd[cuda]" in msg
    msg = bench.missing_requirements("cuda", ["ordered"], cuda_available=True, find_spec=spec(set()),
                                     native_path=lambda: (False, "mamba-ssm 2.2 is not supported"))
    assert "native path is unavailable" in msg and "mamba-ssm 2.2" in msg
    assert bench.missing_requirements("cuda", ["native"], cuda_available=True, find_spec=spec(set())) is None
    assert bench.missing_requirements("cpu", ["ordered", "literal"]) is None
    assert "upstream-det" in bench.missing_requirements("cpu", ["upstream-det", "ordered"])
    assert "--device" in bench.missing_requirements("tpu", ["ordered"])


def test_usage_errors_exit_2(tmp_path, capsys):
    assert bench.main(["--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "give a small --shape" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert bench.main([*SMOKE, "--out", str(blocker / "sub")]) == 2
    assert "--out" in capsys.readouterr().err
    assert bench.main([*SMOKE, "--breakdown", "--breakdown-shape", "1,2", "--out", str(tmp_path)]) == 2
    assert "--breakdown-shape" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- writers
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


def test_ratios_without_native_are_empty():
    sr = {"name": "X", "rows": {"ordered": {"mode": "ordered", "ms": 3.0, "peak_mib": None, "bitwise": True}}}
    bench.finalize_ratios(sr)
    assert sr["rows"]["ordered"]["ratio_ms"] is None and sr["rows"]["ordered"]["ratio_mem"] is None


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


def test_kernel_categories_and_breakdown_table():
    cat = bench.kernel_category
    assert cat("fold_kernel") == cat("scan_kernel") == "fold (ordered-ssd)"
    assert cat("_chunk_scan_fwd_kernel") == cat("_bmm_chunk_bwd_kernel") == "SSD (mamba-ssm Triton)"
    assert cat("_state_passing_bwd_kernel") == "SSD (mamba-ssm Triton)"
    assert cat("_layer_norm_bwd_kernel") == "gated RMSNorm / SwiGLU (Triton)"
    conv = "void causal_conv1d_fwd_kernel<Causal_conv1d_fwd_kernel_traits<128, 4, true, c10::BFloat16>>(ConvParamsBase)"
    assert cat(conv) == "causal-conv1d"
    assert cat("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN") == "GEMM (cuBLAS)"
    assert cat("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "GEMM (cuBLAS)"
    assert cat("Memcpy DtoD (Device -> Device)") == "memcpy/memset"
    assert cat("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, ...)") \
        == "torch elementwise/reduce"
    assert cat("something_else") == "other"
    ev = [("_chunk_scan_fwd_kernel", 100.0), ("_chunk_scan_fwd_kernel", 100.0), ("fold_kernel", 30.0),
          ("nvjet_x", 500.0), ("Memset (Device)", 1.0)]
    agg = bench.aggregate_kernels(ev, steps=2)
    assert agg[0] == {"name": "nvjet_x", "category": "GEMM (cuBLAS)", "calls_per_step": 0.5, "ms_per_step": 0.25}
    assert agg[1]["name"] == "_chunk_scan_fwd_kernel" and agg[1]["calls_per_step"] == 1.0
    assert agg[1]["ms_per_step"] == pytest.approx(0.1)
    assert bench.aggregate_kernels([("op", 50.0, 4)], steps=2)[0]["calls_per_step"] == 2.0
    nat = bench.aggregate_kernels(ev[:2] + ev[3:], steps=2)

    def cats(k):
        c = {}
        for r in k:
            c[r["category"]] = c.get(r["category"], 0.0) + r["ms_per_step"]
        return c

    bd = {"shape": "S2", "dims": "B8", "steps": 2, "unit": "GPU kernel time", "modes": {
        "native": {"kernels": nat, "categories": cats(nat), "total_ms_per_step": sum(k["ms_per_step"] for k in nat)},
        "ordered": {"kernels": agg, "categories": cats(agg), "total_ms_per_step": sum(k["ms_per_step"] for k in agg)}}}
    md = bench.format_breakdown(bd)
    assert "| fold (ordered-ssd) | 0.000 | 0.015 | +0.015 |" in md
    assert "| `fold_kernel` | fold (ordered-ssd) | 0 | 0 | 0.5 | 0.015 | +0.015 |" in md
    assert "| **total** |" in md
    assert "(1 other kernels)" in bench.format_breakdown(bd, top=3)


# ----------------------------------------------------------------------------------------------- harness
def test_interleaving_rotates_the_order():
    calls = []
    times = bench.time_interleaved(calls.append, ["a", "b", "c"], 4, torch.device("cpu"))
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {m: len(t) for m, t in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for ts in times.values() for t in ts)


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


def test_child_process_gets_the_switches_and_reports_json():
    """The upstream-det plumbing, run on the CPU with the ordered mode: the deterministic switches are set in the
    child's environment only, and its results come back as JSON lines."""
    shape = bench.parse_shape(TINY, name="T")
    settings = {"repeats": 2, "warmup": 1, "bit_repeats": 2, "seed": 0}
    before = {k: os.environ.get(k) for k in bench.DET_ENV}
    ch = bench.run_child("upstream-det", [shape], settings, "cpu", mode="ordered")
    assert {k: os.environ.get(k) for k in bench.DET_ENV} == before
    assert ch["returncode"] == 0 and ch["error"] is None, ch
    assert ch["meta"]["env"]["MAMBA_DETERMINISTIC"] == "1" and ch["meta"]["env"]["CAUSAL_CONV1D_DETERMINISTIC"] == "1"
    row = ch["shapes"]["T"]["rows"]["ordered"]
    assert row.get("error") is None and row["n"] == 2 and row["bitwise"] is True
    with pytest.raises(ValueError, match="kind"):
        bench.run_child("other", [shape], settings, "cpu")


@pytest.mark.gpu
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


def test_host_profile_on_the_cpu(tmp_path, capsys):
    """benchmarks/host_profile.py runs one shape on the reference path and writes what it measured: host times
    for the mode asked for and a cProfile in which the ordered backward ran once per profiled step (no timing
    assertions)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "host_profile.py")
    spec = importlib.util.spec_from_file_location("host_profile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--shape", TINY, "--device", "cpu", "--steps", "2", "--top", "50", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"== {TINY} ordered: host " in out
    res = json.load(open(tmp_path / f"host_profile_{TINY}.json"))
    assert res["dims"] == "B2 L64 d32 N16 G1 P16 cs32" and list(res["modes"]) == ["ordered"]
    r = res["modes"]["ordered"]
    assert r["host_ms_median"] > 0 and r["gpu_ms_median"] is None
    prof = r["profile"]["cumulative"]
    # the ordered backward ran once per profiled step (2), inside autograd
    line = next(ln for ln in prof.splitlines() if "(ordered_reference_mamba2_bwd)" in ln)
    assert line.split()[0] == "2", line
