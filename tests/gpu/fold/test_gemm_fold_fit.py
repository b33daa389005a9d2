"""GPU: ``fold_example_gemms`` on a device with less shared memory (the limit faked): rule ``gemm-fit-v1`` runs the
bf16/fp16 kernel at fewer pipeline stages (3 at sm_86/sm_89's 101,376 bytes, 2 at 65,536), and the result has the
bits of the pinned 4-stage configuration (``num_stages`` only sets how far ahead the K loop's tiles are loaded).
The kernels Triton compiled at the lowered stage counts are read back from its cache: each asks at most the faked
limit (``metadata.shared``; on sm_90, which keeps ``num_stages`` buffers, exactly the estimate)."""
import pytest
import torch

from tests.helpers import bits_equal

CASES = [(9, 300, 136, 1000), (3, 37, 5, 260), (2, 4096, 1024, 2176)]  # E, L, M, N


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fewer_stages_on_a_smaller_device_give_the_same_bits(monkeypatch, dtype):
    from csrc_bindings import _resources
    from ordered_ssd.fold import GEMM_FOLD_CONFIGS, fold_example_gemms, gemm_fold_config
    from ordered_ssd.fold import kernels  # imports triton

    g = torch.Generator(device="cuda").manual_seed(3)
    inputs = []
    for E, L, M, N in CASES:
        a = torch.randn(E, L, M, device="cuda", generator=g).to(dtype)
        b = torch.randn(E, L, N, device="cuda", generator=g).to(dtype)
        init = torch.randn(M, N, device="cuda", generator=g)
        inputs.append((a, b, init))
    real = _resources.shared_memory_limit("cuda")
    device = torch.cuda.current_device()
    assert gemm_fold_config(dtype, real) == GEMM_FOLD_CONFIGS[dtype]
    pinned = [(fold_example_gemms(a, b), fold_example_gemms(a, b, init)) for a, b, init in inputs]
    for limit, stages in ((101376, 3), (65536, 2)):
        monkeypatch.setattr(_resources, "shared_memory_limit", lambda device, limit=limit: limit)
        want = GEMM_FOLD_CONFIGS[dtype] if dtype == torch.float32 else (128, 128, 64, 8, 8, stages)
        assert gemm_fold_config(dtype, limit) == want
        for (a, b, init), (p0, p1) in zip(inputs, pinned):
            r0, r1 = fold_example_gemms(a, b), fold_example_gemms(a, b, init)
            assert bool(torch.isfinite(r0).all()) and bits_equal(r0, p0) and bits_equal(r1, p1), (limit, a.shape)
        compiled = [k.metadata.shared for k in kernels.gemm_fold_chain_kernel.device_caches[device][0].values()
                    if k.metadata.num_stages == want[5] and k.metadata.num_warps == want[4]]
        assert compiled and max(compiled) <= limit, (limit, compiled)
