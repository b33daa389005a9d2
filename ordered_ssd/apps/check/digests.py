"""SHA-256 digests of a training step's tensors, computed while the next steps train.

``ordered-ssd check`` hashes every gradient (and, in split-invariance runs, every parameter) after every step. Done
in line, that is a device-to-host copy and a SHA-256 of the whole model per step, with the device idle meanwhile.
:class:`StepDigests` takes the same digests off the training path without weakening them (every byte of every
tensor goes through SHA-256, exactly :func:`ordered_ssd.digest.tensor_sha256`):

1. :meth:`StepDigests.submit` snapshots the tensors' bytes into one flat device buffer (one copy on the device, in
   stream order: the optimizer step that follows cannot change what was snapshotted);
2. on CUDA a side stream copies the snapshot into pinned host memory (the copy engine, beside the next step's
   kernels) and records an event;
3. a thread pool waits for that event and hashes each tensor's bytes (``hashlib`` releases the GIL), while the
   training thread goes on.

At most ``depth`` steps are in flight (a further :meth:`submit` waits for the oldest); :meth:`StepDigests.result`
of a step blocks until its digests are done. Memory: ``depth`` snapshots of the submitted bytes on the device
and as many pinned host buffers (reused).
"""
from __future__ import annotations

import ctypes
import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

__all__ = ["StepDigests", "StepResult"]


class StepResult(NamedTuple):
    """The digests of one submission: ``sha256`` ``{name: hex SHA-256 or "none"}``, and with ``norms=True``
    ``norms`` ``{name: float.hex of the float64 L2 norm, or "none"}`` (else empty)."""

    sha256: Dict[str, str]
    norms: Dict[str, str]


def _sha256_at(ptr: int, nbytes: int) -> str:
    """SHA-256 of ``nbytes`` bytes at host address ``ptr`` (no copy)."""
    if nbytes == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256((ctypes.c_char * nbytes).from_address(ptr)).hexdigest()


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
        depth: how many submissions may be in flight at once (>= 1).
        threads: hashing threads.

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

    def __init__(self, device: torch.device, depth: int = 2, threads: int = 4):
        if depth < 1 or threads < 1:
            raise ValueError(f"depth, threads: expected >= 1, got {depth}, {threads}")
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._slots = [_Slot() for _ in range(depth)]
        self._next = 0
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ordered-ssd-digest")
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._keys: Dict[int, Future] = {}
        self._count = 0

    def submit(self, tensors: Dict[str, Optional[torch.Tensor]], norms: bool = False) -> int:
        """Snapshot ``tensors`` (in stream order) and start hashing them (with ``norms``, also taking each floating
        tensor's L2 norm in float64 from the host copy, in the hashing threads); returns the key of
        :meth:`result`."""
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
            views.append(b)
            layout.append((name, offset, b.numel(), t.dtype))
            offset += b.numel()
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.future is not None:
            slot.future.result()  # the oldest step in flight must be hashed before its buffers are reused
        if slot.device_buf is None or slot.device_buf.numel() < offset:
            slot.device_buf = torch.empty(offset, dtype=torch.uint8, device=self.device)
            slot.host_buf = (torch.empty(offset, dtype=torch.uint8, pin_memory=True) if self._cuda
                             else slot.device_buf)
        if views:
            torch.cat(views, out=slot.device_buf[:offset])  # the snapshot, in the current stream's order
        if self._cuda:
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                slot.host_buf[:offset].copy_(slot.device_buf[:offset], non_blocking=True)
                slot.event = torch.cuda.Event()
                slot.event.record(self._stream)
            slot.device_buf.record_stream(self._stream)
        host, event = slot.host_buf, slot.event
        base = host.data_ptr() if offset else 0

        def norm(off: int, n: int, dtype) -> str:
            if off < 0 or not dtype.is_floating_point:
                return "none"
            return float(host[off:off + n].view(dtype).double().norm()).hex()

        def work() -> StepResult:
            if event is not None:
                event.synchronize()
            sha = {name: ("none" if off < 0 else _sha256_at(base + off, n)) for name, off, n, _ in layout}
            return StepResult(sha, {name: norm(off, n, dt) for name, off, n, dt in layout} if norms else {})

        slot.future = self._pool.submit(work)
        key = self._count
        self._count += 1
        self._keys[key] = slot.future
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

    def __enter__(self) -> "StepDigests":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
