"""The per-kernel breakdown's grouping and table (:mod:`ordered_ssd.apps.bench.breakdown`)."""
import pytest

from ordered_ssd.apps import bench


def test_kernel_categories_and_breakdown_table():
    cat = bench.kernel_category
    assert cat("fold_kernel") == cat("scan_kernel") == "fold (ordered-ssd)"
    for own in ("fold_many_kernel", "example_sums_kernel", "gemm_fold_chain_kernel", "conv1d_grad_partials_kernel",
                "dA_cumsum_grad_kernel"):
        assert cat(own) == "fold (ordered-ssd)", own  # not GEMM (cuBLAS) or other
    assert cat("_chunk_scan_fwd_kernel") == cat("_bmm_chunk_bwd_kernel") == "SSD (mamba-ssm Triton)"
    assert cat("_state_passing_bwd_kernel") == "SSD (mamba-ssm Triton)"
    for m3 in ("mamba3_siso_fwd_kernel", "mamba3_siso_bwd_kernel_dqkv", "angle_dt_bwd_kernel"):
        assert cat(m3) == "Mamba-3 (mamba-ssm Triton)", m3
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
