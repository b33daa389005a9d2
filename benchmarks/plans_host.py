"""Idle-GPU host milliseconds per training step: native, ordered with launch plans and ordered without them
(``csrc_bindings._plans.disabled()``), interleaved step by step, median of 30 each, per bench shape; and which
launchers kept a plan (``_plans.stats()``: ``(plans, unplannable signatures)``).

    python benchmarks/plans_host.py G6,G1
    MAMBA_DETERMINISTIC=1 CAUSAL_CONV1D_DETERMINISTIC=1 python benchmarks/plans_host.py G6   # native = upstream-det

Needs a CUDA GPU and the native extras. A measuring tool: it asserts nothing (docs/performance.md, "launch plans").
"""
import statistics
import sys

import torch

from csrc_bindings import _plans
from ordered_ssd.apps.bench.host_profile import _split_step
from ordered_ssd.apps.bench.runner import LayerRunner, sync
from ordered_ssd.apps.bench.shapes import named_or_parsed_shape


def main(names: str, steps: int = 30) -> None:
    for name in names.split(","):
        r = LayerRunner(named_or_parsed_shape(name), ["native", "ordered"], torch.device("cuda"), 0)
        for _ in range(5):  # warm-up: compiling, upstream's autotuning, the first plans
            r.step("native")
            r.step("ordered")
        t = {"native": [], "ordered-plans": [], "ordered-no-plans": []}
        for _ in range(steps):
            for mode in t:
                sync(r.device)
                if mode == "ordered-no-plans":
                    with _plans.disabled():
                        f, b = _split_step(r, "ordered")
                else:
                    f, b = _split_step(r, mode.split("-")[0])
                sync(r.device)
                t[mode].append(1000 * (f + b))
        med = {m: round(statistics.median(v), 3) for m, v in t.items()}
        print(name, med, {k: v for k, v in _plans.stats().items() if v != (0, 0)}, flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "G6,G1")
