"""The fold's Triton kernels, as ordinary top-level ``@triton.jit`` functions.

Imported lazily by :mod:`ordered_ssd.fold.primitives` (on CUDA only), so ``import ordered_ssd`` never imports
triton. Every kernel adds in the order the docstring of :mod:`ordered_ssd.fold` states: one fp32 addition at a
time, the partition index in a sequential loop inside one program, so the block sizes of the launches (bit-neutral:
they only decide which output elements a program owns) never change a value.
"""
import triton
import triton.language as tl


@triton.jit
def fold_kernel(p_ptr, init_ptr, out_ptr, K, M, stride_k, HAS_INIT: tl.constexpr, BLOCK: tl.constexpr):
    """``out[m] = (((init[m] or +0.0) + p[0, m]) + p[1, m]) + ...`` in fp32; one program per ``BLOCK`` of m."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_INIT:
        acc += tl.load(init_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for k in range(0, K):
        acc += tl.load(p_ptr + k.to(tl.int64) * stride_k + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc, mask=mask)


@triton.jit
def scan_kernel(p_ptr, out_ptr, R, N, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    """Running fp32 sum along each row of ``p`` [R, N] (position 0 first, or N - 1 first with ``REVERSE``)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < R
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, N):
        j = N - 1 - i if REVERSE else i
        acc += tl.load(p_ptr + rows * N + j, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows * N + j, acc, mask=mask)


@triton.jit
def gemm_fold_kernel(a_ptr, b_ptr, init_ptr, out_ptr, NB, L, M, N, s_ab, s_al, s_am, s_bb, s_bl, s_bn,
                     HAS_INIT: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, GROUP_M: tl.constexpr):
    """``out = fold_e(a[e]^T @ b[e])``: one program per [BM, BN] tile of ``out``, the examples in order."""
    # one program per [BM, BN] tile of out; grouped tile order for L2 reuse (changes no value)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gsz = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gsz
    pid_n = (pid % width) // gsz
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    out_offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if HAS_INIT:
        acc += tl.load(init_ptr + out_offs, mask=out_mask, other=0.0).to(tl.float32)
    a_e = a_ptr  # example e's base pointers (pointer arithmetic is 64-bit)
    b_e = b_ptr
    for _ in range(0, NB):
        # the partial of example e: K blocks of BK positions in order, fp32 accumulation
        a_ptrs = a_e + rm[:, None] * s_am + rk[None, :] * s_al
        b_ptrs = b_e + rk[:, None] * s_bl + rn[None, :] * s_bn
        p = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, L, BK):
            a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < L - k0), other=0.0)
            b = tl.load(b_ptrs, mask=(rk[:, None] < L - k0) & (rn[None, :] < N), other=0.0)
            if IEEE:
                p = tl.dot(a, b, p, input_precision="ieee")
            else:
                p = tl.dot(a, b, p)
            a_ptrs += BK * s_al
            b_ptrs += BK * s_bl
        acc += p  # the lexical fold: one fp32 addition per example, example 0 first
        a_e += s_ab
        b_e += s_bb
    tl.store(out_ptr + out_offs, acc, mask=out_mask)
