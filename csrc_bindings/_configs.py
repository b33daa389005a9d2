"""Pinned launch configurations: the table, the rule for keys outside it, the fingerprint.

A configuration is chosen as a pure function of ``(GPU arch, dtype, kernel, the kernel's autotune-key values)``:

1. the pinned table (:mod:`csrc_bindings._pinned_table`, written offline by ``benchmarks/tune_pinned_configs.py``),
   looked up by ``"{arch}/{dtype}/{kernel}/{k1}={v1},{k2}={v2},..."`` with the key names in the autotuner's order;
2. otherwise the **rule** ``mincost-v1``: among the kernel's native candidate configurations (the upstream autotuner
   list, copied in :mod:`csrc_bindings._kernel_specs`), the one with the smallest
   ``prod(BLOCK_SIZE_* values) * num_stages``, the earliest in the upstream list on ties. This is the same cost that
   mamba-ssm's own deterministic mode minimises, so it is the cheapest in shared memory. It reads no timing, no SM
   count, no environment variable, and not the (possibly filtered) ``.configs`` attribute of the live autotuner.

The gated RMSNorm kernels have no autotuner: their ``BLOCK_N`` / ``num_warps`` follow upstream's heuristic (a pure
function of ``group_size`` and the element size), reported with source ``"heuristic"``.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Mapping

import torch

from ._kernel_specs import KERNELS
from ._util import next_pow2

RULE_NAME = "mincost-v1"
#: Bump when a launcher changes what it launches for the same config (part of the fingerprint).
BINDINGS_ABI = 1


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One launch configuration: the block-size constexprs plus ``num_warps`` and ``num_stages``.

    ``source`` says where it came from: ``"table"``, ``"rule"``, ``"explicit"`` (passed by the caller) or
    ``"heuristic"`` (gated RMSNorm, upstream's formula).
    """
    kernel: str
    meta: tuple  # ((name, value), ...) in a fixed order
    num_warps: int
    num_stages: int
    source: str = "explicit"

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


def table_key(arch: str, dtype, kernel: str, key: Mapping) -> str:
    """The table's string key; ``key`` must hold exactly the kernel's autotune-key names."""
    names = KERNELS[kernel]["autotune_key"]
    if names is None:
        raise KeyError(f"{kernel} has no autotuner and no table entry")
    if set(key) != set(names):
        raise KeyError(f"{kernel}: key needs {list(names)}, got {sorted(key)}")
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return f"{arch}/{dt}/{kernel}/" + ",".join(f"{n}={_fmt(key[n])}" for n in names)


def _table() -> dict:
    from ._pinned_table import TABLE
    return TABLE


def _cost(block: Mapping, num_stages: int) -> int:
    prod = 1
    for k, v in block.items():
        if k.startswith("BLOCK_SIZE_") or k == "BLOCK_N":
            prod *= int(v)
    return prod * (num_stages or 1)


@functools.lru_cache(maxsize=None)
def rule_config(kernel: str) -> KernelConfig:
    """The documented fallback (``mincost-v1``): cheapest native candidate, earliest on ties."""
    cands = KERNELS[kernel]["candidates"]
    best = min(range(len(cands)), key=lambda i: (_cost(cands[i][0], cands[i][2]), i))
    block, warps, stages = cands[best]
    return KernelConfig(kernel, tuple(block.items()), warps, stages, "rule")


def _from_dict(kernel: str, d: Mapping, source: str) -> KernelConfig:
    cands = KERNELS[kernel]["candidates"]
    d = dict(d)
    warps = int(d.pop("num_warps", 4))
    stages = int(d.pop("num_stages", 3))
    if cands is not None:
        names = list(cands[0][0].keys())
        if set(d) != set(names):
            raise ValueError(f"{kernel}: a config needs exactly {names} (+ num_warps, num_stages), got {sorted(d)}")
        meta = tuple((n, int(d[n])) for n in names)
    else:
        meta = tuple(sorted((k, int(v)) for k, v in d.items()))
    return KernelConfig(kernel, meta, warps, stages, source)


def pinned_config(kernel: str, key: Mapping, dtype, arch: str) -> KernelConfig:
    """The pinned configuration for ``kernel`` at ``key`` (table entry, else the ``mincost-v1`` rule).

    A pure function of its arguments (the table is a constant of the installed package), memoised: a launcher asks
    for it at every launch.
    """
    # (name, is_bool, value): True and 1 hash alike but format differently in the table key
    return _pinned_config(kernel, tuple(sorted((k, isinstance(v, bool), v) for k, v in key.items())), dtype, arch)


@functools.lru_cache(maxsize=4096)
def _pinned_config(kernel: str, key_items: tuple, dtype, arch: str) -> KernelConfig:
    entry = _table().get(table_key(arch, dtype, kernel, {k: v for k, _, v in key_items}))
    if entry is not None:
        return _from_dict(kernel, entry, "table")
    return rule_config(kernel)


def resolve_config(kernel: str, key: Mapping, dtype, device, config=None) -> KernelConfig:
    """``config`` if given (a :class:`KernelConfig` or a dict of block sizes + num_warps/num_stages), else pinned."""
    if config is None:
        return pinned_config(kernel, key, dtype, device_arch(device))
    if isinstance(config, KernelConfig):
        if config.kernel != kernel:
            raise ValueError(f"config for {config.kernel} passed to the {kernel} launcher")
        return config
    return _from_dict(kernel, config, "explicit")


def table_hash() -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of the pinned table."""
    blob = json.dumps(_table(), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def fingerprint() -> str:
    """``"csrc_bindings/abi1 mamba_ssm=.. causal_conv1d=.. triton=.. torch=.. table=<hash> rule=mincost-v1"``.

    Versions are read from package metadata (nothing native is imported); a missing package reads ``absent``.
    Two runs with equal fingerprints on the same GPU model launch the same kernels with the same configurations.
    """
    from ._native import installed_version
    parts = [f"csrc_bindings/abi{BINDINGS_ABI}"]
    for dist in ("mamba_ssm", "causal_conv1d", "triton"):
        parts.append(f"{dist}={installed_version(dist) or 'absent'}")
    parts.append(f"torch={torch.__version__}")
    parts.append(f"table={table_hash()}")
    parts.append(f"rule={RULE_NAME}")
    return " ".join(parts)


def rmsnorm_heuristic(group_size: int, element_size: int) -> KernelConfig:
    """Upstream's gated-RMSNorm launch rule: ``BLOCK_N = next_pow2(group_size)`` (≤ 64 KB), warps = BLOCK_N/256 in
    [1, 8], 3 stages. Raises ValueError when a group does not fit in one block (upstream raises too)."""
    max_fused = 65536 // element_size
    block_n = min(max_fused, next_pow2(group_size))
    if group_size > block_n:
        raise ValueError(f"gated RMSNorm: group_size {group_size} is over 64 KB per row (upstream limit)")
    warps = min(max(block_n // 256, 1), 8)
    return KernelConfig("rmsnorm_gated", (("BLOCK_N", block_n),), warps, 3, "heuristic")


def layer_keys(*, chunk_size: int, headdim: int, dstate: int, nheads: int, d_nonssm: int = 0):
    """Autotune keys (and which dtype each kernel is keyed on) for one Mamba-2 layer.

    Returns ``[(kernel, key_dict, dtype_role)]``; ``dtype_role`` is ``"model"`` (activations dtype) or ``"fp32"``
    (the inter-chunk states, which mamba-ssm keeps in fp32).
    """
    cs, p, n = chunk_size, headdim, dstate
    rows = [
        ("chunk_cumsum_fwd", {"chunk_size": cs, "nheads": nheads}, "model"),
        ("chunk_cumsum_bwd", {"chunk_size": cs, "nheads": nheads}, "model"),
        ("bmm_chunk_fwd", {"chunk_size": cs, "K": n, "IS_CAUSAL": False}, "model"),
        ("bmm_chunk_bwd", {"chunk_size": cs, "K": n}, "model"),
        ("chunk_state_fwd", {"hdim": p, "dstate": n, "chunk_size": cs}, "model"),
        ("chunk_state_bwd_db", {"chunk_size": cs, "dstate": n, "hdim": p}, "model"),
        ("state_passing_fwd", {"dim": p * n}, "fp32"),
        ("state_passing_bwd", {"dim": p * n}, "fp32"),
        ("chunk_scan_fwd", {"chunk_size": cs, "hdim": p, "dstate": n, "IS_CAUSAL": True}, "model"),
        ("chunk_scan_bwd_dz", {"chunk_size": cs, "hdim": p}, "model"),
        ("chunk_scan_bwd_dstates", {"hdim": p, "dstate": n, "chunk_size": cs}, "model"),
        ("chunk_scan_bwd_dC", {"chunk_size": cs, "dstate": n, "hdim": p}, "model"),
        ("chunk_scan_bwd_dcb", {"chunk_size": cs, "hdim": p}, "model"),
        ("chunk_scan_bwd_ddAcs_stable", {"chunk_size": cs, "hdim": p}, "model"),
        ("chunk_scan_chunk_state_bwd_dx", {"chunk_size": cs, "hdim": p, "dstate": n}, "model"),
    ]
    if d_nonssm:
        rows += [("swiglu_fwd", {"ncols": d_nonssm}, "model"), ("swiglu_bwd", {"ncols": d_nonssm}, "model")]
    return rows


def describe_launch(*, chunk_size: int, headdim: int, dstate: int, nheads: int, ngroups: int = 1,
                    d_nonssm: int = 0, dtype=torch.bfloat16, device=None, arch: str | None = None) -> dict:
    """Configurations the launchers use for one Mamba-2 layer shape, plus the fingerprint.

    Pass ``arch`` (e.g. ``"sm_90"``) or ``device`` (default: the current CUDA device). Imports nothing native.

    Returns:
        ``{"fingerprint": str, "arch": str, "dtype": str, "kernels": {name: {"key": {...}, "dtype": str,
        "config": {...}, "source": "table" | "rule" | "heuristic"}}}``
    """
    if arch is None:
        arch = device_arch(device if device is not None else torch.device("cuda", torch.cuda.current_device()))
    out = {"fingerprint": fingerprint(), "arch": arch, "dtype": dtype_name(dtype), "kernels": {}}
    for kernel, key, role in layer_keys(chunk_size=chunk_size, headdim=headdim, dstate=dstate, nheads=nheads,
                                        d_nonssm=d_nonssm):
        kdt = dtype if role == "model" else torch.float32
        cfg = pinned_config(kernel, key, kdt, arch)
        out["kernels"][kernel] = {"key": dict(key), "dtype": dtype_name(kdt), "config": cfg.as_dict(),
                                  "source": cfg.source}
    group = (nheads * headdim) // ngroups
    elt = torch.empty((), dtype=dtype).element_size()
    try:
        rc = rmsnorm_heuristic(group, elt)
        out["kernels"]["rmsnorm_gated"] = {"key": {"group_size": group}, "dtype": dtype_name(dtype),
                                           "config": rc.as_dict(), "source": rc.source}
    except ValueError as exc:  # pragma: no cover - absurd group sizes
        out["kernels"]["rmsnorm_gated"] = {"error": str(exc)}
    return out
