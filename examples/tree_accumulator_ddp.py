"""Split-invariant data-parallel training: ``TreeGradAccumulator`` with DDP under ``torchrun``.

A global batch of ``BLOCKS`` blocks of ``b`` sequences each is split over ``R`` ranks, rank ``r`` taking the
contiguous blocks ``[r*m, (r+1)*m)`` (``m = BLOCKS / R``) in ``m`` accumulation steps. Every forward and backward
runs under ``ddp.no_sync()``; ``write_grads`` then reduces over ranks: the gradient is the pairwise tree sum of the
``BLOCKS`` block gradients in global block order, divided by ``BLOCKS`` (docs/guarantees.md, "Split invariance").
It has the same bits for every split ``R x m`` of the same global batch, so rank 0 prints the same digests for

    python -m torch.distributed.run --standalone --nproc-per-node 1 examples/tree_accumulator_ddp.py   # 1 x 4
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/tree_accumulator_ddp.py   # 2 x 2

(and ``--nproc-per-node 4``, 4 x 1); autograd's accumulation into ``.grad`` would give 1 x 4 other bits (a
left-to-right sum). gloo on the CPU; nccl on CUDA, one GPU per rank. The model is ``ByteLM`` of ``train_lm.py``.
The rest of the model needs (docs/guarantees.md): deterministic kernels in every block
(``torch.use_deterministic_algorithms(True)``, and ``CUBLAS_WORKSPACE_CONFIG`` on CUDA), the same block shapes and
thread count on every rank, a per-block mean loss, and a data order that is a function of the step alone.
"""
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ordered_ssd import TreeGradAccumulator
from ordered_ssd.distributed import check_rank_fingerprints, init_distributed, rank_fingerprint
from train_lm import ByteLM, corpus, digest  # examples/train_lm.py

BLOCKS, b, L, STEPS, SEED = 4, 2, 64, 3, 0  # global batch: BLOCKS blocks of b sequences of L bytes


def global_batch(data, step):
    """Step ``step``'s global batch [BLOCKS, b, L + 1]: a function of (SEED, step) alone, the same on every rank."""
    g = torch.Generator().manual_seed(SEED * 1_000_003 + step)
    starts = torch.randint(0, len(data) - L - 1, (BLOCKS * b,), generator=g).tolist()
    return torch.stack([data[s:s + L + 1] for s in starts]).view(BLOCKS, b, L + 1)


def train(ctx):
    """``STEPS`` optimizer steps of this rank's share; rank 0 prints the digests."""
    R, rank = ctx.world_size, ctx.rank
    m = BLOCKS // R  # blocks per rank: R and m must be powers of two
    torch.manual_seed(SEED)  # every rank builds the same model (DDP also broadcasts rank 0's)
    model = ByteLM(device=ctx.device)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    acc = TreeGradAccumulator(model.parameters())  # fp32 buffers; at most log2(m) + 1 of them
    data = corpus(ctx.device)
    for step in range(STEPS):
        batch = global_batch(data, step)
        for k in range(rank * m, (rank + 1) * m):  # this rank's contiguous blocks
            with ddp.no_sync():  # DDP must not reduce: the accumulator does, by the tree
                logits = ddp(batch[k, :, :-1])
                F.cross_entropy(logits.reshape(-1, 256), batch[k, :, 1:].reshape(-1)).backward()  # block mean
            acc.add_block()  # takes every .grad, sets it to None
        acc.write_grads()  # collective: .grad = tree over all R*m blocks / (R*m), the same bits on every rank
        grads = digest(p.grad for p in model.parameters())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step}: grad sha256 {grads}")
    if rank == 0:
        print(f"split {R} x {m}: final params sha256 {digest(model.parameters())}")


if __name__ == "__main__":
    if "RANK" not in os.environ:  # started without torchrun: say how to start it, without a traceback
        raise SystemExit("tree_accumulator_ddp.py: run it under torchrun: python -m torch.distributed.run "
                         "--standalone --nproc-per-node 2 examples/tree_accumulator_ddp.py")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # CUDA: before the first cuBLAS call
    ctx = init_distributed("cuda" if torch.cuda.is_available() else "cpu")  # from torchrun's environment
    torch.use_deterministic_algorithms(True)
    if ctx.device.type == "cpu":  # torchrun sets OMP_NUM_THREADS=1 only for more than one process
        torch.set_num_threads(1)
    check_rank_fingerprints(rank_fingerprint(ctx.device, ctx.world_size))  # same versions, device, threads
    train(ctx)
    gc.collect()  # DDP's reducer holds the process group: release it before destroying the group
    dist.barrier()  # every rank done with its collectives before any tears its group down
    dist.destroy_process_group()
