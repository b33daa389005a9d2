"""Data-parallel training with a fixed-order gradient reduction (``torch.distributed``, DDP).

The pieces ``ordered-ssd check --nproc N`` is built from, usable in any DDP training loop:

* :func:`ordered_all_reduce` / :func:`ordered_allreduce_hook`: the sum over ranks in a fixed order. The flattened
  tensor (a DDP bucket) is cut into ``N`` shards; an all-to-all gives rank ``j`` shard ``j`` of every rank, which
  it folds **rank 0 first** with :func:`ordered_ssd.fold.lexical_fold` in the accumulation dtype (fp32; fp64 for
  fp64), divides by ``N`` (one IEEE division, in the accumulation dtype) and casts once to the tensor's dtype;
  an all-gather of the folded shards gives every rank the whole result (traffic O(numel) per rank).
  The result does not depend on the backend's reduction algorithm (ring, tree, NVLS), on message arrival
  order or on the DDP bucket layout: the fold is elementwise, so element ``i`` of the result is
  ``(((+0.0 + g_0[i]) + g_1[i]) + ... + g_{N-1}[i]) / N`` whichever bucket and position it sits in.
* :func:`tree_all_reduce`: the split-invariant reduction of :class:`ordered_ssd.accumulate.TreeGradAccumulator`:
  the same shard exchange, each shard summed over ranks by the pairwise tree
  (:func:`ordered_ssd.fold.tree_fold`) in rank order, not divided: element ``i`` is
  ``tree(g_0[i], ..., g_{N-1}[i])`` wherever it sits.
* :func:`shard_rows`: the documented data sharding (rank ``r`` takes rows ``[r*B/N, (r+1)*B/N)`` of the
  global batch).
* :func:`rank_fingerprint` / :func:`check_rank_fingerprints`: every rank all-gathers its determinism
  fingerprint (which includes the world size, and the pinned native-kernel configurations where the CUDA
  path is available) and all ranks stop with the same message naming the differing ranks if they differ.
* :func:`init_distributed`: process-group set-up from the environment ``torchrun`` provides (gloo on the
  CPU, nccl on CUDA with ``cuda:LOCAL_RANK``).

Scope of the guarantee: for a fixed world size, device type (and GPU model / CPU capability and thread
count), the reduced gradient has the same bits on every rank and in every run. It is a two-level fold
(each rank's gradient, itself ordered within the rank, then the ranks in rank order), so it is *not* the
bits of a 1-process run over the same global batch, and it changes with the world size; the world size is
part of the fingerprint for that reason. See ``docs/distributed.md``.
"""
# No ``from __future__ import annotations``: DDP checks the hook's annotations against the real types.
import datetime
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .fingerprint import determinism_fingerprint, fingerprint_diff, fingerprint_string
from .fold import accumulation_dtype, lexical_fold, tree_fold

__all__ = [
    "ordered_all_reduce", "ordered_allreduce_hook", "tree_all_reduce", "check_power_of_two_world",
    "register_ordered_hook", "ordered_mean", "shard_rows",
    "rank_fingerprint", "check_rank_fingerprints", "fingerprint_mismatch_message", "RankMismatchError",
    "DistContext", "init_distributed", "TEST_SKEW_ENV",
]

#: Testing only: ``"RANK:KEY=VALUE"`` makes rank ``RANK`` report ``VALUE`` for fingerprint field ``KEY``, so the
#: tests can provoke the rank-mismatch stop without two different machines. Never set it for real runs.
TEST_SKEW_ENV = "ORDERED_SSD_TEST_FINGERPRINT_SKEW"


class RankMismatchError(RuntimeError):
    """The ranks of a process group do not share one determinism fingerprint (one-line message)."""


# ----------------------------------------------------------------------------------------------- reduction
def _all_gather_flat(output: torch.Tensor, tensor: torch.Tensor, group):
    # ``all_gather_single`` is the torch >= 2.13 name of ``all_gather_into_tensor`` (deprecated there).
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, tensor, group=group, async_op=True)


def _all_to_all_flat(output: torch.Tensor, tensor: torch.Tensor, group):
    """Rank ``j`` receives shard ``j`` of every rank: ``output.view(N, s)[i] = rank i's tensor.view(N, s)[j]``."""
    return dist.all_to_all_single(output, tensor, group=group, async_op=True)


def _world_size(group) -> int:
    return dist.get_world_size(group)


def _shard_exchange(tensor: torch.Tensor, group) -> Tuple[torch.Tensor, int, int]:
    """All-to-all of the ``N`` contiguous shards of ``tensor`` (flattened, zero-padded to ``N * s``): returns
    ``(received [N, s], N, s)`` where row ``i`` is rank ``i``'s copy of this rank's shard. Blocks the host on
    gloo; on nccl ``wait`` only orders the current stream after the collective. Each rank sends and receives
    ``(N - 1) * s`` elements."""
    world = _world_size(group)
    flat = tensor.reshape(-1)
    n = flat.numel()
    s = -(-n // world)
    if s * world != n:
        padded = torch.zeros(s * world, dtype=flat.dtype, device=flat.device)
        padded[:n].copy_(flat)
        flat = padded
    received = torch.empty(world * s, dtype=flat.dtype, device=flat.device)
    _all_to_all_flat(received, flat, group).wait()
    return received.view(world, s), world, s


def _gather_shards(folded: torch.Tensor, out_flat: torch.Tensor, world: int, group):
    """Start the all-gather of every rank's folded shard ``[s]`` into ``out_flat`` (``n`` elements; the padding, if
    any, goes to a temporary). Returns ``(work, finish)``: call ``finish()`` once ``work`` is done."""
    n, s = out_flat.numel(), folded.numel()
    if s * world == n:
        return _all_gather_flat(out_flat, folded, group), (lambda: None)
    full = torch.empty(world * s, dtype=folded.dtype, device=folded.device)
    return _all_gather_flat(full, folded, group), (lambda: out_flat.copy_(full[:n]))


def check_power_of_two_world(world: int) -> None:
    """Raise ValueError unless ``world`` (a world size) is a power of two (the tree over ranks needs it)."""
    if world < 1 or world & (world - 1):
        raise ValueError(f"the world size {world} is not a power of two: the split-invariant tree reduction needs "
                         f"1, 2, 4, 8, ... ranks")


def tree_all_reduce(flat: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Pairwise tree sum over ranks, in rank order, of ``flat``; **in place**, returns ``flat``.

    Each rank holds in ``flat`` the tree sum of its own contiguous shard of blocks (a subtree); the result is
    ``tree(rank 0, ..., rank N-1)`` with ``tree(x[0:k]) = tree(x[0:k/2]) + tree(x[k/2:k])`` (left + right), in
    ``flat.dtype`` (the accumulator passes fp32, or fp64 for an fp64 model), with identical bits on every rank.

    Algorithm (traffic O(numel) per rank, like a ring all-reduce): ``flat`` is split into ``N`` contiguous shards
    (zero-padded to a multiple of ``N``); an ``all_to_all`` gives rank ``j`` shard ``j`` of every rank; rank ``j``
    adds those ``N`` pieces by the tree in rank order; an ``all_gather`` of the ``N`` summed shards writes the
    result into ``flat`` on every rank. Each rank sends and receives ``2 (N - 1) / N * numel`` elements; extra
    memory ``numel`` (+ padding). The collectives move bytes only; the additions are elementwise and done in the
    same order wherever a shard lands, so the bits do not depend on the backend, the device count per host or
    the shard boundaries.

    Without an initialised default process group (``group`` None), or with one rank, ``flat`` is returned
    unchanged (a world of one). Collective otherwise: every rank calls it with the same shape and dtype.
    Synchronous on gloo; on nccl the result is ordered on the current stream.

    Raises:
        TypeError: ``flat`` is not a floating-point tensor.
        ValueError: the world size is not a power of two.
    """
    if not isinstance(flat, torch.Tensor) or not flat.is_floating_point():
        raise TypeError(f"flat: expected a floating-point torch.Tensor, got "
                        f"{flat.dtype if isinstance(flat, torch.Tensor) else type(flat).__name__}")
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return flat
    world = _world_size(group)
    check_power_of_two_world(world)
    if world == 1:
        return flat
    if not flat.is_contiguous():
        raise ValueError("flat: expected a contiguous tensor")
    received, world, _ = _shard_exchange(flat, group)
    folded = tree_fold(received, dtype=flat.dtype)
    work, finish = _gather_shards(folded, flat.view(-1), world, group)
    work.wait()
    finish()
    return flat


def ordered_all_reduce(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, *,
                       average: bool = True) -> "torch.futures.Future[torch.Tensor]":
    """Sum (or mean) of ``tensor`` over the ranks of ``group``, folded in rank order; in place.

    Element ``i`` of the result is ``lexical_fold`` of the ``N`` ranks' elements ``i`` (rank 0 first, from +0.0,
    in fp32 -- fp64 for fp64), divided by ``N`` if ``average`` (in the accumulation dtype), cast to
    ``tensor.dtype``, written into ``tensor``.

    Algorithm (traffic O(numel) per rank): ``tensor`` is split into ``N`` contiguous shards (zero-padded to a
    multiple of ``N``); an ``all_to_all`` gives rank ``j`` shard ``j`` of every rank (in ``tensor.dtype``); rank
    ``j`` folds those ``N`` pieces in rank order, divides and casts; an ``all_gather`` of the ``N`` results writes
    them into ``tensor``. The fold is elementwise, so the bits are those of folding the whole tensors (the
    all-gather algorithm of ordered-ssd <= 0.1.0.dev0, which moved ``(N - 1) * numel`` elements per rank); each
    rank now sends and receives ``2 (N - 1) / N * numel`` elements, holds ``numel`` extra elements.

    The ``all_to_all`` is started and waited for in the calling thread (on gloo that blocks the host until it is
    done; on nccl ``wait`` only orders the current stream after it), then the fold is launched and the
    ``all_gather`` started; the returned future completes with the all-gather. Every collective is so issued
    from the calling thread, in call order, on every rank (issuing the all-gather from a future callback could
    interleave two DDP buckets' collectives differently on different ranks).

    Args:
        tensor: a contiguous floating-point tensor of any shape, on the group's device (CPU for gloo,
            the rank's GPU for nccl); the same shape and dtype on every rank.
        group: the process group (default: the world).
        average: divide the folded sum by the world size.

    Returns:
        A ``torch.futures.Future`` whose value is ``tensor`` (holding the result) once the collectives and the
        fold are done; ``fut.wait()`` to block.

    Raises:
        TypeError: ``tensor`` is not a floating-point tensor.
        ValueError: ``tensor`` is not contiguous.
        RuntimeError: the process group is not initialised, or the collective fails.

    Determinism: element ``i`` of the result is a function of the ranks' elements ``i`` alone, reduced in
    the same order on every rank, so every rank gets the same bits, in every run, whatever the backend's
    algorithm or the shard boundaries.
    """
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise TypeError(f"tensor: expected a floating-point torch.Tensor, got "
                        f"{tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor: expected a contiguous tensor (DDP bucket buffers are)")
    received, world, _ = _shard_exchange(tensor, group)  # row r = rank r's copy of this rank's shard
    acc_dtype = accumulation_dtype(tensor.dtype)
    acc = lexical_fold(received, dtype=acc_dtype)  # rank 0 first, from +0.0
    if average:
        acc = acc.div_(world)
    folded = acc.to(tensor.dtype)
    work, finish = _gather_shards(folded, tensor.view(-1), world, group)

    def _done(fut: torch.futures.Future, _keep=(received, folded)) -> torch.Tensor:
        # (_keep: the buffers the collectives use stay referenced until the all-gather completes)
        fut.value()  # re-raises a failed collective
        finish()
        return tensor

    return work.get_future().then(_done)


def ordered_allreduce_hook(state: Optional[dist.ProcessGroup],
                           bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradient averaged over ranks by :func:`ordered_all_reduce`.

    Register with ``ddp_model.register_comm_hook(process_group_or_None, ordered_allreduce_hook)`` (or
    :func:`register_ordered_hook`). ``state`` is the process group (None: the world). Each rank's bucket holds
    the gradient of *its own* loss; the hook returns ``(sum over ranks in rank order) / N``, so with the
    per-rank loss a mean over the rank's equally many rows, the result is the gradient of the mean over the
    global batch (the scaling of DDP's default all-reduce).

    Determinism: see :func:`ordered_all_reduce`; the bits do not depend on the bucket layout, so DDP's bucket
    rebuild after the first iteration (and ``bucket_cap_mb``) changes only the speed.
    """
    return ordered_all_reduce(bucket.buffer(), state, average=True)


def register_ordered_hook(model: torch.nn.parallel.DistributedDataParallel,
                          process_group: Optional[dist.ProcessGroup] = None) -> None:
    """Register :func:`ordered_allreduce_hook` on a ``DistributedDataParallel`` model.

    Raises:
        TypeError: ``model`` is not a ``DistributedDataParallel``.
        RuntimeError: a hook is already registered (DDP allows one).
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"model: expected a DistributedDataParallel, got {type(model).__name__}")
    model.register_comm_hook(process_group, ordered_allreduce_hook)


def ordered_mean(value: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Mean over ranks of a (detached) tensor, folded in rank order; a new tensor, identical on every rank.

    Used for the reported global loss: the mean of the ranks' local mean losses, which for equal shards is the
    mean over the global batch. Blocks until done. Raises as :func:`ordered_all_reduce`.
    """
    out = value.detach().clone().contiguous()
    ordered_all_reduce(out, group, average=True).wait()
    return out


# ----------------------------------------------------------------------------------------------- sharding
def shard_rows(global_batch: int, world_size: int, rank: int) -> Tuple[int, int]:
    """``(offset, count)``: rank ``rank`` takes rows ``[rank*B/N, (rank+1)*B/N)`` of the global batch ``B``.

    Raises:
        ValueError: ``B`` is not a positive multiple of ``N``, or ``rank`` is not in ``[0, N)``.
    """
    for name, v in (("global_batch", global_batch), ("world_size", world_size), ("rank", rank)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < {world_size}, got {rank}")
    if global_batch < 1 or global_batch % world_size:
        raise ValueError(f"the global batch {global_batch} is not divisible by the number of processes {world_size} "
                         f"(rank r takes rows [r*B/N, (r+1)*B/N); pick a batch that is a multiple of {world_size})")
    count = global_batch // world_size
    return rank * count, count


# ----------------------------------------------------------------------------------------------- fingerprints
def rank_fingerprint(device: Union[torch.device, str], world_size: int) -> dict:
    """This rank's determinism fingerprint: :func:`determinism_fingerprint` with ``world_size``; on CUDA, with
    the pinned native configurations (``pinned_configs``) when ``csrc_bindings`` loads.

    The testing-only environment variable :data:`TEST_SKEW_ENV` (``"RANK:KEY=VALUE"``) overrides one field on
    one rank.
    """
    device = torch.device(device)
    info = determinism_fingerprint(device, world_size=world_size)
    skew = os.environ.get(TEST_SKEW_ENV)
    if skew:
        who, _, kv = skew.partition(":")
        key, _, value = kv.partition("=")
        if who.strip() == os.environ.get("RANK", "0") and key:
            info[key] = value
    return info


def fingerprint_mismatch_message(infos: Sequence[dict]) -> Optional[str]:
    """None if every rank's fingerprint equals rank 0's; else a one-line message naming the differing ranks
    and fields (ranks with the same fingerprint are listed together)."""
    strings = [fingerprint_string(i) for i in infos]
    if all(s == strings[0] for s in strings):
        return None
    groups: dict = {}
    for r, s in enumerate(strings):
        if s != strings[0]:
            groups.setdefault(s, []).append(r)
    parts = []
    for s, ranks in groups.items():
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        parts.append(f"{who} ({s}) differ{'s' if len(ranks) == 1 else ''} from rank 0 ({strings[0]}) in "
                     f"{fingerprint_diff(infos[0], infos[ranks[0]])}")
    return (f"the {len(infos)} ranks do not share one determinism fingerprint: " + "; ".join(parts) +
            "; they would not compute the same bits, stopping")


def check_rank_fingerprints(info: dict, group: Optional[dist.ProcessGroup] = None) -> List[dict]:
    """All-gather every rank's fingerprint dict; return them (index = rank) if all equal.

    Collective: every rank of ``group`` must call it. Every rank receives the same list and so raises the
    same error.

    Raises:
        RankMismatchError: some rank's fingerprint differs from rank 0's (the message names the ranks and the
            differing fields).
    """
    infos: List[Optional[dict]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(infos, info, group=group)
    msg = fingerprint_mismatch_message(infos)
    if msg is not None:
        raise RankMismatchError(msg)
    return infos


# ----------------------------------------------------------------------------------------------- process group
@dataclass(frozen=True)
class DistContext:
    """This process's place in the job: ``rank``, ``world_size``, ``local_rank``, ``device``, ``backend``."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def init_distributed(device_type: str, timeout_s: float = 600.0) -> DistContext:
    """Initialise the default process group from the ``torchrun`` environment.

    ``device_type`` ``"cpu"``: backend gloo, device ``cpu``. ``"cuda"``: backend nccl, device
    ``cuda:LOCAL_RANK`` (made the current device).

    Raises:
        RuntimeError: not launched by torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR`` unset),
            an unsupported device type, or fewer visible GPUs than local ranks.
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"not launched by torchrun ({', '.join(missing)} unset): run it as "
                           f"python -m torch.distributed.run --nproc-per-node N ...")
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    timeout = datetime.timedelta(seconds=timeout_s)
    if device_type == "cpu":
        device, backend = torch.device("cpu"), "gloo"
        dist.init_process_group(backend, timeout=timeout, store=_attempt_store(rank, world, timeout), rank=rank,
                                world_size=world)
    elif device_type == "cuda":
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local} needs cuda:{local} but only {torch.cuda.device_count()} "
                               f"GPU(s) are visible")
        device, backend = torch.device("cuda", local), "nccl"
        torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timeout, device_id=device,
                                store=_attempt_store(rank, world, timeout), rank=rank, world_size=world)
    else:
        raise RuntimeError(f"device type: expected 'cpu' or 'cuda', got {device_type!r}")
    return DistContext(rank, world, local, device, backend)


def _attempt_store(rank: int, world: int, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store of ``MASTER_ADDR:MASTER_PORT`` under a prefix naming torchrun's restart attempt
    (``TORCHELASTIC_RESTART_COUNT``): after a rank failed and torchrun restarted the group, the agent's store
    still holds the dead attempt's addresses, which gloo would try to connect to."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                          is_master=(not agent and rank == 0), timeout=timeout, wait_for_workers=False)
    return dist.PrefixStore(f"ordered-ssd/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
