"""SHA-256 digests of a training step's tensors, computed while the next steps train.

``ordered-ssd check`` hashes every gradient (and every parameter) after every step. Done in line, that is a
device-to-host copy and a SHA-256 of the whole model per step, with the device idle meanwhile. :class:`StepDigests`
takes the same digests off the training path without weakening them (every byte of every tensor goes through
SHA-256, exactly :func:`ordered_ssd.digest.tensor_sha256`):

1. :meth:`StepDigests.submit` snapshots the tensors' bytes into one flat device buffer (one multi-tensor copy of
   bytes, ``torch._foreach_copy_``, in stream order: the optimizer step that follows cannot change what was
   snapshotted); where each tensor goes is worked out once per set of names, dtypes and shapes and kept
   (:data:`MAX_LAYOUTS` of them), so a step's submission costs the training thread a few calls into torch;
2. on CUDA a side stream copies the snapshot into page-locked host memory (the copy engine, beside the next step's
   kernels) and records an event;
3. a coordinating thread waits for that event (made blocking: the thread sleeps in the driver rather than spinning
   beside the training thread's launches) and has the bytes hashed, each tensor's span on its own, in at most
   ``threads`` tasks of about equal bytes (:func:`~ordered_ssd.apps.check.sha256_worker.hashing_groups`), while the
   training thread goes on.

Where the hashing runs (``hasher``): ``"process"`` (the default on POSIX systems), a hashing process
(:mod:`ordered_ssd.apps.check.sha256_worker`, standard library only) reading the host buffers through shared memory
(an anonymous shared file mapped in both processes; on CUDA registered with the driver as page-locked memory, else
copied to through a pinned staging buffer), asked for a submission's digests in one message; ``"threads"``, hashing
threads in this process. Both give the same digests. The threads cost the training thread its GIL: ``hashlib``
releases it while it hashes, but takes it back twice per tensor, and a training loop launching kernels from Python
holds it nearly all the time, so every hand-over stalls one of them; the process has its own GIL.

With ``norms=True`` each floating tensor's L2 norm in float64 is taken too: on CUDA on the device at :meth:`submit`
(:func:`device_norms`: the snapshot's tensors widened to float64 a group at a time and one ``torch._foreach_norm``,
in stream order, a few launches per submission, copied to the host with it), on the CPU from the host copy, in
threads of this process. Either way a device gives the same norm for the same bits in every run.

At most ``depth`` submissions are in flight (a further :meth:`submit` waits for the oldest);
:meth:`StepDigests.result` of a submission blocks until its digests are done. Memory: ``depth`` snapshots of the
largest submission on the device and as many host buffers (twice as many where CUDA refused to register them;
reused; a larger submission waits for everything in flight and replaces them, and the hashing process with them).
"""
from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from .launch import usable_cores
from .norms import SPAN_ALIGN, NormPlan, device_norms, norm_plan, planned_norms
from .sha256_worker import hashing_groups, sha256_spans

__all__ = ["StepDigests", "StepResult", "copy_event", "default_threads", "default_hasher", "hashing_groups",
           "device_norms", "SPAN_ALIGN"]

#: the most layouts (names, dtypes, shapes) a :class:`StepDigests` keeps; one more forgets them all
MAX_LAYOUTS = 16


class StepResult(NamedTuple):
    """The digests of one submission: ``sha256`` ``{name: hex SHA-256 or "none"}``, and with ``norms=True``
    ``norms`` ``{name: float.hex of the float64 L2 norm, or "none"}`` (else empty)."""

    sha256: Dict[str, str]
    norms: Dict[str, str]


def default_threads() -> int:
    """Hashing threads when not given: half the usable cores, at least 4 and at most 8 (SHA-256 of a 13M-parameter
    model's gradients and parameters is about 107 MB a step, which four threads may hash slower than a GPU trains)."""
    return max(4, min(8, usable_cores() // 2))


def default_hasher() -> str:
    """Where the hashing runs when not given: ``"process"`` where file descriptors can be handed to a child process
    (POSIX), else ``"threads"``."""
    return "process" if os.name == "posix" else "threads"


#: the hashing process's script, run by path (importing it imports neither torch nor ordered_ssd)
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sha256_worker.py")


def _shared_file(nbytes: int) -> int:
    """A file descriptor of an anonymous file of ``nbytes`` bytes that a child process can map: a memfd on Linux,
    else a temporary file unlinked at once (nothing is left behind whatever happens to the processes)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("ordered-ssd-digests")
    else:
        fd, path = tempfile.mkstemp(prefix="ordered-ssd-digests-")
        os.unlink(path)
    os.ftruncate(fd, nbytes)
    return fd


def _in_thread(index: int, call) -> int:
    """``call()`` (a CUDA runtime call returning its error code) in a thread of its own, on CUDA device ``index``,
    as an int (0: success). A failure leaves its error in that thread's CUDA runtime state, not in the training
    thread's, whose next kernel launch would report it."""
    done: List[int] = []

    def run() -> None:
        try:
            torch.cuda.set_device(index)
            done.append(int(call()))
        except Exception:  # noqa: BLE001 - reported as a failure code
            done.append(-1)

    t = threading.Thread(target=run, name="ordered-ssd-register")
    t.start()
    t.join()
    return done[0] if done else -1


def _unregister(ptr: int, index: int) -> None:
    _in_thread(index, lambda: torch.cuda.cudart().cudaHostUnregister(ptr))


class _HostBuffer:
    """A host buffer of ``nbytes`` bytes the hashing process can read: an anonymous shared file (:func:`_shared_file`)
    mapped here as ``tensor``. On CUDA it is registered with the driver as page-locked (portable) memory, so that the
    device copies into it asynchronously on the copy engine; where the driver refuses, the device copies into a
    pinned ``staging`` buffer instead (twice the host memory), and the bytes are copied on into the shared one before
    hashing. Unregistered by :meth:`release`, or when the buffer is garbage-collected (before the mapping goes)."""

    def __init__(self, nbytes: int, device: torch.device):
        self.fd = _shared_file(nbytes)
        self.registered = False
        self.staging = None
        self._finalizer = None
        try:
            self.tensor = torch.frombuffer(mmap.mmap(self.fd, nbytes), dtype=torch.uint8)  # keeps the mapping alive
            if device.type == "cuda":
                ptr = self.tensor.data_ptr()
                index = device.index if device.index is not None else torch.cuda.current_device()
                self.registered = _in_thread(index, lambda: torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 1)) == 0
                if self.registered:
                    self._finalizer = weakref.finalize(self, _unregister, ptr, index)
                else:
                    self.staging = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except BaseException:
            if self._finalizer is not None:
                self._finalizer()
            os.close(self.fd)
            raise

    def release(self) -> None:
        """Unregister and drop the buffer (nothing in flight may use it); the mapping goes with the last view."""
        if self._finalizer is not None:
            self._finalizer()  # once: cudaHostUnregister
            self.registered = False
        self.tensor = self.staging = None
        os.close(self.fd)


class _Hasher:
    """The hashing process (:mod:`~ordered_ssd.apps.check.sha256_worker`) over the host buffers' files ``fds``:
    :meth:`digests` asks for the SHA-256 of spans of one buffer, one request at a time."""

    def __init__(self, fds: Sequence[int], threads: int):
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", WORKER_SCRIPT, str(threads), *map(str, fds)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=tuple(fds),
                                         text=True, start_new_session=True)  # a Ctrl-C at the terminal: the training's
        except OSError as e:
            python = sys.executable or "(sys.executable is empty)"
            raise RuntimeError(f"could not start the SHA-256 hashing process ({python} -I {WORKER_SCRIPT}): {e}; "
                               f"StepDigests(hasher='threads') hashes in this process instead") from e
        self.lock = threading.Lock()

    def digests(self, index: int, spans_json: str, count: int) -> List[str]:
        """The hex SHA-256 of each of the ``count`` spans of buffer ``index`` that ``spans_json`` lists (a JSON list of
        ``[offset, nbytes]``), in order. Raises ``RuntimeError`` if the hashing process has exited."""
        with self.lock:
            try:
                self.proc.stdin.write(f"[{index}, {spans_json}]\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (BrokenPipeError, OSError, ValueError):
                line = ""
            if not line:
                raise RuntimeError(f"the SHA-256 hashing process (pid {self.proc.pid}) exited with code "
                                   f"{self.proc.poll()} before answering (its error, if any, is on stderr above)")
            digests = json.loads(line)
        if len(digests) != count:
            raise RuntimeError(f"the SHA-256 hashing process answered {len(digests)} digests for {count} spans")
        return digests

    def close(self) -> None:
        """End the process (end of its input) and wait for it (killed after 30 s)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class _Layout(NamedTuple):
    """Where a submission's tensors go in the snapshot, kept for every later submission of the same names, dtypes,
    shapes and contiguity: ``entries`` ``(name, offset, nbytes, dtype)`` in order (offset -1 for a None tensor),
    ``nbytes`` in all; ``copies`` ``(position, offset, nbytes, shape, direct)`` for each tensor with bytes to copy
    (its position among the values; ``shape`` that of its bytes as uint8: the tensor's own viewed as uint8 where
    ``direct`` (:func:`_direct`), else flat, from a contiguous copy); ``spans``
    ``(offset, nbytes)`` of the non-None tensors, hashed (``spans_json``: as the hashing process reads them);
    ``floating`` ``(index in entries, offset, nbytes, dtype)`` of the floating ones, and their :class:`NormPlan`."""

    entries: Tuple[Tuple[str, int, int, Optional[torch.dtype]], ...]
    nbytes: int
    copies: Tuple[Tuple[int, int, int, Tuple[int, ...], bool], ...]
    spans: Tuple[Tuple[int, int], ...]
    spans_json: str
    floating: Tuple[Tuple[int, int, int, torch.dtype], ...]
    norm_plan: NormPlan


def copy_event():
    """The CUDA event a submission's copy to the host records and its coordinating thread waits for: blocking
    (``cudaEventBlockingSync``), so that the waiting thread sleeps in ``synchronize()`` instead of busy-waiting in the
    driver beside the training thread's launches (``benchmarks/check_host_time.py`` compares the two)."""
    return torch.cuda.Event(blocking=True)


def _direct(t: torch.Tensor) -> bool:
    """Whether ``t.view(torch.uint8)`` gives ``t``'s bytes in their order: ``t`` contiguous, of at least one
    dimension, its last of stride 1 (a contiguous tensor may have any stride along a dimension of size 1, which
    ``view`` to a narrower dtype refuses). Any other tensor is copied to a contiguous one first."""
    return t.dim() > 0 and t.is_contiguous() and t.stride(-1) == 1


def _check_value(name: str, t) -> None:
    """A submitted value must be a tensor or None: ``TypeError`` naming it otherwise."""
    if t is not None and not isinstance(t, torch.Tensor):
        raise TypeError(f"tensors[{name!r}]: expected a tensor or None, got {type(t).__name__}")


def _byte_sources(values: Sequence[Tuple[str, Optional[torch.Tensor]]], layout: _Layout) -> List[torch.Tensor]:
    """The bytes of each tensor of ``layout.copies`` (of the ``(name, tensor)`` values it was made for), shaped as
    its target view of the snapshot: the tensor viewed as uint8 where direct, else a contiguous flat copy."""
    return [values[i][1].view(torch.uint8) if direct else
            values[i][1].clone(memory_format=torch.contiguous_format).view(-1).view(torch.uint8)
            for i, _, _, _, direct in layout.copies]


def _layout(values: Sequence[Tuple[str, Optional[torch.Tensor]]]) -> _Layout:
    """The :class:`_Layout` of the ``(name, tensor or None)`` values: each tensor's bytes at the next multiple of
    :data:`SPAN_ALIGN` (so that every span can be viewed as its dtype; the padding is never hashed)."""
    entries, copies, offset = [], [], 0
    for position, (name, t) in enumerate(values):
        if t is None:
            entries.append((name, -1, 0, None))
            continue
        offset += -offset % SPAN_ALIGN
        n = t.numel() * t.element_size()
        direct = _direct(t)
        shape = (*t.shape[:-1], t.shape[-1] * t.element_size()) if direct else (n,)
        if n:
            copies.append((position, offset, n, tuple(shape), direct))
        entries.append((name, offset, n, t.dtype))
        offset += n
    spans = tuple((off, n) for _, off, n, _ in entries if off >= 0)
    floating = tuple((i, off, n, dt) for i, (_, off, n, dt) in enumerate(entries)
                     if off >= 0 and dt.is_floating_point)
    return _Layout(tuple(entries), offset, tuple(copies), spans, json.dumps(spans), floating,
                   norm_plan([(off, n, dt) for _, off, n, dt in floating]))


class _Slot:
    """One submission in flight: its device snapshot, host buffer and the hashing's future; the views of its
    snapshot each layout copies into (by layout key), its event and pinned norms buffer (CUDA)."""

    def __init__(self) -> None:
        self.device_buf: Optional[torch.Tensor] = None
        self.host: Optional[_HostBuffer] = None  # the process hasher's shared buffer
        self.host_buf: Optional[torch.Tensor] = None  # where the device copies to (pinned on CUDA)
        self.future: Optional[Future] = None
        self.targets: Dict[tuple, List[torch.Tensor]] = {}
        self.event = None
        self.host_norms: Optional[torch.Tensor] = None


class StepDigests:
    """Asynchronous SHA-256 digests of named tensors, one submission per step (see the module docstring).

    Args:
        device: the device the tensors live on (cpu or cuda).
        depth: how many submissions may be in flight at once (>= 1; the check submits two per step).
        threads: hashing threads (shared by the submissions in flight); default :func:`default_threads`.
        hasher: ``"process"`` (a hashing process reading shared memory) or ``"threads"`` (threads of this
            process); default :func:`default_hasher`. The digests are the same.

    Use::

        digests = StepDigests(device)
        key = digests.submit({name: p.grad for name, p in model.named_parameters()})
        ...                                   # train on
        grads = digests.result(key).sha256    # {name: hex SHA-256, or "none" for a None tensor}
        digests.close()

    The digests equal :func:`ordered_ssd.digest.tensor_sha256` of each tensor at the time of :meth:`submit`
    (its bytes, contiguous); a ``None`` tensor gives ``"none"``. Raises ``TypeError`` for a value that is neither
    a tensor nor None, ``ValueError`` for a tensor on another device or a bad argument, ``RuntimeError`` for a
    submission after :meth:`close`; :meth:`result` of a submission the hashing process did not answer (it died)
    raises ``RuntimeError``, and so may :meth:`close`.
    """

    def __init__(self, device: torch.device, depth: int = 4, threads: Optional[int] = None,
                 hasher: Optional[str] = None):
        threads = default_threads() if threads is None else threads
        hasher = default_hasher() if hasher is None else hasher
        if depth < 1 or threads < 1:
            raise ValueError(f"depth, threads: expected >= 1, got {depth}, {threads}")
        if hasher not in ("process", "threads"):
            raise ValueError(f"hasher: expected 'process' or 'threads', got {hasher!r}")
        self.device = torch.device(device)
        self.hasher = hasher
        self._cuda = self.device.type == "cuda"
        self._slots = [_Slot() for _ in range(depth)]
        self._next = 0
        self._capacity = -1  # bytes of each slot's buffers (allocated at the first submission, grown with them)
        # one coordinating thread per submission in flight, and the threads that hash (threads) or take the CPU norms
        self._pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="ordered-ssd-digest")
        self._hashers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ordered-ssd-sha256")
        self._threads = threads
        self._worker: Optional[_Hasher] = None
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._layouts: Dict[tuple, _Layout] = {}
        self._keys: Dict[int, Tuple[Future, _Layout]] = {}
        self._count = 0
        self._closed = False
        #: seconds spent in :meth:`submit` (``"submit_s"``), of which waiting for the oldest submission's digests
        #: (``"wait_s"``: the hashing behind the training), and the number of submissions
        self.stats = {"submits": 0, "submit_s": 0.0, "wait_s": 0.0}

    def _release(self) -> None:
        """Wait for everything in flight (its errors are left to :meth:`result`), then drop every slot's buffers and
        end the hashing process."""
        futures.wait([slot.future for slot in self._slots if slot.future is not None])
        for slot in self._slots:
            slot.future = None
            if slot.host is not None:
                slot.host.release()
            slot.device_buf = slot.host_buf = slot.host = None
            slot.targets.clear()
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        self._capacity = -1

    def _allocate(self, nbytes: int) -> None:
        """Every slot's buffers of ``nbytes`` bytes (after :meth:`_release`), and the hashing process over them."""
        self._release()
        for slot in self._slots:
            if self.hasher == "process":
                slot.host = _HostBuffer(nbytes, self.device)
                slot.host_buf = slot.host.staging if slot.host.staging is not None else slot.host.tensor
            else:
                slot.host_buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._cuda)
            # on the CPU the snapshot is taken straight into the host buffer (the shared one for the process); the
            # padding between spans is never written, hashed or normed
            slot.device_buf = (torch.empty(nbytes, dtype=torch.uint8, device=self.device) if self._cuda
                               else slot.host_buf)
        if self.hasher == "process":
            self._worker = _Hasher([slot.host.fd for slot in self._slots], self._threads)
        self._capacity = nbytes

    def reserve(self, tensors: Dict[str, Optional[torch.Tensor]]) -> None:
        """Allocate the buffers for submissions of tensors like ``tensors`` (their names, dtypes and shapes; on any
        device, ``meta`` included: nothing is read) and start the hashing process now, rather than at the first
        :meth:`submit`: the registration of the host buffers with the driver and the process's start are then out
        of a timed loop. A larger submission later still replaces them. Raises ``TypeError`` for a value that is
        neither a tensor nor None, ``RuntimeError`` after :meth:`close`."""
        if self._closed:
            raise RuntimeError("StepDigests: reserve after close()")
        for name, t in tensors.items():
            _check_value(name, t)
        nbytes = _layout(list(tensors.items())).nbytes
        if nbytes > self._capacity:
            self._allocate(max(nbytes, SPAN_ALIGN))

    def submit(self, tensors: Dict[str, Optional[torch.Tensor]], norms: bool = False) -> int:
        """Snapshot ``tensors`` (in stream order) and start hashing them (with ``norms``, also taking each floating
        tensor's L2 norm in float64: on CUDA on the device, :func:`device_norms`; on the CPU from the host copy, in
        threads of this process); returns the key of :meth:`result`."""
        t_enter = time.perf_counter()
        if self._closed:
            raise RuntimeError("StepDigests: submit after close()")
        values = list(tensors.items())
        shapes = []  # the layout's key
        for name, t in values:
            if t is None:
                shapes.append((name,))
                continue
            _check_value(name, t)
            if t.device != self.device and not (t.device.type == self.device.type == "cuda"
                                                 and self.device.index is None):
                raise ValueError(f"tensors[{name!r}]: expected a tensor on {self.device}, got {t.device}")
            shapes.append((name, t.dtype, t.shape, _direct(t)))
        shapes = tuple(shapes)
        layout = self._layouts.get(shapes)
        if layout is None:
            if len(self._layouts) >= MAX_LAYOUTS:
                self._layouts.clear()
                for other in self._slots:
                    other.targets.clear()
            layout = self._layouts[shapes] = _layout(values)
        offset = layout.nbytes
        if offset > self._capacity:  # the first submission, or a larger one: new buffers (waits for those in flight)
            t_wait = time.perf_counter()
            self._allocate(max(offset, SPAN_ALIGN))
            self.stats["wait_s"] += time.perf_counter() - t_wait
        index = self._next
        slot = self._slots[index]
        self._next = (self._next + 1) % len(self._slots)
        if slot.future is not None:  # the oldest step in flight must be hashed before its buffers are reused
            t_wait = time.perf_counter()
            futures.wait([slot.future])  # (its error, if any, is left to its result())
            self.stats["wait_s"] += time.perf_counter() - t_wait
        targets = slot.targets.get(shapes)
        if targets is None:
            targets = slot.targets[shapes] = [slot.device_buf[off:off + n].view(shape)
                                           for _, off, n, shape, _ in layout.copies]
        if layout.copies:
            with torch.no_grad():  # the snapshot, in the current stream's order: one multi-tensor copy of bytes
                torch._foreach_copy_(targets, _byte_sources(values, layout))
        floating = layout.floating
        norms_dev = host_norms = None
        if self._cuda and norms and floating:  # on the device, from the snapshot, in stream order
            norms_dev = planned_norms(slot.device_buf, layout.norm_plan)
        event = None
        if self._cuda:
            # what can fail is made before the copy that writes into the host buffer
            if slot.event is None:
                slot.event = copy_event()
            event = slot.event
            if norms_dev is not None:
                if slot.host_norms is None or slot.host_norms.numel() < len(floating):
                    slot.host_norms = torch.empty(len(floating), dtype=torch.float64, pin_memory=True)
                host_norms = slot.host_norms[:len(floating)]
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)
            try:
                with torch.cuda.stream(self._stream):
                    slot.host_buf[:offset].copy_(slot.device_buf[:offset], non_blocking=True)
                    if norms_dev is not None:
                        host_norms.copy_(norms_dev, non_blocking=True)
                        norms_dev.record_stream(self._stream)
                    event.record(self._stream)
                slot.device_buf.record_stream(self._stream)
            except BaseException:
                self._stream.synchronize()  # no copy may still write into a buffer that close() may then free
                raise
        host = slot.host.tensor if slot.host is not None else slot.host_buf  # the bytes hashed
        staging = slot.host.staging if slot.host is not None else None
        worker = self._worker
        spans = layout.spans

        def host_norm(off: int, n: int, dtype) -> float:
            return float(host[off:off + n].view(dtype).double().norm())

        def work() -> Tuple[List[str], Optional[List[float]]]:
            # the least Python here (this thread takes the GIL from the training thread): the digests and norms as
            # they come, made into a StepResult by result()
            if event is not None:
                event.synchronize()
            if staging is not None and offset:  # the driver refused to register the shared buffer
                host[:offset].numpy()[:] = staging[:offset].numpy()
            if norms and not self._cuda:
                norm_tasks = [self._hashers.submit(host_norm, off, n, dt) for _, off, n, dt in floating]
            if worker is not None:
                by_span = worker.digests(index, layout.spans_json, len(spans))
            else:
                view = memoryview(host[:offset].numpy()) if offset else memoryview(b"")
                by_span = sha256_spans(self._hashers, self._threads, view, spans)
            if not norms:
                return by_span, None
            # the pinned norms are read now: the slot's next submission writes over them
            return by_span, (host_norms.tolist() if host_norms is not None
                             else [t.result() for t in norm_tasks] if not self._cuda else [])

        slot.future = self._pool.submit(work)
        key = self._count
        self._count += 1
        self._keys[key] = (slot.future, layout)
        self.stats["submits"] += 1
        self.stats["submit_s"] += time.perf_counter() - t_enter
        return key

    def result(self, key: int) -> StepResult:
        """The digests of submission ``key`` (blocks until they are done); each key can be read once."""
        future, layout = self._keys.pop(key)
        by_span, values = future.result()
        hashes = iter(by_span)
        sha = {name: ("none" if off < 0 else next(hashes)) for name, off, _, _ in layout.entries}
        if values is None:
            return StepResult(sha, {})
        by_index = {i: float(v).hex() for (i, _, _, _), v in zip(layout.floating, values)}
        return StepResult(sha, {name: by_index.get(i, "none") for i, (name, _, _, _) in enumerate(layout.entries)})

    def results(self, keys: Sequence[int]) -> List[StepResult]:
        return [self.result(k) for k in keys]

    def close(self) -> None:
        """Wait for everything in flight, stop the threads and the hashing process, and free the buffers."""
        self._closed = True
        try:
            for f, _ in list(self._keys.values()):
                f.result()
        finally:
            try:
                self._release()
            finally:
                self._pool.shutdown(wait=True)
                self._hashers.shutdown(wait=True)

    def __enter__(self) -> "StepDigests":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
