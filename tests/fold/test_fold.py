"""The lexical fold: order, start value, accumulation dtype, errors."""
import textwrap

import pytest
import torch

from tests.helpers import bits_equal
from ordered_ssd.fold import (LexicalFold, accumulation_dtype, dA_cumsum_grad_scans, fold_dims, lexical_cumsum,
                              lexical_fold)


def test_fold_is_left_to_right_in_fp32():
    # fp32 addition is not associative: (1e8 + 1) - 1e8 = 0 but 1e8 - 1e8 + 1 = 1.
    a = torch.tensor([1e8], dtype=torch.float32)
    one = torch.tensor([1.0], dtype=torch.float32)
    assert lexical_fold([a, one, -a]).item() == 0.0
    assert lexical_fold([a, -a, one]).item() == 1.0
    stacked = torch.stack([a, one, -a])
    assert lexical_fold(stacked).item() == 0.0


def test_fold_equals_sequential_python_sum_bitwise():
    torch.manual_seed(0)
    parts = [torch.randn(5, 7) * 10 ** (i % 5) for i in range(33)]
    expected = torch.zeros(5, 7)
    for p in parts:
        expected = expected + p
    assert bits_equal(lexical_fold(parts), expected)


def test_start_value_is_positive_zero():
    out = lexical_fold([torch.tensor([-0.0])])
    assert torch.signbit(out).item() is False


def test_low_precision_partials_accumulate_in_fp32_and_cast_once():
    parts = [torch.tensor([1.0], dtype=torch.bfloat16)] + [torch.tensor([2.0 ** -9], dtype=torch.bfloat16)] * 8
    # bf16 has 8 bits of mantissa: a bf16 running sum would stay at 1.0; fp32 reaches 1 + 2^-6.
    out = lexical_fold(parts)
    assert out.dtype == torch.bfloat16
    assert out.float().item() == 1.015625
    folder = LexicalFold(torch.bfloat16)
    assert folder.acc_dtype == torch.float32


def test_accumulation_dtype():
    assert accumulation_dtype(torch.float64) == torch.float64
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        assert accumulation_dtype(dt) == torch.float32
    with pytest.raises(TypeError, match="dtype"):
        accumulation_dtype(torch.int32)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="partials: expected at least one"):
        lexical_fold([])
    with pytest.raises(ValueError, match=r"partial: expected shape \(2,\)"):
        lexical_fold([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(TypeError, match="partial: expected a torch.Tensor"):
        LexicalFold(torch.float32).add([1.0])
    with pytest.raises(ValueError, match="no partial"):
        LexicalFold(torch.float32).result()
    assert torch.equal(LexicalFold(torch.float32).result(like=torch.ones(3)), torch.zeros(3))


def test_tensor_sha256_hashes_the_bytes():
    import hashlib
    import struct

    from ordered_ssd.digest import tensor_sha256
    t = torch.tensor([1.0, -0.0], dtype=torch.float32)
    assert tensor_sha256(t) == hashlib.sha256(struct.pack("<ff", 1.0, -0.0)).hexdigest()
    assert tensor_sha256(t) != tensor_sha256(torch.tensor([1.0, 0.0]))
    assert tensor_sha256(torch.arange(6.0).reshape(2, 3).t()) == tensor_sha256(torch.tensor([0.0, 3, 1, 4, 2, 5]))


def test_fold_dims_is_lexical_over_the_listed_axes():
    torch.manual_seed(1)
    t = torch.randn(3, 4, 5) * torch.logspace(0, 6, 5)
    out = fold_dims(t, (0, 2))  # order (a, c): a slowest
    expected = lexical_fold([t[a, :, c] for a in range(3) for c in range(5)])
    assert bits_equal(out, expected)
    out2 = fold_dims(t, (2, 0))  # c slowest
    expected2 = lexical_fold([t[a, :, c] for c in range(5) for a in range(3)])
    assert bits_equal(out2, expected2)
    init = torch.randn(4)
    assert bits_equal(fold_dims(t, (0, 2), init=init), lexical_fold([init] + [t[a, :, c] for a in range(3) for c in range(5)]))
    with pytest.raises(ValueError, match="dims: expected distinct axes"):
        fold_dims(t, (0, 0))


def test_lexical_cumsum_matches_a_sequential_loop():
    torch.manual_seed(2)
    t = torch.randn(2, 3, 7) * 1e3
    fwd = lexical_cumsum(t, dim=-1)
    rev = lexical_cumsum(t, dim=1, reverse=True)
    acc = torch.zeros(2, 3)
    for j in range(7):
        acc = acc + t[..., j]
        assert bits_equal(fwd[..., j], acc)
    acc = torch.zeros(2, 7)
    for j in (2, 1, 0):
        acc = acc + t[:, j]
        assert bits_equal(rev[:, j], acc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fold_example_gemms_off_cuda_is_the_per_example_fold(dtype):
    from ordered_ssd.fold import fold_example_gemms

    g = torch.Generator().manual_seed(3)
    dy = torch.randn(4, 11, 6, generator=g).to(dtype)
    x = torch.randn(4, 11, 5, generator=g).to(dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    fold = LexicalFold(acc)
    for e in range(4):
        fold.add(torch.mm(dy[e].t().to(acc), x[e].to(acc)))
    got = fold_example_gemms(dy, x)
    assert got.dtype == acc and bits_equal(got, fold.result())
    assert bits_equal(fold_example_gemms(dy[2:], x[2:], init=fold_example_gemms(dy[:2], x[:2])), got)
    assert bits_equal(fold_example_gemms(dy[:0], x[:0]), torch.zeros(6, 5, dtype=acc))


def test_fold_example_gemms_rejects_bad_input():
    from ordered_ssd.fold import fold_example_gemms

    a, b = torch.zeros(2, 3, 4), torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match="a: expected a 3-d"):
        fold_example_gemms(a[0], b)
    with pytest.raises(TypeError, match=r"b: expected the dtype of a \(torch.float32\), got torch.float64"):
        fold_example_gemms(a, b.double())
    with pytest.raises(TypeError, match="a: expected a float dtype, got torch.int64"):
        fold_example_gemms(a.long(), b.long())
    with pytest.raises(ValueError, match="b: expected device cpu as a, got meta"):
        fold_example_gemms(a, b.to("meta"))
    with pytest.raises(ValueError, match="init: expected device cpu as a, got meta"):
        fold_example_gemms(a, b, init=torch.zeros(4, 5, device="meta"))
    with pytest.raises(TypeError, match="init: expected a torch.Tensor or None, got list"):
        fold_example_gemms(a, b, init=[0.0])
    with pytest.raises(TypeError, match="init: expected a float dtype, got torch.int32"):
        fold_example_gemms(a, b, init=torch.zeros(4, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"b: expected \[E, L\] = \(2, 3\)"):
        fold_example_gemms(a, b[:, :2])
    with pytest.raises(ValueError, match=r"init: expected shape \(4, 5\)"):
        fold_example_gemms(a, b, init=torch.zeros(5, 4))
    with pytest.raises(TypeError, match="a: expected a torch.Tensor"):
        fold_example_gemms([1], b)


def test_tile_offset_guard():
    from ordered_ssd.fold.gemm import _tile_offsets_overflow

    assert not _tile_offsets_overflow(torch.empty(2, 3, 5), 64)
    wide = torch.empty(1, 4, 2 ** 25, device="meta")  # rows of 2**25 elements: 64 rows reach 2**31
    assert _tile_offsets_overflow(wide, 64) and not _tile_offsets_overflow(wide, 63)
    assert _tile_offsets_overflow(torch.empty(1, 2 ** 25, 65, device="meta").transpose(1, 2), 1)  # (W-1) * stride


def test_reduction_fingerprint_names_the_gemm_fold_settings(monkeypatch):
    from ordered_ssd.fold import settings

    base = settings.reduction_fingerprint()
    assert base == "v7 gemm=09104bbdc2e2"  # version 5's segments, the row-invariant GEMM's block_k (version 7)
    assert base.startswith(f"v{settings.REDUCTION_VERSION} gemm=") and len(base.split("=")[1]) == 12
    from ordered_ssd.ops import row_invariant_gemm as rig

    cfgs = dict(rig.ROW_INVARIANT_GEMM_CONFIGS)
    monkeypatch.setitem(rig.ROW_INVARIANT_GEMM_CONFIGS, torch.float32,
                        rig.RowInvariantGemmConfig(64, 64, 64, 8, 4, 3, "test"))  # another block_k: other bits
    assert settings.reduction_fingerprint() != base
    monkeypatch.setitem(rig.ROW_INVARIANT_GEMM_CONFIGS, torch.float32,
                        rig.RowInvariantGemmConfig(32, 128, 32, 4, 8, 2, "test"))  # only tiles and warps: same bits
    assert settings.reduction_fingerprint() == base and cfgs[torch.float32].block_k == 32
    monkeypatch.setattr(settings, "GEMM_FOLD_SEGMENT_L", settings.GEMM_FOLD_SEGMENT_L * 2)
    longer = settings.reduction_fingerprint()
    monkeypatch.setattr(settings, "GEMM_FOLD_CONFIGS",
                        {**settings.GEMM_FOLD_CONFIGS, torch.bfloat16: (64, 64, 32, 8, 4, 2)})
    configs = settings.reduction_fingerprint()
    monkeypatch.setattr(settings, "CONV1D_BWD_TILE_L", settings.CONV1D_BWD_TILE_L // 2)
    assert len({base, longer, configs, settings.reduction_fingerprint()}) == 4


def test_gemm_fold_shared_bytes_is_the_pipelined_tiles():
    """The estimate against the numbers triton 3.6.0 compiles to (``metadata.shared``, bf16 128x128x64: 131,072 /
    98,304 / 65,536 bytes at 4 / 3 / 2 stages on sm_90, fewer on sm_8x; fp32 64x64x32 at 2 stages: 16,384)."""
    from ordered_ssd.fold.settings import gemm_fold_shared_bytes

    bf16 = (128, 128, 64, 8, 8)
    assert [gemm_fold_shared_bytes(bf16 + (s,), torch.bfloat16) for s in (4, 3, 2, 1)] == [131072, 98304, 65536,
                                                                                             65536]
    assert gemm_fold_shared_bytes(bf16 + (4,), torch.float16) == 131072
    assert gemm_fold_shared_bytes((64, 64, 32, 8, 4, 2), torch.float32) == 32768


@pytest.mark.parametrize("limit,stages", [(232448, 4), (166912, 4), (131072, 4), (131071, 3), (101376, 3),
                                          (98304, 3), (98303, 2), (65536, 2)])
def test_gemm_fold_config_lowers_only_the_stages_to_fit_the_device(limit, stages):
    from ordered_ssd.fold.settings import GEMM_FOLD_CONFIGS, gemm_fold_config

    for dtype in (torch.bfloat16, torch.float16):
        assert gemm_fold_config(dtype, limit) == (128, 128, 64, 8, 8, stages)
    assert gemm_fold_config(torch.float32, limit) == GEMM_FOLD_CONFIGS[torch.float32] == (64, 64, 32, 8, 4, 2)


def test_gemm_fold_config_raises_when_even_one_stage_does_not_fit():
    from ordered_ssd.fold.settings import gemm_fold_config, gemm_fold_configs_for

    with pytest.raises(ValueError) as err:
        gemm_fold_config(torch.bfloat16, 65535)
    assert str(err.value) == (
        "fold_example_gemms: configuration (BM, BN, BK, GROUP_M, num_warps, num_stages) = (128, 128, 64, 8, 8, 4) "
        "for torch.bfloat16 asks 65536 bytes of shared memory per program even at num_stages=1, more than the 65535 "
        "bytes the device allows (shared_memory_per_block_optin)")
    assert gemm_fold_configs_for(65535) == {torch.float32: (64, 64, 32, 8, 4, 2)}


def test_reduction_fingerprint_records_the_configurations_chosen_for_the_device(monkeypatch):
    import csrc_bindings._resources as resources
    from ordered_ssd.fold import settings

    limit = {"bytes": 232448}
    monkeypatch.setattr(resources, "shared_memory_limit", lambda device: limit["bytes"])
    pinned = settings.reduction_fingerprint()
    assert settings.reduction_fingerprint("cuda:0") == pinned and pinned.startswith("v7 gemm=")  # H200
    assert settings.reduction_fingerprint("cpu") == pinned
    limit["bytes"] = 101376
    small = settings.reduction_fingerprint("cuda:0")
    assert small != pinned and small.startswith("v7 gemm=") and len(small.split("=")[1]) == 12
    monkeypatch.setattr(settings, "GEMM_FOLD_CONFIGS", {**settings.GEMM_FOLD_CONFIGS,
                                                        torch.bfloat16: (128, 128, 64, 8, 8, 3),
                                                        torch.float16: (128, 128, 64, 8, 8, 3)})
    assert settings.reduction_fingerprint() == small  # the hash of the configuration set that runs


def test_gemm_fold_chain_kernel_under_the_interpreter():
    """The chained GEMM fold's handoff (tickets, per-tile counts, running sum through ``out``) on the CPU under
    Triton's interpreter, which runs the programs one at a time in ticket order: the result of ``E`` examples in one
    launch is the lexical fold of the single-segment launches, example-major (and continues from ``init``), over
    several tiles, a partial last K block and examples of one, two and three segments (a shorter last one), with
    the same bits for any number of segments per program; a segment length at or above ``L`` gives the bits of one
    segment per example; fp32 with IEEE products, so it also agrees with an fp64 reference to fp32 rounding."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernel on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent("""
        import torch, triton
        from tests.fold.interpreter import allow_runtime_loop_bounds
        allow_runtime_loop_bounds()
        from ordered_ssd.fold import LexicalFold, kernels
        from ordered_ssd.fold.gemm import _aligned_strides, _pow2_divisor
        from tests.helpers import bits_equal

        def chain(a, b, init=None, spp=1, SEG=1024, BM=16, BN=16, BK=16, GROUP_M=2):
            E, L, M = a.shape
            N = b.shape[2]
            nseg = max(1, triton.cdiv(L, SEG))
            out = torch.empty(M, N, dtype=torch.float32)
            tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
            groups = triton.cdiv(E * nseg, spp)
            sync = torch.zeros(tiles + 1, dtype=torch.int32)
            # the alignment hints as the library passes them (8 and 2 among the cases below)
            (aq, sa), (bq, sb) = _aligned_strides(a), _aligned_strides(b)
            mq, nq = _pow2_divisor(M), _pow2_divisor(N)
            kernels.gemm_fold_chain_kernel[(groups * tiles,)](
                a, b, init if init is not None else out, out, sync, E * nseg, nseg, L, M // mq, N // nq, *sa, *sb,
                spp, HAS_INIT=init is not None, IEEE=True, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, SEG=SEG, AQ=aq,
                BQ=bq, MQ=mq, NQ=nq)
            assert sync[:tiles].tolist() == [groups] * tiles and sync[tiles].item() == groups * tiles
            return out

        g = torch.Generator().manual_seed(5)
        cases = 0
        for E, L, M, N, SEG in ((5, 37, 40, 24, 1024), (5, 37, 40, 24, 16), (3, 16, 16, 50, 16),
                                (3, 16, 16, 50, 8)):
            a = torch.randn(E, L, M, generator=g)
            b = torch.randn(E, L, N, generator=g)
            init = torch.randn(M, N, generator=g)
            got = chain(a, b, SEG=SEG)
            nseg = -(-L // SEG)
            fold = LexicalFold(torch.float32)
            for e in range(E):
                for s in range(nseg):  # each segment alone, as an example of its own
                    fold.add(chain(a[e:e + 1, s * SEG:(s + 1) * SEG], b[e:e + 1, s * SEG:(s + 1) * SEG]))
            assert bits_equal(got, fold.result()), (E, L, M, N, SEG)
            for spp in (2, 3, E * nseg, E * nseg + 4):  # the grouping of the segments changes no bit
                assert bits_equal(chain(a, b, spp=spp, SEG=SEG), got), (E, spp)
                assert bits_equal(chain(a, b, init=init, spp=spp, SEG=SEG), chain(a, b, init=init, SEG=SEG)), spp
            assert bits_equal(chain(a[2:], b[2:], init=chain(a[:2], b[:2], SEG=SEG), SEG=SEG), got)
            if nseg == 1:
                assert bits_equal(chain(a, b, SEG=L), got)  # a segment of exactly L positions
            ref = sum(a[e].double().t() @ b[e].double() for e in range(E))
            assert float((got.double() - ref).abs().max()) < 1e-4 * float(ref.abs().max())
            cases += 1
        print("cases", cases)
    """)
    assert "cases 4" in run_python(code, interpret=True)


def test_gemm_fold_chain_kernel_compiles_for_sm90_with_acquire_release_handoff():
    """Ahead-of-time compile for sm_90 (no GPU needed): the ticket is an atomic add; the handoff's count is read
    with a load-acquire and written with a release exchange at GPU scope; the running sum is read past L1; the
    products run on wgmma and every other fp32 addition is a plain add (no fused multiply-add in the fold)."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernel on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent("""
        import re
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from ordered_ssd.fold import kernels

        fn = kernels.gemm_fold_chain_kernel
        const = {"HAS_INIT": True, "IEEE": False, "BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8, "SEG": 4096, "AQ": 1,
                 "BQ": 1, "MQ": 1, "NQ": 1}
        sig = {n: "constexpr" if n in const else {"a_ptr": "*bf16", "b_ptr": "*bf16", "init_ptr": "*fp32",
                                                  "out_ptr": "*fp32", "sync_ptr": "*i32"}.get(n, "i32")
               for n in fn.arg_names}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 8, "num_stages": 4})
        ptx = k.asm["ptx"]
        atoms = set(re.findall(r"\\b(?:atom|ld)\\.global(?:\\.[a-z0-9_]+)+", ptx))
        assert "atom.global.gpu.acq_rel.add.u32" in atoms, atoms  # the ticket
        # the wait (an atomic add of 0 with acquire is lowered to a load-acquire) and the handoff
        assert "ld.global.gpu.acquire.b32" in atoms and "atom.global.gpu.release.exch.b32" in atoms, atoms
        assert "ld.global.cg.b32" in atoms  # the running sum is read past L1
        assert "wgmma.mma_async" in ptx and "mma.sync" not in ptx  # both partial loops on wgmma
        adds = set(re.findall(r"\\b(?:add|fma|sub)(?:\\.[a-z0-9]+)*\\.f32\\b", ptx))
        assert adds <= {"add.f32", "add.rn.f32"}, adds
        print("compiled")
    """)
    assert "compiled" in run_python(code, interpret=False)


def test_gemm_chain_rule_splits_the_segments_by_the_tiles():
    from ordered_ssd.fold import GEMM_FOLD_PROGRAMS_PER_SM, fold_example_gemms, gemm_fold_segments_per_program

    assert GEMM_FOLD_PROGRAMS_PER_SM == 8
    # (segments, tiles, SMs) -> segments per program: about 8 programs per SM, never more groups than segments
    assert gemm_fold_segments_per_program(64, 156, 132) == 10  # S5's in_proj on the H200: 7 groups
    assert gemm_fold_segments_per_program(64, 18, 132) == 2  # few tiles: 59 groups wanted, 32 of 2 segments
    assert gemm_fold_segments_per_program(8, 1072, 132) == 8  # many tiles: one program per tile
    assert gemm_fold_segments_per_program(2, 280, 132) == 1
    assert gemm_fold_segments_per_program(1, 5, 132) == 1
    assert gemm_fold_segments_per_program(0, 5, 132) == 1
    with pytest.raises(ValueError, match=r"segments_per_program: expected None or an int >= 1, got 0"):
        fold_example_gemms(torch.zeros(2, 3, 4), torch.zeros(2, 3, 5), segments_per_program=0)
    with pytest.raises(TypeError, match=r"segments_per_program: expected None or an int, got bool"):
        fold_example_gemms(torch.zeros(2, 3, 4), torch.zeros(2, 3, 5), segments_per_program=True)
    with pytest.raises(TypeError, match=r"segments_per_program: expected None or an int, got float"):
        fold_example_gemms(torch.zeros(2, 3, 4), torch.zeros(2, 3, 5), segments_per_program=2.0)
    with pytest.raises(TypeError, match=r"tiles: expected an int, got float"):
        gemm_fold_segments_per_program(4, 2.0, 132)
    with pytest.raises(ValueError, match=r"tiles >= 1 .* got segments=4, tiles=0, multiprocessors=132"):
        gemm_fold_segments_per_program(4, 0, 132)
    # off CUDA the grouping is ignored (a torch fold); the same result for any value
    a, b = torch.randn(3, 4, 5), torch.randn(3, 4, 6)
    assert torch.equal(fold_example_gemms(a, b, segments_per_program=2), fold_example_gemms(a, b))


def test_gemm_fold_segments_rule():
    """Reduction version 5: an example is cut into segments of ``GEMM_FOLD_SEGMENT_L`` positions (the last one
    shorter), one for ``L`` up to it; the count depends on ``L`` alone."""
    from ordered_ssd.fold import GEMM_FOLD_SEGMENT_L, gemm_fold_segments

    assert GEMM_FOLD_SEGMENT_L == 16384
    assert [gemm_fold_segments(n) for n in (0, 1, 8192, 16383, 16384, 16385, 32768, 65536)] == [1, 1, 1, 1, 1, 2, 2, 4]
    with pytest.raises(TypeError, match="seqlen: expected an int, got float"):
        gemm_fold_segments(2.0)
    with pytest.raises(TypeError, match="seqlen: expected an int, got bool"):
        gemm_fold_segments(True)
    with pytest.raises(ValueError, match="seqlen: expected an int >= 0, got -1"):
        gemm_fold_segments(-1)


def test_fold_example_gemms_off_cuda_folds_the_segments_in_order(monkeypatch):
    """Off CUDA the same partition as the kernels: per example its segments in order, example 0 first; with a
    segment length at or above ``L`` the per-example fold; continuing from ``init`` gives the whole batch's bits."""
    from ordered_ssd.fold import fold_example_gemms, settings

    g = torch.Generator().manual_seed(4)
    dy, x = torch.randn(3, 11, 6, generator=g), torch.randn(3, 11, 5, generator=g)
    whole = fold_example_gemms(dy, x)
    monkeypatch.setattr(settings, "GEMM_FOLD_SEGMENT_L", 4)  # segments of 4, 4 and 3 positions
    got = fold_example_gemms(dy, x)
    fold = LexicalFold(torch.float32)
    for e in range(3):
        for s in (0, 4, 8):
            fold.add(torch.mm(dy[e, s:s + 4].t(), x[e, s:s + 4]))
    assert bits_equal(got, fold.result())
    assert bits_equal(fold_example_gemms(dy[1:], x[1:], init=fold_example_gemms(dy[:1], x[:1])), got)
    assert not bits_equal(got, whole)  # another order: other bits here
    monkeypatch.setattr(settings, "GEMM_FOLD_SEGMENT_L", 11)
    assert bits_equal(fold_example_gemms(dy, x), whole)


def _dA_cumsum_inputs(shape, seed):
    """``(ddA, ddA_prev, ddA_chunk, ddA_next)`` fp32 with magnitudes over ten decades and signed zeros (where the
    order of the additions shows in the bits), and a first row whose last ``ddA_prev`` term plus its ``ddA_chunk``
    is -0.0: only the reverse running sum's +0.0 start turns it into the +0.0 the five operations store."""
    g = torch.Generator().manual_seed(seed)

    def wide(*s):
        t = torch.randn(*s, generator=g) * torch.exp(torch.randn(*s, generator=g) * 5)
        t[torch.rand(*s, generator=g) < 0.05] = -0.0
        return t
    ddA, prev, chunk, nxt = wide(*shape), wide(*shape), wide(*shape[:-1]), wide(*shape)
    prev[0, 0, 0, -1] = chunk[0, 0, 0] = -0.0
    return ddA, prev, chunk, nxt


def test_dA_cumsum_grad_scans_is_upstreams_assembly_in_order():
    """Off CUDA: the five operations in order; a sequential fp32 loop per row gives the same bits."""
    ddA, prev, chunk, nxt = _dA_cumsum_inputs((2, 3, 4, 9), 0)
    want = ddA.clone()
    p = prev.clone()
    p[..., -1] = p[..., -1] + chunk
    rev, fwd = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    prev_cum, next_cum = torch.empty_like(p), torch.empty_like(p)
    for j in range(9):
        fwd = fwd + nxt[..., j]
        next_cum[..., j] = fwd
        rev = rev + p[..., 8 - j]
        prev_cum[..., 8 - j] = rev
    want += next_cum + prev_cum
    got = dA_cumsum_grad_scans(ddA, prev, chunk, nxt)
    assert got is ddA and bits_equal(got, want)
    assert bits_equal(prev, prev_cum)  # overwritten with its reverse running sum
    assert str(prev[0, 0, 0, -1].item()) == "0.0"  # -0.0 + -0.0 from the +0.0 start: +0.0


def test_dA_cumsum_grad_scans_refuses_bad_input_before_writing():
    ddA, prev, chunk, nxt = _dA_cumsum_inputs((2, 3, 4, 9), 1)
    before = [t.clone() for t in (ddA, prev, chunk, nxt)]
    with pytest.raises(ValueError, match=r"ddA_chunk: expected a contiguous float32 tensor of shape \[2, 3, 4\]"):
        dA_cumsum_grad_scans(ddA, prev, chunk[..., :3], nxt)
    with pytest.raises(ValueError, match=r"ddA_next: .* got torch.float64"):
        dA_cumsum_grad_scans(ddA, prev, chunk, nxt.double())
    with pytest.raises(ValueError, match=r"ddA_prev: .*contiguous: False"):
        dA_cumsum_grad_scans(ddA, prev.transpose(0, 1).contiguous().transpose(0, 1), chunk, nxt)
    with pytest.raises(ValueError, match=r"ddA: expected a 4-d tensor \[B, H, C, cs\], got shape \[2, 3, 36\]"):
        dA_cumsum_grad_scans(ddA.reshape(2, 3, 36), prev, chunk, nxt)
    with pytest.raises(ValueError, match=r"ddA: expected a contiguous float32 tensor .* got torch.float16"):
        dA_cumsum_grad_scans(ddA.half(), prev, chunk, nxt)
    with pytest.raises(ValueError, match=r"ddA_next: expected a tensor on ddA's device cpu, got meta"):
        dA_cumsum_grad_scans(ddA, prev, chunk, torch.empty(2, 3, 4, 9, device="meta"))
    assert all(bits_equal(a, b) for a, b in zip((ddA, prev, chunk, nxt), before))


def test_dA_cumsum_grad_kernel_under_the_interpreter():
    """The one-launch kernel (CPU, Triton's interpreter) gives the bits of the five operations (the -0.0 row of
    :func:`_dA_cumsum_inputs` included), over row counts below, at (128) and above a block of rows and chunk
    lengths of 1 to 64 (every remainder of N and N - 1 modulo 4)."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernel on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent("""
        from tests.fold.interpreter import allow_runtime_loop_bounds
        allow_runtime_loop_bounds()
        from ordered_ssd.fold import dA_cumsum_grad_scans
        from tests.fold.test_fold import _dA_cumsum_inputs
        from tests.helpers import bits_equal
        cases = 0
        for seed, shape in enumerate(((1, 1, 1, 1), (2, 3, 4, 9), (2, 4, 16, 5), (1, 8, 17, 64), (3, 5, 9, 16),
                                      (2, 3, 5, 2), (2, 3, 5, 3), (2, 3, 5, 7))):
            args = _dA_cumsum_inputs(shape, seed)
            want = [t.clone() for t in args]
            got = [t.clone() for t in args]
            dA_cumsum_grad_scans(*want, use_triton=False)
            dA_cumsum_grad_scans(*got, use_triton=True)
            assert all(bits_equal(g, w) for g, w in zip(got, want)), shape
            cases += 1
        print("cases", cases)
    """)
    assert "cases 8" in run_python(code, interpret=True)
