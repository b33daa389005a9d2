"""What ordering costs for Mamba-3: one ``OrderedMamba3`` training step (forward + backward) against mamba-ssm's
``Mamba3`` with the same weights, in one process on one GPU.

Usage::

    python benchmarks/mamba3_cost.py [--shape d_model,d_state,headdim,chunk_size,batch,seqlen ...] [--steps 20]
        [--rounds 3] [--json PATH]

Per shape (bf16 layers): a warm-up of both (upstream's autotuner times its candidates there), then ``--rounds``
interleaved rounds of ``--steps`` steps each (native, ordered, native, ...), synchronised; the time of a layer is
its median round, per step. Peak memory: ``torch.cuda.max_memory_allocated`` over one step after a reset, minus the
memory allocated before it. Prints one line per shape with the ratios ordered / native (targets: 1.05 for time,
1.10 for memory).
"""
import argparse
import json
import statistics
import sys
import time

import torch

DEFAULT_SHAPES = ("512,32,32,32,8,1024", "1024,64,64,64,4,2048")


def _step(layer, u, dout):
    u.grad = None
    layer(u).backward(dout)


def _peak(layer, u, dout) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    _step(layer, u, dout)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def measure(shape: str, steps: int, rounds: int) -> dict:
    from mamba_ssm.modules.mamba3 import Mamba3

    from ordered_ssd.modules.mamba3 import OrderedMamba3

    d_model, d_state, headdim, chunk, batch, seqlen = (int(v) for v in shape.split(","))
    cfg = dict(d_model=d_model, d_state=d_state, headdim=headdim, chunk_size=chunk)
    torch.manual_seed(0)
    native = Mamba3(**cfg, device="cuda", dtype=torch.bfloat16)
    ordered = OrderedMamba3(**cfg, device="cuda", dtype=torch.bfloat16)
    ordered.load_state_dict(native.state_dict(), strict=True)
    u = torch.randn(batch, seqlen, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn_like(u)
    layers = {"native": native, "ordered": ordered}
    for layer in layers.values():
        for _ in range(3):
            _step(layer, u, dout)
    times = {k: [] for k in layers}
    for _ in range(rounds):
        for name, layer in layers.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                _step(layer, u, dout)
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / steps * 1e3)
    ms = {k: statistics.median(v) for k, v in times.items()}
    peak = {k: _peak(layer, u, dout) for k, layer in layers.items()}
    return {"shape": cfg | {"batch": batch, "seqlen": seqlen, "dtype": "bf16"}, "ms_per_step": ms,
            "rounds_ms": times, "peak_bytes": peak, "time_ratio": ms["ordered"] / ms["native"],
            "memory_ratio": peak["ordered"] / peak["native"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("mamba3_cost: needs a CUDA GPU with mamba-ssm installed", file=sys.stderr)
        return 2
    rows = []
    print(f"mamba3_cost: {torch.cuda.get_device_name()} torch {torch.__version__}")
    for shape in a.shape or DEFAULT_SHAPES:
        r = measure(shape, a.steps, a.rounds)
        rows.append(r)
        print(f"  {shape}: native {r['ms_per_step']['native']:.3f} ms, ordered {r['ms_per_step']['ordered']:.3f} ms "
              f"(x{r['time_ratio']:.3f}); peak {r['peak_bytes']['native'] / 2**20:.1f} / "
              f"{r['peak_bytes']['ordered'] / 2**20:.1f} MiB (x{r['memory_ratio']:.3f})", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
