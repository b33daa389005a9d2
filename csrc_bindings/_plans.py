"""Launch plans: a launcher's launches replayed for a call like one seen before, without the launcher's Python.

A launcher (``launch_chunk_scan_fwd`` and the others decorated with :func:`planned`) checks its arguments, derives
the kernel's sizes, strides and flags, resolves its configuration, allocates its outputs and launches: tens of
microseconds of Python per call, about a quarter of a small layer step's host time (``docs/performance.md``,
"launch plans"). All of that is a function of the arguments' shapes, strides, dtypes and devices, the
non-tensor arguments and which arguments are the same tensor; only the data pointers differ between the steps of a
training run. :func:`planned` therefore keeps, per launcher and such a **signature**, what the launcher did the first
time (a **plan**): the buffers it allocated (shape, strides, dtype, device, zeroed or not), in order every launch
(kernel, grid, positional arguments with each tensor argument named as "input ``i``" or "buffer ``j``",
configuration) and every given buffer it zeroed (the work of upstream's autotuner pre-hooks), and what it returned.
A later call with the same signature allocates the same buffers, zeroes and launches in the same order through
:func:`csrc_bindings._resources.launch_fitting` (so through the compiled kernel kept by
:mod:`csrc_bindings._launch_cache`; from the second replay on CUDA straight through that kernel, whose key the
signature fixes: :func:`_keep_kernel`) and returns the same structure, with this call's tensors: the same kernels with
the same arguments as the launcher itself would launch, never a bit different (``tests/csrc_bindings/
test_plans.py`` compares the launches of both paths argument by argument; the layer digests on the GPU hold).

**A plan is kept only when the first call is fully accounted for**; otherwise that call's signature is launched by
the launcher every time (no plan):

* every tensor argument of every launch, every zeroed buffer and every returned tensor is one of the call's tensor
  arguments (the same object) or a buffer the launcher allocated through :func:`alloc`, :func:`alloc_like` or
  :func:`csrc_bindings._util.out_buffer` (a view, a copy such as ``.contiguous()`` of a strided input, or a tensor
  from any other torch call makes the call unplannable);
* every non-tensor argument of the call and of every launch is ``None``, a bool, int, float or str, a
  ``torch.dtype``, an object of a registered immutable type (:func:`bind`: ``KernelConfig``, Triton's ``tl.dtype``,
  the dtype of the dots) or a tuple of these (a dict ``config`` is not planned);
* no launch took upstream's autotuner (a key of rule ``native-autotune-v1`` still to be timed) and no CUDA graph was
  being captured (the configuration can differ there); such a call keeps nothing, and the next call of its
  signature is recorded again.

**The signature** of a call: per positional and keyword argument (in call order, keywords by name) its type and,
for a tensor, its shape, strides, dtype, device, whether its data pointer is 16-byte aligned (Triton specialises on
it) and the first argument that is the same tensor object; for another value the value itself (a float by its
bits); and ``_configs.NATIVE_TIMING`` (a test hook that changes the configuration a key resolves to).

**What a decorated launcher must not do** (checked by reading each one when it is decorated; the list is
:data:`PLANNED`): change a tensor in place other than through a launch or :func:`~csrc_bindings._util.out_buffer`'s
zeroing (e.g. call ``zero_`` itself), read a tensor's values or data pointer, or depend on state other than its
arguments and the configuration table (the configuration of a key changes only where ``native-autotune-v1`` keeps
or forgets a timed choice, and ``_configs.record_timed`` / ``forget_timed`` drop every plan there). The
causal-conv1d launchers (C++ calls) and the SwiGLU launchers (they return views) are not planned. The Mamba-3
launchers are planned under Triton's allocator (:func:`csrc_bindings.mamba3._runtime.planned_launcher`: a replay's
launches build their TMA descriptors as the launcher's own would).

The plans are shared by threads (a plan holds no tensor); the recording is per thread. :func:`disabled` holds for
the whole process: autograd runs a CUDA backward on a thread of its own, which a per-thread switch would miss.
"""
from __future__ import annotations

import contextlib
import functools
import struct
import threading
from typing import Callable, Optional

import torch

from . import _launch_cache

#: plans kept per launcher before its plans are emptied (a signature is a few hundred bytes)
MAX_PLANS = 1024

_Tensor = torch.Tensor
_SIMPLE = (type(None), bool, int, float, str, torch.dtype)
_local = threading.local()
_lock = threading.Lock()
_off = [0]  # how many disabled() blocks are open, in any thread
#: the launchers decorated with :func:`planned`, by ``module.qualname``
PLANNED: dict = {}


class _Recording:
    """What one launcher call did: its allocations (``id -> (index, tensor, zero)``) and, in order, its launches
    and the zeroing of given buffers (``steps``)."""

    __slots__ = ("allocs", "steps", "pending")

    def __init__(self):
        self.allocs: dict = {}
        self.steps: list = []
        self.pending = False


def _buffer(t: torch.Tensor, zero: bool) -> torch.Tensor:
    """``t``, just allocated by the launcher, kept in the call's plan as a buffer when one is being recorded."""
    rec = getattr(_local, "rec", None)
    if rec is not None:
        rec.allocs[id(t)] = (len(rec.allocs), t, zero)
    return t


def alloc(shape, dtype, device, *, zero: bool = False) -> torch.Tensor:
    """``torch.empty`` (``torch.zeros`` with ``zero``) of ``shape``, kept in the call's plan as a buffer."""
    return _buffer((torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device), zero)


def alloc_like(x: torch.Tensor, dtype=None) -> torch.Tensor:
    """``torch.empty_like(x, dtype=dtype)``, kept in the call's plan as a buffer."""
    return _buffer(torch.empty_like(x, dtype=dtype), False)


def note_zeroed(t: torch.Tensor) -> None:
    """Keep the zeroing of ``t`` (a buffer the caller gave, just zeroed by :func:`csrc_bindings._util.out_buffer`)
    in the call's plan, in its place among the launches."""
    rec = getattr(_local, "rec", None)
    if rec is not None:
        rec.steps.append(("zero", t))


def note_pending() -> None:
    """The call being recorded launches a key still to be timed by upstream's autotuner: it keeps no plan, and the
    next call of its signature is recorded again (the key's configuration is settled by then)."""
    rec = getattr(_local, "rec", None)
    if rec is not None:
        rec.pending = True


def note_launch(spec, grid: tuple, pos: tuple, cfg, ref: torch.Tensor, full: dict) -> None:
    """Keep one launch of :func:`csrc_bindings._native.launch` in the call's plan: ``grid`` resolved, ``pos`` the
    positional arguments, ``cfg`` the :class:`~csrc_bindings._configs.KernelConfig`, ``full`` the arguments by name
    (their non-tensor part is kept for :func:`~csrc_bindings._resources.layer_sizes`'s messages)."""
    rec = getattr(_local, "rec", None)
    if rec is None:
        return
    sizes = {k: v for k, v in full.items() if not isinstance(v, _Tensor)}
    rec.steps.append(("launch", spec, grid, pos, cfg.as_dict(), cfg.source == "explicit", ref,
                      (sizes, dict(cfg.meta))))


def _value_key(v):
    """A hashable stand-in for a non-tensor argument, or raises ``_Unplannable``. A float by its bits: ``-0.0`` and
    ``0.0`` are other signatures, and a NaN is its own."""
    if type(v) is float:
        return (float, _float_bits(v))
    if isinstance(v, _SIMPLE):
        return (type(v), v)
    if isinstance(v, tuple):
        return (tuple, tuple(_value_key(x) for x in v))
    if type(v) in _bound["value_types"]:  # KernelConfig, tl.dtype: immutable, hashable (registered)
        return (type(v), v)
    raise _Unplannable


_float_bits = struct.Struct("<d").pack


class _Unplannable(Exception):
    pass


def signature(values: tuple) -> Optional[tuple]:
    """The signature of a call whose arguments are ``values`` (positional, then keyword values; the keyword names
    are added by the caller), or None when a value cannot be planned."""
    key = []
    first: dict = {}
    try:
        for i, v in enumerate(values):
            if isinstance(v, _Tensor):
                key.append((v.shape, v.stride(), v.dtype, v.device, not v.data_ptr() & 15,
                            first.setdefault(id(v), i)))
            else:
                key.append(_value_key(v))
    except _Unplannable:
        return None
    return tuple(key)


class Plan:
    """What a launcher call did (see the module docstring): ``buffers`` ``[(shape, strides, dtype, device,
    zero)]``, ``steps`` in order, each ``("zero", source)`` (a given buffer zeroed) or ``("launch", spec, grid,
    template, slots, ref, cfg, explicit, sizes, kept)`` (``template`` the positional arguments with None where
    ``slots`` ``[(position, source)]`` put a tensor; a source is ``("in", i)`` or ``("buf", j)``; ``kept`` the
    compiled kernel, once a replay found it, :func:`_keep_kernel`), and ``result`` (the returned structure, tensors
    as sources)."""

    __slots__ = ("buffers", "steps", "result")

    def __init__(self, buffers, steps, result):
        self.buffers, self.steps, self.result = buffers, steps, result


def replay(plan: Plan, values: tuple):
    """Run ``plan`` for a call with arguments ``values``: allocate its buffers, zero and launch in its order (each
    launch through ``_resources.launch_fitting`` under the device guard of its reference tensor), and return its
    result structure with this call's tensors."""
    native, resources = _bound["native"], _bound["resources"]
    device_guard, kernel_jit = native.device_guard, native.kernel_jit
    launch_fitting, layer_sizes = resources.launch_fitting, resources.layer_sizes
    bufs = [torch.empty_strided(s, st, dtype=dt, device=dev).zero_() if zero else
            torch.empty_strided(s, st, dtype=dt, device=dev)
            for s, st, dt, dev, zero in plan.buffers] if plan.buffers else ()

    def get(src):
        return values[src[1]] if src[0] == "in" else bufs[src[1]]
    for step in plan.steps:
        if step[0] == "zero":
            get(step[1]).zero_()
            continue
        _, spec, grid, template, slots, ref, cfg, explicit, sizes, kept = step
        pos = list(template)
        for p, src in slots:
            pos[p] = get(src)
        pos = tuple(pos)
        r = get(ref)
        jit = kernel_jit(spec)
        if (kept[0] is not None and kept[1] == _launch_cache.generation[0] and kept[3] is jit
                and not getattr(jit, "pre_run_hooks", None) and not any(b.data_ptr() & 15 for b in bufs)):
            with device_guard(r):  # the kernel launch_fitting's kept path would run: no key to build again
                _launch_cache.run_compiled(kept[0], grid, pos, kept[2])
            continue
        with device_guard(r):
            launch_fitting(spec.name, jit, grid, pos, {}, cfg, r, explicit=explicit,
                           sizes=lambda sizes=sizes: layer_sizes(*sizes))
            if r.is_cuda:
                _keep_kernel(kept, jit, pos, cfg, r, explicit)
    return _rebuild(plan.result, get)


def _keep_kernel(kept: list, jit, pos: tuple, cfg: dict, ref: torch.Tensor, explicit: bool) -> None:
    """Keep in a plan's launch (``kept``: ``[kernel, launch-cache generation, device, jit]``) the compiled kernel that
    ``launch_fitting`` keeps for it (``csrc_bindings._launch_cache``), so that later replays run it directly.

    Its key is the same at every replay on CUDA: the signature fixes every argument's type and non-tensor value, the
    inputs' dtypes and alignment, and the buffers' dtypes; a fresh buffer of the caching allocator starts 512-byte
    aligned. Nothing is kept where ``launch_fitting`` would not run the kept kernel (none kept, or an explicit
    configuration whose kept kernel was fitted to fewer stages) or off CUDA."""
    warps, stages = int(cfg["num_warps"]), int(cfg["num_stages"])
    generation = _launch_cache.generation[0]  # before the lookup: a clear() in between must not be missed
    key = _launch_cache.cache_key(jit, ref, pos, warps, stages)
    compiled = _launch_cache.lookup(jit, key)
    if compiled is None or (explicit and int(compiled.metadata.num_stages) != stages):
        return
    kept[:] = [compiled, generation, key[0], jit]


def _rebuild(tmpl, get):
    kind = tmpl[0]
    if kind == "t":
        return get(tmpl[1])
    if kind == "c":
        return tmpl[1]
    if kind == "dict":
        return {k: _rebuild(t, get) for k, t in tmpl[1]}
    items = [_rebuild(t, get) for t in tmpl[1]]
    return tuple(items) if kind == "tuple" else items


def _template(obj, source):
    """The returned structure with tensors as sources (raises ``_Unplannable``): tensors, constants, and tuples,
    lists and dicts with string keys (in their order) of these."""
    if isinstance(obj, _Tensor):
        return ("t", source(obj))
    if isinstance(obj, (tuple, list)):
        return ("tuple" if isinstance(obj, tuple) else "list", [_template(x, source) for x in obj])
    if type(obj) is dict:
        if not all(type(k) is str for k in obj):
            raise _Unplannable
        return ("dict", [(k, _template(v, source)) for k, v in obj.items()])
    if isinstance(obj, _SIMPLE):
        return ("c", obj)
    raise _Unplannable


def _constant(v) -> bool:
    """Whether a non-tensor launch argument can be kept in a plan as it is: a value a signature can hold
    (:func:`_value_key`). The signature fixes it: the launcher derives it from the call's signature alone."""
    try:
        _value_key(v)
    except _Unplannable:
        return False
    return True


def _make_plan(rec: _Recording, values: tuple, result) -> Optional[Plan]:
    inputs = {}
    for i, v in enumerate(values):
        if isinstance(v, _Tensor):
            inputs.setdefault(id(v), i)
    used: dict = {}  # alloc index -> new buffer index (only the buffers a launch or the result uses)
    buffers = []

    def source(t):
        i = inputs.get(id(t))
        if i is not None and values[i] is t:
            return ("in", i)
        a = rec.allocs.get(id(t))
        if a is not None and a[1] is t:
            j = used.get(a[0])
            if j is None:
                j = used[a[0]] = len(buffers)
                buffers.append((tuple(t.shape), tuple(t.stride()), t.dtype, t.device, a[2]))
            return ("buf", j)
        raise _Unplannable
    try:
        steps = []
        for step in rec.steps:
            if step[0] == "zero":
                steps.append(("zero", source(step[1])))
                continue
            _, spec, grid, pos, cfg, explicit, ref, sizes = step
            template, slots = list(pos), []
            for p, v in enumerate(pos):
                if isinstance(v, _Tensor):
                    slots.append((p, source(v)))
                    template[p] = None
                elif not _constant(v):
                    raise _Unplannable
            steps.append(("launch", spec, tuple(grid), tuple(template), tuple(slots), source(ref), dict(cfg),
                          explicit, sizes, [None, -1, None, None]))
        result_tmpl = _template(result, source)
    except _Unplannable:
        return None
    return Plan(tuple(buffers), tuple(steps), result_tmpl)


_plans: dict = {}  # "module.qualname#n" per decorated launcher -> {signature: Plan or _UNPLANNABLE}
_UNPLANNABLE = object()


def planned(fn: Callable) -> Callable:
    """Decorate a launcher: calls with a signature seen before replay its :class:`Plan` (module docstring)."""
    qualified = f"{fn.__module__}.{fn.__qualname__}"
    with _lock:  # a table of its own per decorated function, also for two of the same name
        table = f"{qualified}#{len(_plans)}"
        plans = _plans[table] = {}
    PLANNED[qualified] = fn

    @functools.wraps(fn)
    def launcher(*args, **kwargs):
        if _off[0] or getattr(_local, "rec", None) is not None:  # off, or recording another launcher's call
            return fn(*args, **kwargs)
        values = args + tuple(kwargs.values()) if kwargs else args
        sig = signature(values)
        if sig is None:
            return fn(*args, **kwargs)
        key = (sig, tuple(kwargs), _configs_state()) if kwargs else (sig, _configs_state())
        plan = plans.get(key)
        if plan is not None:
            if plan is _UNPLANNABLE:
                return fn(*args, **kwargs)
            return replay(plan, values)
        rec = _local.rec = _Recording()
        try:
            result = fn(*args, **kwargs)
        finally:
            _local.rec = None
        if rec.pending or _off[0] or _capturing():  # the configuration is not settled yet (timed at this launch),
            return result  # a disabled() block opened meanwhile, or it can differ under a capture: record again
        made = _make_plan(rec, values, result)
        with _lock:
            if len(plans) >= MAX_PLANS:
                plans.clear()
            plans[key] = made if made is not None else _UNPLANNABLE
        return result
    return launcher


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # a CPU build of torch
        return False


def _configs_state():
    """What a launcher's configuration depends on besides its arguments and the constant tables (registered by
    ``_configs``: whether ``native-autotune-v1`` may time, ``_configs.NATIVE_TIMING``, a test hook)."""
    return _bound["configs_state"]()


#: what the modules that import this one register (this module imports none of them: no import cycle):
#: ``native`` (``_native``: ``device_guard``, ``kernel_jit``), ``resources`` (``_resources``: ``launch_fitting``,
#: ``layer_sizes``; read at each replay, so a wrapper set on the module is seen where a replay goes through
#: ``launch_fitting``), ``value_types`` (immutable, hashable non-tensor types a signature or a plan's launch may
#: hold by value: ``KernelConfig`` from ``_configs``, ``tl.dtype`` from ``_native`` when it loads triton),
#: ``configs_state``
_bound: dict = {"native": None, "resources": None, "value_types": frozenset(), "configs_state": lambda: None}


def bind(**kw) -> None:
    """Register what :data:`_bound` names (called once by ``_native`` and ``_configs`` at import)."""
    for k, v in kw.items():
        if k not in _bound:
            raise KeyError(k)
        _bound[k] = frozenset(_bound[k]) | frozenset(v) if k == "value_types" else v


@contextlib.contextmanager
def disabled():
    """Within, in every thread of the process (autograd's backward threads included): every planned launcher runs
    its own Python, no plan used or kept (tests and ``benchmarks/plans_host.py`` compare both paths); a call that
    another thread began before the block opened finishes as it began, but keeps no plan. Blocks nest and may
    overlap between threads: plans are used again once every open block has ended."""
    with _lock:
        _off[0] += 1
    try:
        yield
    finally:
        with _lock:
            _off[0] -= 1


def clear() -> None:
    """Forget every plan (the next call of each signature runs its launcher and records again)."""
    with _lock:
        for plans in _plans.values():
            plans.clear()


def stats() -> dict:
    """``{launcher name: (plans, unplannable signatures)}`` (what is kept now)."""
    with _lock:
        tables = [(t.split("#")[0].rsplit(".", 1)[1], list(p.values())) for t, p in _plans.items()]
    out: dict = {}
    for name, kept in tables:
        n, bad = out.get(name, (0, 0))
        out[name] = (n + sum(p is not _UNPLANNABLE for p in kept), bad + sum(p is _UNPLANNABLE for p in kept))
    return out
