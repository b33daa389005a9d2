"""Where a training run of ``ordered-ssd check`` runs: one process, or one rank of a data-parallel job.

The training loop (:func:`ordered_ssd.apps.check.train.train_loop`) is the same for both; what differs is
asked of the world: the determinism fingerprint, the blocks of every step's batch this process trains on (one
block, all of its rows, for the plain check), the gradient accumulator (none for the plain check), the
checkpoint format, the model wrapper, the recorded loss, and what the ranks share at the end.

A split-invariance run (``spec["split"]``, see :mod:`.split`) is a :class:`DataParallel` world of ``R`` ranks
that trains ``m`` blocks of ``b`` rows per rank and step, without a DDP wrapper: the accumulator's
``write_grads`` reduces across the ranks.
"""
from __future__ import annotations

import gc
import hashlib
import json
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ... import distributed
from ...fingerprint import determinism_fingerprint
from .errors import CheckError, plural

CKPT_FORMAT = 1
DDP_CKPT_FORMAT = 2  # one file for a data-parallel run: every rank's RNG state, the world size


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.random.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _digest_of(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def is_fsdp(split: Optional[dict]) -> bool:
    """Whether a split-invariance run shards the model with FSDP2 (``split["parallel"] == "fsdp"``)."""
    return split is not None and split.get("parallel", "ddp") == "fsdp"


def split_block_ids(split: dict, rank: int, world_size: int) -> List[int]:
    """The global blocks rank ``rank`` trains in a split-invariance run, in its order: ``[r*m, (r+1)*m)`` without
    FSDP (:class:`~ordered_ssd.accumulate.TreeGradAccumulator`'s contiguous blocks), ``k*R + r`` for micro-batch
    ``k`` with FSDP (:func:`ordered_ssd.fsdp.fsdp_blocks`). Both are the same tree over the global blocks."""
    m = int(split["accum"])
    if is_fsdp(split):
        from ...fsdp import fsdp_blocks

        return fsdp_blocks(rank, world_size, m)
    return [rank * m + j for j in range(m)]


def split_blocks(split: dict, rank: int, world_size: int = 1) -> List[Tuple[int, int]]:
    """``(offset, count)`` of the blocks of rank ``rank`` in a split-invariance run (:func:`split_block_ids`,
    ``b`` rows each of the global batch; ``split`` has ``accum`` = m and ``block`` = b)."""
    b = int(split["block"])
    return [(k * b, b) for k in split_block_ids(split, rank, world_size)]


def split_accumulator(split: dict, model: torch.nn.Module):
    """The gradient accumulator of a split-invariance run: the library's pairwise tree
    (:class:`ordered_ssd.accumulate.TreeGradAccumulator`; with FSDP :class:`ordered_ssd.fsdp.FSDPTreeAccumulator`),
    or the control (``split["accumulate"] == "sequential"``): left to right
    (:class:`.sequential.SequentialGradAccumulator`), with FSDP its default reduce-scatter and accumulation
    (:class:`.sequential.FSDPDefaultAccumulation`)."""
    sequential = split.get("accumulate", "tree") == "sequential"
    if is_fsdp(split):
        if sequential:
            from .sequential import FSDPDefaultAccumulation

            return FSDPDefaultAccumulation(model)
        from ...fsdp import FSDPTreeAccumulator

        return FSDPTreeAccumulator(model)
    if sequential:
        from .sequential import SequentialGradAccumulator

        return SequentialGradAccumulator(model.parameters())
    from ...accumulate import TreeGradAccumulator

    return TreeGradAccumulator(model.parameters())


def shard_model(model: torch.nn.Module, ordered: bool) -> None:
    """FSDP2 as torchtitan applies it: ``fully_shard`` on every Mamba-2 block's mixer, then on the whole model
    (the embedding, norms and the tied head); with ``ordered`` the library's reduce-scatter
    (:func:`ordered_ssd.fsdp.set_ordered_reduce_scatter`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for mixer in getattr(model, "mixers", []):
        fully_shard(mixer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if ordered:
        from ...fsdp import set_ordered_reduce_scatter

        set_ordered_reduce_scatter(model)


class SingleProcess:
    """The whole batch of every step in this process (``spec`` without ``nproc``)."""

    rank = 0
    world_size = 1
    holder = "this machine has"  # of a fingerprint, in the resume error

    def __init__(self, spec: dict):
        self.device = torch.device(spec["device"])

    def __enter__(self) -> "SingleProcess":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def fingerprint(self) -> dict:
        return determinism_fingerprint(self.device)

    def rows(self, batch: int) -> Tuple[int, Optional[int]]:
        """``(offset, count)`` of this process's rows of every step's batch (``None``: all of them)."""
        return 0, None

    def blocks(self, batch: int) -> List[Tuple[int, Optional[int]]]:
        """The blocks of every step's batch this process trains on, in order (here: one, the whole batch)."""
        return [self.rows(batch)]

    def accumulator(self, model: torch.nn.Module):
        """None: one block per step, its gradients are those ``backward`` leaves."""
        return None

    def run_name(self, label: str) -> str:
        return label

    def check_checkpoint(self, ckpt: dict, resume: str) -> None:
        if ckpt.get("format") == DDP_CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume} was written by a {ckpt.get('world_size')}-process run "
                             f"(--nproc {ckpt.get('world_size')}); resume it under torchrun with that many processes")
        if ckpt.get("format") != CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume}: unsupported format {ckpt.get('format')!r} (expected {CKPT_FORMAT})")

    def rng_of(self, ckpt: dict) -> dict:
        return ckpt["rng"]

    sharded = False  # the model is never sharded in one process

    def clip(self, model: torch.nn.Module, max_norm: float) -> None:
        """Gradient clipping: ``clip_grad_norm_(..., foreach=False)``."""
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=False)

    def shard(self, model: torch.nn.Module) -> None:
        return None

    def wrap(self, model: torch.nn.Module, spec: dict) -> torch.nn.Module:
        return model

    def global_loss(self, losses: Sequence[torch.Tensor]) -> torch.Tensor:
        """The loss of the step from the losses of this process's blocks (here: the one block's loss), a 0-dim
        tensor on the device (read on the host later, so that the step need not wait for the device)."""
        (loss,) = losses
        return loss.detach()

    def gather(self, model: torch.nn.Module, steps: List[dict], final: Optional[dict], train_s: float) -> List[dict]:
        """What every rank has at the end (here: this process's time and RNG state)."""
        return [{"train_s": train_s, "rng": rng_state(self.device)}]

    def checkpoint_fields(self, every: List[dict]) -> dict:
        return {"format": CKPT_FORMAT, "rng": every[0]["rng"]}

    def record_fields(self, every: List[dict], n_steps: int) -> dict:
        return {"s_per_step": every[0]["train_s"] / max(n_steps, 1)}

    def barrier(self) -> None:
        return None


class DataParallel:
    """One rank of a data-parallel run launched by torchrun with ``spec["nproc"]`` processes.

    Rank ``r`` of ``N`` trains on rows ``[r*B/N, (r+1)*B/N)`` of the global batch of every step
    (:func:`ordered_ssd.distributed.shard_rows`); its loss is the mean over its rows; the model is wrapped in
    ``DistributedDataParallel`` with :func:`ordered_ssd.distributed.ordered_allreduce_hook`, so every
    parameter's gradient is the rank-ordered fold of the ranks' gradients divided by ``N`` (the gradient of the
    mean over the global batch), the same bits on every rank. The recorded loss of a step is the rank-ordered
    mean of the ranks' losses (identical on every rank).

    Entering the context initialises the process group (a :class:`CheckError` outside torchrun or for another
    world size than ``spec["nproc"]``); leaving it destroys the group.
    """

    holder = "these ranks have"

    def __init__(self, spec: dict):
        self.world_size = int(spec["nproc"])
        self.device_type = torch.device(spec["device"]).type
        self.ddp: Optional[torch.nn.Module] = None
        self.split: Optional[dict] = spec.get("split")
        if self.split is not None and int(self.split["ranks"]) != self.world_size:
            raise CheckError(f"the spec's split has {plural(int(self.split['ranks']), 'rank')} but nproc "
                             f"{self.world_size}")

    def __enter__(self) -> "DataParallel":
        try:
            self.context = distributed.init_distributed(self.device_type)
        except RuntimeError as e:
            raise CheckError(str(e)) from None
        if self.context.world_size != self.world_size:
            self.__exit__()
            raise CheckError(f"the spec asks for {plural(self.world_size, 'process', 'processes')} but torchrun "
                             f"started {self.context.world_size}")
        self.rank, self.device = self.context.rank, self.context.device
        return self

    def __exit__(self, *exc) -> None:
        # The DDP model's reducer holds the process group: drop it and collect it before destroying the group
        # (gloo can abort at exit otherwise).
        self.ddp = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()

    def fingerprint(self) -> dict:
        """Every rank's fingerprint (world size included) all-gathered; a :class:`CheckError` naming the differing
        ranks if they differ."""
        info = distributed.rank_fingerprint(self.device, self.world_size)
        try:
            distributed.check_rank_fingerprints(info)
        except distributed.RankMismatchError as e:
            raise CheckError(str(e)) from None
        return info

    def rows(self, batch: int) -> Tuple[int, Optional[int]]:
        try:
            return distributed.shard_rows(batch, self.world_size, self.rank)
        except ValueError as e:
            raise CheckError(f"--batch: {e}") from None

    def blocks(self, batch: int) -> List[Tuple[int, Optional[int]]]:
        """This rank's rows of every step's batch as one block; in a split-invariance run its ``m`` blocks."""
        if self.split is not None:
            return split_blocks(self.split, self.rank, self.world_size)
        return [self.rows(batch)]

    def accumulator(self, model: torch.nn.Module):
        """None (DDP's hook reduces the one block's gradients), or the split-invariance run's accumulator."""
        return None if self.split is None else split_accumulator(self.split, model)

    def run_name(self, label: str) -> str:
        return f"{label} (rank {self.rank})"

    def check_checkpoint(self, ckpt: dict, resume: str) -> None:
        if ckpt.get("format") == CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume} was written by a 1-process run; resume it without --nproc")
        if ckpt.get("format") != DDP_CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume}: unsupported format {ckpt.get('format')!r} "
                             f"(expected {DDP_CKPT_FORMAT})")
        if int(ckpt["world_size"]) != self.world_size:
            written = plural(int(ckpt["world_size"]), "process", "processes")
            raise CheckError(f"checkpoint {resume} was written by {written}, this run has "
                             f"{self.world_size}: every rank's RNG state and data shard belong to one world size")

    def rng_of(self, ckpt: dict) -> dict:
        return ckpt["rng"][self.rank]

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded with FSDP2 (a split-invariance run with ``--fsdp``)."""
        return is_fsdp(self.split)

    def clip(self, model: torch.nn.Module, max_norm: float) -> None:
        """Gradient clipping: ``clip_grad_norm_(..., foreach=False)``; with FSDP2 and the ordered reduce-scatter the
        library's :func:`ordered_ssd.fsdp.ordered_clip_grad_norm_` (the same bits as on the unsharded gradients;
        ``clip_grad_norm_`` would add the ranks' partial norms with the backend's all-reduce)."""
        if self.sharded and self.split.get("accumulate", "tree") == "tree":
            from ...fsdp import ordered_clip_grad_norm_

            ordered_clip_grad_norm_(model.parameters(), max_norm)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=False)

    def shard(self, model: torch.nn.Module) -> None:
        """FSDP2 runs: :func:`shard_model` (the optimizer must be made afterwards, over the sharded parameters)."""
        if self.sharded:
            shard_model(model, ordered=self.split.get("accumulate", "tree") == "tree")

    def wrap(self, model: torch.nn.Module, spec: dict) -> torch.nn.Module:
        if self.split is not None:  # no DDP: the accumulator (or FSDP's reduce-scatter) reduces across ranks
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=spec["ddp"]["bucket_cap_mb"])
        distributed.register_ordered_hook(self.ddp)
        return self.ddp

    def global_loss(self, losses: Sequence[torch.Tensor]) -> torch.Tensor:
        """The mean over the global batch, the same on every rank, as a 0-dim tensor on the device: the rank-ordered
        mean of the ranks' losses; in a split-invariance run the pairwise tree sum of every block's loss in global
        block order, divided by ``R*m`` (the same bits for every split with the same ``R*m``)."""
        if self.split is None:
            (loss,) = losses
            return distributed.ordered_mean(loss.detach())
        from ...accumulate import tree_sum

        mine = torch.stack([loss.detach().float() for loss in losses])
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        by_id = {k: loss for r, rank_losses in enumerate(every)
                 for k, loss in zip(split_block_ids(self.split, r, self.world_size), rank_losses.unbind(0))}
        blocks = [by_id[k] for k in sorted(by_id)]  # global block order
        return tree_sum(blocks) / len(blocks)

    def gather(self, model: torch.nn.Module, steps: List[dict], final: Optional[dict], train_s: float) -> List[dict]:
        """Every rank's time, RNG state and digests of its steps, final and current parameters (index = rank)."""
        from ...digest import tensor_sha256

        # a rank's forward outputs are of its own rows: every other step field must agree across ranks
        shared = [{k: v for k, v in s.items() if k != "outputs"} for s in steps]
        mine = {"train_s": train_s, "steps": _digest_of(shared), "final": _digest_of(final),
                "state": _digest_of({name: tensor_sha256(p.full_tensor() if hasattr(p, "full_tensor") else p)
                                     for name, p in model.named_parameters()}),
                "rng": rng_state(self.device)}
        every: List[Optional[dict]] = [None] * self.world_size
        dist.all_gather_object(every, mine)
        return every

    def checkpoint_fields(self, every: List[dict]) -> dict:
        return {"format": DDP_CKPT_FORMAT, "world_size": self.world_size, "rng": [o["rng"] for o in every]}

    def record_fields(self, every: List[dict], n_steps: int) -> dict:
        disagree = sorted({r for r, o in enumerate(every)
                           if any(o[k] != every[0][k] for k in ("steps", "final", "state"))})
        rank_s = [o["train_s"] / max(n_steps, 1) for o in every]
        return {"s_per_step": max(rank_s), "rank_train_s": [o["train_s"] for o in every], "rank_s_per_step": rank_s,
                "world_size": self.world_size, "backend": self.context.backend, "ranks_agree": not disagree,
                "ranks_disagreeing": disagree}

    def barrier(self) -> None:
        dist.barrier()


def world_of(spec: dict):
    """The world a run of ``spec`` trains in: :class:`DataParallel` if the spec has ``nproc``, else
    :class:`SingleProcess`."""
    return DataParallel(spec) if spec.get("nproc") is not None else SingleProcess(spec)
