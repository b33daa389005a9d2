"""What a ``transformers`` Mamba-2 mixer is and computes, read off it when it is converted: its family, the
supported ``transformers`` versions, its sizes and options (:class:`_Spec`), its gated norm (run once on a probe to
prove what its attributes say) and its ``forward``'s parameters. Imports nothing from ``transformers``.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from ..reference import reference_gated_rmsnorm

__all__ = ["HF_MIXERS", "SUPPORTED_TRANSFORMERS", "hf_mixer_family", "check_transformers_version"]

#: The oldest and the newest ``transformers`` minor versions whose mixers this module mirrors (both included; every
#: minor release between them is tested in CI). What differs between them is read off the objects, never guessed
#: from the version: the gated norm's groups (:func:`_norm_spec`), the forward's cache keyword (:data:`_FORWARD_PARAMS`)
#: and the cache's methods (:func:`_cache_states`, :class:`OrderedHFMamba2Mixer`'s decoding).
SUPPORTED_TRANSFORMERS = ("5.17", "5.25")


#: (module, class name) of each supported mixer class -> its family.
HF_MIXERS = {
    ("transformers.models.mamba2.modeling_mamba2", "Mamba2Mixer"): "mamba2",
    ("transformers.models.bamba.modeling_bamba", "BambaMixer"): "bamba",
    ("transformers.models.nemotron_h.modeling_nemotron_h", "NemotronHMamba2Mixer"): "nemotron_h",
    ("transformers.models.granitemoehybrid.modeling_granitemoehybrid", "GraniteMoeHybridMambaLayer"):
        "granitemoehybrid",
    ("transformers.models.falcon_h1.modeling_falcon_h1", "FalconH1Mixer"): "falcon_h1",
    ("transformers.models.zamba2.modeling_zamba2", "Zamba2MambaMixer"): "zamba2",
}

#: The gated-norm classes of those mixers in 5.17 to 5.25 (``Mamba2RMSNormGated`` is 5.25's name of
#: ``MambaRMSNormGated``). Which groups one normalises over is read off the instance (``group_size``, FalconH1's
#: ``n_groups``, or neither: the whole width, as ``MambaRMSNormGated``, ``BambaRMSNormGated`` and
#: ``GraniteMoeHybridRMSNormGated`` before 5.23) and then checked by running it (:func:`_norm_spec`).
_GATED_NORMS = {"MambaRMSNormGated", "Mamba2RMSNormGated", "BambaRMSNormGated", "GraniteMoeHybridRMSNormGated",
                "Zamba2RMSNormGated", "NemotronHRMSNormGated", "FalconH1RMSNormGated"}

#: The parameters of the supported mixers' ``forward`` (after ``self``): ``cache_params`` up to 5.23, ``cache``
#: from 5.24 (which still takes ``cache_params`` as a deprecated alias). Another signature is refused.
_FORWARD_PARAMS = (("hidden_states", "cache_params", "attention_mask", "**kwargs"),
                   ("hidden_states", "cache", "attention_mask", "**kwargs"))

#: The attributes every supported mixer has (the sizes and options its forward reads).
_REQUIRED = ("num_heads", "head_dim", "n_groups", "ssm_state_size", "conv_kernel_size", "intermediate_size",
             "chunk_size", "time_step_limit", "activation", "layer_idx", "in_proj", "conv1d", "dt_bias", "A_log",
             "D", "norm", "out_proj")

#: What nn.Module keeps in ``__dict__`` for itself, and an instance-level ``forward`` (accelerate's hooks install
#: one); every other public entry is a mixer attribute and is carried over.
_MODULE_STATE = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules", "training", "forward")


def _check_no_hooks(mixer: nn.Module, name: str) -> None:
    """accelerate's dispatch (a ``device_map`` over several devices, or offloading) wraps modules' ``forward`` to
    move weights in; the ordered path reads the weights itself, so such a model is refused, not half served. A
    submodule whose forward a hub kernel replaced (the ``kernels`` package sets the instance's ``forward`` and
    ``_kernel_repo``; e.g. the mixer's ``act``, a ``SiLUActivation``, under transformers 5.25's default
    ``use_kernels=True`` on CUDA) is not refused: the ordered mixer calls no such module but a wrapped projection,
    and ``audit_model`` reports it."""
    for sub_name, sub in mixer.named_modules():
        hub_kernel = sub_name != "" and "_kernel_repo" in sub.__dict__ and not hasattr(sub, "_hf_hook")
        if not hub_kernel and (hasattr(sub, "_hf_hook") or "forward" in sub.__dict__):
            where = f"{name}.{sub_name}" if sub_name else name
            raise ValueError(f"{where}: expected a module without accelerate hooks or a forward set on the instance, "
                             f"got one (accelerate adds them for a device_map over several devices, for offloading "
                             f"and for some quantizers); the ordered mixer reads its weights itself: load the model "
                             f"on one device (device_map=None, or a single device) before convert_to_ordered")


def hf_mixer_family(module: nn.Module) -> Optional[str]:
    """The family of a supported ``transformers`` mixer (``"mamba2"``, ``"bamba"``, ...), else None. The class
    itself must match (not a subclass, which may change the forward). Imports nothing."""
    cls = type(module)
    return HF_MIXERS.get((cls.__module__, cls.__name__))


def _transformers_version() -> str:
    import sys

    mod = sys.modules.get("transformers")
    return getattr(mod, "__version__", "unknown") if mod is not None else "not imported"


def _version_tuple(v: str):
    return tuple(int(p) for p in re.findall(r"\d+", v)[:2])


def _pin_command() -> str:
    lo, hi = SUPPORTED_TRANSFORMERS
    major, minor = _version_tuple(hi)
    return f"pip install 'transformers>={lo},<{major}.{minor + 1}'"


def check_transformers_version() -> str:
    """The imported ``transformers`` version, if within :data:`SUPPORTED_TRANSFORMERS` (the newest one's patch
    releases included); else ``RuntimeError``, one line naming the supported range and the command to pin it."""
    v = _transformers_version()
    lo, hi = SUPPORTED_TRANSFORMERS
    try:
        have = _version_tuple(v)
        if len(have) != 2:
            raise ValueError(v)
    except ValueError:
        raise RuntimeError(f"transformers: expected a version from {lo} to {hi}, got {v}; install a supported one: "
                           f"{_pin_command()}") from None
    if have > _version_tuple(hi):
        raise RuntimeError(f"transformers {v} is newer than {hi}, the newest version ordered-ssd is tested with (its "
                           f"mixers may compute something else); pin a tested one: {_pin_command()}")
    if have < _version_tuple(lo):
        raise RuntimeError(f"transformers {v} is older than {lo}, the oldest version ordered-ssd supports; install a "
                           f"supported one: {_pin_command()}")
    return v


def _forward_params(cls) -> tuple:
    """The names of ``cls.forward``'s parameters after ``self`` (``**kwargs`` as such), through the decorators'
    ``__wrapped__`` (``deprecate_kwarg``, hub kernels' ``use_kernelized_func``)."""
    sig = inspect.signature(cls.forward)
    names = []
    for p in list(sig.parameters.values())[1:]:
        names.append(("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else "") + p.name)
    return tuple(names)


def _norm_spec(norm: nn.Module, name: str, d_ssm: int):
    """``(group_size, eps, norm_before_gate)`` of a gated norm, read off the instance and then proven by running it:
    the norm's own forward on a probe (channels scaled over three orders of magnitude, so that normalising over
    other groups, or gating on the other side, is off by far more than rounding) must equal the gated RMSNorm of
    those values, else the norm is refused. A norm whose weight is not materialised (meta) is read, not run."""
    cls = type(norm).__name__
    if cls not in _GATED_NORMS:
        raise ValueError(f"{name}.norm: expected one of the gated norms {sorted(_GATED_NORMS)} or (FalconH1) "
                         f"nn.Identity, got {cls}; this mixer cannot be converted")
    if hasattr(norm, "group_size"):
        group = int(norm.group_size)
    elif hasattr(norm, "n_groups"):
        group = d_ssm // int(norm.n_groups) if int(norm.n_groups) > 0 else 0
    else:
        group = d_ssm
    if group < 1 or d_ssm % group != 0:
        raise ValueError(f"{name}.norm: expected a group size dividing intermediate_size={d_ssm}, got {group}")
    before = bool(getattr(norm, "norm_before_gate", False))
    eps = float(norm.variance_epsilon)
    w = norm.weight
    if w.device.type == "meta":
        return group, eps, before
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, 3, d_ssm, generator=g, dtype=torch.float64) * torch.logspace(
        -1.5, 1.5, d_ssm, dtype=torch.float64)[torch.randperm(d_ssm, generator=g)]
    z = torch.randn(2, 3, d_ssm, generator=g, dtype=torch.float64)
    with torch.no_grad():
        got = norm(y.to(w.dtype).to(w.device), z.to(w.dtype).to(w.device)).to("cpu", torch.float64)
        want = reference_gated_rmsnorm(y.to(w.dtype).double(), z.to(w.dtype).double(), w.detach().to("cpu").double(),
                                       eps, group, before)
    tol = 1e-4 if w.dtype in (torch.float32, torch.float64) else 3e-2
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item() if got.shape == want.shape else 1.0
    if not err <= tol:
        raise ValueError(f"{name}.norm ({cls}): expected the gated RMSNorm over groups of {group} channels "
                         f"({'norm, then gate' if before else 'gate, then norm'}) that its attributes describe, got "
                         f"another function (relative difference {err:.2g} on a probe); this transformers version's "
                         f"norm is not supported")
    return group, eps, before


@dataclass(frozen=True)
class _Spec:
    """What one mixer computes, read off it at conversion (the sizes, options and family-specific pieces)."""

    family: str
    d_model: int
    nheads: int
    headdim: int
    ngroups: int
    d_state: int
    d_conv: int
    d_ssm: int
    chunk_size: int
    dt_limit: tuple
    norm: str  # "gated" or "none"
    norm_group_size: int
    norm_eps: float
    norm_before_gate: bool
    in_multiplier: Optional[float]  # FalconH1's ssm_in_multiplier (None elsewhere)
    has_mup_vector: bool  # FalconH1's mup_vector buffer


def _spec_of(mixer: nn.Module, family: str) -> _Spec:
    name = f"{type(mixer).__name__}(layer_idx={getattr(mixer, 'layer_idx', None)})"
    missing = [a for a in _REQUIRED if not hasattr(mixer, a)]
    if missing:
        raise TypeError(f"{name}: expected the attributes of transformers {SUPPORTED_TRANSFORMERS[0]}'s mixer, "
                        f"missing {missing}")
    if mixer.activation not in ("silu", "swish"):
        raise ValueError(f"{name}: activation: expected 'silu' (the only activation of the native conv kernels), "
                         f"got {mixer.activation!r}; this model cannot be converted")
    if type(mixer.conv1d) is not nn.Conv1d:
        raise TypeError(f"{name}.conv1d: expected a torch.nn.Conv1d, got {type(mixer.conv1d).__name__}")
    H, P, G, N = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    d_ssm = mixer.intermediate_size
    if H * P != d_ssm:
        raise ValueError(f"{name}: expected num_heads * head_dim == intermediate_size, got {H} * {P} != {d_ssm}")
    if H % G != 0:
        raise ValueError(f"{name}: n_groups: expected a divisor of num_heads={H}, got {G}")
    conv_dim = d_ssm + 2 * G * N
    if tuple(mixer.conv1d.weight.shape) != (conv_dim, 1, mixer.conv_kernel_size):
        raise ValueError(f"{name}.conv1d.weight: expected shape {(conv_dim, 1, mixer.conv_kernel_size)}, "
                         f"got {tuple(mixer.conv1d.weight.shape)}")
    _check_no_hooks(mixer, name)
    limit = mixer.time_step_limit
    try:
        lo, hi = (float(v) for v in limit)
    except (TypeError, ValueError):
        lo = hi = float("nan")
    if not lo <= hi:
        raise ValueError(f"{name}: time_step_limit: expected a (min, max) pair with min <= max (the clamp of dt), "
                         f"got {limit!r}")
    params = _forward_params(type(mixer))
    if params not in _FORWARD_PARAMS:
        raise TypeError(f"{name}.forward: expected the parameters {_FORWARD_PARAMS[1]} (or 'cache_params' for "
                        f"'cache', before transformers 5.24), got {params}; this transformers version's mixer is "
                        f"not supported")
    norm = mixer.norm
    norm_before_gate = False
    if isinstance(norm, nn.Identity):
        if family != "falcon_h1":
            raise ValueError(f"{name}.norm: expected a gated RMSNorm, got nn.Identity (only FalconH1 has no norm)")
        kind, group, eps = "none", d_ssm, 0.0
    else:
        kind = "gated"
        group, eps, norm_before_gate = _norm_spec(norm, name, d_ssm)
    in_mult, has_mup = None, False
    if family == "falcon_h1":
        in_mult = float(mixer.ssm_in_multiplier)
        mup = getattr(mixer, "mup_vector", None)
        if mup is not None:
            width = mixer.in_proj.weight.shape[0]
            if tuple(mup.shape) != (1, 1, width):
                raise ValueError(f"{name}.mup_vector: expected shape (1, 1, {width}), got {tuple(mup.shape)}")
            has_mup = True
    return _Spec(family=family, d_model=mixer.in_proj.weight.shape[1], nheads=H, headdim=P, ngroups=G, d_state=N,
                 d_conv=mixer.conv_kernel_size, d_ssm=d_ssm, chunk_size=int(mixer.chunk_size), dt_limit=(lo, hi),
                 norm=kind, norm_group_size=group, norm_eps=eps, norm_before_gate=norm_before_gate,
                 in_multiplier=in_mult, has_mup_vector=has_mup)
