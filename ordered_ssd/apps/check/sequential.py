"""The control of ``ordered-ssd check --split-invariance --accumulate sequential``: gradient accumulation as it is
usually written, which is *not* split-invariant.

Each rank sums its blocks' gradients left to right in fp32 (what ``.grad`` accumulation over ``m`` backward
passes under ``no_sync`` does), divides by ``m``, then takes the rank-ordered mean over the ranks
(:func:`ordered_ssd.distributed.ordered_all_reduce`). Every run is still reproducible, but the order of the sum
depends on the split: ``(1, 4)`` computes ``(((g0 + g1) + g2) + g3) / 4``, ``(2, 2)``
``((g0 + g1) / 2 + (g2 + g3) / 2) / 2``, so their bits differ. It has the interface of
:class:`ordered_ssd.accumulate.TreeGradAccumulator` (``add_block``, ``write_grads``).
"""
from __future__ import annotations

from typing import Iterable, List, Optional

import torch
import torch.distributed as dist

from ...distributed import ordered_all_reduce


class SequentialGradAccumulator:
    """Left-to-right accumulation of the block gradients, then the rank-ordered mean (the control)."""

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self.params: List[torch.nn.Parameter] = [p for p in params if p.requires_grad]
        self.sums: Optional[List[torch.Tensor]] = None
        self.blocks = 0

    def add_block(self) -> None:
        """Add every parameter's ``.grad`` to the running fp32 sum (left to right) and set it to None."""
        grads = [p.grad for p in self.params]
        if self.sums is None:
            self.sums = [g.detach().to(torch.float32, copy=True) for g in grads]
        else:
            for s, g in zip(self.sums, grads):
                s.add_(g)
        for p in self.params:
            p.grad = None
        self.blocks += 1

    def write_grads(self) -> None:
        """``.grad`` = the rank-ordered mean over the ranks of (this rank's sum / m), in the parameter's dtype."""
        if self.sums is None:
            raise RuntimeError("write_grads: no block was added")
        ranks = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        for p, s in zip(self.params, self.sums):
            s.div_(self.blocks)
            if ranks:
                ordered_all_reduce(s, average=True).wait()
            p.grad = s.to(p.dtype)
        self.sums, self.blocks = None, 0


class FSDPDefaultAccumulation:
    """The control of ``--fsdp --accumulate sequential``: FSDP2 as it is usually run. Its own reduce-scatter
    (the backend's order; the mean over ranks) after every micro-batch, its own accumulation into the sharded
    ``.grad`` (left to right over the micro-batches), then the division by ``m``. Interface of
    :class:`ordered_ssd.fsdp.FSDPTreeAccumulator` (``add_block``, ``write_grads``)."""

    def __init__(self, model: torch.nn.Module):
        self.params: List[torch.nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        self.blocks = 0

    def add_block(self) -> None:
        """Nothing to take: FSDP added this micro-batch's reduced gradient into ``.grad``."""
        self.blocks += 1

    def write_grads(self) -> None:
        """``.grad /= m`` (FSDP already divided by the number of ranks)."""
        if self.blocks == 0:
            raise RuntimeError("write_grads: no block was added")
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(self.blocks)
        self.blocks = 0
