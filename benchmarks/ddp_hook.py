"""Cost of ordered-ssd's ordered gradient reductions versus DDP's default all-reduce.

Usage (launches itself through ``python -m torch.distributed.run`` when not already under torchrun)::

    python benchmarks/ddp_hook.py --nproc 2                       # CPU: gloo; CUDA if available: nccl
    python benchmarks/ddp_hook.py --nproc 2 --device cuda --json ddp_hook.json
    torchrun --nproc-per-node 2 benchmarks/ddp_hook.py ...         # equivalent

Two measurements, each per rank (median over ``--iters`` after ``--warmup``; the table shows rank 0 and the
slowest rank):

1. **Collective**: one fp32 tensor of each ``--sizes-mb`` size (a DDP bucket is 25 MB by default), reduced by
   (a) DDP's default scheme: divide by N, ``all_reduce`` (sum), (b)
   :func:`ordered_ssd.distributed.ordered_all_reduce` (the rank-ordered hook's reduction: all-to-all of shards,
   fold rank 0 first in fp32, all-gather, divide by N) and (c) :func:`ordered_ssd.distributed.tree_all_reduce`
   (the split-invariant reduction: the same exchange, the shards combined by the pairwise tree).
   Also reports the largest relative difference between (a) and (b) (rounding only).
2. **Training step**: the ``ordered-ssd check`` byte-level LM (``OrderedMamba2`` mixer; the device's default
   size unless given), a rank's shard of the global batch in ``--accum`` micro-steps, forward + backward per
   micro-step + clip + AdamW step, three ways: ``DistributedDataParallel`` (``--bucket-cap-mb``) with its
   built-in all-reduce (``no_sync`` for all micro-steps but the last: the usual accumulation), the same with
   :func:`ordered_ssd.distributed.ordered_allreduce_hook`, and the split-invariant
   :class:`ordered_ssd.TreeGradAccumulator` (every micro-step under ``no_sync``, ``add_block`` after each,
   ``write_grads`` after the last). Peak memory per mode on CUDA (``max_memory_allocated``); on the CPU the
   accumulator's extra buffers (``max_buffers_held`` x the gradient size).

Timings are wall-clock with ``torch.cuda.synchronize`` around each iteration on CUDA and a barrier before it.
Nothing is written unless ``--json PATH`` is given (rank 0 writes it).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _torchrun import resolve_device, self_launch, sync  # noqa: E402


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes (one GPU each on CUDA) when self-launching")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--sizes-mb", default="1,4,25,100", help="comma-separated tensor sizes for the collective test")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=None, help="timed training steps (default: --iters)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--accum", type=int, default=2, help="accumulation micro-steps per rank and step (default: 2)")
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--n-layers", type=int, default=None)
    p.add_argument("--d-state", type=int, default=None)
    p.add_argument("--headdim", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="global batch (divisible by the number of processes)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--skip-collective", action="store_true")
    p.add_argument("--skip-model", action="store_true")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    a = p.parse_args(argv)
    if a.nproc < 1 or a.iters < 1 or a.warmup < 0:
        p.error("--nproc and --iters must be >= 1, --warmup >= 0")
    if a.accum < 1 or a.accum & (a.accum - 1):
        p.error(f"--accum: expected a power of two (the tree accumulator's blocks per rank), got {a.accum}")
    try:
        a.sizes = [float(s) for s in a.sizes_mb.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes-mb: expected comma-separated numbers, got {a.sizes_mb!r}")
    if not a.sizes or min(a.sizes) <= 0:
        p.error(f"--sizes-mb: expected positive sizes, got {a.sizes_mb!r}")
    return a


def _launch(a) -> int:
    return self_launch(__file__, a.nproc, resolve_device(a.device))


def _timed(fn, device, iters, warmup):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        dist.barrier()
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gather(x):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    return out


def _collective(a, ctx, world):
    from ordered_ssd.distributed import ordered_all_reduce, tree_all_reduce

    rows = []
    for mb in a.sizes:
        n = int(mb * 2**20 / 4)
        g = torch.Generator().manual_seed(ctx.rank)
        src = torch.randn(n, generator=g).to(ctx.device)
        t = torch.empty_like(src)

        def default():
            t.copy_(src)
            t.div_(world)
            dist.all_reduce(t)

        def ordered():
            t.copy_(src)
            ordered_all_reduce(t).wait()

        def tree():
            t.copy_(src)
            tree_all_reduce(t)

        ms_d = 1000 * _timed(default, ctx.device, a.iters, a.warmup)
        default()
        ref = t.clone()
        ms_o = 1000 * _timed(ordered, ctx.device, a.iters, a.warmup)
        ordered()
        rel = float((t - ref).abs().max() / ref.abs().max())
        ms_t = 1000 * _timed(tree, ctx.device, a.iters, a.warmup) if world & (world - 1) == 0 else None
        rows.append({"size_mb": mb, "allreduce_ms": ms_d, "ordered_ms": ms_o, "tree_ms": ms_t, "max_rel_diff": rel})
        src = t = ref = None  # free before the next size (rebinding, not del: the closures read these names)
    return rows


def _model_step(a, ctx, world):
    from torch.nn.parallel import DistributedDataParallel

    from ordered_ssd import TreeGradAccumulator
    from ordered_ssd.apps.check.spec import DEFAULTS
    from ordered_ssd.apps.check.train import build_model
    from ordered_ssd.apps.lm import lm_loss
    from ordered_ssd.distributed import register_ordered_hook, shard_rows

    d = DEFAULTS[ctx.device.type]
    pick = lambda v, k: d[k] if v is None else v  # noqa: E731
    model_cfg = dict(d_model=pick(a.d_model, "d_model"), n_layers=pick(a.n_layers, "n_layers"),
                     d_state=pick(a.d_state, "d_state"), headdim=pick(a.headdim, "headdim"), ngroups=1,
                     chunk_size=pick(a.chunk_size, "chunk_size"), expand=2)
    batch, seq_len = pick(a.batch, "batch"), pick(a.seq_len, "seq_len")
    if batch % (world * a.accum):
        raise SystemExit(f"ddp_hook.py: error: --batch {batch} is not divisible by {world} processes x "
                         f"--accum {a.accum}")
    _, count = shard_rows(batch, world, ctx.rank)
    block = count // a.accum
    spec = {"seed": 0, "mixer": "ordered", "weight_decay": 0.1, "lr": pick(None, "lr"), "model": model_cfg}
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randint(0, 256, (count, seq_len), generator=g).to(ctx.device)
    y = torch.randint(0, 256, (count, seq_len), generator=g).to(ctx.device)
    steps = a.steps or a.iters
    out = {"model": model_cfg, "global_batch": batch, "seq_len": seq_len, "bucket_cap_mb": a.bucket_cap_mb,
           "accum": a.accum}
    for name in ("allreduce", "ordered", "tree"):
        model, opt = build_model(spec, ctx.device)
        ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                                      bucket_cap_mb=a.bucket_cap_mb)
        if name == "ordered":
            register_ordered_hook(ddp)
        acc = TreeGradAccumulator(model.parameters()) if name == "tree" else None
        most_buffers = [0]

        def step():
            opt.zero_grad(set_to_none=True)
            for i in range(a.accum):
                rows = slice(i * block, (i + 1) * block)
                if acc is not None or i < a.accum - 1:
                    with ddp.no_sync():
                        (lm_loss(ddp(x[rows]), y[rows]) / (1 if acc is not None else a.accum)).backward()
                else:
                    (lm_loss(ddp(x[rows]), y[rows]) / a.accum).backward()
                if acc is not None:
                    acc.add_block()
            if acc is not None:
                most_buffers[0] = max(most_buffers[0], acc.max_buffers_held)
                acc.write_grads()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
            opt.step()

        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        out[f"{name}_ms"] = 1000 * _timed(step, ctx.device, steps, max(a.warmup, 2))
        if ctx.device.type == "cuda":
            out[f"{name}_peak_mib"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
        out["n_params"] = sum(p.numel() for p in model.parameters())
        if acc is not None:
            out["tree_extra_mib"] = most_buffers[0] * acc.numel * acc.dtype.itemsize / 2**20
        ddp = model = opt = acc = None  # free before the next mode (the closure reads these names)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    a = _args(argv)
    if "LOCAL_RANK" not in os.environ:
        return _launch(a)
    import gc

    from ordered_ssd.distributed import init_distributed

    device_type = resolve_device(a.device)
    ctx = init_distributed(device_type)
    world = ctx.world_size
    result = {"world_size": world, "backend": ctx.backend, "device": str(ctx.device.type),
              "gpu": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "iters": a.iters}
    try:
        if not a.skip_collective:
            rows = _collective(a, ctx, world)
            every = _gather(rows)
            result["collective"] = [dict(r, allreduce_ms_ranks=[e[i]["allreduce_ms"] for e in every],
                                         ordered_ms_ranks=[e[i]["ordered_ms"] for e in every],
                                         tree_ms_ranks=[e[i]["tree_ms"] for e in every])
                                    for i, r in enumerate(rows)]
        if not a.skip_model:
            st = _model_step(a, ctx, world)
            every = _gather(st)
            result["train_step"] = dict(st, allreduce_ms_ranks=[e["allreduce_ms"] for e in every],
                                        ordered_ms_ranks=[e["ordered_ms"] for e in every],
                                        tree_ms_ranks=[e["tree_ms"] for e in every])
        if ctx.rank == 0:
            print(f"ddp_hook: {world} processes, {ctx.backend} on {result['gpu'] or 'cpu'} "
                  f"({result['threads']} threads/rank), torch {torch.__version__}; median of {a.iters}, "
                  f"ms (rank 0 / slowest rank)")
            for r in result.get("collective", []):
                print(f"  {r['size_mb']:>7.1f} MB fp32: all_reduce {r['allreduce_ms']:8.3f} / "
                      f"{max(r['allreduce_ms_ranks']):8.3f}   ordered {r['ordered_ms']:8.3f} / "
                      f"{max(r['ordered_ms_ranks']):8.3f}   "
                      f"x{max(r['ordered_ms_ranks']) / max(r['allreduce_ms_ranks']):.2f}"
                      + (f"   tree {r['tree_ms']:8.3f} / {max(r['tree_ms_ranks']):8.3f}"
                         f"   x{max(r['tree_ms_ranks']) / max(r['allreduce_ms_ranks']):.2f}" if r["tree_ms"] else "")
                      + f"   max rel diff {r['max_rel_diff']:.1e}")
            if "train_step" in result:
                t = result["train_step"]
                print(f"  train step ({t['n_params'] / 1e6:.2f}M params, d_model {t['model']['d_model']} x "
                      f"{t['model']['n_layers']} layers, global batch {t['global_batch']} x {t['seq_len']}, "
                      f"bucket {t['bucket_cap_mb']} MB): default all-reduce {t['allreduce_ms']:.2f} / "
                      f"{max(t['allreduce_ms_ranks']):.2f}   ordered hook {t['ordered_ms']:.2f} / "
                      f"{max(t['ordered_ms_ranks']):.2f}   "
                      f"overhead {100 * (max(t['ordered_ms_ranks']) / max(t['allreduce_ms_ranks']) - 1):+.1f}%   "
                      f"tree accumulator {t['tree_ms']:.2f} / {max(t['tree_ms_ranks']):.2f}   "
                      f"overhead {100 * (max(t['tree_ms_ranks']) / max(t['allreduce_ms_ranks']) - 1):+.1f}%")
                mem = ", ".join(f"{m} {t[m + '_peak_mib']:.0f} MiB" for m in ("allreduce", "ordered", "tree")
                                if m + "_peak_mib" in t)
                print(f"  {t['accum']} micro-steps per rank; peak memory: {mem or 'n/a (CPU)'}; the accumulator's "
                      f"extra buffers {t['tree_extra_mib']:.1f} MiB")
            if a.json:
                tmp = a.json + ".tmp"
                with open(tmp, "w") as fh:
                    json.dump(result, fh, indent=1)
                os.replace(tmp, a.json)
        return 0
    finally:
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
