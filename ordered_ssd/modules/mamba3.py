"""``OrderedMamba3``: a drop-in for ``mamba_ssm.modules.mamba3.Mamba3`` (single-input single-output) with ordered
gradients.

Same constructor arguments and defaults as mamba-ssm 2.3.2.post1's ``Mamba3``, the same parameter names, shapes,
dtypes and initialisation (the same random draws, in the same order), the same public attributes; ``state_dict``
loads both ways with ``strict=True``. This module does not import mamba-ssm.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .. import _checks
from ..reference.mamba3 import (Mamba3Dims, Mamba3Params, Mamba3States, ordered_reference_mamba3,
                                reference_mamba3_layer, reference_mamba3_step)
from . import _decode
from .mamba2 import GatedRMSNorm, cuda_path_available

__all__ = ["OrderedMamba3"]

_REFERENCE_DTYPES = (torch.float32, torch.float64)
_CUDA_DTYPES = _checks.CUDA_DTYPES
_BACKENDS = (None, "cuda", "reference")
_ROPE_FRACTIONS = (0.5, 1.0)


class OrderedMamba3(nn.Module):
    """Mamba-3 mixer layer (single-input single-output) whose gradients are bitwise reproducible.

    Constructor: exactly ``mamba_ssm.modules.mamba3.Mamba3`` (2.3.2.post1), same defaults; ``dropout``,
    ``n_layer`` and extra keyword arguments are absorbed, as upstream. ``is_mimo=True`` (the multi-input
    multi-output path, TileLang kernels upstream) raises ``NotImplementedError``: it has no ordered implementation.

    Parameters (``state_dict`` keys): ``in_proj.weight`` [2 d_inner + 2 G N + 3 H + S, d_model] (the split
    ``[z, x, B, C, dd_dt, dd_A, trap, angle]``), ``dt_bias`` [H] (fp32), ``B_bias``, ``C_bias`` [H, 1, N] (fp32,
    ones), ``B_norm.weight``, ``C_norm.weight`` [N], ``D`` [H] (fp32), ``norm.weight`` [d_inner] (with
    ``is_outproj_norm``), ``out_proj.weight`` [d_model, d_inner]; ``H = d_inner / headdim``, ``G = ngroups``,
    ``N = d_state``, ``S = num_rope_angles`` (``d_state * rope_fraction`` rounded down to even, halved).

    Raises (at construction, before any parameter is allocated): ``TypeError`` / ``ValueError`` naming the
    argument for non-int or non-positive sizes, ``d_inner = expand * d_model`` not a multiple of ``headdim``,
    ``nheads`` not a multiple of ``ngroups``, ``rope_fraction`` not 0.5 or 1.0 or giving no rotary angle, ``dt_min >
    dt_max``, a ``dtype`` that is not a floating ``torch.dtype``; ``NotImplementedError`` for ``is_mimo=True``.

    Compute path (:meth:`backend_for`): ``"cuda"`` for CUDA inputs of dtype fp32/bf16/fp16: mamba-ssm's Mamba-3
    SISO Triton kernels at pinned configurations with the cross-example sums folded in order
    (:mod:`ordered_ssd.ops.mamba3_siso`; like upstream, the scan runs in bf16 whatever the layer's dtype), the
    projections and norms of :mod:`ordered_ssd.ops`; ``"reference"`` for CPU and fp64 inputs, or where
    ``layer.backend = "reference"`` asks for it: the pure-PyTorch reference (:mod:`ordered_ssd.reference.mamba3`;
    fp32 or fp64). Never a silent fallback. The CUDA path does not take ``cu_seqlens`` yet (``NotImplementedError``).
    Set ``layer.literal = True`` to run the CUDA backward's kernels once per example (same bits, slower).
    ``torch.compile`` traces the reference path without a graph break (a ``torch.library`` custom op) and gives the
    eager bits; it refuses the CUDA path (``NotImplementedError``).

    Determinism: every parameter gradient is a fp32 (fp64 for fp64 parameters) lexical fold of per-example
    partials (example 0 first, :class:`ordered_ssd.fold.LexicalFold`), so two runs with the same inputs give the
    same bits and an example's partial does not depend on the rest of the batch. Scope: same torch build, same
    device type, on CPU the same number of threads.

    Decoding (as ``Mamba3``): :meth:`allocate_inference_cache`, :meth:`_get_states_from_cache`, :meth:`step`, and
    ``forward(..., inference_params=...)`` (a prefill at ``seqlen_offset == 0`` writes the cache, later calls run
    :meth:`step`). The cache is ``(angle_state [B, H, S], ssm_state [B, H, P, N], k_state [B, 1, H, N], v_state
    [B, H, P])``; angle and SSM states in fp32 (fp64 for a fp64 layer), ``k``/``v`` in the layer's dtype.
    """

    def __init__(
        self,
        d_model,
        d_state=128,
        expand=2,
        headdim=64,
        ngroups=1,
        rope_fraction=0.5,
        dt_min=0.001,
        dt_max=0.1,
        dt_init_floor=1e-4,
        A_floor=1e-4,
        is_outproj_norm=False,
        is_mimo=False,
        mimo_rank=4,
        chunk_size=64,
        dropout=0.0,
        layer_idx=None,
        n_layer=None,
        device=None,
        dtype=None,
        **kwargs,
    ):
        super().__init__()
        for name, value in (("d_model", d_model), ("d_state", d_state), ("expand", expand), ("headdim", headdim),
                            ("ngroups", ngroups), ("chunk_size", chunk_size)):
            _checks.check_int(name, value)
        if _checks.check_flag("is_mimo", is_mimo):
            raise NotImplementedError(
                "OrderedMamba3: is_mimo=True (the multi-input multi-output path, upstream's TileLang kernels) has no "
                "ordered implementation; construct the layer with is_mimo=False (single-input single-output)")
        _checks.check_flag("is_outproj_norm", is_outproj_norm)
        d_inner = int(expand * d_model)
        if d_inner % headdim != 0:
            raise ValueError(f"headdim: expected a divisor of d_inner = expand * d_model = {d_inner}, got {headdim}")
        nheads = d_inner // headdim
        if nheads % ngroups != 0:
            raise ValueError(f"ngroups: expected a divisor of nheads = d_inner / headdim = {nheads}, got {ngroups}")
        if isinstance(rope_fraction, bool) or rope_fraction not in _ROPE_FRACTIONS:
            raise ValueError(f"rope_fraction: expected 0.5 or 1.0 (as Mamba3), got {rope_fraction!r}")
        split = int(d_state * rope_fraction)
        split -= split % 2
        if split // 2 < 1:
            raise ValueError(f"d_state: expected at least {int(2 / rope_fraction)} with rope_fraction="
                             f"{rope_fraction} (one rotary angle), got {d_state}")
        dt_min_f = _checks.check_real("dt_min", dt_min, positive=True)
        dt_max_f = _checks.check_real("dt_max", dt_max, positive=True)
        if dt_min_f > dt_max_f:
            raise ValueError(f"dt_min: expected dt_min <= dt_max={dt_max}, got {dt_min}")
        _checks.check_real("dt_init_floor", dt_init_floor)
        _checks.check_real("A_floor", A_floor)
        _checks.check_factory(device, dtype)

        factory_kwargs = {"device": device, "dtype": dtype}
        self.d_model = d_model
        self.d_state = d_state
        self.expand = expand
        self.headdim = headdim
        self.chunk_size = chunk_size
        self.layer_idx = layer_idx
        self.A_floor = A_floor
        self.is_outproj_norm = is_outproj_norm
        self.is_mimo = False
        self.mimo_rank = 1
        self.d_inner = d_inner
        self.nheads = nheads
        self.num_bc_heads = ngroups
        self.rotary_dim_divisor = int(2 / rope_fraction)
        self.split_tensor_size = split
        self.num_rope_angles = split // 2

        # Parameters are created, and random numbers drawn, in the same order as in Mamba3.
        d_in_proj = 2 * d_inner + 2 * d_state * ngroups + 3 * nheads + self.num_rope_angles
        self.in_proj = nn.Linear(d_model, d_in_proj, bias=False, **factory_kwargs)

        # dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max], floored at dt_init_floor; fp32 always.
        dt = torch.exp(torch.rand(nheads, device=device, dtype=torch.float32) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min))
        dt = torch.clamp(dt, min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.dt_bias._no_weight_decay = True

        self.B_bias = nn.Parameter(1 + torch.zeros((nheads, 1, d_state), dtype=torch.float32, device=device))
        self.C_bias = nn.Parameter(1 + torch.zeros((nheads, 1, d_state), dtype=torch.float32, device=device))
        self.B_norm = GatedRMSNorm(d_state, eps=1e-5, **factory_kwargs)
        self.C_norm = GatedRMSNorm(d_state, eps=1e-5, **factory_kwargs)

        self.D = nn.Parameter(torch.ones(nheads, device=device))
        self.D._no_weight_decay = True

        if is_outproj_norm:
            self.norm = GatedRMSNorm(d_inner, eps=1e-5, norm_before_gate=True, group_size=headdim, **factory_kwargs)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False, **factory_kwargs)
        self.backend = None
        self.literal = False

    # ------------------------------------------------------------------ helpers
    @property
    def dims(self) -> Mamba3Dims:
        """The layer's sizes and constants for :mod:`ordered_ssd.reference.mamba3`."""
        return Mamba3Dims(d_model=self.d_model, d_inner=self.d_inner, headdim=self.headdim,
                          ngroups=self.num_bc_heads, d_state=self.d_state, num_rope_angles=self.num_rope_angles,
                          chunk_size=self.chunk_size, A_floor=float(self.A_floor),
                          is_outproj_norm=bool(self.is_outproj_norm), B_norm_eps=float(self.B_norm.eps),
                          C_norm_eps=float(self.C_norm.eps),
                          norm_eps=float(self.norm.eps) if self.is_outproj_norm else 1e-5)

    def layer_params(self) -> Mamba3Params:
        """The parameters as a :class:`~ordered_ssd.reference.mamba3.Mamba3Params` (the objects, not copies)."""
        return Mamba3Params(self.in_proj.weight, self.dt_bias, self.B_bias, self.C_bias, self.B_norm.weight,
                            self.C_norm.weight, self.D, self.norm.weight if self.is_outproj_norm else None,
                            self.out_proj.weight)

    def _reference_params(self, dtype: torch.dtype) -> Mamba3Params:
        return Mamba3Params(*(p if p is None or p.dtype == dtype else p.to(dtype) for p in self.layer_params()))

    def _step_params(self, dtype: torch.dtype) -> Mamba3Params:
        """:meth:`_reference_params` for decoding steps, cast once and kept until a parameter changes (its object,
        storage or in-place version: an optimizer step, ``load_state_dict``): a bf16 layer's steps on CUDA then do
        not copy ``in_proj`` at every token."""
        params = self.layer_params()
        key = (dtype, tuple(None if p is None else (id(p), p.data_ptr(), p._version) for p in params))
        cached = getattr(self, "_step_cache", None)
        if cached is None or cached[0] != key:
            cached = (key, self._reference_params(dtype))
            self._step_cache = cached
        return cached[1]

    def backend_for(self, u: torch.Tensor) -> str:
        """The compute path for ``u``: ``layer.backend`` when set (``"cuda"`` or ``"reference"``), else ``"cuda"``
        (:mod:`ordered_ssd.ops.mamba3_siso` on mamba-ssm's Triton kernels) for CUDA tensors of dtype fp32/bf16/fp16
        and ``"reference"`` for CPU or fp64 tensors.

        Raises:
            ValueError: ``layer.backend`` is not None, ``"cuda"`` or ``"reference"``; ``"cuda"`` for a non-CUDA ``u``.
            ImportError / RuntimeError: ``"cuda"`` chosen but the CUDA path cannot run here (the message gives the
                reason and ``layer.backend = "reference"`` as the explicit way out).
        """
        backend = self.backend
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected None, 'cuda' or 'reference', got {backend!r}")
        if backend is None:
            backend = "cuda" if u.device.type == "cuda" and u.dtype != torch.float64 else "reference"
        if backend == "cuda":
            if u.device.type != "cuda":
                raise ValueError(f"u: expected a CUDA tensor (layer.backend is 'cuda'), got device {u.device}")
            ok, why = cuda_path_available()
            if not ok:
                raise RuntimeError(f"OrderedMamba3: the ordered CUDA path cannot run here: {why.rstrip('.')}. "
                                   "Install the native extras as the README's GPU section says, or set "
                                   "layer.backend = 'reference' to run the pure-PyTorch reference (fp32/fp64).")
        return backend

    def _check_input(self, u: torch.Tensor, name: str = "u") -> str:
        """Check ``u`` for its path and return the path (:meth:`backend_for`)."""
        w = self.in_proj.weight
        _checks.check_tensor(name, u)
        _checks.check_int("chunk_size", self.chunk_size)  # an attribute a user may set after construction
        backend = self.backend_for(u)
        _checks.check_layer_input(u, d_model=self.d_model, dtype=w.dtype, device=w.device,
                                  allowed_dtypes=_CUDA_DTYPES if backend == "cuda" else _REFERENCE_DTYPES, name=name,
                                  backend=self.backend)
        if backend == "cuda":
            self._check_cuda_sizes()
        return backend

    def _check_cuda_sizes(self) -> None:
        """What the CUDA path needs beyond what the reference takes, before any kernel: ``d_state``, ``headdim`` and
        ``chunk_size`` powers of two >= 16 (the kernels' TMA descriptors and ``tl.dot`` tiles; upstream's wrapper
        asks for powers of two), hence an even number of rotary angles.

        Raises:
            ValueError: naming the attribute, the expected and the actual value.
        """
        for name, value in (("d_state", self.d_state), ("headdim", self.headdim), ("chunk_size", self.chunk_size)):
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name}: expected a power of two >= 16 on the CUDA path (mamba-ssm's Mamba-3 "
                                 f"kernels), got {value}; set layer.backend = 'reference' to run the reference")

    # ------------------------------------------------------------------ forward
    def forward(self, u, seq_idx=None, cu_seqlens=None, inference_params=None):
        """Apply the layer.

        Args:
            u: [B, L, d_model], the dtype and device of ``in_proj.weight``: fp32, bf16 or fp16 on the CUDA path,
                fp32 or fp64 on the reference (CUDA autocast is not supported: the input must have the weights'
                dtype).
            seq_idx: must be None: ``Mamba3`` takes packed sequences through ``cu_seqlens`` (upstream accepts
                ``seq_idx`` and ignores it; here it is refused rather than ignored).
            cu_seqlens: None or [S + 1] integer offsets of S sequences packed into one example (B == 1), strictly
                increasing from 0 to L: each sequence starts from a zero state (and writes its own cache entry in a
                prefill).
            inference_params: None or mamba-ssm's ``InferenceParams`` (needs ``layer_idx``). At ``seqlen_offset ==
                0`` the output is computed as without it and this layer's cache receives the states after the last
                position (per sequence with ``cu_seqlens``); at ``seqlen_offset > 0`` ``u`` is one token per example
                ([B, 1, d_model]) and :meth:`step` runs.

        Returns:
            Tensor [B, L, d_model].

        Raises:
            TypeError / ValueError (naming the argument) for a wrong type, rank, shape, dtype or device, a
            ``seq_idx``, a bad ``cu_seqlens``, before any computation; NotImplementedError for ``cu_seqlens`` on the
            CUDA path; ImportError / RuntimeError when the CUDA path cannot run here (:meth:`backend_for`).
        """
        if seq_idx is not None:
            raise ValueError("seq_idx: expected None (Mamba3 packs sequences through cu_seqlens; upstream ignores "
                             "seq_idx), got a tensor")
        if inference_params is not None and _decode.check_inference_params(inference_params) > 0:
            batch = cu_seqlens.shape[0] - 1 if isinstance(cu_seqlens, torch.Tensor) else u.shape[0]
            states = self._get_states_from_cache(inference_params, batch)
            out, *_ = self.step(u, *states)
            return out
        backend = self._check_input(u)
        Bsz, L, _ = u.shape
        if cu_seqlens is not None:
            _checks.check_cu_seqlens(cu_seqlens, batch=Bsz, seqlen=L, device=u.device)
        if backend == "cuda":
            if cu_seqlens is not None:
                raise NotImplementedError("OrderedMamba3: cu_seqlens on the CUDA path is not built; pass separate "
                                          "examples, or set layer.backend = 'reference'")
            cache = None if inference_params is None else self._get_states_from_cache(inference_params, Bsz)
            return self._forward_cuda(u, cache)
        params = self._reference_params(u.dtype)
        needs_grad = torch.is_grad_enabled() and (u.requires_grad or any(p is not None and p.requires_grad
                                                                         for p in params))
        if inference_params is None or needs_grad:
            out = ordered_reference_mamba3(u, params, self.dims, cu_seqlens)
        if inference_params is not None:  # a prefill: write the cache (no gradient flows into it)
            cache = self._get_states_from_cache(inference_params, Bsz if cu_seqlens is None else
                                                cu_seqlens.shape[0] - 1)
            with torch.no_grad():
                out_nograd, final = reference_mamba3_layer(u, params, self.dims, return_final_states=True,
                                                           cu_seqlens=cu_seqlens)
            cache[0].copy_(final.angle)
            cache[1].copy_(final.ssm)
            cache[2].copy_(final.k[:, None])
            cache[3].copy_(final.v)
            if not needs_grad:
                out = out_nograd
        return out

    def _forward_cuda(self, u, cache=None):
        """The layer on :mod:`ordered_ssd.ops` (as ``Mamba3.forward``, single-input single-output); with ``cache``
        (a prefill) also the states after the last position, from a forward of the kernels without backward."""
        from .. import ops
        from ..ops.mamba3_siso import (kernel_inputs, ordered_dt_softplus, ordered_mamba3_siso_combined,
                                       ordered_mamba3_siso_fwd)

        if torch.compiler.is_compiling():
            raise NotImplementedError("OrderedMamba3: torch.compile of the CUDA path is not supported yet (its "
                                      "kernels are not custom ops); compile the rest of the model and leave this "
                                      "layer eager (torch.compiler.disable), or use the reference path")

        Bsz, L, _ = u.shape
        H, P, G, N, S = self.nheads, self.headdim, self.num_bc_heads, self.d_state, self.num_rope_angles
        zxbcdt = ops.ordered_linear(u, self.in_proj.weight, None)
        z, x, Bm, C, dd_dt, dd_A, trap, angles = torch.split(
            zxbcdt, [self.d_inner, self.d_inner, G * N, G * N, H, H, H, S], dim=-1)
        A = torch.clamp(-torch.nn.functional.softplus(dd_A.to(torch.float32)), max=-self.A_floor)
        DT = ordered_dt_softplus(dd_dt, self.dt_bias)
        ADT = (A * DT).transpose(1, 2)
        DT = DT.transpose(1, 2)
        Bm = ops.ordered_gated_rmsnorm(Bm.reshape(Bsz, L * G, N), self.B_norm.weight, None, eps=self.B_norm.eps,
                                       group_size=N, norm_before_gate=True, chunk_size=self.chunk_size)
        C = ops.ordered_gated_rmsnorm(C.reshape(Bsz, L * G, N), self.C_norm.weight, None, eps=self.C_norm.eps,
                                      group_size=N, norm_before_gate=True, chunk_size=self.chunk_size)
        args = (C.reshape(Bsz, L, G, N), Bm.reshape(Bsz, L, G, N), x.reshape(Bsz, L, H, P), ADT, DT,
                trap.transpose(1, 2), self.C_bias[:, 0], self.B_bias[:, 0],
                angles.unsqueeze(-2).expand(Bsz, L, H, S).to(torch.float32), self.D)
        gate = None if self.is_outproj_norm else z.reshape(Bsz, L, H, P)
        if torch.is_grad_enabled():
            y = ordered_mamba3_siso_combined(*args, gate, self.chunk_size, literal=self.literal)
        if cache is not None or not torch.is_grad_enabled():  # one forward of the kernels, nothing stored for a
            with torch.no_grad():                              # backward; with a cache, the final states too
                res = ordered_mamba3_siso_fwd(*kernel_inputs(*args, gate), chunk_size=self.chunk_size,
                                              store_for_backward=False, return_final_states=cache is not None)
            if not torch.is_grad_enabled():
                y = res["out"]
            if cache is not None:
                cache[0].copy_(res["final_angle"])
                cache[1].copy_(res["final_ssm"])
                cache[2].copy_(res["final_k"][:, None])
                cache[3].copy_(res["final_v"])
        y = y.reshape(Bsz, L, self.d_inner)
        if self.is_outproj_norm:
            y = ops.ordered_gated_rmsnorm(y, self.norm.weight, z, eps=self.norm.eps, group_size=self.headdim,
                                          norm_before_gate=True, chunk_size=self.chunk_size)
        return ops.ordered_linear(y.to(x.dtype), self.out_proj.weight, None)

    # ------------------------------------------------------------------ decoding
    def step(self, u, angle_state, ssm_state, k_state, v_state, **kwargs):
        """One decoding step (``Mamba3.step``): ``u`` [B, d_model] (or [B, 1, d_model]) -> ``(out, angle_state,
        ssm_state, k_state, v_state)``, ``out`` of ``u``'s shape, the four states updated in place and returned.

        States as :meth:`allocate_inference_cache` makes them. Computed by
        :func:`ordered_ssd.reference.mamba3.reference_mamba3_step` (in fp32 on CUDA, the parameters cast once and
        kept while they do not change; upstream's CuTe-DSL step kernel is not used); runs without autograd. A step
        continues the forward over the same tokens: a prefill of ``L`` tokens then steps gives the outputs of one
        forward over all of them (up to rounding). Bitwise repeatable: the step has no sum across examples.

        Raises:
            TypeError / ValueError (naming the argument): ``u`` not [B, d_model] / [B, 1, d_model] of the layer's
            dtype and device; a state of another shape or device.
        """
        _checks.check_tensor("u", u)
        if u.dim() not in (2, 3) or (u.dim() == 3 and u.shape[1] != 1):
            raise ValueError(f"u: expected [B, d_model] or [B, 1, d_model] (one token per example), got "
                             f"{tuple(u.shape)}")
        u3 = u if u.dim() == 3 else u[:, None]
        backend = self._check_input(u3)
        self._check_cache((angle_state, ssm_state, k_state, v_state), u3.shape[0], u3.device)
        cd = u.dtype if backend == "reference" else torch.float32  # the CUDA step: the reference's math in fp32
        with torch.no_grad():
            states = Mamba3States(angle_state.to(cd), ssm_state.to(cd), k_state[:, 0].to(cd), v_state.to(cd))
            out, nxt = reference_mamba3_step(u3[:, 0].to(cd), self._step_params(cd), self.dims, states)
            out = out.to(u.dtype)
            angle_state.copy_(nxt.angle)
            ssm_state.copy_(nxt.ssm)
            k_state.copy_(nxt.k[:, None])
            v_state.copy_(nxt.v)
        return (out if u.dim() == 2 else out[:, None]), angle_state, ssm_state, k_state, v_state

    def _state_shapes(self, batch: int) -> dict:
        H, P, N, S = self.nheads, self.headdim, self.d_state, self.num_rope_angles
        return {"angle_state": (batch, H, S), "ssm_state": (batch, H, P, N), "k_state": (batch, 1, H, N),
                "v_state": (batch, H, P)}

    def _check_cache(self, states, batch: int, device) -> None:
        _decode.check_states(states, self._state_shapes(batch), device)

    def allocate_inference_cache(self, batch_size, max_seqlen, device=None, dtype=None, inplace_state=None, **kwargs):
        """``(angle_state [B, H, S], ssm_state [B, H, P, N], k_state [B, 1, H, N], v_state [B, H, P])``, zeros on
        ``device`` (default: the parameters'): angle and SSM states fp32 (fp64 when ``dtype``, default
        ``in_proj.weight``'s dtype, is fp64), ``k``/``v`` in ``dtype``. ``max_seqlen`` is unused (the state does
        not grow), as upstream.

        Raises:
            TypeError / ValueError: ``batch_size`` not an int >= 1; ``dtype`` not a floating torch.dtype.
        """
        _checks.check_int("batch_size", batch_size)
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise TypeError(f"dtype: expected None or a floating torch.dtype, got {dtype!r}")
        device = self.in_proj.weight.device if device is None else device
        dtype = self.in_proj.weight.dtype if dtype is None else dtype
        state_dtype = torch.promote_types(torch.float32, dtype)
        shapes = self._state_shapes(batch_size)
        return tuple(torch.zeros(shape, device=device, dtype=state_dtype if name in ("angle_state", "ssm_state")
                                 else dtype) for name, shape in shapes.items())

    def _get_states_from_cache(self, inference_params, batch_size, initialize_states=False):
        """This layer's four states in ``inference_params.key_value_memory_dict[layer_idx]``, allocated
        (:meth:`allocate_inference_cache`) on first use, zeroed with ``initialize_states``.

        Raises:
            ValueError: ``layer_idx`` is None; a cached state of another batch size. TypeError: ``inference_params``
            without ``key_value_memory_dict`` / ``seqlen_offset``.
        """
        return _decode.cached_states(
            self, inference_params, batch_size, initialize_states,
            allocate=lambda: self.allocate_inference_cache(batch_size, 0),
            check=lambda states: self._check_cache(states, batch_size, self.in_proj.weight.device))
