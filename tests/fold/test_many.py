"""ordered_ssd.fold.many: several folds in one launch give, bit for bit, the folds of :func:`fold_dims`.

The partials of a training step's backward (their shapes and strides as the launchers allocate them) and a few odd
layouts are folded by :func:`fold_many` and compared with one :func:`fold_dims` each; :func:`fold_example_sums`
with the per-example :class:`LexicalFold` the projection bias used before. The values span many binades (so a
different order of the additions gives other bits, which the tests check too). The Triton kernels run under
Triton's interpreter in a fresh process (when triton is installed; skipped otherwise); the GPU suite runs them on
CUDA (``tests/gpu/fold/test_gemm_fold.py``).
"""
import textwrap

import pytest
import torch

from ordered_ssd.fold import FOLD_MANY_MAX, LexicalFold, fold_dims, fold_example_sums, fold_many
from ordered_ssd.fold.many import _EXAMPLE_SUMS_UNROLL, _layout
from tests.fold.interpreter import run_python
from tests.helpers import bits_equal

# B, C (chunks), T (tiles), H, Tn (headdim tiles), L, S (head splits), G, N, cs (chunk size)
B, C, T, H, Tn, L, S, G, N, cs = 2, 3, 2, 5, 3, 12, 2, 2, 4, 4


def _wide(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * torch.exp(4 * torch.randn(*shape, generator=g))).to(dtype)


def step_requests(seed=0):
    """``(name, request, read_in_place)``: the folds of one backward step (the partials' shapes as the launchers
    allocate them) and odd layouts; ``read_in_place``: :func:`fold_many` reads the tensor through its strides."""
    r = [
        ("dA", ((B, C, H), (0, 1)), True),
        ("ddt_bias", ((B, C, H), (0, 1)), True),
        ("dD [H]", ((B, C, T, H, Tn), (0, 1, 2, 4)), True),
        ("dD [H, P]", ((B, C, T, H, 6), (0, 1, 2)), True),
        ("rmsnorm weight", ((7, 10), 0), True),
        ("conv weight", ((B, T, 9, 4), (0, 1)), True),
        ("conv bias (bf16 out)", ((B, T, 9), (0, 1), torch.bfloat16), True),
        ("ddt headdim tiles", ((B, H, C, cs, Tn), -1), True),
        ("dB head splits", ((B, L, S, G, N), 2), True),
        ("dCB head splits", ((B, C, S, G, cs, cs), 2), True),
        ("ddA row tiles", ((B, H, C, T, cs), 3), True),
        ("ddA chunk tiles", ((B, H, C, T), -1), True),
        ("five partials", ((5, 7), 0), True),
        ("one partial", ((1, 6), 0), True),
    ]
    out = []
    for i, (name, (shape, dims, *dtype), inplace) in enumerate(r):
        out.append((name, (_wide(shape, seed + i), dims, *dtype), inplace))
    t = _wide((4, 5, 6), seed + 50)
    out.append(("transposed, axes listed out of order", (t.transpose(0, 2), (2, 0)), True))
    t = _wide((3, 4, 5, 6), seed + 51)
    out.append(("two runs each, strided", (t[:, ::2, :, 1:], (3, 1)), True))
    out.append(("three output runs (copied)", (t[:, ::2, :, 1:], 1), False))
    out.append(("bf16 partials", (_wide((6, 3, 5), seed + 52, torch.bfloat16), (0, 1)), True))
    out.append(("no output", (_wide((5, 0), seed + 53), 0), True))
    return out


def example_sums_reference(t, bias_dtype):
    """The projection bias's fold as it was before :func:`fold_example_sums`: one :func:`fold_dims` per example,
    folded by :class:`LexicalFold`."""
    folder = LexicalFold(bias_dtype)
    for e in range(t.shape[0]):
        folder.add(fold_dims(t[e], 0, dtype=torch.float32))
    return folder.result(like=torch.empty(t.shape[-1], device=t.device))


def _reference(req):
    t, dims, *dtype = req
    return fold_dims(t, dims, dtype=dtype[0] if dtype else None)


def test_layouts_are_read_in_place_where_two_runs_each_suffice():
    for name, req, inplace in step_requests():
        t = req[0]
        dims = tuple(d % t.dim() for d in ((req[1],) if isinstance(req[1], int) else req[1]))
        got = _layout(t, dims)
        assert (got[0] is t) == inplace, name
        KO, KI, M = got[1], got[2], got[3]
        K = 1
        for d in dims:
            K *= t.shape[d]
        assert KO * KI == K and M == t.numel() // max(K, 1) or t.numel() == 0, name


def test_off_cuda_it_is_fold_dims_and_none_stays_none():
    reqs = step_requests()
    got = fold_many([req for _, req, _ in reqs] + [None])
    assert got[-1] is None
    for (name, req, _), g in zip(reqs, got):
        want = _reference(req)
        assert g.dtype == want.dtype and g.shape == want.shape and bits_equal(g, want), name


def test_the_values_decide_the_bits_of_a_reordered_fold():
    """The test data can tell orders apart: folding the partials of dA in reverse gives other bits."""
    t = step_requests()[0][1][0]
    assert not bits_equal(fold_dims(t, (0, 1)), fold_dims(t.flip(0, 1), (0, 1)))


def test_fold_example_sums_off_cuda_is_the_per_example_lexical_fold():
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        dy = _wide((3, 7, 9), 3, dtype)
        assert bits_equal(fold_example_sums(dy, dtype), example_sums_reference(dy, dtype)), dtype
    empty = fold_example_sums(torch.zeros(0, 4, 3), torch.float32)
    assert empty.shape == (3,) and bits_equal(empty, torch.zeros(3))


def test_fold_example_sums_refuses_more_features_than_its_grid_takes():
    wide = torch.zeros(1).expand(2, 3, 65535 * 256 + 1)  # no memory: stride 0
    with pytest.raises(ValueError, match=r"t: expected at most 16776960 features \(the last dim\) on the Triton path, "
                                         r"got 16776961"):
        fold_example_sums(wide, torch.float32, use_triton=True)


def test_repeated_axes_are_refused():
    with pytest.raises(ValueError, match=r"dims: expected distinct axes, got \(0, 0\)"):
        fold_many([(torch.zeros(2, 3), (0, -2))])


def test_triton_kernels_under_the_interpreter():
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernels on CUDA)")
    code = textwrap.dedent(f"""
        import torch
        from tests.fold.interpreter import allow_runtime_loop_bounds
        allow_runtime_loop_bounds()
        from ordered_ssd.fold import fold_example_sums, fold_many
        from tests.fold.test_many import _reference, _wide, example_sums_reference, step_requests
        from tests.helpers import bits_equal
        reqs = step_requests(seed=7)
        # all of them: {FOLD_MANY_MAX} per launch, so two launches, and a None in between
        got = fold_many([req for _, req, _ in reqs[:4]] + [None] + [req for _, req, _ in reqs[4:]], use_triton=True)
        assert got[4] is None
        got = got[:4] + got[5:]
        for (name, req, _), g in zip(reqs, got):
            want = _reference(req)
            assert g.dtype == want.dtype and g.shape == want.shape and bits_equal(g, want), name
        one = fold_many([reqs[2][1]], use_triton=True)[0]  # alone in its launch: the same bits
        assert bits_equal(one, _reference(reqs[2][1]))
        cases = len(reqs) + 1
        # 2 x UNROLL + 6 positions: the unrolled loop twice and its tail
        for dtype, shape in ((torch.float32, (3, 7, 9)), (torch.bfloat16, (3, 2 * {_EXAMPLE_SUMS_UNROLL} + 6, 9))):
            dy = _wide(shape, 11, dtype)
            for t in (dy, dy.transpose(0, 1).contiguous().transpose(0, 1),
                      dy.transpose(1, 2).contiguous().transpose(1, 2)):
                for bias_dtype in (torch.float32, torch.bfloat16):
                    g = fold_example_sums(t, bias_dtype, use_triton=True)
                    want = example_sums_reference(t, bias_dtype)
                    assert g.dtype == bias_dtype and bits_equal(g, want), (dtype, bias_dtype)
                    cases += 1
        print("cases", cases)
    """)
    assert f"cases {len(step_requests()) + 1 + 12}" in run_python(code, interpret=True)


def test_triton_kernels_compile_for_sm90_with_plain_fp32_additions():
    """Ahead-of-time compile (triton's own ptxas, no GPU needed) for the H200's sm_90, with unused folds passed as
    None and sizes specialised to 1 as Triton's launcher does: it compiles, and every fp32 addition in the PTX is a
    plain round-to-nearest ``add.f32`` (no flush to zero, no fused multiply-add, no atomics): the arithmetic of
    :func:`fold_dims`'s kernel and of the CPU fold. The ``dA_cumsum`` kernel, plain and with ``N`` specialised to
    1, also keeps its global loads and stores scalar (each thread reads back its own stores of ``prev``)."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernels on CUDA)")
    code = textwrap.dedent("""
        import re
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from ordered_ssd.fold import kernels
        from ordered_ssd.fold.many import _EXAMPLE_SUMS_UNROLL

        def check(fn, sig, const, num_warps=4):
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": num_warps})
            ptx = k.asm["ptx"]
            assert k.asm["cubin"] and not re.search(r"^\\s*(@%p\\d+\\s+)?(atom|red)\\.", ptx, re.M)
            adds = set(re.findall(r"\\b(?:add|fma|sub)(?:\\.[a-z0-9]+)*\\.f32\\b", ptx))
            assert adds == {"add.f32"}, adds

        fn = kernels.fold_many_kernel
        for nfolds, ones in ((1, ("M0",)), (3, ("KI0", "MI0", "MI1", "KO2", "M2")), (8, ("KI1", "M0", "M7"))):
            const = {"NFOLDS": nfolds, "BLOCK": 256}
            const.update({n: None for n in fn.arg_names if n[-1].isdigit() and int(n[-1]) >= nfolds})
            const.update({n: 1 for n in ones})
            check(fn, {n: "constexpr" if n in const else ("*fp32" if n[0] in "po" else "i32") for n in fn.arg_names},
                  const)
        fn = kernels.example_sums_kernel
        for block, ones in ((32, ()), (256, ()), (64, ("L",)), (32, ("L", "M", "s_e"))):  # as launched, and L == 1
            const = {"BLOCK": block, "UNROLL": _EXAMPLE_SUMS_UNROLL, **{n: 1 for n in ones}}
            sig = {n: "constexpr" if n in const else {"p_ptr": "*bf16", "out_ptr": "*fp32"}.get(n, "i32")
                   for n in fn.arg_names}
            check(fn, sig, const, num_warps=block // 32)
        fn = kernels.dA_cumsum_grad_kernel
        for const in ({"BLOCK": 128}, {"BLOCK": 128, "N": 1}):
            sig = {n: "constexpr" if n in const else {"R": "i32", "N": "i32"}.get(n, "*fp32") for n in fn.arg_names}
            check(fn, sig, const)
            # each thread reads back its own scalar stores of prev (no barrier in the kernel): no vector accesses
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": 4})
            ptx = k.asm["ptx"]
            assert re.search(r"\\bst\\.global\\.b32\\b", ptx) and re.search(r"\\bld\\.global\\.b32\\b", ptx)
            assert not re.search(r"\\b(ld|st)\\.global(\\.[a-z0-9]+)*\\.v[248]\\b", ptx)
        print("compiled")
    """)
    assert "compiled" in run_python(code, interpret=False)
