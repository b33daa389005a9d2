"""GPU: the shared-memory check before every launch (``csrc_bindings._resources``, rule ``fit-stages-v1``).

* ``num_stages`` is bit-neutral for every Triton kernel of the layer: each kernel's example, at its pinned block
  sizes and ``num_warps``, gives the same bits at every stage count from the pinned one down to 1 (bf16 at headdim
  64; fp32 at headdim 256, where the kernels that block the head dimension whole hold 256-wide tiles);
* a configuration passed explicitly that does not fit raises ``ValueError`` naming the kernel, the bytes, the limit
  and ``headdim=512``, and launches nothing;
* the pinned configuration of such a kernel, refused by Triton, runs at fewer stages, with the same bits.
"""
import dataclasses

import pytest
import torch

from tests.helpers import bits_equal


def _outputs(kernel, p, cfg):
    from csrc_bindings._registry import run_kernel

    outs = run_kernel(kernel, p, cfg)
    torch.cuda.synchronize()
    return outs


@pytest.mark.parametrize("dtype,headdim", [(torch.bfloat16, 64), (torch.float32, 256)], ids=["bf16-p64", "fp32-p256"])
def test_num_stages_does_not_change_a_bit_of_any_kernel(dtype, headdim):
    from csrc_bindings._configs import device_arch
    from csrc_bindings._examples import problem_for_key
    from csrc_bindings._registry import layer_keys, pinned_config

    compared = []
    for kernel, key, role in layer_keys(chunk_size=256, headdim=headdim, dstate=128, nheads=8):
        kdt = dtype if role == "model" else torch.float32
        cfg = pinned_config(kernel, key, kdt, device_arch("cuda"))
        p = problem_for_key(kernel, key, kdt, "cuda", batch=2, seqlen_chunks=2, nheads=8)
        first = None
        for stages in range(cfg.num_stages, 0, -1):
            explicit = dataclasses.replace(cfg, num_stages=stages, source="explicit")
            try:
                outs = _outputs(kernel, p, explicit)
            except ValueError as exc:  # this stage count does not fit the device: nothing to compare
                assert "bytes of shared memory" in str(exc)
                continue
            if first is None:
                first = (stages, outs)
                continue
            assert len(outs) == len(first[1])
            for i, (a, b) in enumerate(zip(outs, first[1])):
                assert bits_equal(a, b), (kernel, key, f"output {i}", f"num_stages {stages} vs {first[0]}")
            compared.append((kernel, stages))
    assert {k for k, _ in compared} >= {"chunk_state_bwd_db", "chunk_scan_bwd_dC", "chunk_scan_bwd_dcb",
                                        "chunk_scan_chunk_state_bwd_dx", "chunk_scan_fwd", "bmm_chunk_fwd"}


def _p512_fp32(kernel):
    from csrc_bindings._examples import problem_for_key
    from csrc_bindings._registry import layer_keys

    key = dict(next(k for n, k, _ in layer_keys(chunk_size=256, headdim=512, dstate=128, nheads=4) if n == kernel))
    return key, problem_for_key(kernel, key, torch.float32, "cuda", batch=1, seqlen_chunks=2, nheads=4)


def test_an_explicit_config_that_does_not_fit_raises_before_launching(monkeypatch):
    from csrc_bindings import _launch_cache, _resources
    from csrc_bindings._registry import pinned_config

    monkeypatch.setattr(_resources, "_verdicts", {})
    monkeypatch.setattr(_launch_cache, "_caches", {})  # no kernel kept by an earlier test
    key, p = _p512_fp32("chunk_state_bwd_db")
    cfg = pinned_config("chunk_state_bwd_db", key, torch.float32, "sm_90")
    limit = _resources.shared_memory_limit("cuda")
    too_big = dataclasses.replace(cfg, num_stages=3, source="explicit")
    with pytest.raises(ValueError) as err:
        _outputs("chunk_state_bwd_db", p, too_big)
    msg = str(err.value)
    assert msg.startswith("chunk_state_bwd_db: configuration ") and "num_stages=3 asks " in msg
    asked = int(msg.split(" asks ")[1].split(" bytes")[0])
    assert asked > limit and f"more than the {limit} bytes" in msg
    assert "(layer sizes: headdim=512, dstate=128, chunk_size=256" in msg and "BLOCK_SIZE_K=512" in msg


def test_a_pinned_config_runs_at_fewer_stages_with_the_same_bits(monkeypatch):
    """Triton refuses the pinned 3-stage kernel (262,400 bytes at headdim 512 in fp32 on sm_90; a limit faked
    below 200,000 bytes elsewhere); the launch runs it at 2 stages, with the bits of an explicit 2-stage launch."""
    from csrc_bindings import _launch_cache, _resources
    from csrc_bindings._registry import pinned_config

    key, p = _p512_fp32("chunk_scan_bwd_dC")
    cfg = pinned_config("chunk_scan_bwd_dC", key, torch.float32, "sm_90")
    assert cfg.source != "explicit" and cfg.num_stages >= 3
    want = _outputs("chunk_scan_bwd_dC", p, dataclasses.replace(cfg, num_stages=2, source="explicit"))
    monkeypatch.setattr(_resources, "_verdicts", {})
    monkeypatch.setattr(_launch_cache, "_caches", {})  # a kept kernel would skip the fitting this test watches
    real = _resources.shared_memory_limit("cuda")
    monkeypatch.setattr(_resources, "shared_memory_limit", lambda device: min(real, 200000))
    got = _outputs("chunk_scan_bwd_dC", p, None)
    assert [v for k, v in _resources._verdicts.items() if k[0] == "chunk_scan_bwd_dC"] == [2]
    assert all(bits_equal(a, b) for a, b in zip(got, want))
