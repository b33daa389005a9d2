"""Split-invariant gradient accumulation: the same gradient bits for every split of a global batch over ranks and
accumulation steps.

The contract (``docs/guarantees.md``, "Split invariance"): a global batch of ``n`` examples is cut into blocks of
``b`` examples (the micro-batch); rank ``r`` of ``R`` holds the contiguous blocks ``[r*m, (r+1)*m)`` and runs them
in ``m`` accumulation steps (``R``, ``m`` powers of two). The gradient that reaches the optimizer is the pairwise
tree sum, in fp32, of the ``R*m`` block gradients in global block order
(``tree(g[0:k]) = tree(g[0:k/2]) + tree(g[k/2:k])``, :func:`tree_sum`), divided by ``R*m`` (exact), so it has the
same bits for every ``(R, m)`` with the same ``R*m`` -- provided each block gradient is itself computed the same
way wherever it runs (``OrderedMamba2`` guarantees that for its own parameters).

:class:`TreeGradAccumulator` adds the block gradients on a binary-counter stack (at most ``log2(m) + 1``
gradient-sized buffers), and reduces over ranks with :func:`ordered_ssd.distributed.tree_all_reduce` (each rank's
local sum is the subtree of its shard; traffic O(gradient size) per rank)::

    acc = TreeGradAccumulator(model.parameters())
    for block in my_blocks:                 # m blocks of b examples each; under ddp.no_sync() if DDP
        loss_fn(model(block.x), block.y).backward()
        acc.add_block()                     # takes every .grad, sets it to None
    acc.write_grads()                       # .grad = tree over all ranks' blocks / (R*m)
    optimizer.step(); optimizer.zero_grad()
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import torch

from .distributed import tree_all_reduce
from .fold import tree_fold

__all__ = ["TreeGradAccumulator", "tree_sum"]


def tree_sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The reference definition of the accumulated gradient: the pairwise tree sum of ``tensors`` (a power-of-two
    number of same-shaped tensors), ``tree(t[0:k]) = tree(t[0:k/2]) + tree(t[k/2:k])``, each leaf cast to fp32
    (fp64 when the first tensor is fp64, as :class:`TreeGradAccumulator` does for an fp64 model), a new tensor.

    Raises:
        ValueError: no tensors, a count that is not a power of two, or different shapes.
    """
    return tree_fold(list(tensors))


def _is_pow2(k: int) -> bool:
    return k >= 1 and not k & (k - 1)


class TreeGradAccumulator:
    """Accumulates block gradients by a pairwise tree in fp32 and reduces them over ranks in global block order.

    Args:
        params: the parameters whose gradients are accumulated, in this order (the order of the flat buffers; it
            does not change any bit, the additions being elementwise). All on one device. Parameters with
            ``requires_grad=False`` are left out (their ``.grad`` is never touched). A parameter whose ``.grad``
            is None after a block's backward counts as zeros for that block; one whose ``.grad`` is None after
            every block on every rank keeps ``.grad = None`` (the optimizer skips it, as without accumulation).

    Accumulation dtype: fp32, as the contract says, for fp32, bf16 and fp16 parameters (bf16/fp16 block gradients
    are widened exactly). A model whose parameters are **all** fp64 accumulates in fp64 (the package's rule,
    :func:`ordered_ssd.fold.accumulation_dtype`, as the DDP hook does): narrowing fp64 gradients to fp32 would
    throw away precision the user asked for. Mixing fp64 with other dtypes raises (use two accumulators).
    :attr:`dtype` says which.

    Memory: one flat buffer of the gradients' total size per stack node; :attr:`buffers_held` nodes now,
    :attr:`max_buffers_held` the most since construction or the last :meth:`reset` (``<= log2(blocks) + 1``:
    the binary representation of the block count, plus the block being pushed).

    Use: after each block's ``backward()`` call :meth:`add_block`; after the last one :meth:`write_grads` (a
    collective when a process group is initialised: every rank calls it), then clip and step as usual, and zero
    the gradients (``set_to_none``, torch's default) before the next step's first backward: autograd adds into a
    ``.grad`` that is not None. Before exchanging anything, the ranks compare their block counts, gradient sizes
    and dtypes (a small all-gather): if they differ, every rank raises the same ``ValueError`` (no rank is left
    waiting in a collective).

    Raises:
        ValueError: no parameters, parameters on several devices, or fp64 mixed with other dtypes.
        TypeError: a non-floating-point parameter.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self.params: List[torch.nn.Parameter] = [p for p in params
                                                 if not isinstance(p, torch.Tensor) or p.requires_grad]
        if not self.params:
            raise ValueError("params: expected at least one parameter that requires grad, got none")
        for p in self.params:
            if not isinstance(p, torch.Tensor) or not p.is_floating_point():
                raise TypeError(f"params: expected floating-point parameters, got "
                                f"{p.dtype if isinstance(p, torch.Tensor) else type(p).__name__}")
        devices = {p.device for p in self.params}
        if len(devices) != 1:
            raise ValueError(f"params: expected parameters on one device, got {sorted(map(str, devices))}")
        self.device = devices.pop()
        n64 = sum(p.dtype == torch.float64 for p in self.params)
        if 0 < n64 < len(self.params):
            raise ValueError(f"params: {n64} fp64 parameter(s) mixed with {len(self.params) - n64} of other dtypes; "
                             f"accumulate them with two TreeGradAccumulators")
        #: accumulation dtype: fp32, or fp64 for an all-fp64 model
        self.dtype = torch.float64 if n64 else torch.float32
        self.numel = sum(self._numel_of(p) for p in self.params)
        self._stack: List[tuple] = []  # (level, flat buffer): node of 2**level consecutive blocks
        self._had_grad = [False] * len(self.params)  # a .grad in some block of this rank
        self.blocks = 0
        self.max_buffers_held = 0

    # ------------------------------------------------------------------------------------------- local view
    # What a subclass over sharded parameters (:class:`ordered_ssd.fsdp.FSDPTreeAccumulator`) changes: the local
    # tensor of a parameter or gradient, the fields the ranks must agree on, the reduction over ranks, the group
    # compared over, and how a written local gradient becomes the parameter's ``.grad``.
    @staticmethod
    def _local_of(t: torch.Tensor) -> torch.Tensor:
        return t

    def _numel_of(self, p) -> int:
        return p.numel()

    def _meta_fields(self) -> dict:
        return {"blocks": self.blocks, "gradient elements": self.numel,
                "accumulation bits": 64 if self.dtype == torch.float64 else 32, "parameters": len(self.params)}

    def _reduce_flat(self, flat: torch.Tensor, group) -> torch.Tensor:
        return tree_all_reduce(flat, group)

    def _agree_group(self, group):
        return group

    def _wrap_grad(self, p, local: torch.Tensor):
        return local

    # ------------------------------------------------------------------------------------------- state
    @property
    def buffers_held(self) -> int:
        """Gradient-sized buffers held now (stack nodes)."""
        return len(self._stack)

    def reset(self) -> None:
        """Drop every added block (and the buffer counters); the parameters' ``.grad`` are left alone."""
        self._stack = []
        self._had_grad = [False] * len(self.params)
        self.blocks = 0
        self.max_buffers_held = 0

    # ------------------------------------------------------------------------------------------- adding
    def _flatten_grads(self) -> torch.Tensor:
        flat = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        off = 0
        for i, p in enumerate(self.params):
            k = self._numel_of(p)
            seg = flat[off:off + k]
            g = None if p.grad is None else self._local_of(p.grad)
            self._had_grad[i] = self._had_grad[i] or g is not None
            if g is None:
                seg.zero_()
            else:
                if g.is_sparse:
                    raise ValueError("sparse gradients are not supported by TreeGradAccumulator")
                seg.copy_(g.reshape(-1))  # logical (row-major) order; widening is exact
            off += k
        return flat

    def add_block(self) -> None:
        """Push the current ``.grad`` of every parameter (the gradient of one block's loss) as the next block,
        merge equal-level nodes (earlier blocks on the left, fp32 ``left += right``), set every ``.grad`` to None.
        """
        node = self._flatten_grads()
        for p in self.params:
            p.grad = None
        self._stack.append((0, node))
        self.max_buffers_held = max(self.max_buffers_held, len(self._stack))
        while len(self._stack) >= 2 and self._stack[-1][0] == self._stack[-2][0]:
            level, right = self._stack.pop()
            _, left = self._stack[-1]
            left.add_(right)
            self._stack[-1] = (level + 1, left)
        self.blocks += 1

    # ------------------------------------------------------------------------------------------- results
    def _agree(self, group) -> List[bool]:
        """Compare block count, gradient size and dtype across the ranks of ``group`` (every rank raises the same
        ``ValueError`` if they differ) and return, per parameter, whether any rank saw a ``.grad`` for it."""
        world = self.world_size(group)
        if world == 1:
            return list(self._had_grad)
        import torch.distributed as dist

        group = self._agree_group(group)
        device = self.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
        fields = self._meta_fields()
        meta = torch.tensor(list(fields.values()), dtype=torch.int64, device=device)
        every = [torch.empty_like(meta) for _ in range(world)]
        dist.all_gather(every, meta, group=group)
        rows = [tuple(int(v) for v in t.tolist()) for t in every]
        if len(set(rows)) != 1:
            raise ValueError(f"{type(self).__name__}: the ranks differ in ({', '.join(fields)}): " +
                             ", ".join(f"rank {r}: {row}" for r, row in enumerate(rows)) +
                             "; every rank must add the same number of blocks of the same parameters")
        seen = torch.tensor(self._had_grad, dtype=torch.int32, device=device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=group)
        return [bool(v) for v in seen.tolist()]

    def _local(self) -> torch.Tensor:
        if not _is_pow2(self.blocks):
            raise ValueError(f"the number of accumulated blocks {self.blocks} is not a power of two: the tree sum "
                             f"needs 1, 2, 4, 8, ... blocks per rank")
        assert len(self._stack) == 1
        return self._stack[0][1]

    def local_sum(self) -> torch.Tensor:
        """The flat tree sum (fp32; fp64 for an fp64 model) of this rank's blocks, in parameter order: the
        accumulator's own buffer (do not modify it; :meth:`reduce` works on a copy).

        Raises:
            ValueError: :attr:`blocks` is not a power of two (0 included).
        """
        return self._local()

    def reduce(self, group=None) -> torch.Tensor:
        """The flat tree sum over **all** ranks' blocks in global block order (rank ``r``'s blocks are blocks
        ``[r*m, (r+1)*m)``): each rank's :meth:`local_sum` is a subtree, combined by the same tree in rank order
        (:func:`ordered_ssd.distributed.tree_all_reduce`; O(gradient size) traffic per rank). A new tensor, the
        same bits on every rank; the accumulator is unchanged. Without an initialised process group, or with one
        rank, a copy of :meth:`local_sum`. Collective otherwise.

        Raises:
            ValueError: the ranks differ in block count, gradient size or dtype (raised on every rank);
                :attr:`blocks` or the world size is not a power of two.
        """
        self._agree(group)
        return self._reduce_flat(self._local().clone(), group)

    def world_size(self, group=None) -> int:
        """The number of ranks :meth:`reduce` combines (1 without an initialised process group)."""
        import torch.distributed as dist
        if group is None and not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(group)

    def write_grads(self, scale: Optional[float] = None, group=None) -> None:
        """Write ``reduce(group) * scale`` into every parameter's ``.grad`` (its dtype, shape and strides; cast
        once), then :meth:`reset`. ``scale`` defaults to ``1 / (blocks * world size)``, exact for powers of two:
        with each block's loss a mean over its examples, the result is the gradient of the mean over the global
        batch. The multiplication is done in the accumulation dtype, before the cast. Collective when a process
        group is initialised.

        Raises:
            ValueError: as :meth:`reduce` (no block added included); nothing is written then.
        """
        seen = self._agree(group)
        local = self._local()
        if scale is None:
            scale = 1.0 / (self.blocks * self.world_size(group))
        flat = self._reduce_flat(local, group)  # in place: the buffer is dropped by reset() below
        flat.mul_(scale)
        off = 0
        for p, had_grad in zip(self.params, seen):
            k = self._numel_of(p)
            if had_grad:
                local_p = self._local_of(p)
                g = torch.empty_like(local_p, memory_format=torch.preserve_format)
                g.copy_(flat[off:off + k].view(local_p.shape))
                p.grad = self._wrap_grad(p, g)
            off += k
        self.reset()

    def __repr__(self) -> str:
        return (f"TreeGradAccumulator({len(self.params)} parameters, {self.numel} elements, dtype={self.dtype}, "
                f"blocks={self.blocks}, buffers_held={self.buffers_held})")
