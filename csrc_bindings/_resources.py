"""Shared memory: what a launch asks for, what the device allows, and the rule for what does not fit.

A Triton kernel whose compiled form asks for more shared memory per program than the device allows is refused by
Triton when it is launched: ``CompiledKernel`` compares its ``metadata.shared`` with the device's limit and raises
``triton.runtime.errors.OutOfResources`` *before* launching. Left alone, that error ends the step after every
kernel before it has run, with no hint of which layer size caused it. :func:`launch_fitting` (every launch of
:func:`csrc_bindings._native.launch`, and ordered-ssd's own fold kernel) launches at the pinned configuration, and
when Triton refuses it for shared memory (nothing of that kernel has run):

* **The number asked** is read from the compiled kernel at each candidate stage count (``JITFunction.warmup``
  compiles, or takes from Triton's cache, exactly the kernel a launch would run, without launching it;
  ``metadata.shared`` is the number Triton compares). It is exact where an estimate from the block sizes is not:
  the software pipeliner keeps ``num_stages`` buffers on sm_90 (wgmma) but ``num_stages - 1`` on sm_8x, pipelines
  only loads it can vectorise, and adds scratch for layout conversions. The verdict is cached per kernel,
  configuration, device and specialisation (tensor dtypes and 16-byte alignment, integers equal to 1 or divisible
  by 16, constexpr values: what Triton specialises on).
* **The limit** is ``torch.cuda.get_device_properties(device).shared_memory_per_block_optin`` (the number Triton
  itself compares with), cached per device (:func:`shared_memory_limit`).
* **The rule** ``fit-stages-v1`` (:func:`fit_stages`): the same block sizes and ``num_warps`` with ``num_stages``
  lowered one at a time, down to 1; the first that fits is launched. ``num_stages`` only sets how many tiles the
  pipeliner loads ahead: the loop bodies, hence every sum, are the same (compared bit for bit by the GPU test
  ``tests/gpu/csrc_bindings/test_resources.py``). A configuration passed explicitly by the caller is never changed.
  When nothing fits, ``ValueError`` names the kernel, the configuration, the bytes asked and the limit, and the
  layer sizes the kernel's block sizes come from (e.g. ``headdim=512``); any other ``OutOfResources`` (threads,
  from the registers a kernel needs) becomes a ``ValueError`` naming the same.

A launch that fits costs nothing extra (one ``try``). The stage count launched depends on the compiled kernel (so on
the triton version, the GPU arch, the shapes and dtypes) and on the device limit only: the same on every run.
Imports nothing native.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping

import torch

from . import _launch_cache

FIT_RULE = "fit-stages-v1"

#: launch-argument names that are layer sizes, and the name the error message gives them
LAYER_SIZE_NAMES = {"hdim": "headdim", "dstate": "dstate", "chunk_size": "chunk_size", "nheads": "nheads",
                    "ngroups": "ngroups", "dim": "headdim*dstate", "ncols": "ncols", "N": "group_size"}

_lock = threading.Lock()
_verdicts: dict = {}


@functools.cache
def _properties_of(index: int):
    return torch.cuda.get_device_properties(index)


def _properties(device):
    """``torch.cuda.get_device_properties`` of CUDA ``device`` (the current one for a bare ``"cuda"``), cached per
    device."""
    device = torch.device(device)
    return _properties_of(device.index if device.index is not None else torch.cuda.current_device())


def shared_memory_limit(device) -> int:
    """Bytes of shared memory one program (thread block) may use on CUDA ``device``
    (``shared_memory_per_block_optin``: 232,448 on the H200 and H100, 166,912 on the A100, 101,376 on sm_86/sm_89);
    cached per device."""
    return int(_properties(device).shared_memory_per_block_optin)


def multiprocessor_count(device) -> int:
    """Multiprocessors (SMs) of CUDA ``device`` (``multi_processor_count``: 132 on the H200); cached per device."""
    return int(_properties(device).multi_processor_count)


def _describe(cfg_dict: Mapping) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg_dict.items())


def layer_sizes(args: Mapping, config_names=()) -> str:
    """``"headdim=512, dstate=128, chunk_size=256; BLOCK_SIZE_K=512"``: the layer sizes among the launch arguments
    ``args`` and the block sizes the launcher derived from them (constexprs named ``BLOCK*`` that are not in the
    configuration, ``config_names``)."""
    sizes = [f"{LAYER_SIZE_NAMES[n]}={int(args[n])}" for n in LAYER_SIZE_NAMES
             if isinstance(args.get(n), int) and not isinstance(args.get(n), bool)]
    blocks = [f"{n}={int(v)}" for n, v in args.items()
              if n.startswith("BLOCK") and n not in config_names and isinstance(v, int) and not isinstance(v, bool)]
    return ", ".join(sizes) + ("; " + ", ".join(blocks) if blocks else "")


def fit_stages(kernel: str, config: Mapping, asked: Callable[[int], int], limit: int, *, sizes="",
               device_name: str = "the device", explicit: bool = False) -> int:
    """The ``num_stages`` to launch ``kernel`` with (rule ``fit-stages-v1``).

    Args:
        kernel: the kernel's name (for the message).
        config: the configuration as a dict, with ``num_warps`` and ``num_stages``.
        asked: ``asked(num_stages)``, the bytes of shared memory per program the kernel asks at that stage count
            (the compiled kernel's ``metadata.shared``).
        limit: the bytes the device allows per program.
        sizes: the layer sizes behind the kernel's block sizes (:func:`layer_sizes`), for the message (a string, or
            a function that returns it, called only for the message).
        explicit: the caller passed the configuration: it is never changed.

    Returns:
        ``config["num_stages"]`` if it fits, else the largest smaller count that fits.

    Raises:
        ValueError: nothing fits (or an explicit configuration does not): ``"<kernel>: configuration <...> asks
            <bytes> bytes of shared memory per program, more than the <limit> bytes <device> allows ..."``.
    """
    stages = int(config["num_stages"])
    first = asked(stages)
    if first <= limit:
        return stages
    tried = [f"{first} at num_stages={stages}"]
    if not explicit:
        for s in range(stages - 1, 0, -1):
            got = asked(s)
            if got <= limit:
                return s
            tried.append(f"{got} at num_stages={s}")
    sizes = sizes() if callable(sizes) else sizes
    where = f" (layer sizes: {sizes})" if sizes else ""
    lower = ("; fewer stages do not fit either (" + ", ".join(tried[1:]) + ")" if len(tried) > 1
             else "; an explicit configuration is never changed" if explicit else "")
    raise ValueError(f"{kernel}: configuration {_describe(config)} asks {first} bytes of shared memory per program, "
                     f"more than the {limit} bytes {device_name} allows (shared_memory_per_block_optin){where}{lower}. "
                     f"No configuration of this kernel fits this shape on this device: use smaller layer sizes.")


def _spec_key(v, _int=int, _tensor=torch.Tensor):
    """What Triton specialises a launch argument on (dtype and 16-byte alignment of a tensor; an int's value when
    it is 1, else whether it divides by 16; any other value itself). Called for every argument of every launch."""
    t = type(v)
    if t is _int:
        return 1 if v == 1 else ("d16" if v % 16 == 0 else "i")
    if isinstance(v, _tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    return v if v is None or t in (bool, float, str) else t.__name__


def out_of_resources(kernel: str, exc: Exception, config: Mapping, ref: torch.Tensor, sizes="") -> ValueError:
    """The ``ValueError`` for a Triton ``OutOfResources`` that the rule does not handle (threads; or shared memory
    that Triton refuses although :func:`fit_launch` found it to fit)."""
    sizes = sizes() if callable(sizes) else sizes
    where = f" (layer sizes: {sizes})" if sizes else ""
    return ValueError(f"{kernel}: configuration {_describe(config)} does not fit "
                      f"{torch.cuda.get_device_name(ref.device)}{where}: {exc}")


def fit_launch(kernel: str, jit, grid, args: tuple, kwargs: Mapping, config: Mapping, ref: torch.Tensor, *,
               sizes="", explicit: bool = False) -> int:
    """The ``num_stages`` at which ``jit[grid](*args, **kwargs, num_warps=.., num_stages=..)`` fits ``ref``'s device
    (:func:`fit_stages` on the compiled kernels' ``metadata.shared``, compiled without launching); cached per
    specialisation. Off CUDA: ``config["num_stages"]``.

    Raises:
        ValueError: as :func:`fit_stages`.
    """
    stages = int(config["num_stages"])
    if not ref.is_cuda:
        return stages
    warps = int(config["num_warps"])
    key = (kernel, tuple(config.items()), explicit, ref.device.index, tuple(map(_spec_key, args)),
           tuple((k, _spec_key(v)) for k, v in kwargs.items()))
    got = _verdicts.get(key)
    if got is not None:
        return got

    def asked(s: int) -> int:
        compiled = jit.warmup(*args, grid=grid, num_warps=warps, num_stages=s, **kwargs)
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode returns a future
            compiled = compiled.result()
        if compiled is None:  # a user's jit_cache_hook skipped the compile: Triton's own check remains
            return 0
        return int(compiled.metadata.shared)

    got = fit_stages(kernel, config, asked, shared_memory_limit(ref.device), sizes=sizes, explicit=explicit,
                     device_name=torch.cuda.get_device_name(ref.device))
    with _lock:
        _verdicts[key] = got
    return got


def launch_fitting(kernel: str, jit, grid, args: tuple, kwargs: Mapping, config: Mapping, ref: torch.Tensor, *,
                   sizes="", explicit: bool = False) -> int:
    """``jit[grid](*args, **kwargs, num_warps=.., num_stages=..)`` at ``config``; if Triton refuses it for shared
    memory (before launching), at the stage count :func:`fit_launch` picks. Returns the stage count launched. A key
    launched before (:mod:`csrc_bindings._launch_cache`) launches the compiled kernel kept for it, at the stage count
    that fitted then, without Triton's per-launch Python.

    Args:
        config: the configuration as a dict with ``num_warps`` and ``num_stages`` (for the message and the rule).
        sizes: the layer sizes for a message (a string or a function returning one).
        explicit: the caller passed the configuration: it is never changed.

    Raises:
        ValueError: nothing fits (as :func:`fit_stages`), or Triton refuses the launch for another resource or
            despite the check (the message names the kernel, the configuration, the layer sizes and Triton's
            numbers); nothing of this kernel has run.
    """
    warps, stages = int(config["num_warps"]), int(config["num_stages"])
    pos, key, kept = _launch_cache.find(jit, args, kwargs, ref, warps, stages)
    if kept is not None and explicit and int(kept.metadata.num_stages) != stages:
        kept = None  # fitted for a pinned launch: an explicit configuration is never changed (Triton's path refuses)
    if kept is not None:  # this key launched before: its compiled kernel (at the stage count that fitted)
        _launch_cache.run_compiled(kept, grid, pos, key[0])
        return int(kept.metadata.num_stages)
    try:
        _launch_cache.keep(jit, key, jit[grid](*args, **kwargs, num_warps=warps, num_stages=stages))
        return stages
    except Exception as exc:
        if type(exc).__name__ != "OutOfResources":
            raise
        if getattr(exc, "name", None) != "shared memory":
            raise out_of_resources(kernel, exc, config, ref, sizes) from exc
    fitted = fit_launch(kernel, jit, grid, args, kwargs, config, ref, sizes=sizes, explicit=explicit)
    try:
        _launch_cache.keep(jit, key, jit[grid](*args, **kwargs, num_warps=warps, num_stages=fitted))
    except Exception as exc:
        if type(exc).__name__ != "OutOfResources":
            raise
        raise out_of_resources(kernel, exc, {**config, "num_stages": fitted}, ref, sizes) from exc
    return fitted
