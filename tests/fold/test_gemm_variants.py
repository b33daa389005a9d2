"""Rule ``gemm-timed-v2`` of ``fold_example_gemms`` off the GPU: which variants it times, how it picks one, and the
variants' kernels under Triton's interpreter (the bits of the chain) and compiled for sm_90. The GPU suite
(``tests/gpu/fold/test_gemm_fold.py``) checks the bits on the H200."""
import textwrap

import pytest
import torch

from ordered_ssd.fold import GEMM_FOLD_VARIANTS, GEMM_FOLD_WORKSPACE_BYTES, gemm, settings

STATIC = ("chain", (128, 128, 64, 8, 8, 4))


def test_fastest_picks_the_least_time_and_the_earlier_variant_on_a_tie():
    launched = []
    times = {"s": [3.0, 2.5, 2.6], "x": [1.0, 2.0, 1.1], "y": [1.5, 1.0, 0.95], "z": [5.0, 0.9, 5.0]}

    def launch(v):
        launched.append(v)

    calls = {}

    def timer(fn):
        fn()
        v = launched[-1]
        calls[v] = calls.get(v, 0) + 1
        return times[v][calls[v] - 1]

    assert gemm._fastest(["s", "x", "y", "z"], launch, timer) == "z"  # min over 3 rounds: z 0.9 (round 2)
    assert launched[:4] == ["s", "x", "y", "z"]  # each launched once (compiled) before any timing
    assert calls == {"s": 3, "x": 3, "y": 3, "z": 3}
    calls.clear()
    assert gemm._fastest(["s", "x", "y", "z"], launch, timer, rounds=1) == "x"  # first round only: x 1.0
    assert gemm._fastest(["s", "x", "y"], lambda v: None, lambda fn: 1.0) == "s"  # a tie: the earlier


def test_cost_is_gpu_time_plus_the_host_time_of_the_launches(monkeypatch):
    """Rule gemm-timed-v2 ranks a variant by its GPU time (CUDA events, faked here at 3 ms over the 3 calls) plus
    the host time of its calls (each sleeps 20 ms here): 1 + 20 ms per call, not the GPU's 1 ms alone."""
    import time

    class Event:  # stands in for torch.cuda.Event: 3 ms from start to end
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 3.0

    synced = []
    monkeypatch.setattr(torch.cuda, "Event", Event)
    stream = type("Stream", (), {"synchronize": lambda self: synced.append(1)})()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    calls = []
    cost = gemm._gpu_and_host_ms(lambda: (calls.append(1), time.sleep(0.02)), repeats=3)
    assert len(calls) == 3 and synced == [1]  # the stream synchronized once, before the span
    assert 21.0 <= cost < 41.0  # 1 ms of GPU per call + at least 20 ms of host (sleep may overrun, not underrun)
    quick = gemm._gpu_and_host_ms(lambda: None, repeats=3)
    assert 1.0 <= quick < 1.5  # the GPU's 1 ms per call, and next to no host time


def test_fastest_drops_a_variant_that_does_not_fit_but_never_the_static_one():
    def launch(v):
        if v == "big":
            raise ValueError("does not fit")
        if v == "oom":
            raise torch.cuda.OutOfMemoryError("out of memory")

    picked = gemm._fastest(["s", "big", "oom", "x"], launch, lambda fn: {"s": 2.0, "x": 1.0}[probe(fn)])
    assert picked == "x"

    def launch_static_fails(v):
        if v == "s":
            raise ValueError("the static choice does not fit")

    with pytest.raises(ValueError, match="the static choice does not fit"):
        gemm._fastest(["s", "x"], launch_static_fails, lambda fn: 1.0)
    # an error while timed drops the variant too (the workspace of "partials" may run out of memory then)
    rounds = {"x": 0}

    def timer(fn):
        v = probe(fn)
        if v == "x":
            rounds["x"] += 1
            if rounds["x"] == 2:
                raise torch.cuda.OutOfMemoryError("out of memory")
            return 0.5
        return 1.0

    assert gemm._fastest(["s", "x", "y"], lambda v: None, timer) == "s"
    with pytest.raises(ValueError, match="static"):
        gemm._fastest(["s", "x"], lambda v: None,
                            lambda fn: (_ for _ in ()).throw(ValueError("static")) if probe(fn) == "s" else 1.0)
    with pytest.raises(RuntimeError, match="other"):  # any other error propagates
        gemm._fastest(["s", "x"], lambda v: (_ for _ in ()).throw(RuntimeError("other")), lambda fn: 1.0)


_LAST = []


def probe(fn):
    """The variant ``fn`` launches (test helper for the timer)."""
    fn()
    return _LAST[-1]


@pytest.fixture(autouse=True)
def _record_launches(monkeypatch):
    _LAST.clear()
    real = gemm._fastest

    def fastest(variants, launch, timer, **kwargs):  # the real default rounds
        return real(variants, lambda v: (_LAST.append(v), launch(v)), timer, **kwargs)

    monkeypatch.setattr(gemm, "_fastest", fastest)
    yield


@pytest.fixture
def h200(monkeypatch):
    from csrc_bindings import _resources

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(_resources, "shared_memory_limit", lambda device: 232448)
    monkeypatch.setattr(settings, "GEMM_FOLD_TIMING", True)


def test_timed_variants_on_sm90_half_dtypes(h200):
    a = torch.zeros(2, 3, 8, dtype=torch.bfloat16)  # strides (24, 8, 1): 16-byte multiples, as TMA needs
    got = gemm._timed_variants(a, STATIC, 1000, 512, 2)
    assert got[0] == STATIC and got[1:] == list(GEMM_FOLD_VARIANTS[1:])
    assert gemm._timed_variants(a, STATIC, 1000, 512, 2, b=a[:, :, :4]) == got  # a narrower view: aligned
    assert gemm._timed_variants(a.half(), STATIC, 1000, 512, 2) == got
    # the partials of all segments larger than the workspace bound: no "partials" variant (one group only)
    big = gemm._timed_variants(a, STATIC, GEMM_FOLD_WORKSPACE_BYTES // 8 + 1, 512, 2)
    assert [v for v in got if v[0] != "partials"] == big
    assert gemm._timed_variants(a, STATIC, GEMM_FOLD_WORKSPACE_BYTES // 8, 512, 2) == got
    assert gemm._timed_variants(a, STATIC, GEMM_FOLD_WORKSPACE_BYTES // 8, 512, 3) == big


def test_tma_variants_only_where_both_operands_allow_tma(h200):
    """The "tma" kinds load through TMA descriptors: unit stride on the last axis, data pointer and the other
    strides multiples of 16 bytes, bf16/fp16. Where a or b does not allow that, rule gemm-timed-v2 times the
    other variants only (the same bits either way)."""
    a = torch.zeros(2, 3, 8, dtype=torch.bfloat16)
    every = gemm._timed_variants(a, STATIC, 1000, 512, 2)
    assert {k for k, _ in every} == {"chain", "nest", "partials", "tma", "tma-persistent"}
    others = [v for v in every if not v[0].startswith("tma")]
    for bad in (torch.zeros(2, 3, 4, dtype=torch.bfloat16),          # position stride 4 elements: 8 bytes
                torch.zeros(2, 8, 3, dtype=torch.bfloat16).transpose(1, 2),  # not unit stride on the last axis
                torch.zeros(2, 3, 9, dtype=torch.bfloat16)[:, :, 1:]):  # data 2 bytes past an aligned start
        assert not gemm.tma_ready(bad)
        assert gemm._timed_variants(bad, STATIC, 1000, 512, 2) == others
        assert gemm._timed_variants(a, STATIC, 1000, 512, 2, b=bad) == others
    assert gemm.tma_ready(a) and gemm.tma_ready(a.half()) and not gemm.tma_ready(a.float())
    with pytest.raises(ValueError, match="'tma' variant expects bf16/fp16 with unit stride"):
        gemm._launch_gemm_variant(None, ("tma", (64, 64, 64, 8, 4, 4)), a, torch.zeros(2, 3, 4, dtype=a.dtype),
                                  None, False, torch.empty(8, 4), (2, 1, 4096), None)


def test_timed_variants_off_sm90_fp32_small_shared_memory_or_hook_off(h200, monkeypatch):
    from csrc_bindings import _resources

    a = torch.zeros(2, 3, 4, dtype=torch.bfloat16)
    assert gemm._timed_variants(a.float(), STATIC, 10, 512, 2) == []
    monkeypatch.setattr(settings, "GEMM_FOLD_TIMING", False)
    assert gemm._timed_variants(a, STATIC, 10, 512, 2) == []
    monkeypatch.setattr(settings, "GEMM_FOLD_TIMING", True)
    monkeypatch.setattr(_resources, "shared_memory_limit", lambda device: 101376)  # sm_86/sm_89's
    small = gemm._timed_variants(a, STATIC, 10, 512, 2)
    assert small[0] == STATIC and small[1:] and all(
        settings.gemm_fold_shared_bytes(c, torch.bfloat16) <= 101376 for _, c in small[1:])
    assert ("partials", (128, 256, 64, 8, 8, 3)) not in small
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert gemm._timed_variants(a, STATIC, 10, 512, 2) == []


def test_nothing_is_timed_at_one_position_per_example(h200):
    """At L = 1 the static choice only: the variants gave other bits there before reduction version 4 (Triton
    compiled L == 1 as a constant) and have not been compared on a GPU since."""
    a = torch.zeros(2, 1, 4, dtype=torch.bfloat16)
    assert gemm._timed_variants(a, STATIC, 10, 1, 2) == []
    assert gemm._timed_variants(a, STATIC, 10, 2, 2)[0] == STATIC


def test_every_variant_takes_the_static_k_block():
    """The variants differ only in what the docstring calls bit-neutral: BK (the K block of a partial's product
    chain) is the pinned bf16/fp16 one."""
    for kind, config in GEMM_FOLD_VARIANTS[1:]:
        assert kind in ("chain", "nest", "partials", "tma", "tma-persistent")
        assert config[2] == settings.GEMM_FOLD_CONFIGS[torch.bfloat16][2]
    assert GEMM_FOLD_VARIANTS[0] == ("chain", None)


def test_variant_kernels_under_the_interpreter_give_the_chains_bits():
    """The nest kernel, the chain kernel in groups of 1, 2 and all but one segment (groups that start inside an
    example too) and the partials kernel followed by the ordered fold, on the CPU under Triton's interpreter (fp32,
    IEEE products): the bits of the chain kernel in one group, with and without ``init``, over several tiles, a
    partial last K block, several workspace groups and examples of three segments."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernels on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent("""
        import torch, triton
        from tests.fold.interpreter import allow_runtime_loop_bounds
        allow_runtime_loop_bounds()
        from ordered_ssd.fold import kernels
        from tests.helpers import bits_equal
        def consts(L, SEG):  # no alignment hints: the sizes and strides as they are
            return max(1, triton.cdiv(L, SEG)), dict(IEEE=True, BM=16, BN=16, BK=16, GROUP_M=2, SEG=SEG, AQ=1, BQ=1,
                                                     MQ=1, NQ=1)

        def chain(a, b, init, SEG, spp=None):
            E, L, M = a.shape
            N = b.shape[2]
            nseg, K = consts(L, SEG)
            spp = E * nseg if spp is None else spp
            out = torch.empty(M, N, dtype=torch.float32)
            tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)
            sync = torch.zeros(tiles + 1, dtype=torch.int32)
            # the interpreter runs the programs one at a time in launch order, the tickets' order: no wait spins
            kernels.gemm_fold_chain_kernel[(triton.cdiv(E * nseg, spp) * tiles,)](
                a, b, init if init is not None else out, out, sync, E * nseg, nseg, L, M, N, *a.stride(),
                *b.stride(), spp, HAS_INIT=init is not None, **K)
            return out

        def nest(a, b, init, SEG):
            E, L, M = a.shape
            N = b.shape[2]
            nseg, K = consts(L, SEG)
            out = torch.empty(M, N, dtype=torch.float32)
            tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)
            kernels.gemm_fold_nest_kernel[(tiles,)](a, b, init if init is not None else out, out, E * nseg, nseg, L,
                                                    M, N, *a.stride(), *b.stride(), HAS_INIT=init is not None,
                                                    **K)
            return out

        def partials(a, b, init, group, SEG):
            E, L, M = a.shape
            N = b.shape[2]
            nseg, K = consts(L, SEG)
            out = torch.empty(M, N, dtype=torch.float32)
            buf = torch.empty(group, M * N, dtype=torch.float32)
            tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)
            for u0 in range(0, E * nseg, group):
                n = min(group, E * nseg - u0)
                kernels.gemm_partials_kernel[(tiles, n)](a, b, buf, u0, nseg, L, M, N, *a.stride(), *b.stride(), **K)
                src = (init if init is not None else out) if u0 == 0 else out
                kernels.fold_kernel[(triton.cdiv(M * N, 64),)](buf, src, out, n, M * N, buf.stride(0),
                                                              HAS_INIT=(init is not None) or u0 > 0, BLOCK=64)
            return out

        g = torch.Generator().manual_seed(3)
        cases = 0
        for E, L, M, N, SEG in ((5, 37, 40, 24, 4096), (3, 16, 16, 50, 4096), (3, 37, 40, 24, 16)):
            a = torch.randn(E, L, M, generator=g)
            b = torch.randn(E, L, N, generator=g).transpose(1, 2).contiguous().transpose(1, 2)
            init = torch.randn(M, N, generator=g)
            for i in (None, init):
                want = chain(a, b, i, SEG)
                assert bits_equal(nest(a, b, i, SEG), want), ("nest", E)
                for spp in (1, 2, E * max(1, triton.cdiv(L, SEG)) - 1):
                    assert bits_equal(chain(a, b, i, SEG, spp), want), ("chain", spp, E)
                for group in (1, 2, E):
                    assert bits_equal(partials(a, b, i, group, SEG), want), ("partials", group, E)
                cases += 1
        print("cases", cases)
    """)
    assert "cases 6" in run_python(code, interpret=True)


def test_tma_kernels_under_the_interpreter_give_the_chains_bits():
    """The two TMA kernels (one tile per program; persistent on 1, 2 and 5 programs) on the CPU under Triton's
    interpreter, fp16 inputs (the interpreter's descriptor loads return bf16 as raw integers): the bits of the
    chain kernel in one group, with and without ``init``, over several tiles, partial tiles at the edges of M and
    N, a partial last K block and examples of three segments."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernels on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent("""
        import torch, triton
        from triton.tools.tensor_descriptor import TensorDescriptor
        from tests.fold.interpreter import allow_runtime_loop_bounds
        allow_runtime_loop_bounds()
        from ordered_ssd.fold import kernels
        from tests.helpers import bits_equal
        T = dict(BM=16, BN=16, BK=16, GROUP_M=2)

        def chain(a, b, init, SEG):
            E, L, M = a.shape
            N = b.shape[2]
            nseg = max(1, triton.cdiv(L, SEG))
            out = torch.empty(M, N, dtype=torch.float32)
            tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)
            sync = torch.zeros(tiles + 1, dtype=torch.int32)
            kernels.gemm_fold_chain_kernel[(tiles,)](
                a, b, init if init is not None else out, out, sync, E * nseg, nseg, L, M, N, *a.stride(),
                *b.stride(), E * nseg, HAS_INIT=init is not None, IEEE=False, SEG=SEG, AQ=1, BQ=1, MQ=1, NQ=1, **T)
            return out

        def tma(a, b, init, SEG, programs=None):
            E, L, M = a.shape
            N = b.shape[2]
            nseg = max(1, triton.cdiv(L, SEG))
            out = torch.empty(M, N, dtype=torch.float32)
            tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)
            ad = TensorDescriptor(a, list(a.shape), list(a.stride()), [1, 16, 16])
            bd = TensorDescriptor(b, list(b.shape), list(b.stride()), [1, 16, 16])
            args = (ad, bd, init if init is not None else out, out, E * nseg, nseg, L, M, N)
            if programs is None:
                kernels.gemm_fold_tma_kernel[(tiles,)](*args, HAS_INIT=init is not None, SEG=SEG, **T)
            else:
                kernels.gemm_fold_tma_persistent_kernel[(programs,)](*args, programs, HAS_INIT=init is not None,
                                                                     SEG=SEG, **T)
            return out

        g = torch.Generator().manual_seed(5)
        cases = 0
        for E, L, M, N, SEG in ((5, 37, 40, 24, 4096), (3, 16, 16, 56, 4096), (3, 37, 40, 24, 16)):
            a = torch.randn(E, L, M, generator=g).half()
            b = torch.randn(E, L, N, generator=g).half()
            init = torch.randn(M, N, generator=g)
            for i in (None, init):
                want = chain(a, b, i, SEG)
                assert bits_equal(tma(a, b, i, SEG), want), ("tma", E)
                for programs in (1, 2, 5):
                    assert bits_equal(tma(a, b, i, SEG, programs), want), ("tma-persistent", programs, E)
                cases += 1
        print("cases", cases)
    """)
    assert "cases 6" in run_python(code, interpret=True)


def test_variant_kernels_compile_for_sm90_on_tensor_cores():
    """Ahead-of-time compile for sm_90 (no GPU needed) at every configuration of the variants: each compiles, fits
    the H200's shared memory, and its products run on wgmma."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernels on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent("""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from ordered_ssd.fold import GEMM_FOLD_VARIANTS, kernels

        done = 0
        for kind, (BM, BN, BK, G, w, s) in GEMM_FOLD_VARIANTS[1:]:
            fn = {"partials": kernels.gemm_partials_kernel, "nest": kernels.gemm_fold_nest_kernel,
                  "chain": kernels.gemm_fold_chain_kernel, "tma": kernels.gemm_fold_tma_kernel,
                  "tma-persistent": kernels.gemm_fold_tma_persistent_kernel}[kind]
            const = {"IEEE": False, "BM": BM, "BN": BN, "BK": BK, "GROUP_M": G, "SEG": 4096, "AQ": 1, "BQ": 1,
                     "MQ": 1, "NQ": 1, "HAS_INIT": kind != "partials"}
            const = {n: v for n, v in const.items() if n in fn.arg_names}
            sig = {n: "constexpr" if n in const else {"a_ptr": "*bf16", "b_ptr": "*bf16", "sync_ptr": "*i32",
                                                      "a_desc": f"tensordesc<bf16[1,{BK},{BM}]>",
                                                      "b_desc": f"tensordesc<bf16[1,{BK},{BN}]>"}.get(
                n, "*fp32" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": w, "num_stages": s})
            ptx = k.asm["ptx"]
            assert "wgmma.mma_async" in ptx and k.metadata.shared <= 232448, (kind, BM, BN)
            assert ("cp.async.bulk.tensor.3d" in ptx) == kind.startswith("tma"), kind  # TMA loads, and only there
            done += 1
        print("compiled", done)
    """)
    assert f"compiled {len(GEMM_FOLD_VARIANTS) - 1}" in run_python(code, interpret=False)


def test_gemm_fold_kernels_never_compile_the_length_as_a_constant():
    """Reduction version 4: the three GEMM-fold kernels take ``L`` with ``do_not_specialize``, so ``L == 1`` is not
    compiled as a constant (which unrolled the K loop and let Triton fold ``acc += p`` into the tensor-core
    accumulation); their other integer arguments keep Triton's specialisation. Ahead-of-time compiles for sm_90
    at ``L`` = 1 given as a constant, with one segment per example (``NSEG`` = 1, which Triton does specialise as a
    constant), show what that did: the chain kernel's loop over a program's further segments (and the nest kernel's
    only product) accumulate into the running sum."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernels on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent(r"""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from ordered_ssd.fold import kernels

        for fn in (kernels.gemm_fold_chain_kernel, kernels.gemm_fold_nest_kernel, kernels.gemm_partials_kernel):
            flags = {p.name: p.do_not_specialize for p in fn.params}
            assert flags["L"] is True and not any(v for k, v in flags.items() if k != "L"), flags
        fused = {}
        for name, fn, extra in (("chain", kernels.gemm_fold_chain_kernel, {"HAS_INIT": True}),
                                ("nest", kernels.gemm_fold_nest_kernel, {"HAS_INIT": True})):
            for L in ("one", "i32"):
                const = {"IEEE": False, "BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8, "SEG": 4096, "AQ": 1,
                         "BQ": 1, "MQ": 1, "NQ": 1, "NSEG": 1, **extra}
                if L == "one":
                    const["L"] = 1
                sig = {n: "constexpr" if n in const else {"a_ptr": "*bf16", "b_ptr": "*bf16", "sync_ptr": "*i32"}.get(
                    n, "*fp32" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
                k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
                dots = [ln for ln in k.asm["ttir"].splitlines() if "tt.dot" in ln]
                fused[(name, L)] = any("%acc" in ln.split("=", 1)[1].split(",")[2] for ln in dots)
        assert fused == {("chain", "one"): True, ("chain", "i32"): False, ("nest", "one"): True,
                         ("nest", "i32"): False}, fused
        # do_not_specialize also drops the divisible-by-16 hint on L: with and without it, the same fp32
        # additions, loads, stores and tensor-core instructions (only the K masks' comparisons differ)
        import collections, re
        fn = kernels.gemm_fold_chain_kernel
        const = {"IEEE": False, "BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8, "HAS_INIT": True}
        sig = {n: "constexpr" if n in const else {"a_ptr": "*bf16", "b_ptr": "*bf16", "sync_ptr": "*i32"}.get(
            n, "*fp32" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
        names = list(fn.arg_names)
        hints = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                 if n not in const and n not in ("L", "NB", "sync_ptr")}
        counts = []
        for with_l in (True, False):
            attrs = dict(hints)
            if with_l:
                attrs[(names.index("L"),)] = [["tt.divisibility", 16]]
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 4})
            ops = collections.Counter(re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z]+(?:\.[a-z0-9_]+)*)", k.asm["ptx"],
                                                 re.M))
            counts.append({o: c for o, c in ops.items() if o.startswith(("add.", "fma", "wgmma", "ld.global",
                                                                          "st.global", "cp.async"))})
        assert counts[0] == counts[1] and counts[0].get("add.f32", 0) > 0, counts
        print("checked")
    """)
    assert "checked" in run_python(code, interpret=False)


def test_alignment_hints_give_the_gemm_folds_16_byte_copies():
    """A width such as S5's in_proj (3224, a multiple of 8 but not of 16 elements) gives Triton no divisibility
    hint, so without help the kernels load scalar by scalar with two buffers; passed divided by 8 and multiplied
    back by a constant (``MQ``, ``AQ``, ...: ``gemm._aligned_strides``), the sizes and strides let the chain
    and nest kernels pipeline 16-byte asynchronous copies on sm_90 (ahead-of-time compiles; no GPU needed)."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernels on CUDA)")
    from tests.fold.interpreter import run_python
    code = textwrap.dedent(r"""
        import re
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from ordered_ssd.fold import kernels

        got = {}
        for name, fn in (("chain", kernels.gemm_fold_chain_kernel), ("nest", kernels.gemm_fold_nest_kernel),
                         ("partials", kernels.gemm_partials_kernel)):
            for q in (1, 8):
                const = {"IEEE": False, "BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8, "SEG": 4096, "AQ": q, "BQ": q,
                         "MQ": q, "NQ": q, "s_am": 1, "s_bn": 1}  # unit feature strides: Triton specialises 1
                const.update({"HAS_INIT": True} if "HAS_INIT" in fn.arg_names else {})
                sig = {n: "constexpr" if n in const else {"a_ptr": "*bf16", "b_ptr": "*bf16", "sync_ptr": "*i32"}.get(
                    n, "*fp32" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
                attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in fn.arg_names
                         if n.endswith("_ptr")}  # 16-byte aligned tensors, as torch allocates them
                k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 4})
                ptx = k.asm["ptx"]
                got[(name, q)] = len(re.findall(r"cp\.async\.cg\.shared\.global \[[^\]]+\], \[[^\]]+\], 0x10",
                                                ptx))
                assert "wgmma.mma_async" in ptx, (name, q)
        assert all(got[(n, 1)] == 0 and got[(n, 8)] > 0 for n in ("chain", "nest", "partials")), got
        print("copies", got)
    """)
    assert "copies" in run_python(code, interpret=False)
