"""``OrderedHFMamba2Mixer``: the Mamba-2 mixer of Hugging Face ``transformers`` models, with ordered gradients.

One class serves the six families whose mixers share one forward in the supported ``transformers`` versions
(``Mamba2Mixer``, ``BambaMixer``, ``NemotronHMamba2Mixer``, ``GraniteMoeHybridMambaLayer``, ``FalconH1Mixer``,
``Zamba2MambaMixer``); what differs between them is read off the mixer when it is converted (:class:`_Spec`):
the gated norm's group size, epsilon and gate order, or no norm (FalconH1's ``mamba_rms_norm=False``), and
FalconH1's input multiplier and ``mup_vector``. A mixer whose norm, activation or attributes are not one of
these is refused, naming what is not supported.

The forward computes what the original mixer's forward computes (``transformers`` 5.17 to 5.22's
``modeling_<family>.py``, the same mixer code in those versions but for how it reads the cache), step by step:

1. ``hidden_states * attention_mask[..., None]`` (padding zeroed), times FalconH1's ``ssm_in_multiplier``;
2. ``zxbcdt = in_proj(.)``, times FalconH1's ``mup_vector``; split ``[z, xBC, dt]``;
3. causal depthwise conv1d + SiLU on ``xBC`` (from the cache's conv state when there is one), the mask again;
4. the SSD scan (``dt = clamp(softplus(dt + dt_bias), time_step_limit)``, ``A = -exp(A_log)``, ``D`` skip), from
   the cache's recurrent state when there is one, writing the final state back;
5. the gated RMSNorm ``norm(y * silu(z))`` over groups of the norm's group size (or ``y * silu(z)`` without a
   norm), then ``out_proj``.

One decoding token (a cache holding the layer's states, and one position) runs causal-conv1d's
``causal_conv1d_update`` and mamba-ssm's ``selective_state_update`` on the cache's tensors in place, as the
original does (without ``time_step_limit``, as the original's step).

Paths (as :class:`~ordered_ssd.OrderedMamba2`): on CUDA the ordered operations of :mod:`ordered_ssd.ops` on the
native kernels (the fused :func:`~ordered_ssd.ops.ordered_mamba_split_conv1d_scan_combined` where no mask acts, the
scan starts from zeros (no cache, or a prefill into it) and the norm's groups are the scan's groups; else the conv,
the scan, the norm and the projections one by one); elsewhere the pure-PyTorch reference
(:mod:`ordered_ssd.reference`, fp32/fp64) with autograd.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _checks
from ..modules.mamba2 import _cuda_path_ok, _cuda_path_status, _mark_native_check_constant
from ..reference import reference_causal_conv1d, reference_chunk_scan, reference_gated_rmsnorm
from ..reference.decode import reference_causal_conv1d_update, reference_selective_state_update

__all__ = ["OrderedHFMamba2Mixer", "HF_MIXERS", "SUPPORTED_TRANSFORMERS", "hf_mixer_family", "ordered_from_hf",
           "hf_from_ordered"]

#: The ``transformers`` versions whose mixers this module mirrors: ``>=`` the first, ``<`` the second. Their mixer
#: forward is one code, but for how it reads the cache (:func:`_cache_states`); 5.23 changed the mixers again.
SUPPORTED_TRANSFORMERS = ("5.17", "5.23")


def _cache_states(cache, layer_idx):
    """``(conv_state, recurrent_state, recording_past)`` of layer ``layer_idx`` as the installed version's mixer reads
    them: 5.21 and later through ``cache.get_conv_state`` / ``get_recurrent_state`` / ``is_recording_past`` (None
    where the layer holds no state yet), 5.17 to 5.20 through ``cache.has_previous_state`` and ``cache.layers``."""
    if hasattr(cache, "get_conv_state"):
        return (cache.get_conv_state(layer_idx, state_idx=0), cache.get_recurrent_state(layer_idx, state_idx=0),
                cache.is_recording_past(layer_idx))
    if cache.has_previous_state(layer_idx):
        layer = cache.layers[layer_idx]
        return layer.conv_states[0], layer.recurrent_states[0], layer.record_past
    return None, None, False

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

#: The gated-norm classes of those mixers: normalised over the whole width (full), over ``group_size`` channels
#: (grouped), over ``n_groups`` groups with a ``norm_before_gate`` flag (FalconH1).
_FULL_NORMS = {"MambaRMSNormGated", "BambaRMSNormGated", "GraniteMoeHybridRMSNormGated"}
_GROUP_SIZE_NORMS = {"Zamba2RMSNormGated", "Mamba2RMSNormGated", "NemotronHRMSNormGated"}
_N_GROUPS_NORMS = {"FalconH1RMSNormGated"}

#: The attributes every supported mixer has (the sizes and options its forward reads).
_REQUIRED = ("num_heads", "head_dim", "n_groups", "ssm_state_size", "conv_kernel_size", "intermediate_size",
             "chunk_size", "time_step_limit", "activation", "layer_idx", "in_proj", "conv1d", "dt_bias", "A_log",
             "D", "norm", "out_proj")

#: What nn.Module keeps in ``__dict__`` for itself, and an instance-level ``forward`` (accelerate's hooks install
#: one); every other public entry is a mixer attribute and is carried over.
_MODULE_STATE = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules", "training", "forward")


def _check_no_hooks(mixer: nn.Module, name: str) -> None:
    """accelerate's dispatch (a ``device_map`` over several devices, or offloading) wraps modules' ``forward`` to
    move weights in; the ordered path reads the weights itself, so such a model is refused, not half served."""
    for sub_name, sub in mixer.named_modules():
        if hasattr(sub, "_hf_hook") or "forward" in sub.__dict__:
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


def check_transformers_version() -> str:
    """The imported ``transformers`` version, if in :data:`SUPPORTED_TRANSFORMERS`; else ``RuntimeError``."""
    v = _transformers_version()
    lo, hi = SUPPORTED_TRANSFORMERS
    try:
        ok = _version_tuple(lo) <= _version_tuple(v) < _version_tuple(hi)
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(f"transformers: expected a version >= {lo}, < {hi} (the mixers ordered-ssd mirrors), got "
                           f"{v}; install it with: pip install 'ordered-ssd[hf]'")
    return v


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
    norm = mixer.norm
    norm_cls = type(norm).__name__
    norm_before_gate = False
    if isinstance(norm, nn.Identity):
        if family != "falcon_h1":
            raise ValueError(f"{name}.norm: expected a gated RMSNorm, got nn.Identity (only FalconH1 has no norm)")
        kind, group, eps = "none", d_ssm, 0.0
    elif norm_cls in _FULL_NORMS:
        kind, group, eps = "gated", d_ssm, float(norm.variance_epsilon)
    elif norm_cls in _GROUP_SIZE_NORMS:
        kind, group, eps = "gated", int(norm.group_size), float(norm.variance_epsilon)
    elif norm_cls in _N_GROUPS_NORMS:
        kind, group, eps = "gated", d_ssm // int(norm.n_groups), float(norm.variance_epsilon)
        norm_before_gate = bool(norm.norm_before_gate)
    else:
        raise ValueError(f"{name}.norm: expected one of the gated norms "
                         f"{sorted(_FULL_NORMS | _GROUP_SIZE_NORMS | _N_GROUPS_NORMS)} or (FalconH1) nn.Identity, "
                         f"got {norm_cls}; this mixer cannot be converted")
    if kind == "gated" and (group < 1 or d_ssm % group != 0):
        raise ValueError(f"{name}.norm: expected a group size dividing intermediate_size={d_ssm}, got {group}")
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


class OrderedHFMamba2Mixer(nn.Module):
    """The Mamba-2 mixer of a ``transformers`` model, with ordered gradients (see the module docstring).

    Built by :func:`ordered_from_hf` (through :func:`ordered_ssd.convert_to_ordered`), never directly: it takes
    the original mixer's parameters, buffers and submodules (the same objects, under the same names: ``in_proj``,
    ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``, ``out_proj``, FalconH1's ``mup_vector``) and its other
    attributes (``layer_idx``, ``num_heads``, ``config``, ...), so ``state_dict`` keys, values and dtypes are
    unchanged and an optimizer built before the conversion keeps working.

    ``forward(hidden_states, cache_params=None, attention_mask=None, **kwargs)`` as the original:

    * ``hidden_states`` [B, L, hidden_size]: fp32/bf16/fp16 on CUDA, fp32/fp64 elsewhere, the dtype of
      ``in_proj.weight`` (any of those under CUDA autocast);
    * ``attention_mask`` [B, L] of 0/1 (padding positions zeroed before ``in_proj`` and after the conv) or None;
    * ``cache_params``: the model's cache object (prefill writes the conv and recurrent states, a one-token call
      after it decodes from them in place);
    * packed sequences (padding-free batches, B == 1): ``seq_idx`` [1, L] int (``DataCollatorWithFlattening(
      return_seq_idx=True)``), or ``cu_seq_lens_q`` [S + 1] (``return_flash_attn_kwargs=True``), from which
      ``seq_idx`` is made on the device; the conv and the scan do not cross a sequence boundary. Other keyword
      arguments are ignored, as the original ignores those its kernels do not take.

    Returns [B, L, hidden_size] in the dtype of ``hidden_states``.

    Raises (before any kernel): ``TypeError`` / ``ValueError`` naming the argument for a wrong rank, width,
    dtype or device of ``hidden_states``, a ``seq_idx`` / ``cu_seq_lens_q`` of the wrong shape, dtype or device,
    ``attention_mask`` not [B, L], packed sequences continuing from ``cache_params``; ``NotImplementedError`` for a
    one-token step from the cache in training mode with autograd on (the step runs without autograd, as
    ``OrderedMamba2.step``: use ``model.eval()``); ``ImportError`` / ``RuntimeError`` on CUDA without the native
    extras (never a silent fallback; ``mixer.backend = "reference"`` asks for the reference explicitly). At
    conversion, a mixer dispatched by accelerate (hooks on it or its submodules) or without a ``(min, max)``
    ``time_step_limit`` is refused.

    Determinism: on CUDA every gradient of a shared parameter (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``,
    ``D``, ``norm.weight``, ``out_proj``) is an fp32 fold of per-example partials in the documented order
    (``docs/native.md``), and every native launch is pinned, so repeated runs give the same bits; a projection
    wrapped by another module (e.g. a PEFT LoRA layer) is called as that module, whose own gradients are torch's.
    Decoding steps have no cross-program sums. Scope as ``docs/guarantees.md``; the rest of the model (attention,
    MLP, embeddings) must be deterministic too (``docs/convert.md``).
    """

    #: Which path ``forward`` takes: None (CUDA tensors of fp32/bf16/fp16 -> "cuda", else "reference").
    backend = None

    def __init__(self):  # pragma: no cover - guarded: use ordered_from_hf
        raise TypeError("OrderedHFMamba2Mixer: build it from a transformers mixer with ordered_ssd.convert_to_ordered("
                        "model) (or ordered_ssd.hf.ordered_from_hf(mixer)), not directly")

    # ------------------------------------------------------------------ forward
    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
        spec = self._ordered_spec
        u = hidden_states
        backend = self._backend_for(u)
        autocast = u.device.type == "cuda" and torch.is_autocast_enabled("cuda")
        w = self.in_proj.weight
        _checks.check_layer_input(u, d_model=spec.d_model, dtype=None if autocast else w.dtype, device=w.device,
                                  allowed_dtypes=_checks.CUDA_DTYPES if backend == "cuda" else (torch.float32,
                                                                                                torch.float64),
                                  name="hidden_states", backend=self.backend)
        Bsz, L, _ = u.shape
        mask = self._check_mask(attention_mask, Bsz, L, u.device)
        seq_idx = self._packed_seq_idx(kwargs, Bsz, L, u.device)
        cache = cache_params
        conv_state, ssm_state, recording = _cache_states(cache, self.layer_idx) if cache is not None else (None,) * 3
        use_prev = ssm_state is not None
        if use_prev and seq_idx is not None:
            raise ValueError("seq_idx / cu_seq_lens_q: packed sequences continuing from cache_params are not "
                             "supported (the cache holds one state per row, of the last sequence); prefill or train "
                             "a packed batch from an empty cache, or with use_cache=False")
        if use_prev and L == 1:  # the original's recurrent form (its conv through the cache while it records past)
            if self.training and torch.is_grad_enabled():
                raise NotImplementedError(f"{type(self).__name__}: a one-token step from cache_params in training "
                                          "mode (the step runs without autograd, as OrderedMamba2.step); call "
                                          "model.eval(), or train on whole sequences")
            return self._decode_step(u, mask, cache, conv_state, ssm_state, backend, conv_through_cache=recording)
        return self._forward_seq(u, mask, seq_idx, cache, ssm_state, backend)

    def _backend_for(self, u) -> str:
        _checks.check_tensor("hidden_states", u)
        backend = self.backend
        if backend not in (None, "cuda", "reference"):
            raise ValueError(f"backend: expected None, 'cuda' or 'reference', got {backend!r}")
        if backend is None:
            backend = "cuda" if u.device.type == "cuda" and u.dtype != torch.float64 else "reference"
        if backend == "cuda":
            if u.device.type != "cuda":
                raise ValueError(f"hidden_states: expected a CUDA tensor (mixer.backend is 'cuda'), got device "
                                 f"{u.device}")
            if not _cuda_path_ok():
                _, why, exc = _cuda_path_status()
                raise exc(f"{type(self).__name__}: the ordered CUDA path cannot run here: {why}. Install the native "
                          "extras as the README's GPU section says, or set mixer.backend = 'reference' to run the "
                          "pure-PyTorch reference (fp32/fp64, slow) on this device.")
        return backend

    @staticmethod
    def _check_mask(mask, Bsz, L, device):
        if mask is None:
            return None
        _checks.check_tensor("attention_mask", mask)
        if mask.dim() != 2 or tuple(mask.shape) != (Bsz, L):
            raise ValueError(f"attention_mask: expected a 2-d tensor [B, L] = [{Bsz}, {L}] of 0/1 (the model's "
                             f"recurrent mask), got shape {tuple(mask.shape)}")
        if mask.device != device:
            raise ValueError(f"attention_mask: expected device {device}, got {mask.device}")
        return mask

    @staticmethod
    def _packed_seq_idx(kwargs, Bsz, L, device):
        seq_idx = kwargs.get("seq_idx")
        if seq_idx is not None:
            _checks.check_seq_idx(seq_idx, batch=Bsz, seqlen=L, device=device)
            return seq_idx.to(torch.int32)
        cu = kwargs.get("cu_seq_lens_q")
        if cu is None:
            return None
        _checks.check_tensor("cu_seq_lens_q", cu)
        if cu.dim() != 1 or cu.shape[0] < 2 or cu.dtype.is_floating_point or cu.dtype == torch.bool:
            raise ValueError(f"cu_seq_lens_q: expected a 1-d integer tensor of S + 1 >= 2 offsets, got shape "
                             f"{tuple(cu.shape)} dtype {cu.dtype}")
        if Bsz != 1:
            raise ValueError(f"cu_seq_lens_q: expected a padding-free batch (B == 1, the sequences packed along L), "
                             f"got B = {Bsz}")
        if cu.device != device:
            raise ValueError(f"cu_seq_lens_q: expected device {device}, got {cu.device}")
        pos = torch.arange(L, device=device, dtype=cu.dtype)
        return torch.bucketize(pos, cu[1:].contiguous(), right=True).to(torch.int32).unsqueeze(0)

    # ------------------------------------------------------------------ pieces
    def _project_in(self, u, mask, backend):
        spec = self._ordered_spec
        if mask is not None:
            u = (u * mask[:, :, None]).to(u.dtype)
        if spec.in_multiplier is not None:
            u = u * spec.in_multiplier
        if backend == "cuda" and type(self.in_proj) is nn.Linear:
            from .. import ops

            zxbcdt = ops.ordered_linear(u, self.in_proj.weight, self.in_proj.bias)
        else:
            zxbcdt = self.in_proj(u)
        if spec.has_mup_vector:
            zxbcdt = zxbcdt * self.mup_vector
        return zxbcdt

    def _project_out(self, y, dtype, backend):
        y = y.to(dtype)
        if backend == "cuda" and type(self.out_proj) is nn.Linear:
            from .. import ops

            return ops.ordered_linear(y, self.out_proj.weight, self.out_proj.bias)
        return self.out_proj(y)

    def _A(self, backend, dtype):
        if backend == "cuda":
            from .. import ops

            return ops.ordered_A_from_log(self.A_log)
        return -torch.exp(self.A_log.to(torch.float64 if dtype == torch.float64 else torch.float32))

    def _fused_ok(self, mask, use_prev) -> bool:
        """The fused op computes the layer from ``zxbcdt`` when no mask acts between the conv and the scan, the scan
        starts from zeros, and the norm's groups are the scan's groups."""
        spec = self._ordered_spec
        return (mask is None and not use_prev and
                (spec.norm == "none" or spec.norm_group_size == spec.d_ssm // spec.ngroups))

    def _forward_seq(self, u, mask, seq_idx, cache, initial, backend):
        use_prev = initial is not None
        spec = self._ordered_spec
        H, P, G, N = spec.nheads, spec.headdim, spec.ngroups, spec.d_state
        Bsz, L, _ = u.shape
        dtype = u.dtype
        zxbcdt = self._project_in(u, mask, backend)
        conv_w = self.conv1d.weight.squeeze(1)
        if backend == "cuda":
            self._check_cuda_path(Bsz, L)
            if self._fused_ok(mask, use_prev):
                from .. import ops

                if cache is not None:  # a prefill: the cache keeps the last d_conv conv inputs, as the original's
                    xBC = zxbcdt[..., spec.d_ssm:2 * spec.d_ssm + 2 * G * N]
                    cache.update_conv_state(xBC.transpose(1, 2), self.layer_idx, conv_kernel_size=spec.d_conv)
                plain_out = type(self.out_proj) is nn.Linear
                y = ops.ordered_mamba_split_conv1d_scan_combined(
                    zxbcdt, conv_w, self.conv1d.bias, self.dt_bias, self._A(backend, dtype), D=self.D,
                    chunk_size=spec.chunk_size, seq_idx=seq_idx, dt_limit=spec.dt_limit, activation="silu",
                    rmsnorm_weight=self.norm.weight if spec.norm == "gated" else None, rmsnorm_eps=spec.norm_eps,
                    outproj_weight=self.out_proj.weight if plain_out else None,
                    outproj_bias=self.out_proj.bias if plain_out else None, headdim=P, ngroups=G,
                    norm_before_gate=spec.norm_before_gate, return_final_states=cache is not None)
                if cache is not None:
                    y, final = y
                    cache.update_recurrent_state(final, layer_idx=self.layer_idx)
                return y if plain_out else self.out_proj(y.to(dtype))
        z, xBC, dt = torch.split(zxbcdt, [spec.d_ssm, spec.d_ssm + 2 * G * N, H], dim=-1)
        xBC = self._conv(xBC, conv_w, seq_idx, cache, use_prev, backend)
        if mask is not None:
            xBC = (xBC * mask[:, :, None]).to(xBC.dtype)
        x, B, C = torch.split(xBC, [spec.d_ssm, G * N, G * N], dim=-1)
        z_gate = z.reshape(Bsz, L, H, P) if spec.norm == "none" else None
        kw = dict(D=self.D, z=z_gate, dt_bias=self.dt_bias, dt_softplus=True, dt_limit=spec.dt_limit, seq_idx=seq_idx,
                  initial_states=initial, return_final_states=cache is not None)
        args = (x.reshape(Bsz, L, H, P), dt, self._A(backend, dtype), B.reshape(Bsz, L, G, N),
                C.reshape(Bsz, L, G, N), spec.chunk_size)
        if backend == "cuda":
            from .. import ops

            y = ops.ordered_mamba_chunk_scan_combined(*args, **kw)
        else:
            y = reference_chunk_scan(*args, **kw)
        if cache is not None:
            y, final = y
            cache.update_recurrent_state(final, layer_idx=self.layer_idx)
        y = y.reshape(Bsz, L, spec.d_ssm)
        y = self._gate(y, z, backend)
        return self._project_out(y, dtype, backend)

    def _conv(self, xBC, conv_w, seq_idx, cache, use_prev, backend):
        """Causal conv1d + SiLU of ``xBC`` [B, L, C]; with a cache, its conv state is updated, and the conv starts
        from it when it holds earlier inputs (``use_prev``; at a prefill it returns ``xBC`` zero-padded on the left,
        which the conv does by itself)."""
        L = xBC.shape[1]
        if cache is not None:  # the model's cache keeps the last d_conv inputs and returns them with the new ones
            full = cache.update_conv_state(xBC.transpose(1, 2), self.layer_idx,
                                           conv_kernel_size=self._ordered_spec.d_conv)
            if use_prev:
                xBC = full.transpose(1, 2)
        if backend == "cuda":
            from .. import ops

            out = ops.ordered_causal_conv1d(xBC.transpose(1, 2), conv_w, self.conv1d.bias, seq_idx=seq_idx,
                                            activation="silu").transpose(1, 2)
        else:
            out = reference_causal_conv1d(xBC, conv_w, self.conv1d.bias, seq_idx, activation="silu")
        return out[:, -L:]

    def _gate(self, y, z, backend):
        spec = self._ordered_spec
        if spec.norm == "none":  # the gate was applied in the scan
            return y
        if backend == "cuda":
            from .. import ops

            return ops.ordered_gated_rmsnorm(y, self.norm.weight, z, eps=spec.norm_eps,
                                             group_size=spec.norm_group_size,
                                             norm_before_gate=spec.norm_before_gate, chunk_size=spec.chunk_size)
        return reference_gated_rmsnorm(y, z, self.norm.weight.to(y.dtype), spec.norm_eps, spec.norm_group_size,
                                       spec.norm_before_gate)

    def _check_cuda_path(self, batch, seqlen):
        spec = self._ordered_spec
        _checks.check_conv_width("conv_kernel_size", spec.d_conv)
        _checks.check_cuda_path_sizes(batch=batch, seqlen=seqlen, nheads=spec.nheads, headdim=spec.headdim,
                                      dstate=spec.d_state, chunk_size=spec.chunk_size,
                                      zxbcdt_width=self.in_proj.weight.shape[0])

    @torch.no_grad()
    def _decode_step(self, u, mask, cache, conv_state, ssm_state, backend, conv_through_cache=False):
        """One token from the cache's states (updated in place), as the original's recurrent form. With
        ``conv_through_cache`` (the cache records past states, for assisted decoding) the conv input goes through
        ``cache.update_conv_state`` and the conv runs over what it returns, as the original does then."""
        spec = self._ordered_spec
        H, P, G, N = spec.nheads, spec.headdim, spec.ngroups, spec.d_state
        Bsz = u.shape[0]
        dtype = u.dtype
        zxbcdt = self._project_in(u, mask, backend)[:, 0]
        z, xBC, dt = torch.split(zxbcdt, [spec.d_ssm, spec.d_ssm + 2 * G * N, H], dim=-1)
        conv_w = self.conv1d.weight.squeeze(1)
        z_gate = z.reshape(Bsz, H, P) if spec.norm == "none" else None
        if conv_through_cache:
            xBC = self._conv(xBC[:, None], conv_w, None, cache, True, backend)[:, 0]
        if backend == "cuda":
            from .. import ops

            if not conv_through_cache:
                if conv_state.dtype != xBC.dtype:
                    raise TypeError(f"cache_params conv state: expected dtype {xBC.dtype} (causal-conv1d's update "
                                    f"kernel), got {conv_state.dtype}")
                xBC = ops.ordered_causal_conv1d_update(xBC, conv_state, conv_w, self.conv1d.bias, "silu")
        elif not conv_through_cache:
            xBC = reference_causal_conv1d_update(xBC, conv_state, conv_w, self.conv1d.bias, "silu")
        if mask is not None:  # the model passes no mask for one token; a caller's mask acts as in the original
            xBC = (xBC * mask[:, -1:]).to(xBC.dtype)
        x, B, C = torch.split(xBC, [spec.d_ssm, G * N, G * N], dim=-1)
        if backend == "cuda":
            from .. import ops

            update = ops.ordered_selective_state_update
        else:
            update = reference_selective_state_update
        y = update(ssm_state, x.reshape(Bsz, H, P), dt, self._A(backend, dtype), B.reshape(Bsz, G, N),
                   C.reshape(Bsz, G, N), D=self.D, z=z_gate, dt_bias=self.dt_bias, dt_softplus=True)
        y = y.reshape(Bsz, 1, spec.d_ssm)
        y = self._gate(y, z[:, None], backend)
        return self._project_out(y, dtype, backend)

    def extra_repr(self) -> str:
        s = self._ordered_spec
        return (f"family={s.family}, layer_idx={self.layer_idx}, heads={s.nheads}, headdim={s.headdim}, "
                f"ngroups={s.ngroups}, d_state={s.d_state}, chunk_size={s.chunk_size}, norm={s.norm}"
                + (f"(group_size={s.norm_group_size})" if s.norm == "gated" else ""))


def ordered_from_hf(mixer: nn.Module) -> OrderedHFMamba2Mixer:
    """An :class:`OrderedHFMamba2Mixer` holding ``mixer``'s parameters, buffers, submodules and attributes (the
    same objects); ``mixer`` is kept (unregistered) for :func:`hf_from_ordered`.

    Raises:
        TypeError: ``mixer`` is not a supported mixer class (:data:`HF_MIXERS`), or lacks its attributes.
        ValueError: a norm, activation or shape the ordered path does not implement (naming it).
        RuntimeError: the imported ``transformers`` is not of :data:`SUPPORTED_TRANSFORMERS`.
    """
    family = hf_mixer_family(mixer)
    if family is None:
        raise TypeError(f"mixer: expected one of the transformers mixers {sorted(c for _, c in HF_MIXERS)}, got "
                        f"{type(mixer).__module__}.{type(mixer).__name__}")
    check_transformers_version()
    spec = _spec_of(mixer, family)
    new = OrderedHFMamba2Mixer.__new__(OrderedHFMamba2Mixer)
    nn.Module.__init__(new)
    for key, value in mixer.__dict__.items():
        if key not in _MODULE_STATE and not key.startswith("_") or key in ("_is_hf_initialized",):
            new.__dict__[key] = value
    new._parameters = dict(mixer._parameters)
    new._buffers = dict(mixer._buffers)
    new._non_persistent_buffers_set = set(mixer._non_persistent_buffers_set)
    new._modules = dict(mixer._modules)
    new.training = mixer.training
    new.__dict__["_ordered_spec"] = spec
    new.__dict__["_hf_original"] = mixer
    if torch.cuda.is_available():
        _mark_native_check_constant()
    return new


def hf_from_ordered(new: OrderedHFMamba2Mixer) -> nn.Module:
    """The original mixer of ``new``, given ``new``'s current parameters, buffers, submodules and mode (so what
    was trained or loaded after the conversion is kept)."""
    if type(new) is not OrderedHFMamba2Mixer:
        raise TypeError(f"mixer: expected an OrderedHFMamba2Mixer, got {type(new).__name__}")
    orig = new.__dict__["_hf_original"]
    orig._parameters = dict(new._parameters)
    orig._buffers = dict(new._buffers)
    orig._non_persistent_buffers_set = set(new._non_persistent_buffers_set)
    orig._modules = dict(new._modules)
    orig.train(new.training)
    return orig
