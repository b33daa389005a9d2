"""``benchmarks/hf_model_bench.py``: the CPU smoke mode (tiny hybrid config, upstream-det child included) writes the
JSON the GPU run writes, ordered's gradients repeat bitwise and equal the child's; the full configs have the sizes
the issue asks for (counted on the meta device); the original kernels' resolution is read from transformers'
wrappers."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "hf_model_bench.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import hf_model_bench as bench  # noqa: E402


def test_tiny_cpu_run_writes_the_results_json(tmp_path):
    out = tmp_path / "bench-hf.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--configs", "bamba-hybrid",
                           "--steps", "1", "--warmup", "0", "--bitwise-repeats", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| bamba-hybrid |" in proc.stdout
    r = json.loads(out.read_text())
    assert r["schema"] == bench.SCHEMA and r["complete"] is True
    for key in ("torch", "transformers", "git_commit", "device"):
        assert key in r["environment"]
    assert r["targets"] == {"ordered_vs_original_tokens_per_s": 0.97, "ordered_vs_upstream_det_tokens_per_s": 1.0}
    (run,) = r["runs"]
    assert run["config"] == "bamba-hybrid" and (run["batch"], run["seq_len"]) == (2, 64) and run["params"] > 0
    assert set(run["modes"]) == {"original", "ordered", "upstream-det"}
    for mode in run["modes"].values():
        assert mode["tokens_per_s"] > 0 and mode["ms_per_step_median"] > 0
        assert mode["fused_path_probe"]["all_without_cache_and_mask"] is True
        assert {"peak_bytes", "resident_bytes", "bitwise", "bitwise_eager_attn"} <= set(mode)
    ordered = run["modes"]["ordered"]
    assert ordered["bitwise"]["repeats"] == 2 and ordered["bitwise"]["distinct_digests"] == 1
    assert ordered["bitwise_eager_attn"]["distinct_digests"] == 1
    assert ordered["bitwise"]["differing_params_total"] == 0
    child = run["upstream_det_child"]
    assert child["env"] == {"MAMBA_DETERMINISTIC": "1", "CAUSAL_CONV1D_DETERMINISTIC": "1"}
    assert child["pid"] != os.getpid() and "error" not in child
    assert child["ordered"]["bitwise"]["distinct_digests"] == 1
    assert run["ordered_same_bits_across_processes"] is True
    assert set(run["ratios"]) == {"ordered_vs_original", "ordered_vs_upstream_det_same_process",
                                  "ordered_vs_upstream_det_cross_process"}
    assert set(run["targets_met"]) == {"vs_original", "vs_upstream_det"}
    assert r["summary"]["ordered_all_grads_bitwise"] is True
    assert r["summary"]["ordered_same_bits_across_processes"] is True


@pytest.mark.parametrize("name, lo, hi", [("mamba2-130m", 125e6, 135e6), ("bamba-hybrid", 200e6, 300e6)])
def test_full_configs_have_the_asked_sizes(name, lo, hi):
    cls, cfg, _ = bench.build_config(name, tiny=False, attn="sdpa")
    with torch.device("meta"):
        model = cls(cfg)
    assert lo <= sum(p.numel() for p in model.parameters()) <= hi
    kinds = bench.param_kinds(model)
    assert "mamba_mixer" in kinds.values()
    assert bench.has_attention(model) == (name == "bamba-hybrid")


def test_the_kernel_check_reads_what_transformers_resolved():
    from transformers.models.mamba2 import modeling_mamba2

    impl = bench._resolved_implementation(modeling_mamba2.mamba2_split_conv1d_scan_combined)
    assert callable(impl)  # here (no mamba-ssm): transformers' own fallback, which the CUDA run refuses
    assert bench.check_original_kernels([], torch.device("cpu"))["status"].startswith("cpu")


def test_bad_arguments_are_refused():
    for argv in (["--configs", "nope"], ["--shapes", "4by2048"], ["--bitwise-repeats", "1"]):
        with pytest.raises(SystemExit):
            bench._args(argv)
