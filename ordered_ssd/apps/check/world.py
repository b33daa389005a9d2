"""Where a training run of ``ordered-ssd check`` runs: one process, or one rank of a data-parallel job.

The training loop (:func:`ordered_ssd.apps.check.train.train_loop`) is the same for both; what differs is
asked of the world: the determinism fingerprint, the rows of every step's batch this process trains on, the
checkpoint format, the model wrapper, the recorded loss, and what the ranks share at the end.
"""
from __future__ import annotations

import gc
import hashlib
import json
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from ... import distributed
from ...fingerprint import determinism_fingerprint
from .errors import CheckError

CKPT_FORMAT = 1
DDP_CKPT_FORMAT = 2  # one file for a data-parallel run: every rank's RNG state, the world size


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.random.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _digest_of(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


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

    def wrap(self, model: torch.nn.Module, spec: dict) -> torch.nn.Module:
        return model

    def global_loss(self, loss: torch.Tensor) -> float:
        return float(loss.item())

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

    def __enter__(self) -> "DataParallel":
        try:
            self.context = distributed.init_distributed(self.device_type)
        except RuntimeError as e:
            raise CheckError(str(e)) from None
        if self.context.world_size != self.world_size:
            self.__exit__()
            raise CheckError(f"the spec asks for {self.world_size} processes but torchrun started "
                             f"{self.context.world_size}")
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

    def run_name(self, label: str) -> str:
        return f"{label} (rank {self.rank})"

    def check_checkpoint(self, ckpt: dict, resume: str) -> None:
        if ckpt.get("format") == CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume} was written by a 1-process run; resume it without --nproc")
        if ckpt.get("format") != DDP_CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume}: unsupported format {ckpt.get('format')!r} "
                             f"(expected {DDP_CKPT_FORMAT})")
        if int(ckpt["world_size"]) != self.world_size:
            raise CheckError(f"checkpoint {resume} was written by {ckpt['world_size']} processes, this run has "
                             f"{self.world_size}: every rank's RNG state and data shard belong to one world size")

    def rng_of(self, ckpt: dict) -> dict:
        return ckpt["rng"][self.rank]

    def wrap(self, model: torch.nn.Module, spec: dict) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=spec["ddp"]["bucket_cap_mb"])
        distributed.register_ordered_hook(self.ddp)
        return self.ddp

    def global_loss(self, loss: torch.Tensor) -> float:
        """The mean over the global batch, the same on every rank."""
        return float(distributed.ordered_mean(loss.detach()).item())

    def gather(self, model: torch.nn.Module, steps: List[dict], final: Optional[dict], train_s: float) -> List[dict]:
        """Every rank's time, RNG state and digests of its steps, final and current parameters (index = rank)."""
        from ...digest import tensor_sha256

        mine = {"train_s": train_s, "steps": _digest_of(steps), "final": _digest_of(final),
                "state": _digest_of({name: tensor_sha256(p) for name, p in model.named_parameters()}),
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
