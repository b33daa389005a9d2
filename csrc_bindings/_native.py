"""Lazy access to the native kernels, with the version and signature check.

Nothing here imports triton, mamba-ssm or causal-conv1d at import time. The first launcher call runs
:func:`native` (triton and mamba-ssm) or :func:`native_conv` (causal-conv1d's C++ extension); each imports the
extension and checks the installed version against the supported one. Each kernel is then checked against its
:class:`~csrc_bindings._spec.KernelSpec` (argument names and autotune key, or a C++ op's number of arguments) before
its first launch (:func:`kernel_jit`, :func:`conv_op`); ``csrc_bindings.check_native()`` checks every kernel at once.
The results are cached for the life of the process; the check never touches the native modules' state (it only
reads ``__version__``, ``arg_names``, ``keys`` and docstrings).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import operator
import re
import sys
import threading
from types import SimpleNamespace

import torch

from . import _plans, _resources
from ._resources import launch_fitting, layer_sizes
from ._spec import TIMING_PENDING, key_of

#: Versions the launchers were written and tested against (exact match required).
SUPPORTED_VERSIONS = {"mamba_ssm": "2.3.2.post1", "causal_conv1d": "1.7.0"}
#: The install command of the native extras (mamba-ssm needs torch at build time, hence no build isolation; a
#: CUDA build of torch must be installed first; README, "Install", "GPU").
INSTALL_HINT = ("pip install --no-build-isolation mamba-ssm==" + SUPPORTED_VERSIONS["mamba_ssm"] + " causal-conv1d=="
                + SUPPORTED_VERSIONS["causal_conv1d"])

_lock = threading.Lock()
_state: dict = {}


def installed_version(dist: str) -> str | None:
    """Installed version of distribution ``dist`` from package metadata, without importing it (None if absent)."""
    for name in (dist, dist.replace("_", "-")):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _version_error(dist: str, installed: str | None) -> str:
    return (f"csrc_bindings supports {dist}=={SUPPORTED_VERSIONS[dist]} only, but {dist}=={installed} is installed. "
            f"Install the supported versions with `{INSTALL_HINT}` (after a CUDA build of torch).")


def _check_version(dist: str, module) -> str:
    installed = installed_version(dist) or getattr(module, "__version__", None)
    if installed != SUPPORTED_VERSIONS[dist]:
        raise RuntimeError(_version_error(dist, installed))
    return installed


def _import_extra(modname: str, what: str):
    try:
        return importlib.import_module(modname)
    except ImportError as exc:
        raise ImportError(f"csrc_bindings needs {what} (module {modname!r} could not be imported: {exc}). "
                          f"Install the CUDA extras with `{INSTALL_HINT}`.") from exc


def unwrap_jit(kernel):
    """Return the JIT function under ``@triton.autotune`` / ``@triton.heuristics`` wrappers (reads ``.fn`` only)."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    obj = kernel
    while isinstance(obj, (Autotuner, Heuristics)):
        obj = obj.fn
    return obj


def _load_triton():
    triton = _import_extra("triton", "triton")
    tl = _import_extra("triton.language", "triton")
    mamba_ssm = _import_extra("mamba_ssm", "mamba-ssm")
    mamba_version = _check_version("mamba_ssm", mamba_ssm)
    from packaging import version as _v  # a dependency of triton and mamba-ssm
    _plans.bind(value_types=(type(tl.bfloat16),))  # launch plans keep the dots' dtype (tl.dtype) as it is
    return SimpleNamespace(
        triton=triton, tl=tl, kernels={}, jit={},  # filled by kernel_jit, one checked kernel at a time
        versions={"mamba_ssm": mamba_version, "triton": triton.__version__},
        triton_22=_v.parse(triton.__version__) >= _v.parse("2.2.0"),
    )


def _changed(ns, what: str) -> RuntimeError:
    return RuntimeError(f"mamba-ssm {ns.versions['mamba_ssm']}: {what} csrc_bindings supports mamba-ssm=="
                        f"{SUPPORTED_VERSIONS['mamba_ssm']} (`{INSTALL_HINT}`).")


def _check_triton_kernel(ns, spec):
    module = _import_extra(spec.module, "mamba-ssm")
    kernel = getattr(module, spec.attr, None)
    if kernel is None:
        raise _changed(ns, f"kernel {spec.module}.{spec.attr} not found;")
    jit = unwrap_jit(kernel)
    got = tuple(getattr(jit, "arg_names", ()))
    if got != spec.arg_names:
        raise _changed(ns, f"kernel {spec.attr} has arguments {list(got)}, but the launcher passes "
                           f"{list(spec.arg_names)}.")
    if spec.autotune_key is not None:
        keys = tuple(getattr(kernel, "keys", ()))
        if keys != spec.autotune_key:
            raise _changed(ns, f"kernel {spec.attr} is autotuned on {list(keys)}, the pinned table is keyed on "
                               f"{list(spec.autotune_key)}.")
    return kernel, jit


def _arity(fn) -> int:
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    m = re.match(r"^\s*\w+\((.*)\)\s*->", doc[0]) if doc else None
    if m is None:
        raise ValueError("no pybind signature")
    depth, count, body = 0, 0, m.group(1).strip()
    if not body:
        return 0
    for ch in body:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            count += 1
    return count + 1


def _load_conv():
    causal_conv1d = _import_extra("causal_conv1d", "causal-conv1d")
    conv_version = _check_version("causal_conv1d", causal_conv1d)
    ext = _import_extra("causal_conv1d_cuda", "causal-conv1d")
    return SimpleNamespace(ext=ext, ops={}, versions={"causal_conv1d": conv_version})  # ops: filled by conv_op


def _check_conv_op(ns, spec):
    fn = getattr(ns.ext, spec.attr, None)
    try:
        got = _arity(fn) if fn is not None else None
    except ValueError:
        got = "unreadable"
    if got != spec.arity:
        raise RuntimeError(
            f"causal-conv1d {ns.versions['causal_conv1d']}: causal_conv1d_cuda.{spec.attr} takes {got} arguments, "
            f"the launcher passes {spec.arity}. csrc_bindings supports causal-conv1d=="
            f"{SUPPORTED_VERSIONS['causal_conv1d']} (`{INSTALL_HINT}`).")
    return fn


def _load_once(key: str, load):
    """``load()`` the first time ``key`` is asked for (thread-safe), the cached result afterwards."""
    return _checked(_state, key, load)


def native():
    """The checked Triton side (triton, mamba-ssm); imported and version-checked once, at first use.

    Raises:
        ImportError: triton or mamba-ssm is not installed (message names ``pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0``).
        RuntimeError: the installed mamba-ssm is not the supported version (message names installed and supported
            versions).
    """
    return _load_once("triton", _load_triton)


def native_conv():
    """The checked causal-conv1d side (its ``causal_conv1d_cuda`` extension); imported and checked at first use.

    Raises:
        ImportError: causal-conv1d is not installed.
        RuntimeError: wrong causal-conv1d version.
    """
    return _load_once("conv", _load_conv)


def mamba2_class():
    """mamba-ssm's ``Mamba2`` module class (``mamba_ssm.modules.mamba2.Mamba2``), imported and version-checked at
    first use (for :func:`ordered_ssd.convert_to_mamba2`).

    Raises:
        ImportError: mamba-ssm is not installed. RuntimeError: another mamba-ssm version.
    """
    def load():
        module = _import_extra("mamba_ssm.modules.mamba2", "mamba-ssm")
        _check_version("mamba_ssm", module)
        return module.Mamba2
    return _load_once("mamba2_class", load)


def _checked(cache: dict, name: str, check):
    """``cache[name]``, computed by ``check()`` (thread-safe) the first time."""
    got = cache.get(name)
    if got is None:
        with _lock:
            got = cache.get(name)
            if got is None:
                got = cache[name] = check()
    return got


def kernel_jit(spec):
    """The JIT function of Triton kernel ``spec``, checked against the spec (argument names, autotune key) at
    first use; ``native().kernels[spec.name]`` then holds the autotuned kernel object.

    Raises:
        ImportError / RuntimeError: as :func:`native`, or the kernel is missing or its argument names or autotune
            key differ from the spec (message names installed and supported versions).
    """
    ns = native()

    def check():
        kernel, jit = _check_triton_kernel(ns, spec)
        ns.kernels[spec.name] = kernel
        return jit
    return _checked(ns.jit, spec.name, check)


def conv_op(spec):
    """causal-conv1d's C++ op ``spec.attr``, its number of arguments checked against ``spec.arity`` at first use.

    Raises:
        ImportError / RuntimeError: as :func:`native_conv`, or the op takes another number of arguments.
    """
    ns = native_conv()
    return _checked(ns.ops, spec.name, lambda: _check_conv_op(ns, spec))


def dot_dtype(*ts):
    """The ``tl`` dtype of the kernels' dots: bf16 if any input is bf16, else fp16 if any is, else fp32."""
    tl = native().tl
    if any(t.dtype == torch.bfloat16 for t in ts):
        return tl.bfloat16
    if any(t.dtype == torch.float16 for t in ts):
        return tl.float16
    return tl.float32


_NO_GUARD = contextlib.nullcontext()


def device_guard(t: torch.Tensor):
    """``torch.cuda.device(t.device)`` for a CUDA tensor on another device than the current one; a no-op context
    otherwise (``t`` on the current device: nothing to switch; CPU/interpreter development)."""
    if t.is_cuda:
        index = t.get_device()
        if index != torch.cuda.current_device():
            return torch.cuda.device(index)
    return _NO_GUARD


@functools.lru_cache(maxsize=None)
def _positional(names: tuple):
    """``full -> tuple(full[n] for n in names)`` as one C call (``operator.itemgetter``), per kernel signature."""
    getter = operator.itemgetter(*names)
    return getter if len(names) > 1 else (lambda full: (getter(full),))


def launch(spec, grid, args: dict, cfg, ref: torch.Tensor) -> None:
    """Launch native kernel ``spec`` through its JIT function (through its autotuner only for a configuration marked
    ``native-autotune-v1:pending``, see :func:`_launch_timed`).

    ``args`` maps *every* argument name of the kernel (pointers, sizes, strides and constexprs, including the
    config's block sizes, which are merged in here) to its value; the call is positional in ``arg_names`` order, with
    ``num_warps``/``num_stages`` from ``cfg``, under the device guard of ``ref``'s device. A missing or unexpected
    name raises RuntimeError before launching. A launch that Triton refuses for shared memory (before launching)
    runs at fewer ``num_stages`` (:func:`csrc_bindings._resources.launch_fitting`, rule ``fit-stages-v1``), else
    ``ValueError`` names the kernel, the configuration, the bytes, the limit and the layer sizes; a configuration
    with ``source == "explicit"`` is never changed. ``grid``: a tuple, or a function of the configuration's block
    sizes (``{"BLOCK_SIZE_M": .., ...}``) returning one (needed by the kernels that ``native-autotune-v1`` times).
    """
    jit = kernel_jit(spec)
    name, names = spec.name, spec.arg_names
    full = dict(args)
    for k, v in cfg.meta:
        if k in full:
            raise RuntimeError(f"{name}: config key {k} collides with a launcher argument")
        full[k] = v
    try:  # every name present (a KeyError otherwise) and no other one (the counts then agree): the same check
        pos = _positional(names)(full)
    except KeyError:
        pos = None
    if pos is None or len(full) != len(names):
        missing = [n for n in names if n not in full]
        extra = [n for n in full if n not in names]
        raise RuntimeError(f"{name}: launcher arguments do not match the kernel signature "
                           f"(missing {missing}, unexpected {extra})")

    if cfg.speed == TIMING_PENDING:
        _plans.note_pending()  # a planned launcher's call that times a key keeps no plan
        if _launch_timed(spec, grid, args, ref):
            return
    if callable(grid):
        grid = grid(dict(cfg.meta))
    _plans.note_launch(spec, grid, pos, cfg, ref, full)  # into the launcher's plan, when one is being recorded

    def sizes():
        return layer_sizes(full, dict(cfg.meta))
    with device_guard(ref):
        launch_fitting(name, jit, grid, pos, {}, cfg.as_dict(), ref, explicit=cfg.source == "explicit", sizes=sizes)


#: what upstream's autotuner object holds about its last run and its choices, put back after a timing
_TUNER_STATE = ("best_config", "configs_timings", "bench_time", "nargs")


def _byte_range(t: torch.Tensor):
    """``[first byte, past the last byte)`` that ``t`` may touch (torch strides are never negative); None if empty."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    return start, start + t.element_size() * (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())))


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes ``a`` may touch and the bytes ``b`` may touch intersect (extents, not exact elements)."""
    ra, rb = _byte_range(a), _byte_range(b)
    return ra is not None and rb is not None and ra[0] < rb[1] and rb[0] < ra[1]


def live_configs(tuner) -> tuple:
    """An upstream autotuner object's own configurations as ``(block kwargs, num_warps, num_stages)``, the form of
    ``KernelSpec.candidates``."""
    return tuple((dict(c.kwargs), c.num_warps, c.num_stages) for c in tuner.configs)


def _hookless(tuner) -> bool:
    """Whether an autotuner object has configurations and no hook (``reset_to_zero``, ``restore_value``,
    ``pre_hook``)."""
    configs = getattr(tuner, "configs", None)
    return bool(configs) and not (getattr(tuner, "reset_to_zero", None) or getattr(tuner, "restore_value", None)
                                  or any(c.pre_hook is not None for c in configs))


def _live_is_spec(tuner, spec) -> bool:
    """Whether the live autotuner times exactly ``spec.candidates`` without hooks."""
    return _hookless(tuner) and live_configs(tuner) == spec.candidates


#: this package's own autotuner per kernel name, for kernels whose live one mamba-ssm's deterministic mode cut
#: (:func:`_tuner_for`); never handed to upstream
_own_tuners: dict = {}


def _tuner_for(spec, tuner):
    """The autotuner that times a key of ``spec`` (rule ``native-autotune-v1``): upstream's own object ``tuner``
    where it times exactly ``spec.candidates``; where mamba-ssm's deterministic mode (``MAMBA_DETERMINISTIC``, read
    at its import: ``autotune_configs``) cut its list to fewer of them, this package's own ``triton.autotune`` object
    over the same function (``tuner.fn``: upstream's heuristics and JIT function) with ``spec.candidates`` and
    upstream's key, made once per kernel (upstream's object is not changed, and a native layer in the process keeps
    its cut list). Any candidate gives the same bits (the neutrality proof), so this changes speed only: without it
    the key kept its static configuration in such a process. None (not timed) for any other list or a hook."""
    if _live_is_spec(tuner, spec):
        return tuner
    live = live_configs(tuner) if _hookless(tuner) else ()
    if not live or len(live) >= len(spec.candidates) or any(c not in spec.candidates for c in live):
        return None
    own = _own_tuners.get(spec.name)
    if own is None:
        own = _own_tuners[spec.name] = _make_own_tuner(spec, tuner)
    return own


def _make_own_tuner(spec, tuner):
    """A ``triton.autotune`` object over ``tuner.fn`` with ``spec.candidates`` and ``tuner``'s key (a seam for the
    CPU tests)."""
    import triton
    configs = [triton.Config(dict(kw), num_warps=w, num_stages=st) for kw, w, st in spec.candidates]
    return triton.autotune(configs=configs, key=list(tuner.keys))(tuner.fn)


def _launch_timed(spec, grid, args: dict, ref: torch.Tensor) -> bool:
    """Launch ``spec`` through upstream's autotuner (rule ``native-autotune-v1``, :mod:`csrc_bindings._configs`):
    it times every native candidate on these arguments (synchronising) and launches the fastest; the choice is kept
    for the key's later launches, and the autotuner object is left as it was (its ``cache`` and its record of the
    run put back: a native ``Mamba2`` in the process times its own keys as before). ``grid``: a function of the
    configuration's block sizes.

    Where mamba-ssm's deterministic mode cut the live autotuner's list, the timing goes through this package's own
    autotuner with the full list instead (:func:`_tuner_for`).

    Returns False, having launched nothing (the caller launches the static configuration): during a CUDA-graph
    capture on ``ref``'s device; when an output's bytes overlap another tensor argument's (the timing's repeated
    launches would change an input); when the live autotuner's configurations are neither ``spec.candidates`` nor a
    part of them (or it has a hook) or it runs out of memory while timing (a warning): the key then keeps its static
    choice for the process.

    Raises:
        RuntimeError: the autotuner chose a configuration that is not one of ``spec.candidates``.
    """
    if not callable(grid) or _record_timed is None:
        return False
    tensors = [(n, v) for n, v in args.items() if isinstance(v, torch.Tensor)]
    for name in spec.timing_outputs:
        o = args.get(name)
        if o is not None and any(_overlap(o, t) for n, t in tensors if n != name):
            return False
    key = key_of(spec, args)
    tuner = _tuner_for(spec, native().kernels[spec.name])  # the triton.autotune object (kernel_jit checked it)
    if tuner is None:
        _record_timed(spec, key, ref, None, 0)
        return False
    with device_guard(ref):
        if torch.cuda.is_current_stream_capturing():
            return False
        cache = dict(tuner.cache)
        state = {a: getattr(tuner, a) for a in _TUNER_STATE if hasattr(tuner, a)}
        try:
            tuner[lambda meta: grid(meta)](**args)
            best = tuner.best_config
            timed = len(getattr(tuner, "configs_timings", None) or ()) if len(tuner.cache) > len(cache) else 0
        except torch.OutOfMemoryError as exc:
            import warnings
            warnings.warn(f"{spec.name}: out of memory while upstream's autotuner timed the key {key} "
                          f"({str(exc).splitlines()[0] if str(exc) else 'OutOfMemoryError'}); the key keeps its "
                          f"static configuration (the same bits)", RuntimeWarning, stacklevel=3)
            best = None
        finally:
            tuner.cache.clear()
            tuner.cache.update(cache)
            for a in _TUNER_STATE:
                if a in state:
                    setattr(tuner, a, state[a])
                elif hasattr(tuner, a):
                    delattr(tuner, a)
    _record_timed(spec, key, ref, best, timed if best is not None else 0)
    return best is not None


_record_timed = None  # csrc_bindings._configs.record_timed, registered by that module (which imports this one)


def set_timed_recorder(record) -> None:
    """Register ``record(spec, key, ref, best_config or None, candidates timed)``, called by :func:`_launch_timed`
    (None: the key keeps its static choice). :mod:`csrc_bindings._configs` registers its ``record_timed`` when
    imported."""
    global _record_timed
    _record_timed = record


_plans.bind(native=sys.modules[__name__], resources=_resources)  # what a launcher's plan replays through
