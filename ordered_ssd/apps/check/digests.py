"""SHA-256 digests of a training step's tensors, computed while the next steps train.

``ordered-ssd check`` hashes every gradient (and, in split-invariance runs, every parameter) after every step. Done
in line, that is a device-to-host copy and a SHA-256 of the whole model per step, with the device idle meanwhile.
:class:`StepDigests` takes the same digests off the training path without weakening them (every byte of every
tensor goes through SHA-256, exactly :func:`ordered_ssd.digest.tensor_sha256`):

1. :meth:`StepDigests.submit` snapshots the tensors' bytes into one flat device buffer (one copy on the device, in
   stream order: the optimizer step that follows cannot change what was snapshotted);
2. on CUDA a side stream copies the snapshot into pinned host memory (the copy engine, beside the next step's
   kernels) and records an event;
3. a thread waits for that event and hands the tensors to a pool of ``threads`` hashing threads, in at most
   ``threads`` tasks of about equal bytes (:func:`hashing_groups`; ``hashlib`` releases the GIL, so the tasks hash
   in parallel, and few tasks take the GIL from the training thread few times), while the training thread goes
   on.

With ``norms=True`` each floating tensor's L2 norm in float64 is taken too: on CUDA on the device at :meth:`submit`
(:func:`device_norms`: the snapshot's tensors widened to float64 a group at a time and one ``torch._foreach_norm``,
in stream order, a few launches per submission, copied to the host with it), on the CPU in the hashing threads.
Either way a device gives the same norm for the same bits in every run.

At most ``depth`` submissions are in flight (a further :meth:`submit` waits for the oldest);
:meth:`StepDigests.result` of a submission blocks until its digests are done. Memory: ``depth`` snapshots of the
submitted bytes on the device and as many pinned host buffers (reused).
"""
from __future__ import annotations

import hashlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from .launch import usable_cores

__all__ = ["StepDigests", "StepResult", "default_threads", "hashing_groups", "device_norms"]

#: the most elements :func:`device_norms` widens to float64 in one copy (64 MiB of float64): a larger tensor is
#: widened in pieces of this many elements
NORM_GROUP_ELEMENTS = 1 << 23
#: each tensor's offset in a :class:`StepDigests` snapshot is a multiple of this many bytes (so that every span can be
#: viewed as its dtype); the padding bytes between spans are never hashed
SPAN_ALIGN = 16


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
    wide: List[torch.Tensor] = []
    where: List[List[int]] = []  # per span: its indices into wide (several for a span widened in pieces)
    group: List[Tuple[int, int, torch.dtype]] = []

    def flush() -> None:
        if group:
            start, dt = group[0][0], group[0][2]
            end = group[-1][0] + group[-1][1]
            as64 = snap[start:end].view(dt).to(torch.float64)
            sizes = []
            for i, (off, n, _) in enumerate(group):
                gap = group[i + 1][0] - (off + n) if i + 1 < len(group) else 0
                sizes += [n // dt.itemsize, gap // dt.itemsize]
            wide.extend(as64.split(sizes)[0::2])  # the spans, without the padding between them
            group.clear()

    count = 0
    for off, n, dt in spans:
        elems = n // dt.itemsize
        if elems > NORM_GROUP_ELEMENTS:
            flush()
            step = NORM_GROUP_ELEMENTS * dt.itemsize
            first = len(wide)
            for p in range(off, off + n, step):
                wide.append(snap[p:min(p + step, off + n)].view(dt).to(torch.float64))
            where.append(list(range(first, len(wide))))
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
        where.append([len(wide) + len(group) - 1])
    flush()
    norms = list(torch._foreach_norm(wide, 2)) if wide else []
    picked = [norms[ix[0]] if len(ix) == 1 else torch.linalg.vector_norm(torch.stack([norms[i] for i in ix]))
              for ix in where]
    if not picked:
        return torch.zeros(0, dtype=torch.float64, device=snap.device)
    return torch.stack(picked)


class StepResult(NamedTuple):
    """The digests of one submission: ``sha256`` ``{name: hex SHA-256 or "none"}``, and with ``norms=True``
    ``norms`` ``{name: float.hex of the float64 L2 norm, or "none"}`` (else empty)."""

    sha256: Dict[str, str]
    norms: Dict[str, str]


def _sha256_group(buf: memoryview, spans: Sequence[Tuple[int, int]]) -> List[str]:
    """SHA-256 of each ``(offset, nbytes)`` span of the host buffer ``buf``, in order. Each span is a slice of the
    one memoryview (no copy, and no Python object built per tensor beyond the slice), and ``hashlib`` hashes it
    with the GIL released, so the training thread keeps the GIL while the threads hash."""
    return [hashlib.sha256(buf[off:off + n]).hexdigest() for off, n in spans]


def hashing_groups(nbytes: Sequence[int], count: int) -> List[List[int]]:
    """The indices ``0..len(nbytes)-1`` in at most ``count`` groups of about equal bytes: largest first, each to the
    group with the fewest bytes so far (ties: the lower index), each group's indices ascending; empty groups left
    out. One hashing task per group, so that a step's tensors cost a few tasks (each taking the GIL to start and to
    finish) rather than one per tensor; each tensor's digest is its own whatever its group."""
    k = max(1, min(count, len(nbytes)))
    loads = [0] * k
    groups: List[List[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        j = min(range(k), key=lambda j: (loads[j], j))
        groups[j].append(i)
        loads[j] += nbytes[i]
    return [sorted(g) for g in groups if g]


def default_threads() -> int:
    """Hashing threads when not given: half the usable cores, at least 4 and at most 8 (SHA-256 of a 13M-parameter
    model's gradients and parameters is about 107 MB a step, which four threads may hash slower than a GPU trains)."""
    return max(4, min(8, usable_cores() // 2))


class _Slot:
    """One step in flight: the device snapshot, its host copy (pinned on CUDA), the copy's event."""

    def __init__(self) -> None:
        self.device_buf: Optional[torch.Tensor] = None
        self.host_buf: Optional[torch.Tensor] = None
        self.event = None
        self.future: Optional[Future] = None


class StepDigests:
    """Asynchronous SHA-256 digests of named tensors, one submission per step (see the module docstring).

    Args:
        device: the device the tensors live on (cpu or cuda).
        depth: how many submissions may be in flight at once (>= 1; the check submits two per step).
        threads: hashing threads (shared by the submissions in flight); default :func:`default_threads`.

    Use::

        digests = StepDigests(device)
        key = digests.submit({name: p.grad for name, p in model.named_parameters()})
        ...                                   # train on
        grads = digests.result(key).sha256    # {name: hex SHA-256, or "none" for a None tensor}
        digests.close()

    The digests equal :func:`ordered_ssd.digest.tensor_sha256` of each tensor at the time of :meth:`submit`
    (its bytes, contiguous); a ``None`` tensor gives ``"none"``. Raises ``TypeError`` for a value that is neither
    a tensor nor None, ``ValueError`` for a tensor on another device.
    """

    def __init__(self, device: torch.device, depth: int = 4, threads: Optional[int] = None):
        threads = default_threads() if threads is None else threads
        if depth < 1 or threads < 1:
            raise ValueError(f"depth, threads: expected >= 1, got {depth}, {threads}")
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._slots = [_Slot() for _ in range(depth)]
        self._next = 0
        # one coordinating thread per submission in flight, and the pool that hashes their tensors
        self._pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="ordered-ssd-digest")
        self._hashers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ordered-ssd-sha256")
        self._threads = threads
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._padding = torch.zeros(SPAN_ALIGN, dtype=torch.uint8, device=self.device)
        self._keys: Dict[int, Future] = {}
        self._count = 0
        #: seconds spent in :meth:`submit` (``"submit_s"``), of which waiting for the oldest submission's digests
        #: (``"wait_s"``: the hashing behind the training), and the number of submissions
        self.stats = {"submits": 0, "submit_s": 0.0, "wait_s": 0.0}

    def submit(self, tensors: Dict[str, Optional[torch.Tensor]], norms: bool = False) -> int:
        """Snapshot ``tensors`` (in stream order) and start hashing them (with ``norms``, also taking each floating
        tensor's L2 norm in float64: on CUDA on the device, :func:`device_norms`; on the CPU from the host copy, in
        the hashing threads); returns the key of :meth:`result`."""
        t_enter = time.perf_counter()
        names = list(tensors)
        views: List[torch.Tensor] = []
        layout: List[Tuple[str, int, int, Optional[torch.dtype]]] = []  # (name, offset, nbytes, dtype); -1: None
        offset = 0
        for name in names:
            t = tensors[name]
            if t is None:
                layout.append((name, -1, 0, None))
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"tensors[{name!r}]: expected a tensor or None, got {type(t).__name__}")
            if t.device != self.device and not (t.device.type == self.device.type == "cuda"
                                                 and self.device.index is None):
                raise ValueError(f"tensors[{name!r}]: expected a tensor on {self.device}, got {t.device}")
            b = t.detach().contiguous().reshape(-1).view(torch.uint8)
            pad = -offset % SPAN_ALIGN
            if pad:  # every span starts aligned (a view as its dtype); the padding is never hashed
                views.append(self._padding[:pad])
                offset += pad
            views.append(b)
            layout.append((name, offset, b.numel(), t.dtype))
            offset += b.numel()
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.future is not None:
            t_wait = time.perf_counter()
            slot.future.result()  # the oldest step in flight must be hashed before its buffers are reused
            self.stats["wait_s"] += time.perf_counter() - t_wait
        if slot.device_buf is None or slot.device_buf.numel() < offset:
            slot.device_buf = torch.empty(offset, dtype=torch.uint8, device=self.device)
            slot.host_buf = (torch.empty(offset, dtype=torch.uint8, pin_memory=True) if self._cuda
                             else slot.device_buf)
        if views:
            torch.cat(views, out=slot.device_buf[:offset])  # the snapshot, in the current stream's order
        norms_dev = host_norms = None
        floating = [(i, off, n, dt) for i, (_, off, n, dt) in enumerate(layout) if off >= 0 and dt.is_floating_point]
        if self._cuda and norms and floating:  # on the device, from the snapshot, in stream order
            snap = slot.device_buf
            norms_dev = device_norms(snap, [(off, n, dt) for _, off, n, dt in floating])
        if self._cuda:
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                slot.host_buf[:offset].copy_(slot.device_buf[:offset], non_blocking=True)
                if norms_dev is not None:
                    host_norms = torch.empty(norms_dev.shape, dtype=torch.float64, pin_memory=True)
                    host_norms.copy_(norms_dev, non_blocking=True)
                    norms_dev.record_stream(self._stream)
                slot.event = torch.cuda.Event()
                slot.event.record(self._stream)
            slot.device_buf.record_stream(self._stream)
        host, event = slot.host_buf, slot.event
        view = memoryview(host[:offset].numpy()) if offset else memoryview(b"")

        def host_norm(off: int, n: int, dtype) -> str:
            return float(host[off:off + n].view(dtype).double().norm()).hex()

        def work() -> StepResult:
            if event is not None:
                event.synchronize()
            spans = [(off, n) for _, off, n, _ in layout if off >= 0]
            tasks = [(group, self._hashers.submit(_sha256_group, view, [spans[i] for i in group]))
                     for group in hashing_groups([n for _, n in spans], self._threads)]
            if norms and not self._cuda:
                norm_tasks = [self._hashers.submit(host_norm, off, n, dt) for _, off, n, dt in floating]
            by_span: List[str] = [""] * len(spans)
            for group, task in tasks:
                for i, digest in zip(group, task.result()):
                    by_span[i] = digest
            hashes = iter(by_span)
            sha = {name: ("none" if off < 0 else next(hashes)) for name, off, _, _ in layout}
            if not norms:
                return StepResult(sha, {})
            values = ([float(v).hex() for v in host_norms.tolist()] if host_norms is not None
                      else [t.result() for t in norm_tasks] if not self._cuda else [])
            by_index = {i: v for (i, _, _, _), v in zip(floating, values)}
            return StepResult(sha, {name: by_index.get(i, "none") for i, (name, _, _, _) in enumerate(layout)})

        slot.future = self._pool.submit(work)
        key = self._count
        self._count += 1
        self._keys[key] = slot.future
        self.stats["submits"] += 1
        self.stats["submit_s"] += time.perf_counter() - t_enter
        return key

    def result(self, key: int) -> StepResult:
        """The digests of submission ``key`` (blocks until they are done); each key can be read once."""
        return self._keys.pop(key).result()

    def results(self, keys: Sequence[int]) -> List[StepResult]:
        return [self.result(k) for k in keys]

    def close(self) -> None:
        """Wait for everything in flight and stop the threads."""
        for f in list(self._keys.values()):
            f.result()
        self._pool.shutdown(wait=True)
        self._hashers.shutdown(wait=True)

    def __enter__(self) -> "StepDigests":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
