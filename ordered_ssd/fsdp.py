"""FSDP2 (``torch.distributed.fsdp.fully_shard``) with an ordered gradient reduce-scatter: the same gradient bits
for every number of ranks and accumulation steps, and the same bits as DDP with
:class:`~ordered_ssd.accumulate.TreeGradAccumulator`.

FSDP2 reduce-scatters each group's gradients with the backend's ``reduce_scatter``, whose order of additions
depends on the algorithm the backend picks (ring, tree, NVLS), on the ring and on the world size. Here:

* :func:`set_ordered_reduce_scatter` plugs :class:`OrderedReduceScatter` into every ``fully_shard``-ed module of
  a model (``FSDPModule.set_custom_reduce_scatter``): an ``all_to_all`` gives rank ``j`` its shard of every rank's
  gradient (bytes only), and rank ``j`` adds those ``R`` pieces by the pairwise tree in rank order
  (:func:`ordered_ssd.fold.tree_fold`, fp32; fp64 for fp64), without dividing. Traffic per rank
  ``(R - 1) / R`` of the group's gradient, as a ring reduce-scatter.
* :class:`FSDPTreeAccumulator` takes the reduced (sharded) gradients after every micro-batch's backward and adds
  them by the pairwise tree over micro-batches; :meth:`~FSDPTreeAccumulator.write_grads` divides by ``R * m``
  once and casts once.

The contract (``docs/distributed.md``): a global batch cut into ``R * m`` blocks of ``b`` examples (``R`` ranks,
``m`` micro-batches, powers of two); in micro-batch ``k`` rank ``r`` trains **block** ``k * R + r``. The gradient
written is ``tree(g[0], ..., g[R*m - 1]) / (R * m)`` in global block order, because a pairwise tree over
``R * m`` leaves is the tree over micro-batches of the trees over each micro-batch's ``R`` consecutive blocks.
It is the very sum :class:`~ordered_ssd.accumulate.TreeGradAccumulator` computes for DDP (where rank ``r`` holds
the contiguous blocks ``[r*m, (r+1)*m)``), so FSDP2 and DDP give the same bits for the same global batch, with
any ``(R, m)`` of the same product -- provided each block gradient is computed the same way wherever it runs
(``OrderedMamba2`` guarantees that for its parameters; the rest of the model must be deterministic too).

Supported ``fully_shard`` options: ``reshard_after_forward`` (any; it moves bytes), ``mp_policy`` whose
gradient reduction is in fp32 or fp64 (``reduce_dtype=torch.float32`` whenever ``param_dtype`` is bf16/fp16),
one 1-D mesh (plain FSDP). Refused, with a ``ValueError`` naming the option: CPU offload (``CPUOffloadPolicy``),
HSDP or replicate meshes (their all-reduce is the backend's), an all-reduce hook, FSDP's own accumulation
without communication (``set_requires_gradient_sync(False)``: its unsharded sum is left to right), and a world
size that is not a power of two.
"""
from __future__ import annotations

from typing import Iterable, List, Optional

import torch
import torch.distributed as dist

from .accumulate import TreeGradAccumulator
from .distributed import check_power_of_two_world
from .fold import tree_fold

__all__ = ["OrderedReduceScatter", "set_ordered_reduce_scatter", "FSDPTreeAccumulator", "ordered_clip_grad_norm_",
           "fsdp_blocks"]

_INSTALL = "ordered-ssd's FSDP2 support needs torch >= 2.11 (torch.distributed.fsdp.fully_shard)"


def _fsdp_api():
    """``(FSDPModule, ReduceScatter, CPUOffloadPolicy)``; ImportError naming the torch version otherwise."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError as e:
        raise ImportError(f"{_INSTALL}; this torch is {torch.__version__} ({e}); install it with: "
                          f"pip install 'torch>=2.11'") from None
    for name in ("set_custom_reduce_scatter", "set_gradient_divide_factor", "set_force_sum_reduction_for_comms"):
        if not hasattr(FSDPModule, name):
            raise ImportError(f"{_INSTALL}: FSDPModule.{name} is missing in torch {torch.__version__}; install it "
                              f"with: pip install 'torch>=2.11'")
    return FSDPModule, ReduceScatter, CPUOffloadPolicy


def _param_groups(module) -> list:
    """The FSDP parameter groups of one ``fully_shard``-ed module (torch 2.11 has one attribute, later a list)."""
    state = module._get_fsdp_state()
    if hasattr(state, "_fsdp_param_groups"):
        return [g for g in state._fsdp_param_groups if g is not None]
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def fsdp_blocks(rank: int, world_size: int, micro_batches: int) -> List[int]:
    """The global blocks rank ``rank`` trains, micro-batch by micro-batch: ``[k * R + rank for k in range(m)]``
    (the order :class:`FSDPTreeAccumulator` sums in). Raises ValueError for a rank outside ``[0, R)`` or counts
    that are not powers of two."""
    check_power_of_two_world(world_size)
    if micro_batches < 1 or micro_batches & (micro_batches - 1):
        raise ValueError(f"micro_batches: expected a power of two (1, 2, 4, ...), got {micro_batches}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < {world_size}, got {rank}")
    return [k * world_size + rank for k in range(micro_batches)]


# ----------------------------------------------------------------------------------------------- the reduce-scatter
def _reduce_scatter_base():
    return _fsdp_api()[1]


class OrderedReduceScatter:
    """A ``ReduceScatter`` for ``FSDPModule.set_custom_reduce_scatter``: rank ``j`` receives, for every element of
    its shard, ``tree(g_0, ..., g_{R-1})``, the pairwise tree sum of the ranks' gradients in rank order
    (:func:`ordered_ssd.fold.tree_fold`), in the reduction dtype (fp32 or fp64), **not divided** by ``R``
    (:class:`FSDPTreeAccumulator` divides once).

    FSDP2 lays the reduce-scatter input out as ``R`` contiguous pieces, piece ``j`` for rank ``j``; an
    ``all_to_all_single`` (bytes only) gives rank ``j`` piece ``j`` of every rank as ``[R, s]``, folded row 0
    first. The bits do not depend on the backend's algorithm, on the world size (element ``i`` of a parameter is
    the same tree wherever its shard lands) or on the FSDP group layout. Synchronous: on nccl it is ordered on the
    current (reduce-scatter) stream, on gloo it blocks the host. Memory: one received copy of the input, plus the
    tree's levels (about as much again, transiently).

    ``calls`` counts the reductions (for tests and diagnostics).

    Raises (at call time, on every rank alike):
        TypeError: the reduction dtype is not fp32 or fp64.
        ValueError: the op is not ``SUM`` (the module's divide factor was changed after
            :func:`set_ordered_reduce_scatter`), or the world size is not a power of two.
    """

    def __new__(cls, *args, **kwargs):
        # subclass torch's abstract ReduceScatter lazily (importing ordered_ssd must not import FSDP)
        base = _reduce_scatter_base()
        if not issubclass(cls, base):
            cls = _ordered_reduce_scatter_class(base)
        return object.__new__(cls)

    def __init__(self) -> None:
        self.calls = 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        if input_tensor.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"ordered reduce-scatter: expected gradients reduced in fp32 or fp64, got "
                            f"{input_tensor.dtype}; set fully_shard(mp_policy=MixedPrecisionPolicy(reduce_dtype="
                            f"torch.float32))")
        if op != dist.ReduceOp.SUM:
            raise ValueError(f"ordered reduce-scatter: expected the SUM op (set_ordered_reduce_scatter sets the "
                             f"gradient divide factor to 1 and sum-only reductions), got {op}; do not change the "
                             f"module's gradient divide factor afterwards")
        world = group.size()
        check_power_of_two_world(world)
        received = torch.empty_like(input_tensor)
        dist.all_to_all_single(received, input_tensor, group=group)
        output_tensor.copy_(tree_fold(received.view(world, -1), dtype=input_tensor.dtype))
        self.calls += 1
        return None

    def __repr__(self) -> str:
        return f"OrderedReduceScatter(calls={self.calls})"


_CLASSES: dict = {}


def _ordered_reduce_scatter_class(base):
    if base not in _CLASSES:
        _CLASSES[base] = type("OrderedReduceScatter", (OrderedReduceScatter, base), {
            "__module__": __name__, "__doc__": OrderedReduceScatter.__doc__})
    return _CLASSES[base]


def _fsdp_modules(model: torch.nn.Module) -> list:
    FSDPModule = _fsdp_api()[0]
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _check_group(name: str, group, CPUOffloadPolicy) -> None:
    """Refuse (ValueError naming ``name`` and the option) what the ordered reduction does not cover."""
    where = f"fully_shard module {name or '(root)'}"
    if isinstance(getattr(group, "offload_policy", None), CPUOffloadPolicy):
        raise ValueError(f"{where}: expected no CPU offload, got offload_policy=CPUOffloadPolicy(); the ordered "
                         f"reduce-scatter supports parameters and gradients on the device")
    if getattr(group.mesh_info, "replicate_mesh_dim", None) is not None:
        raise ValueError(f"{where}: expected a 1-D mesh (plain FSDP), got a mesh with a replicate dimension "
                         f"(HSDP/replicate): its all-reduce is the backend's, in no fixed order")
    if getattr(group, "_all_reduce_hook", None) is not None:
        raise ValueError(f"{where}: expected no all-reduce hook (set_all_reduce_hook), got one")
    mp = group.mp_policy
    dtypes = {fp.sharded_param.dtype for fp in group.fsdp_params}
    reduce = mp.reduce_dtype or mp.param_dtype
    for dtype in ([reduce] if reduce is not None else sorted(dtypes, key=str)):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{where}: expected gradients reduced in fp32 or fp64, got {dtype} (mp_policy "
                             f"param_dtype={mp.param_dtype}, reduce_dtype={mp.reduce_dtype}, parameters "
                             f"{sorted(map(str, dtypes))}); pass mp_policy=MixedPrecisionPolicy(param_dtype=..., "
                             f"reduce_dtype=torch.float32)")


def set_ordered_reduce_scatter(model: torch.nn.Module) -> List[OrderedReduceScatter]:
    """Make every ``fully_shard``-ed module of ``model`` (``model`` itself included) reduce its gradients with
    :class:`OrderedReduceScatter`; call it after ``fully_shard`` and before the first backward. Each module's
    gradient divide factor is set to 1 with sum-only reductions, so after a backward every sharded ``.grad``
    holds the **sum** over ranks; use :class:`FSDPTreeAccumulator` to divide (and to accumulate micro-batches).

    Returns the reduce-scatters set (one per module, in ``model.modules()`` order).

    Raises:
        ImportError: torch without FSDP2's custom reduce-scatter (torch < 2.11).
        ValueError: no ``fully_shard``-ed module in ``model``; an option the ordered reduction does not cover (see
            the module docstring); nothing is changed then.
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    _, _, CPUOffloadPolicy = _fsdp_api()
    names = {m: n for n, m in model.named_modules()}
    modules = _fsdp_modules(model)
    if not modules:
        raise ValueError("model: expected a model with fully_shard-ed modules (torch.distributed.fsdp."
                         "fully_shard), got none")
    for m in modules:  # every check before any change
        groups = _param_groups(m)
        if len(groups) > 1:
            raise ValueError(f"fully_shard module {names[m] or '(root)'}: expected one parameter group, got "
                             f"{len(groups)} (per-parameter meshes from shard_placement_fn)")
        for g in groups:
            _check_group(names[m], g, CPUOffloadPolicy)
    comms = []
    for m in modules:
        comm = OrderedReduceScatter()
        m.set_custom_reduce_scatter(comm)
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
        comms.append(comm)
    return comms


# ----------------------------------------------------------------------------------------------- accumulation
def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


class FSDPTreeAccumulator(TreeGradAccumulator):
    """Accumulates FSDP2's sharded gradients by the pairwise tree over micro-batches and divides once.

    Use after :func:`set_ordered_reduce_scatter`; in micro-batch ``k`` rank ``r`` trains block ``k * R + r``
    (:func:`fsdp_blocks`)::

        set_ordered_reduce_scatter(model)
        acc = FSDPTreeAccumulator(model)
        for k in range(m):                       # every micro-batch reduces (no set_requires_gradient_sync)
            loss_fn(model(x[k * R + rank]), y[k * R + rank]).backward()
            acc.add_block()                      # takes every sharded .grad (a sum over ranks), sets it to None
        acc.write_grads()                        # .grad = tree over the m micro-batches / (R * m), cast once
        ordered_clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(); optimizer.zero_grad()

    It is a :class:`~ordered_ssd.accumulate.TreeGradAccumulator` over each rank's local shards (the same stack,
    at most ``log2(m) + 1`` buffers of the rank's shard size; fp32, fp64 for an all-fp64 model) whose
    :meth:`write_grads` does not communicate: the ranks were already summed by the reduce-scatter. The default
    scale is ``1 / (m * R)``.

    Args:
        model: the ``fully_shard``-ed model (its parameters that require grad are accumulated).

    Raises:
        ValueError: a model without :func:`set_ordered_reduce_scatter` (its reduce-scatter is not ordered); as
            :class:`~ordered_ssd.accumulate.TreeGradAccumulator`.
    """

    def __init__(self, model: torch.nn.Module):
        modules = _fsdp_modules(model)
        ordered = [m for m in modules if all(isinstance(g._reduce_scatter_comm, OrderedReduceScatter)
                                             for g in _param_groups(m))]
        if not modules or len(ordered) != len(modules):
            raise ValueError("model: expected a fully_shard-ed model with set_ordered_reduce_scatter(model) applied, "
                             f"got {len(modules)} fully_shard-ed module(s), {len(ordered)} with the ordered "
                             f"reduce-scatter")
        self._modules = modules
        super().__init__(model.parameters())
        mesh = {p.device_mesh for p in self.params if _is_dtensor(p)}
        self._group = mesh.pop().get_group() if len(mesh) == 1 else None

    @staticmethod
    def _local_of(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if _is_dtensor(t) else t

    def _numel_of(self, p) -> int:
        return self._local_of(p).numel()

    def add_block(self) -> None:
        for m in self._modules:
            for g in _param_groups(m):
                if not g.reduce_grads:
                    raise ValueError("FSDPTreeAccumulator: a module has set_requires_gradient_sync(False): FSDP "
                                     "would add the micro-batches left to right; keep gradient sync on and call "
                                     "add_block() after every micro-batch")
        super().add_block()

    def world_size(self, group=None) -> int:
        """The number of ranks the gradients were summed over (the FSDP mesh's size; 1 without FSDP sharding)."""
        group = self._group if group is None else group
        return 1 if group is None else dist.get_world_size(group)

    def _meta_fields(self) -> dict:
        # not the gradient elements: shard sizes differ between ranks (FSDP pads the last ones)
        return {"blocks": self.blocks, "parameters": len(self.params)}

    def _reduce_flat(self, flat: torch.Tensor, group) -> torch.Tensor:
        return flat  # the ranks were summed by the ordered reduce-scatter

    def _agree_group(self, group):
        return self._group if group is None else group

    def _wrap_grad(self, p, local: torch.Tensor):
        if not _is_dtensor(p):
            return local
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())


# ----------------------------------------------------------------------------------------------- clipping
def _dim0_sharded(t) -> bool:
    """A DTensor sharded on dim 0 over a 1-D mesh (FSDP2's layout), whose rows follow ``torch.chunk``."""
    from torch.distributed.tensor import Shard

    return (_is_dtensor(t) and t.device_mesh.ndim == 1 and len(t.placements) == 1
            and isinstance(t.placements[0], Shard) and t.placements[0].dim == 0 and t.dim() > 0)


def _full_tensors(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """The whole tensor of each (DTensor or plain) tensor, bytes only: the dim-0-sharded DTensors of one mesh,
    device and dtype are all-gathered in **one** collective (each rank's shards zero-padded to ``ceil(rows / R)``
    rows, concatenated; every tensor then reassembled from the ranks' row blocks, as ``full_tensor()`` does),
    other DTensors by ``full_tensor()``, plain tensors as they are. Collective when any tensor is a DTensor."""
    out: List[Optional[torch.Tensor]] = [None] * len(tensors)
    batches: dict = {}
    for i, t in enumerate(tensors):
        if _dim0_sharded(t):
            batches.setdefault((t.device_mesh, t.to_local().device, t.dtype), []).append(i)
        elif _is_dtensor(t):
            out[i] = t.full_tensor()
        else:
            out[i] = t
    for (mesh, device, dtype), idx in batches.items():
        group, world = mesh.get_group(), mesh.size()
        pieces, layout = [], []
        for i in idx:
            t = tensors[i]
            rows, rest = t.shape[0], tuple(t.shape[1:])
            chunk = -(-rows // world)
            width = chunk * (t.numel() // rows if rows else 0)
            local = t.to_local().reshape(-1)
            padded = torch.zeros(width, dtype=dtype, device=device)
            padded[:local.numel()] = local
            pieces.append(padded)
            layout.append((i, rows, rest, chunk, width))
        send = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype, device=device)
        recv = torch.empty(world * send.numel(), dtype=dtype, device=device)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn(recv, send, group=group)
        recv = recv.view(world, -1)
        offset = 0
        for i, rows, rest, chunk, width in layout:
            blocks = []
            for r in range(world):
                n = max(0, min(chunk, rows - r * chunk))
                blocks.append(recv[r, offset:offset + width].view(chunk, *rest)[:n])
            out[i] = torch.cat(blocks).view(rows, *rest)
            offset += width
    return out  # type: ignore[return-value]


def ordered_clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0,
                            error_if_nonfinite: bool = False) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, foreach=False)`` with the bits of the
    unsharded gradients, for sharded (DTensor) gradients too; returns the total norm (a plain tensor, the same on
    every rank).

    ``clip_grad_norm_`` on DTensor gradients adds the ranks' partial norms with the backend's all-reduce, so the
    norm, the clip coefficient and every clipped gradient change with the world size. Here the DTensor gradients
    are all-gathered (bytes: one collective for all of FSDP2's dim-0 shards of one mesh, device and dtype, so the
    extra memory is about two unsharded copies of the gradients, transiently, and the traffic O(gradient size) per
    rank), the norms are computed exactly as ``clip_grad_norm_`` computes them on full tensors
    (``torch.linalg.vector_norm`` per gradient, grouped by device and dtype in first-seen order, then of the
    stacked norms), and each rank scales its local shard by the same coefficient. Plain-tensor gradients are used
    as they are: the result equals ``clip_grad_norm_(..., foreach=False)`` of the unsharded model bit for bit
    (tested on 1, 2 and 4 ranks). Collective when any gradient is a DTensor.

    Raises:
        RuntimeError: ``error_if_nonfinite`` and the norm is not finite (as ``clip_grad_norm_``).
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = [p for p in parameters if p.grad is not None]
    groups: dict = {}
    for p in params:
        groups.setdefault((p.grad.device, p.grad.dtype), []).append(p)
    ordered = [p for ps in groups.values() for p in ps]
    fulls = _full_tensors([p.grad for p in ordered])
    norms = [torch.linalg.vector_norm(g, norm_type) for g in fulls]
    del fulls
    if not norms:
        return torch.tensor(0.0)
    first = norms[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so "
                           f"it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           f"norm anyway, set `error_if_nonfinite=False`")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for (device, _), ps in groups.items():
        for p in ps:
            local = p.grad.to_local() if _is_dtensor(p.grad) else p.grad
            local.mul_(coef.to(device))
    return total
