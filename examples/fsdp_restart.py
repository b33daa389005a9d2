"""FSDP2 with the ordered reduce-scatter, a sharded checkpoint, and a restart on another number of ranks.

The model of ``train_lm.py`` is ``fully_shard``-ed (every ``OrderedMamba2`` mixer, then the whole model) and
trained on a global batch of ``BLOCKS`` blocks: in micro-batch ``k`` rank ``r`` trains block ``k * R + r``
(``fsdp_blocks``). ``set_ordered_reduce_scatter`` makes FSDP2's gradient reduce-scatter add the ranks in a fixed
tree, ``FSDPTreeAccumulator`` adds the micro-batches by the same tree and ``ordered_clip_grad_norm_`` clips with
the unsharded model's bits, so every step has the same bits for every number of ranks R (docs/distributed.md).
A run stopped on R ranks and resumed on R' therefore continues with the bits of the uninterrupted run:

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/fsdp_restart.py            # 4 steps
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/fsdp_restart.py \\
        --ckpt /tmp/fsdp-ckpt --stop-at 2                                      # 2 steps on 2 ranks, checkpoint
    python -m torch.distributed.run --standalone --nproc-per-node 1 examples/fsdp_restart.py \\
        --ckpt /tmp/fsdp-ckpt                                                   # resumed on 1 rank: steps 2, 3

Rank 0 prints every step's gradient digest; the three runs print the same digests for the same steps. gloo on
the CPU, nccl on CUDA (one GPU per rank). The rest of the model needs what ``tree_accumulator_ddp.py`` says.
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ordered_ssd.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ordered_ssd.distributed import init_distributed
from ordered_ssd.fsdp import FSDPTreeAccumulator, fsdp_blocks, ordered_clip_grad_norm_, set_ordered_reduce_scatter
from train_lm import ByteLM, corpus, digest  # examples/train_lm.py
from tree_accumulator_ddp import BLOCKS, SEED, global_batch  # examples/tree_accumulator_ddp.py


def full(t):
    """The whole tensor of a sharded (DTensor) one: an all-gather, collective."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def main(steps, ckpt, stop_at):
    ctx = init_distributed("cuda" if torch.cuda.is_available() else "cpu")  # from torchrun's environment
    R, rank = ctx.world_size, ctx.rank
    torch.manual_seed(SEED)  # every rank builds the same model; fully_shard keeps each rank's shard
    model = ByteLM(device=ctx.device)
    mesh = init_device_mesh(ctx.device.type, (R,))
    for mixer in model.mixers:
        fully_shard(mixer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    set_ordered_reduce_scatter(model)  # every fully_shard-ed module: all-to-all, then the tree in rank order
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)  # over the sharded parameters
    acc = FSDPTreeAccumulator(model)
    start = 0
    if ckpt and latest_checkpoint(ckpt):  # resume, on this run's number of ranks (validated first)
        start = load_checkpoint(latest_checkpoint(ckpt), model, optimizer)["app_state"]["step"]
    data = corpus(ctx.device)
    for step in range(start, stop_at or steps):
        batch = global_batch(data, step)  # [BLOCKS, b, L + 1], the same on every rank
        for k in fsdp_blocks(rank, R, BLOCKS // R):
            logits = model(batch[k, :, :-1])
            F.cross_entropy(logits.reshape(-1, 256), batch[k, :, 1:].reshape(-1)).backward()  # block mean
            acc.add_block()  # after every micro-batch (FSDP2's gradient sync stays on)
        acc.write_grads()  # .grad = tree over the BLOCKS blocks / BLOCKS (sharded)
        grads = digest(full(p.grad) for p in model.parameters())
        ordered_clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step}: grad sha256 {grads}")
    if ckpt and stop_at:
        save_checkpoint(ckpt, stop_at, model, optimizer, app_state={"step": stop_at})  # atomic, every rank
    final = digest(full(p) for p in model.parameters())
    if rank == 0:
        print(f"{R} rank{'' if R == 1 else 's'}, steps {start}..{(stop_at or steps) - 1}: final params sha256 {final}")
    del model, optimizer, acc
    gc.collect()  # the FSDP modules hold the process group: release them before destroying it
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--ckpt", default=None, help="checkpoint directory: resume from it if it holds one")
    parser.add_argument("--stop-at", type=int, default=None, help="stop after this step and checkpoint")
    args = parser.parse_args()
    if "RANK" not in os.environ:  # started without torchrun: say how to start it, without a traceback
        raise SystemExit("fsdp_restart.py: run it under torchrun: python -m torch.distributed.run --standalone "
                         "--nproc-per-node 2 examples/fsdp_restart.py")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # CUDA: before the first cuBLAS call
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the CPU bits depend on the thread count: the same on every rank and run
    main(args.steps, args.ckpt, args.stop_at)
