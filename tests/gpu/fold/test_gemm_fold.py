"""GPU: ``fold_example_gemms`` (one Triton launch for a projection's weight gradient) is the lexical fold of
per-example partials that do not depend on the rest of the batch.

Checked bit for bit: the batch result against a :class:`LexicalFold` over the kernel's own single-segment results
(so a segment's partial is the same alone or in any batch, and the segments are added one at a time, example 0's
first; up to ``GEMM_FOLD_SEGMENT_L`` positions an example is one segment); continuing from ``init`` against the
whole batch; repeats; strided inputs. And by value against fp64.
"""

import pytest
import torch

from tests.helpers import bits_equal

CASES = [  # E, L, M, N: unaligned M/N/L, L below one K block, a single example, S5's in_proj width
    (9, 300, 136, 1000),
    (3, 37, 5, 260),
    (1, 1000, 300, 129),
    (4, 20, 3224, 96),
]


def _inputs(E, L, M, N, dtype, seed=5):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dy = torch.randn(E, L, M, device="cuda", generator=g).to(dtype)
    x = torch.randn(E, L, N, device="cuda", generator=g).to(dtype)
    return dy, x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("E,L,M,N", CASES)
def test_fold_example_gemms_is_the_fold_of_single_example_partials(dtype, E, L, M, N):
    from ordered_ssd.fold import LexicalFold, fold_example_gemms

    dy, x = _inputs(E, L, M, N, dtype)
    got = fold_example_gemms(dy, x)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    fold = LexicalFold(torch.float32)
    for e in range(E):
        fold.add(fold_example_gemms(dy[e:e + 1], x[e:e + 1]))
    assert bits_equal(got, fold.result())
    for _ in range(5):
        assert bits_equal(fold_example_gemms(dy, x), got)
    if E > 1:
        k = E // 2
        assert bits_equal(fold_example_gemms(dy[k:], x[k:], init=fold_example_gemms(dy[:k], x[:k])), got)
    ref = torch.einsum("elm,eln->mn", dy.double(), x.double())
    # fp32 sums (bf16/fp16 products are exact; fp32 ones must not be TF32, which would miss this by ~10x)
    assert (got.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
# (40, 1, 520, 300): one position per example (reduction version 4: L is never compiled as a constant)
# (2, 40000, 136, 200): three segments per example, the last one shorter (reduction version 5)
@pytest.mark.parametrize("E,L,M,N", [(64, 100, 300, 200), (13, 512, 3224, 96), (2, 64, 1000, 1000),
                                     (40, 1, 520, 300), (2, 40000, 136, 200)])
def test_segments_per_program_changes_no_bit(dtype, E, L, M, N):
    """Rule ``gemm-chain-v1`` is bit-neutral: any grouping of the segments (1 per program, the rule's, all of them,
    uneven last groups) gives the same bits, 20 times over (the chain's hand-off under load: no lost or reordered
    addition)."""
    from ordered_ssd.fold import fold_example_gemms, gemm_fold_segments

    dy, x = _inputs(E, L, M, N, dtype, seed=7)
    init = torch.randn(M, N, device="cuda")
    S = E * gemm_fold_segments(L)
    want = fold_example_gemms(dy, x, segments_per_program=S)  # one program per tile: the segments in one loop
    want_init = fold_example_gemms(dy, x, init, segments_per_program=S)
    for spp in sorted({1, 2, 3, 7, max(1, S // 2), S, None}, key=lambda v: -1 if v is None else v):
        for _ in range(20 if spp in (1, None) else 3):
            assert bits_equal(fold_example_gemms(dy, x, segments_per_program=spp), want), spp
        assert bits_equal(fold_example_gemms(dy, x, init, segments_per_program=spp), want_init), spp


def test_fold_example_gemms_strided_inputs_and_the_linear_grad():
    """Transposed and sliced inputs give the bits of contiguous copies; ``ordered_linear_weight_grad`` on CUDA
    is this fold cast to the weight dtype."""
    from ordered_ssd.fold import fold_example_gemms
    from ordered_ssd.ops.linear import ordered_linear_weight_grad

    dy, x = _inputs(5, 200, 130, 70, torch.bfloat16, seed=9)
    ref = fold_example_gemms(dy, x)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)  # [E, L, N] with stride(2) = L
    wide = torch.zeros(5, 200, 150, device="cuda", dtype=torch.bfloat16)
    wide[..., 10:140] = dy  # a slice with row stride 150
    assert bits_equal(fold_example_gemms(wide[..., 10:140], xt), ref)
    dW, db = ordered_linear_weight_grad(dy, x, torch.bfloat16, torch.float32)
    assert bits_equal(dW, ref.to(torch.bfloat16))
    assert torch.allclose(db.double(), dy.double().sum((0, 1)), rtol=1e-5, atol=1e-4)


def test_empty_batch_and_negative_zero_init():
    """No example: the result is +0.0 + init (a -0.0 init comes back as +0.0, as LexicalFold's start value gives)."""
    from ordered_ssd.fold import fold_example_gemms

    dy, x = _inputs(0, 50, 130, 70, torch.bfloat16)
    assert bits_equal(fold_example_gemms(dy, x), torch.zeros(130, 70, device="cuda"))
    init = torch.full((130, 70), -0.0, device="cuda")
    assert bits_equal(fold_example_gemms(dy, x, init=init), torch.zeros(130, 70, device="cuda"))
    dy1, x1 = _inputs(1, 50, 130, 70, torch.bfloat16)
    assert bits_equal(fold_example_gemms(dy1, x1, init=init), fold_example_gemms(dy1, x1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_long_sequences_fold_their_segments_in_order(dtype):
    """Reduction version 5: past ``GEMM_FOLD_SEGMENT_L`` positions an example's partials are per segment (the last
    one shorter), each the bits of that segment alone, folded segment by segment, example 0's first; continuing from
    ``init`` at any example gives the batch's bits; ``ordered_linear_weight_grad`` takes this fold at every length;
    and a segment length of at least ``L`` gives the per-example fold (the bits of version 4)."""
    from ordered_ssd.fold import GEMM_FOLD_SEGMENT_L, LexicalFold, fold_example_gemms, linear_weight_grad_is_fused
    from ordered_ssd.fold import settings
    from ordered_ssd.ops.linear import ordered_linear_weight_grad

    SEG = GEMM_FOLD_SEGMENT_L
    E, L, M, N = 3, 2 * SEG + 100, 136, 72
    dy, x = _inputs(E, L, M, N, dtype, seed=11)
    assert linear_weight_grad_is_fused(dy, torch.float32)
    got = fold_example_gemms(dy, x)
    fold = LexicalFold(torch.float32)
    for e in range(E):
        for s0 in (0, SEG, 2 * SEG):
            fold.add(fold_example_gemms(dy[e:e + 1, s0:s0 + SEG], x[e:e + 1, s0:s0 + SEG]))
    assert bits_equal(got, fold.result())
    for k in (1, 2):
        assert bits_equal(fold_example_gemms(dy[k:], x[k:], init=fold_example_gemms(dy[:k], x[:k])), got), k
    dW, _ = ordered_linear_weight_grad(dy, x, torch.float32)
    assert bits_equal(dW, got)
    ref = torch.einsum("elm,eln->mn", dy.double(), x.double())
    # fp32 sums of ~10^5 products: 2.3e-5 of the largest entry measured in bf16/fp16 on the H200
    assert (got.double() - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    with pytest.MonkeyPatch.context() as mp:  # one segment per example: the per-example fold
        mp.setattr(settings, "GEMM_FOLD_SEGMENT_L", L)
        whole = fold_example_gemms(dy, x)
        per_example = LexicalFold(torch.float32)
        for e in range(E):
            per_example.add(fold_example_gemms(dy[e:e + 1], x[e:e + 1]))
        assert bits_equal(whole, per_example.result())
    assert not bits_equal(whole, got)  # another order, other bits


def test_fp64_projection_weight_grad_is_the_per_example_fp64_fold():
    """fp64 on CUDA keeps the per-example GEMMs (``fold_example_gemms_grouped``), in fp64 throughout."""
    from ordered_ssd.fold import LexicalFold, linear_weight_grad_is_fused
    from ordered_ssd.ops.linear import ordered_linear_weight_grad

    dy, x = _inputs(3, 300, 72, 40, torch.float64, seed=12)
    assert not linear_weight_grad_is_fused(dy, torch.float64)
    fold = LexicalFold(torch.float64)
    for e in range(3):
        fold.add(torch.mm(dy[e].t(), x[e]))
    for group_bytes in (1, 1 << 40):  # groups of 1 and all 3
        dW, db = ordered_linear_weight_grad(dy, x, torch.float64, torch.float64, group_bytes=group_bytes)
        assert dW.dtype == torch.float64 and bits_equal(dW, fold.result()), group_bytes


def test_fold_kernels_on_cuda_equal_the_cpu_fold():
    from ordered_ssd.fold import fold_dims, lexical_cumsum

    torch.manual_seed(9)
    t = (torch.randn(6, 5, 300, 3) * torch.logspace(0, 5, 3)).cuda()
    for dims in ((0,), (0, 1), (1, 3), (0, 1, 3)):
        assert bits_equal(fold_dims(t, dims).cpu(), fold_dims(t.cpu(), dims)), dims
    init = torch.randn(5, 300, 3).cuda()
    assert bits_equal(fold_dims(t, 0, init=init).cpu(), fold_dims(t.cpu(), 0, init=init.cpu()))
    tb = t.to(torch.bfloat16)
    assert bits_equal(fold_dims(tb, (0, 1)).cpu(), fold_dims(tb.cpu(), (0, 1)))
    for rev in (False, True):
        assert bits_equal(lexical_cumsum(t, dim=2, reverse=rev).cpu(), lexical_cumsum(t.cpu(), dim=2, reverse=rev))


def test_dA_cumsum_grad_kernel_on_cuda_equals_the_cpu_operations():
    from ordered_ssd.fold import dA_cumsum_grad_scans
    from tests.fold.test_fold import _dA_cumsum_inputs

    # chunk lengths with every remainder of N and N - 1 modulo 4
    for seed, shape in enumerate(((2, 24, 16, 256), (1, 8, 17, 64), (5, 3, 1, 1), (2, 3, 5, 2), (2, 3, 5, 3),
                                  (3, 2, 7, 5), (2, 4, 3, 31), (2, 2, 9, 100))):
        args = _dA_cumsum_inputs(shape, seed)
        want = [t.clone() for t in args]
        dA_cumsum_grad_scans(*want)
        got = [t.cuda() for t in args]
        dA_cumsum_grad_scans(*got)
        assert all(bits_equal(g.cpu(), w) for g, w in zip(got, want)), shape


VARIANT_CASES = CASES + [  # bench-like projections: many short examples (S5's out_proj), few long ones
    (64, 512, 768, 1536),
    (3, 4096, 520, 2048),
    (2, 40000, 520, 256),  # three segments per example
    (64, 512, 1072, 256),  # G1's in_proj: few output tiles (the chain at 64 x 64)
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("E,L,M,N", VARIANT_CASES)
def test_every_variant_gives_the_static_choices_bits(dtype, E, L, M, N):
    """Rule ``gemm-timed-v2`` is bit-neutral: every variant of ``GEMM_FOLD_VARIANTS`` that the rule would time here
    (the chain at other tiles; one program per tile; per-segment partials in a workspace then an ordered fold; the
    TMA kernels, one tile per program or persistent; any tile, warps, stages) gives the bits of the static chain,
    with and without ``init``, 3 times each; the partials variant also where the rule would not time it (several
    workspace groups). Twice: contiguous inputs (TMA only where their widths make the strides 16-byte multiples),
    and views of wider buffers whose strides are (TMA at every width: the loads past M or N zero-filled)."""
    from csrc_bindings import _resources
    from ordered_ssd.fold import (GEMM_FOLD_SEGMENT_L, GEMM_FOLD_VARIANTS, GEMM_FOLD_WORKSPACE_BYTES,
                                  gemm_fold_segments, kernels)
    from ordered_ssd.fold.gemm import _launch_gemm_variant, _timed_variants, tma_ready
    from ordered_ssd.fold.settings import gemm_fold_config

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("rule gemm-timed-v2 times its variants on sm_90 only")
    init = torch.randn(M, N, device="cuda")
    static = ("chain", gemm_fold_config(dtype, _resources.shared_memory_limit(init.device)))
    fits = 4 * M * N * E * gemm_fold_segments(L) <= GEMM_FOLD_WORKSPACE_BYTES
    partials = [v for v in GEMM_FOLD_VARIANTS if v[0] == "partials"]
    n_tma = sum(k.startswith("tma") for k, _ in GEMM_FOLD_VARIANTS)
    for padded in (False, True):
        dy, x = _inputs(E, L, M, N, dtype, seed=13)
        if padded:  # the same values in buffers 8 elements wider than the next multiple of 8
            dy = torch.cat([dy, dy.new_zeros(E, L, -M % 8 + 8)], 2)[:, :, :M]
            x = torch.cat([x, x.new_zeros(E, L, -N % 8 + 8)], 2)[:, :, :N]
        tma = tma_ready(dy) and tma_ready(x)
        assert tma or not padded
        with pytest.MonkeyPatch.context() as mp:
            from ordered_ssd.fold import settings
            mp.setattr(settings, "GEMM_FOLD_TIMING", True)
            variants = _timed_variants(dy, static, M * N, L, E * gemm_fold_segments(L), x)
        assert variants[0] == static
        assert len(variants) == len(GEMM_FOLD_VARIANTS) - (0 if fits else 2) - (0 if tma else n_tma)
        assert {k for k, _ in variants} == ({"chain", "nest"} | ({"partials"} if fits else set())
                                            | ({"tma", "tma-persistent"} if tma else set()))

        def run(variant, with_init):
            out = torch.empty(M, N, dtype=torch.float32, device="cuda")
            src = init if with_init else out
            segments = (E * gemm_fold_segments(L), gemm_fold_segments(L), GEMM_FOLD_SEGMENT_L)
            _launch_gemm_variant(kernels, variant, dy, x, src, with_init, out, segments, None)
            return out

        for with_init in (False, True):
            want = run(static, with_init)
            for variant in variants[1:] + ([] if fits else partials):
                for _ in range(3):
                    assert bits_equal(run(variant, with_init), want), (variant, with_init, padded)


@pytest.mark.native_timing
def test_timed_choice_is_kept_per_shape_and_gives_the_static_bits(monkeypatch):
    """The first call of a shape times the variants (by GPU plus host time, ``_gpu_and_host_ms``) and keeps the least
    costly for that shape (a second call times nothing); the result has the static choice's bits; another shape is timed
    on its own; an explicit ``segments_per_program`` is never timed."""
    from ordered_ssd.fold import fold_example_gemms, gemm_fold_config, gemm_fold_timed_choices, gemm

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("rule gemm-timed-v2 times its variants on sm_90 only")
    monkeypatch.setattr(gemm, "_gemm_timed", {})
    calls = []
    real = gemm._fastest
    monkeypatch.setattr(gemm, "_fastest", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    dy, x = _inputs(16, 512, 1000, 300, torch.bfloat16, seed=17)
    static = fold_example_gemms(dy, x, segments_per_program=2)
    assert calls == [] and gemm_fold_timed_choices() == {}
    got = fold_example_gemms(dy, x)
    assert calls == [gemm._gpu_and_host_ms] and len(gemm_fold_timed_choices()) == 1  # rule v2's cost
    assert bits_equal(got, static)
    for _ in range(3):
        assert bits_equal(fold_example_gemms(dy, x), static)
    assert len(calls) == 1
    fold_example_gemms(dy[:5], x[:5])
    assert len(calls) == 2 and len(gemm_fold_timed_choices()) == 2
    (key, choice), = [(k, v) for k, v in gemm_fold_timed_choices().items() if k[2] == 16]
    assert key[1:6] == (torch.bfloat16, 16, 512, 1000, 300)
    from csrc_bindings import _resources
    static_choice = ("chain", gemm_fold_config(torch.bfloat16, _resources.shared_memory_limit(dy.device)))
    assert choice in gemm._timed_variants(dy, static_choice, 1000 * 300, 512, 16)
