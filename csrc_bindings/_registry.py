"""The kernels of ``csrc_bindings``, assembled from the files that mirror upstream, and what is asked by name.

:data:`SPECS` lists every kernel's :class:`~csrc_bindings._spec.KernelSpec`, in the order one Mamba-2 layer step
launches them; each spec lives beside its launcher in the file named after the upstream module that defines the
kernel. From them come :data:`KERNELS` (the Triton kernels), :data:`CONV_OPS` (causal-conv1d's C++ ops), the pinned
configuration by kernel name (:func:`pinned_config`, :func:`rule_config`, :func:`table_key`), a layer's autotune
keys (:func:`layer_keys`, derived from the specs' ``autotune_key``), :func:`describe_launch` and :func:`run_kernel`
(a lookup of the kernel's example runner). Imports nothing native.
"""
from __future__ import annotations

from typing import Mapping

import torch

from . import (causal_conv1d, k_activations, layernorm_gated, selective_state_update, ssd_bmm, ssd_chunk_scan,
               ssd_chunk_state, ssd_combined, ssd_state_passing)
from ._configs import (KernelConfig, bind_kernel_specs, device_arch, dtype_name, fingerprint, order_of, pinned_of,
                       rule_of, table_key_of, timed_of)
from ._spec import KernelSpec, key_of
from .layernorm_gated import rmsnorm_heuristic

#: every native kernel, in the order one Mamba-2 layer step launches them (forward and backward pieces), then the
#: decoding kernels
SPECS: tuple[KernelSpec, ...] = (
    ssd_chunk_state.CHUNK_CUMSUM_FWD, ssd_chunk_state.CHUNK_CUMSUM_BWD,
    ssd_bmm.BMM_CHUNK_FWD, ssd_bmm.BMM_CHUNK_BWD,
    ssd_chunk_state.CHUNK_STATE_FWD, ssd_chunk_state.CHUNK_STATE_BWD_DB,
    ssd_state_passing.STATE_PASSING_FWD, ssd_state_passing.STATE_PASSING_BWD,
    ssd_chunk_scan.CHUNK_SCAN_FWD, ssd_chunk_scan.CHUNK_SCAN_BWD_DZ, ssd_chunk_scan.CHUNK_SCAN_BWD_DSTATES,
    ssd_chunk_scan.CHUNK_SCAN_BWD_DC, ssd_chunk_scan.CHUNK_SCAN_BWD_DCB, ssd_chunk_scan.CHUNK_SCAN_BWD_DDACS_STABLE,
    ssd_combined.CHUNK_SCAN_CHUNK_STATE_BWD_DX,
    k_activations.SWIGLU_FWD, k_activations.SWIGLU_BWD,
    layernorm_gated.RMSNORM_GATED_FWD, layernorm_gated.RMSNORM_GATED_BWD,
    causal_conv1d.CAUSAL_CONV1D_FWD, causal_conv1d.CAUSAL_CONV1D_BWD,
    # decoding (OrderedMamba2 with inference_params): the varlen states of a packed prefill, then one token's step
    ssd_chunk_state.CHUNK_STATE_VARLEN, causal_conv1d.CAUSAL_CONV1D_UPDATE,
    selective_state_update.SELECTIVE_STATE_UPDATE,
)
#: the files that mirror an upstream module, in the order of :data:`SPECS`
MIRRORS = (ssd_chunk_state, ssd_bmm, ssd_state_passing, ssd_chunk_scan, ssd_combined, k_activations, layernorm_gated,
           causal_conv1d, selective_state_update)
_BY_NAME = {s.name: s for s in SPECS}
#: the Triton kernels, by name (checked against their ``arg_names`` and autotune key at first use)
KERNELS = {s.name: s for s in SPECS if s.arity is None}
bind_kernel_specs(lambda: KERNELS)  # the fingerprint names which of them take nearest-order-v1
#: causal-conv1d's C++ ops, by name (checked against their number of arguments at first use)
CONV_OPS = {s.name: s for s in SPECS if s.arity is not None}
#: kernels with a table entry (autotuned upstream), in layer order
TUNED_KERNELS = tuple(s.name for s in SPECS if s.candidates is not None)
#: every kernel with an example runner (all of them), in layer order
ALL_KERNELS = tuple(s.name for s in SPECS if s.example is not None)


def _tuned(kernel: str) -> KernelSpec:
    """The spec of autotuned kernel ``kernel``, else ``KeyError("kernel: expected one of [...], got ...")``."""
    if kernel not in TUNED_KERNELS:
        raise KeyError(f"kernel: expected one of {list(TUNED_KERNELS)}, got {kernel!r}")
    return KERNELS[kernel]


def table_key(arch: str, dtype, kernel: str, key: Mapping) -> str:
    """The table's string key ``"{arch}/{dtype}/{kernel}/{k1}={v1},..."``; ``key`` must hold exactly the kernel's
    autotune-key names.

    Raises:
        KeyError: ``kernel`` is not an autotuned kernel (:data:`TUNED_KERNELS`), or ``key``'s names are not exactly
            its autotune key.
    """
    return table_key_of(_tuned(kernel), arch, dtype, key)


def pinned_config(kernel: str, key: Mapping, dtype, arch: str) -> KernelConfig:
    """The pinned configuration for ``kernel`` at ``key`` (table entry, else ``nearest-order-v1``, else the
    ``mincost-v1`` rule); memoised.

    Raises:
        KeyError: as :func:`table_key`.
    """
    return pinned_of(_tuned(kernel), key, dtype, arch)


def timed_config(kernel: str, key: Mapping, dtype, arch: str) -> KernelConfig | None:
    """The configuration upstream's autotuner chose for ``kernel`` at ``key`` in this process (rule
    ``native-autotune-v1``), or None when it has not timed that key (or never times this kernel)."""
    return timed_of(_tuned(kernel), key, dtype, arch)


def order_config(kernel: str, key: Mapping, dtype, arch: str) -> KernelConfig:
    """The pinned configuration for ``kernel`` at ``key`` before any speed choice (table entry, else
    ``nearest-order-v1``, else the ``mincost-v1`` rule): its order parameters are the ones every launch keeps.

    Raises:
        KeyError: as :func:`table_key`.
    """
    return order_of(_tuned(kernel), key, dtype, arch)


def rule_config(kernel: str) -> KernelConfig:
    """The documented fallback (``mincost-v1``): cheapest native candidate, earliest on ties.

    Raises:
        KeyError: ``kernel`` is not an autotuned kernel (:data:`TUNED_KERNELS`).
    """
    return rule_of(_tuned(kernel))


def layer_keys(*, chunk_size: int, headdim: int, dstate: int, nheads: int, d_nonssm: int = 0):
    """Autotune keys (and which dtype each kernel is keyed on) for one Mamba-2 layer, derived from the specs.

    Each autotune-key name stands for a layer size (``hdim`` the head dim, ``K`` and ``dstate`` the state dim,
    ``dim = headdim * dstate``, ``ncols = d_nonssm``; a spec's ``layer_key_consts`` fixes the others, e.g.
    ``IS_CAUSAL``). The SwiGLU kernels are left out when ``d_nonssm`` is 0.

    Returns ``[(kernel, key_dict, dtype_role)]`` in layer order; ``dtype_role`` is ``"model"`` (activations dtype)
    or ``"fp32"`` (the inter-chunk states, which mamba-ssm keeps in fp32).

    Raises nothing of its own: every autotune-key name of the specs is one of the sizes above (a spec naming
    another would raise ``KeyError`` here; ``tests/csrc_bindings/test_recorded.py`` pins the rows).
    """
    sizes = {"chunk_size": chunk_size, "nheads": nheads, "hdim": headdim, "dstate": dstate, "K": dstate,
             "dim": headdim * dstate, "ncols": d_nonssm or None}
    rows = []
    for spec in SPECS:
        if spec.autotune_key is None:
            continue
        key = key_of(spec, {**sizes, **spec.layer_key_consts})
        if all(v is not None for v in key.values()):
            rows.append((spec.name, key, spec.layer_dtype))
    return rows


def run_kernel(kernel: str, p: dict, config=None):
    """Run the launcher of ``kernel`` on example problem ``p`` (:func:`csrc_bindings._examples.make_problem`);
    return its output tensors as a tuple (Nones dropped)."""
    r = _BY_NAME[kernel].example(p, config)
    return tuple(t for t in r if isinstance(t, torch.Tensor))


def describe_launch(*, chunk_size: int, headdim: int, dstate: int, nheads: int, ngroups: int = 1,
                    d_nonssm: int = 0, dtype=torch.bfloat16, device=None, arch: str | None = None) -> dict:
    """Configurations the launchers use for one Mamba-2 layer shape, plus the fingerprint.

    Pass ``arch`` (e.g. ``"sm_90"``) or ``device`` (default: the current CUDA device). Imports nothing native.

    Returns:
        ``{"fingerprint": str, "arch": str, "dtype": str, "kernels": {name: {"key": {...}, "dtype": str,
        "config": {...}, "source": "table" | "nearest:<table key>" | "rule" | "heuristic"[, "speed": where the
        bit-neutral parameters came from]}}}``; a group too wide for the gated RMSNorm
        gives ``"rmsnorm_gated": {"error": message}`` instead of raising. A kernel that upstream's autotuner has
        timed at this key in this process (rule ``native-autotune-v1``, :mod:`csrc_bindings._configs`) shows that
        choice, with ``"speed": "native-autotune-v1"``; before its first launch, the static choice it would launch
        during a CUDA-graph capture.

    Raises:
        RuntimeError / AssertionError: from torch, when neither ``arch`` nor ``device`` is given and CUDA is not
            available (reading the current device's capability).
    """
    if arch is None:
        arch = device_arch(device if device is not None else torch.device("cuda", torch.cuda.current_device()))
    out = {"fingerprint": fingerprint(), "arch": arch, "dtype": dtype_name(dtype), "kernels": {}}
    for kernel, key, role in layer_keys(chunk_size=chunk_size, headdim=headdim, dstate=dstate, nheads=nheads,
                                        d_nonssm=d_nonssm):
        kdt = dtype if role == "model" else torch.float32
        cfg = timed_config(kernel, key, kdt, arch) or pinned_config(kernel, key, kdt, arch)
        out["kernels"][kernel] = {"key": dict(key), "dtype": dtype_name(kdt), "config": cfg.as_dict(),
                                  "source": cfg.source, **({"speed": cfg.speed} if cfg.speed else {})}
    group = (nheads * headdim) // ngroups
    elt = torch.empty((), dtype=dtype).element_size()
    try:
        rms_config = rmsnorm_heuristic(group, elt)
        out["kernels"]["rmsnorm_gated"] = {"key": {"group_size": group}, "dtype": dtype_name(dtype),
                                           "config": rms_config.as_dict(), "source": rms_config.source}
    except ValueError as exc:  # pragma: no cover - absurd group sizes
        out["kernels"]["rmsnorm_gated"] = {"error": str(exc)}
    return out
