"""Pinned launch configurations: the table, the rule for keys outside it, the fingerprint.

A configuration is chosen as a pure function of ``(GPU arch, dtype, kernel, the kernel's autotune-key values)``:

1. the pinned table (:mod:`csrc_bindings.pinned.table`, written offline by ``python -m csrc_bindings.pinned.tune``),
   looked up by ``"{arch}/{dtype}/{kernel}/{k1}={v1},{k2}={v2},..."`` with the key names in the autotuner's order;
2. otherwise, for a kernel whose spec names ``order_nearest`` sizes (the chunk-cumsum kernels: ``nheads``;
   ``state_passing_bwd``: ``dim``), the **rule** ``nearest-order-v1``: the entry of the same arch, dtype and kernel
   with the same other key values whose ``order_nearest`` sizes are nearest (sum of ``|log2(a / b)|``; ties to the
   first key in sorted order), :func:`nearest_order_key`;
3. otherwise the **rule** ``mincost-v1``: among the kernel's native candidate configurations (the upstream autotuner
   list, copied into the kernel's :class:`~csrc_bindings._spec.KernelSpec`), the one with the smallest
   ``prod(BLOCK_SIZE_* values) * num_stages``, the earliest in the upstream list on ties. This is the same cost that
   mamba-ssm's own deterministic mode minimises, so it is the cheapest in shared memory. It reads no timing, no SM
   count, no environment variable, and not the (possibly filtered) ``.configs`` attribute of the live autotuner.

A configuration has two parts (:mod:`csrc_bindings.pinned.neutral` proves the split per kernel on the GPU):

* the **order** parameters, which decide bits (block sizes along reduced dimensions, and whatever else the proof
  finds to change an output bit): always from 1., 2. or 3. above, so the bits of a shape never depend on speed tuning;
* the **bit-neutral** parameters (:data:`csrc_bindings.pinned.neutral_params.NEUTRAL`; only on the arch of the
  proof and within the key range its cases covered, ``PROVEN``: elsewhere none), chosen for speed: from the
  speed table (:mod:`csrc_bindings.pinned.speed_table`, tuned offline per key by ``python -m
  csrc_bindings.pinned.tune --speed``) at the key itself; at a key of the pinned table, that entry's own (every
  value of it was timed there); else by the rule ``nearest-speed-v1``: the entry of the speed table or the pinned
  table (both timed) of the same arch, dtype and kernel whose key is nearest (sum over the key's sizes of
  ``|log2(a / b)|``; boolean key values must match; ties to the first key in sorted order); with no entry at all,
  those of the order configuration. A shape-only choice as well, so every run launches the same configuration,
  but one that tuning may change without changing a bit.

**Mamba-3 launches of few programs** (rule ``few-programs-v1``, :func:`few_programs_config`): a Mamba-3 kernel's
launch whose grid has at most as many programs as the device has SMs takes, at a key of ``FEW_PROGRAMS``
(:mod:`.pinned.mamba3_params`), other values of its bit-neutral parameters (the Mamba-3 proof's ``NEUTRAL``, on its
arch and within its ``PROVEN`` range), where the timing found them faster for so few programs (so far one kernel
and key: the forward at chunk 64 and ``d_state`` 128, three pipeline stages instead of two). A function of the
shape and the GPU's SM count (which a MIG slice lowers); never a bit.

**Kernels whose every parameter is bit-neutral** (``NEUTRAL`` lists every block size, ``num_warps`` and
``num_stages`` of the kernel) and that write their outputs with plain stores only
(:attr:`~csrc_bindings._spec.KernelSpec.timing_outputs`: ``chunk_scan_fwd``, ``chunk_state_fwd``,
``chunk_state_varlen``, ``bmm_chunk_fwd``, ``bmm_chunk_bwd``, ``chunk_scan_bwd_dstates``, ``state_passing_fwd``)
take, by the rule ``native-autotune-v1``, the configuration upstream's own autotuner times for the key: at the
first launch of a (device arch, dtype, kernel, key) in the process, on the arch of the proof and within its key
range, the launch goes through the kernel's ``triton.autotune`` object (which times every native candidate on the
launch's own arguments, synchronising, exactly as a native ``Mamba2`` layer's first step does) and the chosen
configuration is kept for every later launch of that key, which goes through the JIT function like any other.
Any candidate gives the same bits (the proof), so which one the timing picks changes speed only: the choice may
differ between processes, never a bit. Not timed: during CUDA-graph capture (the static choice above launches,
and the next launch outside a capture times), when an output's bytes overlap another argument's, for an explicit
``config``, and (the key then keeps its static choice for the process) when the live autotuner's configurations
are neither the spec's candidates nor a part of them (or it has a hook) or it runs out of memory while timing.
Where mamba-ssm's deterministic mode cut the live list to one candidate, the package's own autotuner times all of
them (:func:`csrc_bindings._native._tuner_for`). The autotuner object gets its ``cache`` and its record of the run
back (:func:`csrc_bindings._native._launch_timed`).

The gated RMSNorm kernels have no autotuner: their ``BLOCK_N`` / ``num_warps`` follow upstream's heuristic (a pure
function of ``group_size`` and the element size, :func:`csrc_bindings.layernorm_gated.rmsnorm_heuristic`), reported
with source ``"heuristic"``.

Everything here takes a :class:`~csrc_bindings._spec.KernelSpec`; the public functions that take a kernel's name
(``pinned_config``, ``rule_config``, ``table_key``) are in :mod:`csrc_bindings._registry`.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from typing import Mapping, Optional

import torch

from . import _plans
from ._native import installed_version, set_timed_recorder
from ._resources import FIT_RULE
from ._spec import TIMING_PENDING, KernelSpec, key_of

RULE_NAME = "mincost-v1"
#: The rule by which a key missing from the table takes a near entry's order parameters (kernels that allow it).
NEAREST_ORDER_RULE = "nearest-order-v1"
SPEED_RULE = "nearest-speed-v1"
#: The rule by which a Mamba-3 launch of at most one program per SM takes other bit-neutral values
#: (:func:`few_programs_config`).
FEW_PROGRAMS_RULE = "few-programs-v1"
#: The rule by which a kernel whose every parameter is bit-neutral takes upstream's autotuned choice (docstring).
TIMED_RULE = "native-autotune-v1"
#: Whether :func:`launch_config` may ask for ``native-autotune-v1`` (a test hook: False launches the static choice).
NATIVE_TIMING = True
#: Bump when a launcher changes what it launches for the same config (part of the fingerprint).
BINDINGS_ABI = 1


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One launch configuration: the block-size constexprs plus ``num_warps`` and ``num_stages``.

    ``source`` says where its order parameters came from: ``"table"``, ``"nearest:<table key>"`` (rule
    ``nearest-order-v1``), ``"rule"``, ``"explicit"`` (passed by the
    caller) or ``"heuristic"`` (gated RMSNorm, upstream's formula). ``speed`` says where its bit-neutral parameters
    came from: ``""`` (the same place), ``"speed-table"``, ``"nearest:<table key>"`` (rule ``nearest-speed-v1``)
    or ``"native-autotune-v1"`` (upstream's autotuner timed it in this process); ``"native-autotune-v1:pending"``
    marks a launch that is to time its key.
    """
    kernel: str
    meta: tuple  # ((name, value), ...) in a fixed order
    num_warps: int
    num_stages: int
    source: str = "explicit"
    speed: str = ""

    def __getitem__(self, name):
        return dict(self.meta)[name]

    def as_dict(self) -> dict:
        """``{"BLOCK_SIZE_M": .., ..., "num_warps": .., "num_stages": ..}``"""
        d = dict(self.meta)
        d["num_warps"] = self.num_warps
        d["num_stages"] = self.num_stages
        return d


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def device_arch(device) -> str:
    """``"sm_90"`` for a CUDA device of compute capability 9.0; the device type (e.g. ``"cpu"``) otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_arch(device.index if device.index is not None else torch.cuda.current_device())
    return device.type


@functools.lru_cache(maxsize=None)
def _cuda_arch(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _fmt(v) -> str:
    return str(bool(v)) if isinstance(v, bool) else str(int(v))


def table_key_of(spec: KernelSpec, arch: str, dtype, key: Mapping) -> str:
    """The table's string key; ``key`` must hold exactly the kernel's autotune-key names."""
    names = spec.autotune_key
    if names is None:
        raise KeyError(f"kernel: expected a kernel with an autotuner (and so table entries), got {spec.name}")
    if set(key) != set(names):
        raise KeyError(f"key: expected the names {list(names)} (the autotune key of {spec.name}), got {sorted(key)}")
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return f"{arch}/{dt}/{spec.name}/" + ",".join(f"{n}={_fmt(key[n])}" for n in names)


def _table() -> dict:
    from .pinned.table import TABLE
    return TABLE


def _order_table() -> dict:
    """The pinned configurations by table key: the Mamba-2 kernels' table (:func:`_table`, whose hash the
    fingerprint names) and the Mamba-3 kernels' ``ORDER`` (:mod:`.pinned.mamba3_params`, whose hash
    ``ordered_ssd.ops.mamba3_siso.mamba3_fingerprint`` names). Read where a configuration is not memoised yet.
    The Mamba-3 kernels have no speed choice (their proof is not part of ``NEUTRAL``/``PROVEN``): a key outside
    ``ORDER`` launches the ``mincost-v1`` rule's configuration whole, in every mode of the layer."""
    from .pinned.mamba3_params import ORDER
    return {**_table(), **ORDER}


def _cost(block: Mapping, num_stages: int) -> int:
    prod = 1
    for k, v in block.items():
        if k.startswith("BLOCK_SIZE_") or k == "BLOCK_N":
            prod *= int(v)
    return prod * (num_stages or 1)


@functools.lru_cache(maxsize=None)
def rule_of(spec: KernelSpec) -> KernelConfig:
    """The documented fallback (``mincost-v1``): cheapest native candidate, earliest on ties."""
    cands = spec.candidates
    best = min(range(len(cands)), key=lambda i: (_cost(cands[i][0], cands[i][2]), i))
    block, warps, stages = cands[best]
    return KernelConfig(spec.name, tuple(block.items()), warps, stages, "rule")


def config_from_dict(spec: KernelSpec, d: Mapping, source: str) -> KernelConfig:
    """A :class:`KernelConfig` from ``{"BLOCK_SIZE_*": .., "num_warps": .., "num_stages": ..}``."""
    cands = spec.candidates
    d = dict(d)
    warps = int(d.pop("num_warps", 4))
    stages = int(d.pop("num_stages", 3))
    if cands is not None:
        names = list(cands[0][0].keys())
        if set(d) != set(names):
            raise ValueError(f"config: expected exactly {names} (+ num_warps, num_stages) for {spec.name}, "
                             f"got {sorted(d)}")
        meta = tuple((n, int(d[n])) for n in names)
    else:
        meta = tuple(sorted((k, int(v)) for k, v in d.items()))
    return KernelConfig(spec.name, meta, warps, stages, source)


def _key_items(key: Mapping) -> tuple:
    # (name, is_bool, value): True and 1 hash alike but format differently in the table key
    return tuple(sorted((k, isinstance(v, bool), v) for k, v in key.items()))


def pinned_of(spec: KernelSpec, key: Mapping, dtype, arch: str) -> KernelConfig:
    """The configuration launched for ``spec`` at ``key``: the order parameters of :func:`order_of`, the bit-neutral
    ones chosen for speed (speed table, else ``nearest-speed-v1``; see the module docstring).

    A pure function of its arguments (the tables are constants of the installed package), memoised: a launcher asks
    for it at every launch.
    """
    return _pinned(spec, _key_items(key), dtype, arch)


def order_of(spec: KernelSpec, key: Mapping, dtype, arch: str) -> KernelConfig:
    """The pinned configuration before any speed choice (table entry, else ``nearest-order-v1``, else the
    ``mincost-v1`` rule): the one whose order parameters every launch keeps."""
    return _order(spec, _key_items(key), dtype, arch)


@functools.lru_cache(maxsize=4096)
def _order(spec: KernelSpec, key_items: tuple, dtype, arch: str) -> KernelConfig:
    key = {k: v for k, _, v in key_items}
    table = _order_table()
    tkey = table_key_of(spec, arch, dtype, key)
    entry = table.get(tkey)
    if entry is not None:
        return config_from_dict(spec, entry, "table")
    near = nearest_order_key(spec, key, tkey, table)
    if near is not None:
        return config_from_dict(spec, table[near], f"nearest:{near}")
    return rule_of(spec)


def nearest_order_key(spec: KernelSpec, key: Mapping, tkey: str, table: Mapping) -> str | None:
    """Rule ``nearest-order-v1``: for a kernel with :attr:`~csrc_bindings._spec.KernelSpec.order_nearest` names,
    the pinned-table key of the same arch, dtype and kernel whose values of those names are nearest to ``key``'s
    (sum of ``|log2(a / b)|``) and whose other key values are ``key``'s own; ties to the first key in sorted order.
    None for another kernel, or without such an entry (then ``mincost-v1``)."""
    if not spec.order_nearest:
        return None
    return _nearest_key(key, tkey, table, along=spec.order_nearest)


def _nearest_key(key: Mapping, tkey: str, keys, along=None) -> str | None:
    """The one of ``keys`` (table keys) of ``tkey``'s arch, dtype and kernel nearest to ``key`` by :func:`_distance`
    over every key name, or with ``along`` over those names only, the others equal to ``key``'s own; an infinite
    distance (a boolean value against another) never counts; ties to the first key in sorted order; None if none.
    Both nearest rules use it (``nearest-speed-v1``, ``nearest-order-v1``)."""
    prefix = tkey.rsplit("/", 1)[0] + "/"
    best = None
    for k in sorted(keys):
        if not k.startswith(prefix):
            continue
        other = _parse_key(k[len(prefix):])
        if along is None:
            d = _distance(key, other)
        elif any(other.get(n) != v or isinstance(other.get(n), bool) != isinstance(v, bool)
                 for n, v in key.items() if n not in along):
            continue
        else:
            d = _distance({n: key[n] for n in along}, {n: other.get(n) for n in along})
        if d != float("inf") and (best is None or d < best[0]):
            best = (d, k)
    return None if best is None else best[1]


def _neutral() -> dict:
    from .pinned.neutral_params import NEUTRAL
    return NEUTRAL


def _proof() -> tuple:
    from .pinned import neutral_params
    return neutral_params.ARCH, neutral_params.PROVEN


def _proven(kernel: str, key: Mapping, arch: str, proof: Optional[tuple] = None) -> bool:
    """Whether the neutrality proof (``(arch, PROVEN)``; the Mamba-2 kernels' by default) covers ``kernel`` at
    ``key`` on ``arch``: the arch it ran on, every key size within the range its cases ran, every boolean key value
    one it ran."""
    proof_arch, proven = proof or _proof()
    ranges = proven.get(kernel)
    if arch != proof_arch or not ranges:
        return False
    for name, v in key.items():
        r = ranges.get(name)
        if r is None:
            return False
        if isinstance(v, bool) or isinstance(r[0], bool):
            if v not in r or not isinstance(v, bool):
                return False
        elif not r[0] <= v <= r[1]:
            return False
    return True


def _speed() -> dict:
    from .pinned.speed_table import SPEED
    return SPEED


def _parse_key(text: str) -> dict:
    out = {}
    for part in text.split(","):
        n, v = part.split("=")
        out[n] = (v == "True") if v in ("True", "False") else int(v)
    return out


def _distance(a: Mapping, b: Mapping) -> float:
    d = 0.0
    for n, v in a.items():
        w = b.get(n)
        if isinstance(v, bool) or isinstance(w, bool) or w is None:
            if v != w or isinstance(v, bool) != isinstance(w, bool):
                return float("inf")
        elif v != w:
            d += abs(math.log2(max(int(v), 1) / max(int(w), 1)))
    return d


def speed_entry(spec: KernelSpec, key: Mapping, dtype, arch: str):
    """``(bit-neutral parameter values, where from)`` for ``spec`` at ``key``: the speed table's entry at the key
    (``"speed-table"``); ``(None, "")`` at a key of the pinned table (its entry was timed there); else the nearest
    entry of the same arch, dtype and kernel in the speed table or the pinned table (``"nearest:<table key>"``, rule
    ``nearest-speed-v1``; a speed entry replaces a pinned one of the same key), else ``(None, "")``. Only parameters
    listed in ``NEUTRAL`` for the kernel are returned, and only on the arch of the proof and within the key range
    its cases covered (``PROVEN``): elsewhere ``(None, "")``."""
    neutral = _neutral().get(spec.name, ())
    if not neutral or not _proven(spec.name, key, arch):
        return None, ""
    speed, table = _speed(), _order_table()
    tkey = table_key_of(spec, arch, dtype, key)
    if tkey in speed:
        entry, source = speed[tkey], "speed-table"
    elif tkey in table:
        return None, ""  # the table entry's own values: tuned at this key
    else:
        best = _nearest_key(key, tkey, set(table) | set(speed))
        if best is None:
            return None, ""
        entry, source = speed.get(best, table.get(best)), f"nearest:{best}"
    return {n: int(entry[n]) for n in neutral if n in entry}, source


@functools.lru_cache(maxsize=4096)
def _pinned(spec: KernelSpec, key_items: tuple, dtype, arch: str) -> KernelConfig:
    base = _order(spec, key_items, dtype, arch)
    values, source = speed_entry(spec, {k: v for k, _, v in key_items}, dtype, arch)
    if not values:
        return base
    meta = tuple((n, values.get(n, v)) for n, v in base.meta)
    return dataclasses.replace(base, meta=meta, num_warps=values.get("num_warps", base.num_warps),
                               num_stages=values.get("num_stages", base.num_stages), speed=source)


def _mamba3_speed() -> tuple:
    """``(ARCH, NEUTRAL, PROVEN, FEW_PROGRAMS)`` of :mod:`.pinned.mamba3_params`."""
    from .pinned import mamba3_params as m
    return m.ARCH, m.NEUTRAL, m.PROVEN, m.FEW_PROGRAMS


def few_programs_config(spec: KernelSpec, cfg: KernelConfig, key: Mapping, programs: int, sms: int, dtype,
                        arch: str) -> KernelConfig:
    """The rule ``few-programs-v1`` (Mamba-3 kernels): a launch of at most ``sms`` programs (the device's SMs, so
    at most one program per SM) takes the bit-neutral values of ``FEW_PROGRAMS`` at its table key
    (:mod:`.pinned.mamba3_params`: timed at the shapes whose launch is that small, where they beat the key's entry);
    ``cfg`` (the pinned configuration) with those values, marked ``speed="few-programs-v1"``. Only parameters of
    the kernel's ``NEUTRAL`` change, only on the arch of that proof and within its key range (``PROVEN``); else,
    for more programs, for a key without an entry, for an explicit ``cfg`` or one still to be timed
    (``native-autotune-v1``), ``cfg`` itself. Never a bit; raises nothing."""
    if programs > sms or cfg.source == "explicit" or cfg.speed == TIMING_PENDING:
        return cfg
    proof_arch, neutral, proven, few = _mamba3_speed()
    names = neutral.get(spec.name, ())
    entry = few.get(table_key_of(spec, arch, dtype, key))
    if not entry or not names or not _proven(spec.name, key, arch, (proof_arch, proven)):
        return cfg
    values = {n: int(entry[n]) for n in names if n in entry}
    meta = tuple((n, values.get(n, v)) for n, v in cfg.meta)
    return dataclasses.replace(cfg, meta=meta, num_warps=values.get("num_warps", cfg.num_warps),
                               num_stages=values.get("num_stages", cfg.num_stages), speed=FEW_PROGRAMS_RULE)


def launch_config_for_grid(spec: KernelSpec, grid, args: Mapping, ref, config=None) -> KernelConfig:
    """:func:`launch_config`, then, without an explicit ``config`` and on CUDA, :func:`few_programs_config` for the
    launch's programs (``grid``: a tuple, or a function of the configuration's block sizes: then counted at both
    configurations, and the rule's kept only where it too launches at most one program per SM) and the device's
    SMs. The Mamba-3 launchers' configuration. Raises what :func:`launch_config` raises."""
    cfg = launch_config(spec, args, ref, config)
    if config is not None or not _on_cuda(ref):
        return cfg
    from ._resources import multiprocessor_count

    def programs(c):
        return math.prod(grid(dict(c.meta)) if callable(grid) else grid)
    sms = multiprocessor_count(ref.device)
    few = few_programs_config(spec, cfg, key_of(spec, args), programs(cfg), sms, ref.dtype, device_arch(ref.device))
    return few if few is cfg or programs(few) <= sms else cfg


def resolve_config(spec: KernelSpec, key: Mapping, dtype, device, config=None) -> KernelConfig:
    """``config`` if given (a :class:`KernelConfig` or a dict of block sizes + num_warps/num_stages), else pinned."""
    if config is None:
        return pinned_of(spec, key, dtype, device_arch(device))
    if isinstance(config, KernelConfig):
        if config.kernel != spec.name:
            raise ValueError(f"config: expected a config for {spec.name}, got one for {config.kernel}")
        return config
    return config_from_dict(spec, config, "explicit")


def launch_config(spec: KernelSpec, args: Mapping, ref, config=None) -> KernelConfig:
    """The configuration of one launch of ``spec``: ``config`` if given, else the pinned one for the autotune key
    read from the launch arguments ``args`` (:func:`~csrc_bindings._spec.key_of`), at ``ref``'s dtype and device;
    for a kernel that ``native-autotune-v1`` covers, the configuration upstream's autotuner chose for the key in
    this process, or a configuration marked :data:`TIMING_PENDING` when the key is still to be timed (see the
    module docstring).

    Raises:
        ValueError: as :func:`resolve_config`, or a configuration the kernel computes wrongly
            (``spec.config_error``), before anything is launched.
    """
    key = key_of(spec, args)
    if config is None and spec.timing_outputs and _on_cuda(ref):
        cfg = _timed_or_pinned(spec, key, ref)
    else:
        cfg = resolve_config(spec, key, ref.dtype, ref.device, config)
    if spec.config_error is not None:
        msg = spec.config_error(dict(cfg.meta))
        if msg:
            raise ValueError(msg)
    return cfg


def _on_cuda(ref) -> bool:  # a seam for the CPU tests of native-autotune-v1
    return ref.is_cuda


_timed: dict = {}  # (arch, dtype, kernel name, key items) -> KernelConfig timed by upstream's autotuner
_timed_names: dict = {}  # the timed keys -> (their table key, candidates timed)


@functools.lru_cache(maxsize=None)
def _all_neutral(spec: KernelSpec) -> bool:
    """Whether every parameter of ``spec``'s configurations (block sizes, ``num_warps``, ``num_stages``) is
    bit-neutral by the proof (``NEUTRAL``)."""
    if not spec.candidates:
        return False
    names = set(spec.candidates[0][0]) | {"num_warps", "num_stages"}
    return names <= set(_neutral().get(spec.name, ()))


def _timed_or_pinned(spec: KernelSpec, key: Mapping, ref) -> KernelConfig:
    arch = device_arch(ref.device)
    items = _key_items(key)
    hit = _timed.get((arch, ref.dtype, spec.name, items))
    if hit is not None:
        return hit
    base = _pinned(spec, items, ref.dtype, arch)
    if (NATIVE_TIMING and _all_neutral(spec) and _proven(spec.name, key, arch)
            and not torch.cuda.is_current_stream_capturing()):
        return dataclasses.replace(base, speed=TIMING_PENDING)
    return base


def record_timed(spec: KernelSpec, key: Mapping, ref, best, timed: int = 0) -> KernelConfig:
    """Keep ``best`` (a ``triton.Config`` that upstream's autotuner chose for ``spec`` at ``key``; ``timed``
    candidates were timed for it, 0 when the autotuner's cache already held the key) for later launches of the key
    at ``ref``'s device arch and dtype; with ``best`` None, keep the static choice for the key instead (it is never
    timed in this process). Returns the kept :class:`KernelConfig`.

    Raises:
        RuntimeError: ``best`` is not one of ``spec``'s native candidates (another mamba-ssm than the one checked).
    """
    arch = device_arch(ref.device)
    items = _key_items(key)
    base = _pinned(spec, items, ref.dtype, arch)
    tk = (arch, ref.dtype, spec.name, items)
    _plans.clear()  # a key's configuration changes here: launch plans recorded before may hold the old one
    if best is None:
        _timed[tk] = base
        return base
    cand = (dict(best.kwargs), int(best.num_warps), int(best.num_stages))
    if cand not in spec.candidates:
        raise RuntimeError(f"{spec.name}: upstream's autotuner chose {cand}, not one of the candidates "
                           f"csrc_bindings knows for it")
    cfg = dataclasses.replace(base, meta=tuple((n, int(cand[0][n])) for n, _ in base.meta), num_warps=cand[1],
                              num_stages=cand[2], speed=TIMED_RULE)
    _timed[tk] = cfg
    _timed_names[tk] = (table_key_of(spec, arch, ref.dtype, key), timed)
    return cfg


set_timed_recorder(record_timed)


def timed_of(spec: KernelSpec, key: Mapping, dtype, arch: str):
    """The :class:`KernelConfig` timed for ``spec`` at ``key`` (``dtype``, ``arch``) in this process, or None."""
    cfg = _timed.get((arch, dtype, spec.name, _key_items(key)))
    return cfg if cfg is not None and cfg.speed == TIMED_RULE else None


def timed_configs() -> dict:
    """``{"{arch}/{dtype}/{kernel}/{key}": config dict}`` of every key ``native-autotune-v1`` timed in this
    process (:func:`~csrc_bindings.describe_launch` shows them too)."""
    return {name: _timed[k].as_dict() for k, (name, _) in sorted(_timed_names.items(), key=lambda kv: kv[1][0])}


def timing_counts() -> dict:
    """``{table key: candidates timed}`` of the keys of :func:`timed_configs` (0: upstream's autotuner already held
    the key, from a native layer's launch in this process)."""
    return {name: n for name, n in sorted(_timed_names.values())}


def forget_timed() -> None:
    """Forget every timed choice (the next launch of each key times again; for tests), and every launch plan."""
    _timed.clear()
    _timed_names.clear()
    _plans.clear()


def table_hash() -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of the pinned table."""
    blob = json.dumps(_table(), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def fingerprint(speed: bool = True) -> str:
    """``"csrc_bindings/abi1 mamba_ssm=.. causal_conv1d=.. triton=.. torch=.. table=<hash>
    rule=mincost-v1+nearest-order-v1:<hash> fit=fit-stages-v1 speed=<hash>"`` (without the ``speed=`` part when
    ``speed`` is False: what decides bits; the ``rule`` hash, :func:`nearest_order_hash`, names which kernels take
    ``nearest-order-v1`` along which key sizes).

    Versions are read from package metadata (nothing native is imported); a missing package reads ``absent``.
    Two runs with equal fingerprints on the same GPU model (with the same SM count: ``few-programs-v1`` reads it,
    for bit-neutral parameters only) launch the same kernels with the same configurations
    (``fit``: the rule that lowers ``num_stages`` of a configuration the device's shared memory cannot hold,
    :mod:`csrc_bindings._resources`; it depends on the GPU model's limit, which the GPU model fixes). ``speed``
    (:func:`speed_hash`) covers only bit-neutral parameters: two runs that differ in it alone give the same bits.
    """
    parts = [f"csrc_bindings/abi{BINDINGS_ABI}"]
    for dist in ("mamba_ssm", "causal_conv1d", "triton"):
        parts.append(f"{dist}={installed_version(dist) or 'absent'}")
    parts.append(f"torch={torch.__version__}")
    parts.append(f"table={table_hash()}")
    parts.append(f"rule={RULE_NAME}+{NEAREST_ORDER_RULE}:{nearest_order_hash()}")
    parts.append(f"fit={FIT_RULE}")
    if speed:
        parts.append(f"speed={speed_hash()}")
    return " ".join(parts)


#: ``() -> {kernel name: KernelSpec}``, bound by :mod:`csrc_bindings._registry` (which imports this module)
_kernel_specs = None


def bind_kernel_specs(get) -> None:
    """Called once by :mod:`csrc_bindings._registry` with a function that returns its ``KERNELS``."""
    global _kernel_specs
    _kernel_specs = get


def nearest_order_hash() -> str:
    """SHA-256 (first 8 hex digits) of which kernels take ``nearest-order-v1`` along which key sizes
    (``{kernel: order_nearest}``): it decides configurations as the table does, from this package's own specs."""
    if _kernel_specs is None:  # never after ``import csrc_bindings``, whose __init__ imports the registry
        raise RuntimeError("csrc_bindings._registry has not bound the kernel specs")
    spec_map = {name: list(spec.order_nearest) for name, spec in sorted(_kernel_specs().items())
                if spec.order_nearest}
    return hashlib.sha256(json.dumps(spec_map, sort_keys=True).encode()).hexdigest()[:8]


def speed_hash() -> str:
    """SHA-256 (first 12 hex digits) of the canonical JSON of the bit-neutral parameters (``NEUTRAL``) and the speed
    table, with the rule name, and of the Mamba-3 kernels' proof and ``FEW_PROGRAMS`` with theirs: what decides the
    speed choices (never a bit)."""
    blob = json.dumps({"neutral": _neutral(), "proof": _proof(), "speed": _speed(), "rule": SPEED_RULE,
                       "mamba3": _mamba3_speed(), "few": FEW_PROGRAMS_RULE},
                      sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


# a launcher's plan may hold a KernelConfig argument by value, and is kept per NATIVE_TIMING (csrc_bindings._plans)
_plans.bind(value_types=(KernelConfig,), configs_state=lambda: NATIVE_TIMING)
