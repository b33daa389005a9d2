"""The row-count-invariant GEMM's Triton kernel (imported lazily, on CUDA only: ``import ordered_ssd`` never imports
triton). :mod:`ordered_ssd.ops.row_invariant_gemm` launches it at its pinned configuration.

``c[m, n] = sum_k a[m, k] * b[k, n]`` (``+ bias[n]``): one program per ``BLOCK_M x BLOCK_N`` tile of ``c``, the
``K`` loop in blocks of ``BLOCK_K`` in order from ``k = 0``, tensor-core products accumulated in fp32 (IEEE fp32
products for fp32 inputs), the bias added to the fp32 accumulator, one rounding to ``c``'s dtype. No split-K, no
shape-dependent choice: an element of ``c`` depends on row ``m`` of ``a`` and column ``n`` of ``b`` only, never on
``M`` or on where row ``m`` sits in its tile (the MMA computes each output element from its row and column alone).
``M`` is passed with ``do_not_specialize`` so that ``M == 1`` is not compiled as a constant into other code.
"""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])
def row_invariant_mm_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                            HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped tile order (only which program computes which tile: no value depends on it)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % size_m)
    pid_n = (pid % per_group) // size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + offs_k[:, None] * s_bk + offs_n[None, :] * s_bn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n, other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)
