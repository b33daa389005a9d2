"""GPU: the speed choice of bit-neutral parameters changes no bit at keys the proof never ran.

For layer shapes inside the proof's key range (``csrc_bindings.pinned.neutral_params.PROVEN``) but at keys none of
its cases used, every kernel whose launched configuration differs from its order configuration (a speed-table or
``nearest-speed-v1`` choice) gives bitwise the same outputs at both, twice each, with a partial last chunk and two
groups. Guards the rule that borrows neutral parameters from the nearest timed entry.
"""
import dataclasses

import pytest
import torch

from tests.helpers import bits_equal

# (chunk_size, headdim, dstate, nheads): in range, but keys of no proof case (the proof ran 64/32/16, 256/64/128,
# 128/128/64, 128/128/256)
SHAPES = [(128, 64, 32, 8), (64, 64, 128, 16), (256, 32, 64, 12), (128, 128, 128, 8), (64, 64, 256, 16),
          (256, 128, 256, 8)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_speed_choice_gives_the_order_configurations_bits(dtype):
    from csrc_bindings._configs import device_arch
    from csrc_bindings._examples import problem_for_key
    from csrc_bindings._registry import layer_keys, order_config, pinned_config, run_kernel

    arch = device_arch("cuda")
    compared, failures = [], []
    for chunk_size, headdim, dstate, nheads in SHAPES:
        for kernel, key, role in layer_keys(chunk_size=chunk_size, headdim=headdim, dstate=dstate, nheads=nheads):
            kdt = dtype if role == "model" else torch.float32
            chosen = pinned_config(kernel, key, kdt, arch)
            if not chosen.speed:
                continue
            order = order_config(kernel, key, kdt, arch)
            p = problem_for_key(kernel, key, kdt, "cuda", batch=2, seqlen=int(2.5 * chunk_size), nheads=nheads,
                                ngroups=2)
            runs = []
            for cfg in (chosen, order, chosen):
                outs = run_kernel(kernel, p, dataclasses.replace(cfg, source="explicit"))
                torch.cuda.synchronize()
                runs.append(outs)
            same = all(len(r) == len(runs[0]) and all(bits_equal(a, b) for a, b in zip(r, runs[0])) for r in runs)
            compared.append((kernel, tuple(key.items()), chosen.speed))
            if not same:
                failures.append((kernel, key, chosen.as_dict(), order.as_dict()))
    assert compared, "no launch at these shapes had a speed choice: nothing was compared"
    assert failures == []
