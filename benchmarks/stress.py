"""Stress the bitwise promise on the GPU: many training steps of ``OrderedMamba2`` on fixed inputs, under load.

For each shape of :data:`SHAPES` (bf16 and fp32; one with ``seq_idx``, one with ``ngroups > 1``, one at B = 32) the
script runs ``--steps`` forward + backward steps on the same inputs and compares the output, the input gradient and
every parameter gradient with the first step's, bit for bit (``torch.equal`` on integer views, on the GPU), while
another process loads the same GPU with large GEMMs and memory copies (``--load``). Then it starts ``--fresh``
child processes, each with an empty Triton cache, and one more with ``CUDA_LAUNCH_BLOCKING=1``, and compares the
SHA-256 of their first step with this process's; the children run while this process runs its steps.

    python benchmarks/stress.py --steps 1000 --load --fresh 3 --out stress-out     # the full run
    python benchmarks/stress.py --short --out stress-out                            # the GPU gate's short mode

Prints one line per shape and a summary line ``stress: N/N steps identical, K/K fresh processes identical`` (with
``--load``: whether the load process was still running when the steps ended, and its iteration count); writes
``stress.json`` under ``--out``. Exit status 0 only with zero mismatches and, with ``--load``, a load that lasted.
A step is a forward and a backward on fixed parameters and inputs (no optimizer step), compared with the first.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ordered_ssd import OrderedMamba2  # noqa: E402
from ordered_ssd.apps.files import atomic_write_json  # noqa: E402
from ordered_ssd.digest import bit_view, tensor_sha256  # noqa: E402

# name: (dtype, batch, seqlen, layer options, packed sequences)
SHAPES = {
    "bf16-B4-L512": (torch.bfloat16, 4, 512, dict(d_model=256, d_state=64, headdim=64, chunk_size=128), False),
    "fp32-ngroups4": (torch.float32, 2, 300, dict(d_model=256, d_state=32, headdim=32, ngroups=4, chunk_size=64),
                      False),
    "bf16-seq_idx": (torch.bfloat16, 3, 400, dict(d_model=192, d_state=64, headdim=32, chunk_size=64), True),
    "bf16-B32": (torch.bfloat16, 32, 128, dict(d_model=128, d_state=16, headdim=32, chunk_size=64), False),
}


def _problem(name):
    dtype, batch, seqlen, options, packed = SHAPES[name]
    torch.manual_seed(0)
    layer = OrderedMamba2(**options, device="cuda").to(dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(batch, seqlen, options["d_model"], device="cuda", generator=gen).to(dtype)
    dout = torch.randn(batch, seqlen, options["d_model"], device="cuda", generator=gen).to(dtype)
    seq_idx = None
    if packed:
        seq_idx = torch.zeros(batch, seqlen, dtype=torch.int32, device="cuda")
        for b in range(batch):
            for cut in range(1 + b, seqlen, 97 + 13 * b):
                seq_idx[b, cut:] += 1
    return layer, u, dout, seq_idx


def _step(layer, u, dout, seq_idx):
    layer.zero_grad(set_to_none=True)
    x = u.clone().requires_grad_(True)
    out = layer(x, seq_idx=seq_idx)
    out.backward(dout)
    result = {"out": out.detach(), "u.grad": x.grad}
    result.update({f"{n}.grad": p.grad for n, p in layer.named_parameters()})
    return result


def run_shape(name, steps):
    """``(first-step digests, mismatching steps)`` of ``steps`` steps on the same inputs."""
    layer, u, dout, seq_idx = _problem(name)
    first = {k: bit_view(v).clone() for k, v in _step(layer, u, dout, seq_idx).items()}
    mismatches = []
    for i in range(1, steps):
        got = _step(layer, u, dout, seq_idx)
        bad = [k for k, v in got.items() if not torch.equal(bit_view(v), first[k])]
        if bad:
            mismatches.append({"step": i, "tensors": bad})
    torch.cuda.synchronize()
    return {k: tensor_sha256(v) for k, v in first.items()}, mismatches


def _load_main(seconds):
    """The load: large bf16 GEMMs and device-to-device copies in a loop, for ``seconds`` or until SIGTERM; prints
    ``{"load_iterations": n}`` at the end (the parent records it in ``stress.json``)."""
    import signal

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    end = time.time() + seconds
    n = 0
    while time.time() < end and not stop:
        for _ in range(8):
            a = (a @ a).clamp_(-1, 1)
            dst.copy_(src)
        torch.cuda.synchronize()
        n += 8
    print(json.dumps({"load_iterations": n}), flush=True)


def _start_children(envs):
    """Start one fresh child process per environment of ``envs``; each prints its first-step digests (and compiles
    every kernel anew when its Triton cache is empty). They run while this process runs its own steps."""
    return [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child-digests"],
                             env=dict(os.environ, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for extra in envs]


def _collect_children(procs):
    """The children's digests, in order (``RuntimeError`` with the end of its stderr if a child failed)."""
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"child failed ({proc.returncode}): {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="steps per shape (default: 1000)")
    ap.add_argument("--short", action="store_true", help="the gate's short mode: 100 steps, 1 fresh process")
    ap.add_argument("--load", action="store_true", help="load the same GPU from another process meanwhile")
    ap.add_argument("--fresh", type=int, default=3, help="fresh processes with empty Triton caches (default: 3)")
    ap.add_argument("--out", default="stress-out", help="folder for stress.json (default: stress-out)")
    ap.add_argument("--child-digests", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-load", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_load is not None:
        _load_main(args.child_load)
        return 0
    if args.child_digests:
        print(json.dumps({name: run_shape(name, 1)[0] for name in SHAPES}))
        return 0
    if not torch.cuda.is_available():
        print("stress: needs a CUDA GPU with the native extras (README, GPU section)", file=sys.stderr)
        return 2
    steps, fresh = (100, 1) if args.short else (args.steps, args.fresh)
    os.makedirs(args.out, exist_ok=True)
    loader = None
    if args.load:
        loader = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child-load", "3600"],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(5)  # let it start loading
    report = {"steps_per_shape": steps, "load": bool(args.load), "shapes": {}, "fresh": []}
    runs = [{"TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="stress-triton-")} for _ in range(fresh)]
    runs.append({"TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="stress-triton-"), "CUDA_LAUNCH_BLOCKING": "1"})
    children = _start_children(runs)  # they run meanwhile, under the same load
    total = bad_total = 0
    try:
        for name in SHAPES:
            t0 = time.perf_counter()
            digests, mismatches = run_shape(name, steps)
            report["shapes"][name] = {"digests": digests, "mismatching_steps": mismatches,
                                      "seconds": round(time.perf_counter() - t0, 2)}
            total += steps
            bad_total += len(mismatches)
            print(f"{name:>16}: {steps - len(mismatches)}/{steps} steps identical "
                  f"({report['shapes'][name]['seconds']} s{', under load' if loader else ''})", flush=True)
            atomic_write_json(os.path.join(args.out, "stress.json"), report)
    finally:
        if loader is not None:
            early = loader.poll()  # the load must still be running when the steps end
            loader.terminate()
            out, _ = loader.communicate()
            report["load_alive_to_the_end"] = early is None
            report["load_exit_status_before_stop"] = early
            report["load_output"] = out.strip().splitlines()[-1:] if out else []
    if loader is not None and not report["load_alive_to_the_end"]:
        print(f"stress: the load process ended early (exit status {report['load_exit_status_before_stop']}): "
              "the steps did not all run under load", file=sys.stderr)
    load_ok = loader is None or report["load_alive_to_the_end"]
    here = {name: report["shapes"][name]["digests"] for name in SHAPES}
    same = 0
    for env_extra, digests in zip(runs, _collect_children(children)):
        ok = digests == here
        same += ok
        report["fresh"].append({"env": sorted(env_extra), "identical": ok})
    report["summary"] = (f"stress: {total - bad_total}/{total} steps identical, {same}/{len(runs)} fresh processes "
                         f"identical ({fresh} with empty Triton caches, 1 with CUDA_LAUNCH_BLOCKING=1)"
                         + ("" if loader is None else f"; load ran to the end: {'yes' if load_ok else 'NO'} "
                            f"({report['load_output']})"))
    atomic_write_json(os.path.join(args.out, "stress.json"), report)
    print(report["summary"])
    return 0 if bad_total == 0 and same == len(runs) and load_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
