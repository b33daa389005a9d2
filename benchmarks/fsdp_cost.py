"""Cost of FSDP2 with ordered-ssd's ordered reduce-scatter against FSDP2's default, and of the sharded checkpoints.

Usage (launches itself through ``python -m torch.distributed.run`` when not already under torchrun)::

    python benchmarks/fsdp_cost.py --nproc 4                       # CPU: gloo
    python benchmarks/fsdp_cost.py --nproc 2 --device cuda --json fsdp_cost.json

The ``ordered-ssd check`` byte-level LM (``OrderedMamba2`` mixers; the device's default size unless given),
``fully_shard`` on every mixer and on the whole model, two copies built side by side:

* **default**: FSDP2's own reduce-scatter (the backend's sum, divided by R) after every micro-batch, its own
  accumulation into the sharded ``.grad``, ``clip_grad_norm_``;
* **ordered**: :func:`ordered_ssd.fsdp.set_ordered_reduce_scatter`, :class:`ordered_ssd.fsdp.FSDPTreeAccumulator`,
  :func:`ordered_ssd.fsdp.ordered_clip_grad_norm_`.

A step is ``--accum`` micro-batches of ``--batch / (R * accum)`` examples per rank (forward, backward), clip, AdamW.
The two are timed **interleaved** (``--rounds`` rounds of ``--iters`` steps each, default then ordered; the median
step of each), after ``--warmup`` steps each. Peak memory per mode on CUDA (``max_memory_allocated`` over its
timed steps); on the CPU the ordered path's extra buffers are reported from their sizes (the reduce-scatter's
received copy and tree levels of the largest FSDP group, the accumulator's stack, the clip's gathered
gradients). Then the checkpoint of the
ordered model and its optimizer: :func:`ordered_ssd.checkpoint.save_checkpoint` and
:func:`~ordered_ssd.checkpoint.load_checkpoint` (median of 3 each, into ``--ckpt-dir``, removed afterwards), and
its size. Nothing is written unless ``--json PATH`` is given (rank 0 writes it).
"""
import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
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
    p.add_argument("--iters", type=int, default=5, help="timed steps per mode and round (default: 5)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--accum", type=int, default=2, help="micro-batches per rank and step (a power of two)")
    for name in ("d-model", "n-layers", "d-state", "headdim", "chunk-size", "batch", "seq-len"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--ckpt-dir", default=None, help="where the checkpoint timing writes (default: a temporary "
                                                    "directory)")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    a = p.parse_args(argv)
    if a.nproc < 1 or a.iters < 1 or a.rounds < 1 or a.warmup < 0:
        p.error("--nproc, --iters and --rounds must be >= 1, --warmup >= 0")
    if a.accum < 1 or a.accum & (a.accum - 1):
        p.error(f"--accum: expected a power of two, got {a.accum}")
    return a


def _launch(a) -> int:
    from ordered_ssd.apps.check.spec import DEFAULTS

    device = resolve_device(a.device)
    batch = DEFAULTS[device]["batch"] if a.batch is None else a.batch
    if batch % (a.nproc * a.accum):
        print(f"fsdp_cost.py: error: --batch {batch} is not divisible by {a.nproc} ranks x --accum {a.accum}",
              file=sys.stderr)
        return 2
    return self_launch(__file__, a.nproc, device)


def _median_ms(fn, device, n):
    times = []
    for _ in range(n):
        dist.barrier()
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(1000 * (time.perf_counter() - t0))
    return times


def main(argv=None) -> int:
    a = _args(argv)
    if "LOCAL_RANK" not in os.environ:
        return _launch(a)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ordered_ssd.apps.check.sequential import FSDPDefaultAccumulation
    from ordered_ssd.apps.check.spec import DEFAULTS
    from ordered_ssd.apps.check.train import build_model, make_optimizer, no_decay_names
    from ordered_ssd.apps.lm import lm_loss
    from ordered_ssd.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from ordered_ssd.distributed import init_distributed
    from ordered_ssd.fsdp import FSDPTreeAccumulator, fsdp_blocks, ordered_clip_grad_norm_, set_ordered_reduce_scatter

    device_type = resolve_device(a.device)
    ctx = init_distributed(device_type)
    world, device = ctx.world_size, ctx.device
    d = DEFAULTS[device.type]
    pick = lambda v, k: d[k] if v is None else v  # noqa: E731
    cfg = dict(d_model=pick(a.d_model, "d_model"), n_layers=pick(a.n_layers, "n_layers"),
               d_state=pick(a.d_state, "d_state"), headdim=pick(a.headdim, "headdim"), ngroups=1,
               chunk_size=pick(a.chunk_size, "chunk_size"), expand=2)
    batch, seq_len = pick(a.batch, "batch"), pick(a.seq_len, "seq_len")
    blocks = world * a.accum
    if batch % blocks:
        raise SystemExit(f"fsdp_cost.py: error: --batch {batch} is not divisible by {world} ranks x --accum "
                         f"{a.accum}")
    b = batch // blocks
    spec = {"seed": 0, "mixer": "ordered", "weight_decay": 0.1, "lr": pick(None, "lr"), "model": cfg}
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, seq_len), generator=g).to(device)
    y = torch.randint(0, 256, (batch, seq_len), generator=g).to(device)
    mesh = init_device_mesh(device.type, (world,))
    runs = {}
    for mode in ("default", "ordered"):
        model, _ = build_model(spec, device)
        no_decay = no_decay_names(model)
        for mixer in model.mixers:
            fully_shard(mixer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if mode == "ordered":
            set_ordered_reduce_scatter(model)
            acc = FSDPTreeAccumulator(model)
        else:
            acc = FSDPDefaultAccumulation(model)
        runs[mode] = (model, make_optimizer(model, spec, no_decay), acc)

    most_buffers = [0]

    def step(mode):
        model, opt, acc = runs[mode]
        opt.zero_grad(set_to_none=True)
        for k in fsdp_blocks(ctx.rank, world, a.accum):
            rows = slice(k * b, (k + 1) * b)
            lm_loss(model(x[rows]), y[rows]).backward()
            acc.add_block()
        if mode == "ordered":
            most_buffers[0] = max(most_buffers[0], acc.max_buffers_held)
        acc.write_grads()
        if mode == "ordered":
            ordered_clip_grad_norm_(model.parameters(), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        opt.step()

    times = {m: [] for m in runs}
    peak = {m: 0.0 for m in runs}
    for m in runs:
        _median_ms(lambda: step(m), device, a.warmup)
    for _ in range(a.rounds):
        for m in runs:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times[m] += _median_ms(lambda: step(m), device, a.iters)
            if device.type == "cuda":
                peak[m] = max(peak[m], torch.cuda.max_memory_allocated(device) / 2**20)
    model, opt, acc = runs["ordered"]
    n_params = sum(p.numel() for p in model.parameters())
    local = sum(p.to_local().numel() for p in model.parameters())
    groups = [model] + list(model.mixers)
    largest = max(sum(p.numel() for p in m.parameters(recurse=m is not model) if p.requires_grad)
                  for m in groups)  # a group's unsharded gradient (the root: its own parameters)
    extra_mib = {"reduce_scatter": 2 * largest * 4 / 2**20,  # the received copy and the tree's levels
                 "accumulator": most_buffers[0] * local * 4 / 2**20,
                 "clip_gather": 2 * n_params * 4 / 2**20}  # ordered_clip_grad_norm_: gathered and reassembled
    # the sharded checkpoint of the ordered model
    own = a.ckpt_dir is None
    root = a.ckpt_dir or (tempfile.mkdtemp(prefix="fsdp-cost-") if ctx.rank == 0 else None)
    box = [root]
    dist.broadcast_object_list(box, src=0)
    root = box[0]
    save_ms, load_ms = [], []
    for i in range(3):
        save_ms += _median_ms(lambda: save_checkpoint(root, i + 1, model, opt, app_state={"data_position": i}),
                              device, 1)
        load_ms += _median_ms(lambda: load_checkpoint(latest_checkpoint(root), model, opt), device, 1)
    path = latest_checkpoint(root)
    ckpt_mib = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) / 2**20
    dist.barrier()
    if ctx.rank == 0 and own:
        shutil.rmtree(root, ignore_errors=True)
    mine = {m: statistics.median(t) for m, t in times.items()}
    every = [None] * world
    dist.all_gather_object(every, {"ms": mine, "peak": peak, "save": statistics.median(save_ms),
                                   "load": statistics.median(load_ms)})
    result = {"world_size": world, "backend": ctx.backend, "device": device.type,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "model": cfg, "n_params": n_params,
              "global_batch": batch, "seq_len": seq_len, "accum": a.accum, "block": b, "iters": a.iters,
              "rounds": a.rounds,
              "default_ms": max(e["ms"]["default"] for e in every),
              "ordered_ms": max(e["ms"]["ordered"] for e in every),
              "default_ms_ranks": [e["ms"]["default"] for e in every],
              "ordered_ms_ranks": [e["ms"]["ordered"] for e in every],
              "default_peak_mib": max(e["peak"]["default"] for e in every) if device.type == "cuda" else None,
              "ordered_peak_mib": max(e["peak"]["ordered"] for e in every) if device.type == "cuda" else None,
              "ordered_extra_mib": extra_mib, "checkpoint_mib": ckpt_mib,
              "checkpoint_save_ms": max(e["save"] for e in every), "checkpoint_load_ms": max(e["load"] for e in every)}
    if ctx.rank == 0:
        r = result
        print(f"fsdp_cost: {world} ranks, {ctx.backend} on {r['gpu'] or 'cpu'} ({r['threads']} threads/rank), torch "
              f"{torch.__version__}; {n_params / 1e6:.2f}M params (d_model {cfg['d_model']} x {cfg['n_layers']}), "
              f"global batch {batch} x {seq_len} in {blocks} blocks of {b} ({a.accum} micro-batches per rank)")
        print(f"  step (median of {a.rounds} x {a.iters}, slowest rank): FSDP2 default {r['default_ms']:.2f} ms, "
              f"ordered {r['ordered_ms']:.2f} ms, x{r['ordered_ms'] / r['default_ms']:.3f}")
        if device.type == "cuda":
            print(f"  peak memory: default {r['default_peak_mib']:.0f} MiB, ordered {r['ordered_peak_mib']:.0f} MiB, "
                  f"x{r['ordered_peak_mib'] / r['default_peak_mib']:.3f}")
        print(f"  ordered extra buffers (sizes): reduce-scatter {extra_mib['reduce_scatter']:.2f} MiB transient, "
              f"accumulator {extra_mib['accumulator']:.2f} MiB, clip gather {extra_mib['clip_gather']:.2f} MiB "
              f"transient")
        print(f"  checkpoint ({ckpt_mib:.1f} MiB, model + AdamW): save {r['checkpoint_save_ms']:.0f} ms, load "
              f"{r['checkpoint_load_ms']:.0f} ms")
        if a.json:
            tmp = a.json + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(result, fh, indent=1)
            os.replace(tmp, a.json)
    del model, opt, acc
    runs.clear()
    gc.collect()  # the FSDP modules (cycles through their hooks) hold the process group: free them first
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
