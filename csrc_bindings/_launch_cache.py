"""Launch a compiled Triton kernel again without Triton's per-launch Python: the compiled kernel cached per
(kernel, device, configuration, arguments).

``jit[grid](*args)`` (``JITFunction.run``) binds and specialises every argument, builds and hashes a cache key from
the specialisation and the options, reads the runtime knobs, checks the kernel's globals and only then calls the
compiled kernel's launcher: tens of microseconds of Python per launch, about a quarter of a small layer step's host
time (``docs/performance.md``, "Where the time goes"). A training step launches the same kernels with the same
arguments, but for the data pointers, at every step. :func:`launch` therefore keeps, per JIT function, the
``CompiledKernel`` that Triton's own path returned for an argument key, and launches it directly the next time the key
comes (``CompiledKernel.run``, the call ``JITFunction.run`` ends with, with the same launch metadata and launch
enter/exit hooks, on the current stream of the current device).

**The key** is finer than Triton's specialisation, so a cached kernel is always the one Triton would have chosen:

* every argument's type; per tensor argument its dtype and whether its data pointer is 16-byte aligned (Triton
  specialises on both);
* every other argument's exact value (Triton specialises integers on ``== 1``, divisibility by 16 and the 32-bit
  range, and constexprs on their value: all functions of the value);
* the current device index (Triton's kernel cache is per current device), ``num_warps`` and ``num_stages``.

A miss (the first launch of a shape) goes through ``jit[grid]`` as before; the returned kernel is kept. Nothing is
cached off CUDA, under Triton's interpreter, for an argument that cannot be hashed, for arguments that do not cover
the kernel's signature exactly (defaults left to Triton), or for a kernel with ``pre_run_hooks``: those launches
take ``jit[grid]`` every time. The cache holds at most :data:`MAX_ENTRIES` keys per
kernel and is emptied when full (a key is a few hundred bytes; the compiled kernels stay in Triton's own cache).
What runs on the GPU is the same compiled kernel with the same arguments either way: the cache changes host time,
never a bit (``tests/gpu/csrc_bindings/test_launch_cache.py`` compares both paths bit for bit).

Not seen by a cached launch: ``TRITON_DEBUG``, ``knobs.compilation.instrumentation_mode`` or the JIT function's
``debug`` changed after the first launch of a key, and a kernel's global variable changed after compiling (Triton
raises for that; upstream's kernels have none that change).
"""
from __future__ import annotations

import operator
import threading

import torch

#: keys kept per JIT function before its cache is emptied
MAX_ENTRIES = 4096

_lock = threading.Lock()
_caches: dict = {}  # id(jit) -> (jit, {key: CompiledKernel})
_Tensor = torch.Tensor
_JIT = None  # triton.runtime.jit.JITFunction, imported at the first CUDA launch


_knobs = None  # triton.knobs, likewise


class _NoTriton:
    """Stands for ``JITFunction`` where triton cannot be imported: nothing is an instance, nothing is cached."""


def _jit_class():
    global _JIT, _knobs
    if _JIT is None:
        try:
            from triton import knobs
            from triton.runtime.jit import JITFunction
        except ImportError:  # a stand-in JIT function (tests) off a triton install: launched, never cached
            return _NoTriton
        _JIT, _knobs = JITFunction, knobs
    return _JIT


def argument_key(args) -> tuple:
    """The part of the cache key that comes from the arguments: ``(types, values, tensors)``, where ``types`` is
    the type of every argument, ``values`` every non-tensor argument (in order) and ``tensors`` ``(dtype,
    aligned)`` per tensor argument (``aligned``: data pointer divisible by 16). The same information as a
    ``(dtype, aligned)`` or ``(type, value)`` pair per argument, gathered with one C-level ``itemgetter`` per kind
    (a plan kept per ``types``) instead of a Python test per argument: about half the host time."""
    types = tuple(map(type, args))
    plan = _plans.get(types)
    if plan is None:
        plan = _plan(types)
    tensors, values = plan
    return types, values(args), tuple([(t.dtype, not t.data_ptr() & 15) for t in tensors(args)])


_plans: dict = {}  # argument types -> (tensor getter, value getter); one per launch site and optional-argument mix


def _getter(idx: list):
    if not idx:
        return lambda a: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda a: (a[i],)
    return operator.itemgetter(*idx)


def _plan(types: tuple):
    """``(tensor getter, value getter)`` for arguments of these types (kept; emptied past :data:`MAX_ENTRIES`)."""
    tensors = [i for i, t in enumerate(types) if issubclass(t, _Tensor)]
    values = [i for i, t in enumerate(types) if not issubclass(t, _Tensor)]
    plan = (_getter(tensors), _getter(values))
    with _lock:
        if len(_plans) >= MAX_ENTRIES:
            _plans.clear()
        _plans[types] = plan
    return plan


def _cache_of(jit) -> dict:
    entry = _caches.get(id(jit))
    if entry is None or entry[0] is not jit:
        with _lock:
            entry = _caches.get(id(jit))
            if entry is None or entry[0] is not jit:
                entry = _caches[id(jit)] = (jit, {})
    return entry[1]


def cache_key(jit, ref: torch.Tensor, args: tuple, num_warps: int, num_stages):
    """The key of a launch of ``jit`` with positional ``args`` (every argument of the kernel, constexprs included,
    in its order) on the current device (``ref``: a tensor of the launch; the callers launch under its device
    guard); None when such a launch is not cached (``ref`` off CUDA, Triton's interpreter, a kernel with
    ``pre_run_hooks``, an argument that cannot be hashed)."""
    if not ref.is_cuda or not isinstance(jit, _jit_class()) or jit.pre_run_hooks:
        return None
    key = (torch._C._cuda_getDevice(), num_warps, num_stages, argument_key(args))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def lookup(jit, key):
    """The compiled kernel kept for ``key`` (from :func:`cache_key`), or None."""
    return None if key is None else _cache_of(jit).get(key)


def keep(jit, key, compiled) -> None:
    """Keep ``compiled`` (what ``jit[grid](...)`` returned) for ``key``; nothing for a None key, a None result (a
    user's compile hook skipped the compile) or a future (defensive: Triton 3.6's launch path waits for it)."""
    if key is None or compiled is None or hasattr(compiled, "result"):
        return
    cache = _cache_of(jit)
    with _lock:
        if len(cache) >= MAX_ENTRIES:
            cache.clear()
        cache[key] = compiled


def run_compiled(compiled, grid, args: tuple, device: int) -> None:
    """Launch ``compiled`` on ``grid`` (1 to 3 ints) with positional ``args`` on the current stream of ``device``,
    exactly as ``JITFunction.run`` ends (launch metadata, enter and exit hooks)."""
    runtime = _knobs.runtime  # set by _jit_class, which made the key of any kept kernel
    stream = torch._C._cuda_getCurrentRawStream(device)
    n = len(grid)
    metadata = compiled.launch_metadata(grid, stream, *args)
    compiled.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, compiled.function,
                 compiled.packed_metadata, metadata, runtime.launch_enter_hook, runtime.launch_exit_hook, *args)


def positional(jit, args: tuple, kwargs: dict):
    """``args`` followed by ``kwargs`` in ``jit.arg_names`` order (every name after the positional ones must be in
    ``kwargs``, and nothing else); None when they do not cover the signature exactly (such a launch is not cached)."""
    arg_names = getattr(jit, "arg_names", None)
    if arg_names is None:  # not a JIT function: never cached
        return None
    if not kwargs:
        return tuple(args) if len(args) == len(arg_names) else None
    names = arg_names[len(args):]
    if len(names) != len(kwargs):
        return None
    try:
        return tuple(args) + tuple(kwargs[n] for n in names)
    except KeyError:
        return None


def find(jit, args: tuple, kwargs: dict, ref: torch.Tensor, num_warps: int, num_stages):
    """``(positional args, key, kept kernel)`` of a launch of ``jit``: the arguments in signature order
    (:func:`positional`), its :func:`cache_key` and the kernel kept for it; ``(None, None, None)`` for a launch
    that is not cached (``ref`` off CUDA, arguments short of the signature, ...), ``(pos, key, None)`` for a key
    not launched yet."""
    pos = positional(jit, args, kwargs) if ref.is_cuda else None
    key = None if pos is None else cache_key(jit, ref, pos, num_warps, num_stages)
    return pos, key, lookup(jit, key)


def launch(jit, grid, args: tuple, kwargs: dict, ref: torch.Tensor, *, num_warps: int, num_stages=None):
    """``jit[grid](*args, **kwargs, num_warps=num_warps)`` (and ``num_stages=`` unless None: Triton's default),
    through the compiled kernel kept for this launch's key when there is one (the same kernel, arguments and
    stream). Returns the compiled kernel (None where Triton returns none)."""
    pos, key, compiled = find(jit, args, kwargs, ref, num_warps, num_stages)
    if compiled is not None:
        run_compiled(compiled, grid, pos, key[0])
        return compiled
    options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    compiled = jit[grid](*args, **kwargs, **options)
    keep(jit, key, compiled)
    return compiled


#: bumped by :func:`clear` (a launcher's plan, ``csrc_bindings._plans``, holds a kept kernel for its generation)
generation = [0]


def clear() -> None:
    """Forget every kept kernel (the next launch of each key takes Triton's own path; launch plans forget theirs)."""
    with _lock:
        _caches.clear()
        generation[0] += 1
