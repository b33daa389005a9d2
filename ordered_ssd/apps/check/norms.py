"""The float64 L2 norms of the tensors in a flat byte snapshot, on its device, in a few launches
(:func:`device_norms`): the norms ``ordered-ssd check`` records with each step's digests
(:class:`~ordered_ssd.apps.check.digests.StepDigests`) for the picture's magnitudes. A plan (:func:`norm_plan`)
depends on the layout only and is worked out once per layout; :func:`planned_norms` runs it."""
from __future__ import annotations

from typing import List, NamedTuple, Sequence, Tuple

import torch

__all__ = ["SPAN_ALIGN", "NORM_GROUP_ELEMENTS", "NormPlan", "norm_plan", "planned_norms", "device_norms"]

#: the most elements :func:`device_norms` widens to float64 in one copy (64 MiB of float64): a larger tensor is
#: widened in pieces of this many elements
NORM_GROUP_ELEMENTS = 1 << 23
#: each tensor's offset in a :class:`StepDigests` snapshot is a multiple of this many bytes (so that every span can be
#: viewed as its dtype); the padding bytes between spans are never hashed
SPAN_ALIGN = 16


class NormPlan(NamedTuple):
    """How :func:`device_norms` widens a snapshot's spans: ``groups`` ``(start, end, dtype, sizes)``, each a byte
    range widened to float64 at once and split into ``sizes`` elements (spans and the padding between them, in
    turn), and ``where``, per span its indices into the widened tensors (several for a span widened in pieces)."""

    groups: Tuple[Tuple[int, int, torch.dtype, Tuple[int, ...]], ...]
    where: Tuple[Tuple[int, ...], ...]


def norm_plan(spans: Sequence[Tuple[int, int, torch.dtype]]) -> NormPlan:
    """The widening of :func:`device_norms` for ``spans`` (see there); depends on the layout only."""
    groups: List[Tuple[int, int, torch.dtype, Tuple[int, ...]]] = []
    where: List[Tuple[int, ...]] = []
    group: List[Tuple[int, int, torch.dtype]] = []
    widened = 0  # the tensors widened so far (a group's spans, each piece of a long span)

    def flush() -> None:
        nonlocal widened
        if group:
            start, dt = group[0][0], group[0][2]
            sizes: List[int] = []
            for i, (off, n, _) in enumerate(group):
                gap = group[i + 1][0] - (off + n) if i + 1 < len(group) else 0
                sizes += [n // dt.itemsize, gap // dt.itemsize]
            groups.append((start, group[-1][0] + group[-1][1], dt, tuple(sizes)))
            widened += len(group)
            group.clear()

    count = 0
    for off, n, dt in spans:
        elems = n // dt.itemsize
        if elems > NORM_GROUP_ELEMENTS:
            flush()
            step = NORM_GROUP_ELEMENTS * dt.itemsize
            first = widened
            for p in range(off, off + n, step):
                end = min(p + step, off + n)
                groups.append((p, end, dt, ((end - p) // dt.itemsize, 0)))
                widened += 1
            where.append(tuple(range(first, widened)))
            continue
        if group:
            gap = off - (group[-1][0] + group[-1][1])
            if dt != group[-1][2] or not 0 <= gap < SPAN_ALIGN or \
                    count + gap // dt.itemsize + elems > NORM_GROUP_ELEMENTS:
                flush()
            else:
                count += gap // dt.itemsize  # the padding is widened with the group (and left out after)
        if not group:
            count = 0
        group.append((off, n, dt))
        count += elems
        where.append((widened + len(group) - 1,))
    flush()
    return NormPlan(tuple(groups), tuple(where))


def planned_norms(snap: torch.Tensor, plan: NormPlan) -> torch.Tensor:
    """:func:`device_norms` of ``snap`` by a plan of :func:`norm_plan`."""
    if not plan.where:
        return torch.zeros(0, dtype=torch.float64, device=snap.device)
    wide: List[torch.Tensor] = []
    for start, end, dt, sizes in plan.groups:
        wide.extend(snap[start:end].view(dt).to(torch.float64).split(sizes)[0::2])  # without the padding
    norms = list(torch._foreach_norm(wide, 2))
    if len(wide) == len(plan.where):  # one widened tensor per span, in order
        return torch.stack(norms)
    return torch.stack([norms[ix[0]] if len(ix) == 1 else torch.linalg.vector_norm(torch.stack([norms[i] for i in ix]))
                        for ix in plan.where])


def device_norms(snap: torch.Tensor, spans: Sequence[Tuple[int, int, torch.dtype]]) -> torch.Tensor:
    """The float64 L2 norm of each tensor ``(offset, nbytes, dtype)`` of the flat byte buffer ``snap`` (offsets
    multiples of the dtype's size), in the order given, as one float64 tensor on ``snap``'s device.

    Consecutive spans of one dtype separated by less than :data:`SPAN_ALIGN` bytes (the snapshot's alignment padding)
    are widened to float64 together, at most :data:`NORM_GROUP_ELEMENTS` elements at a time (a longer span in pieces
    of that many, whose norms are then combined as the norm of their norms), and every widened tensor's norm comes from
    one ``torch._foreach_norm``: a few launches in all, instead of one or two per tensor, and at most 64 MiB of
    float64 at a time. The same bytes in the same layout give the same bits (``_foreach_norm``'s split of a tensor
    among its accumulators depends on the tensor's alignment in the widened buffer, so a tensor's norm may differ in
    its last bits between layouts; norms are recorded, never compared)."""
    return planned_norms(snap, norm_plan(spans))
