"""``OrderedMamba2``: a drop-in for ``mamba_ssm.modules.mamba2.Mamba2`` with ordered gradients.

Same constructor arguments and defaults as mamba-ssm 2.3.2.post1's ``Mamba2``, the same parameter
names, shapes, dtypes and initialisation (the same random draws, in the same order), the same
public attributes; ``state_dict`` loads both ways with ``strict=True``. This module does not
import mamba-ssm.
"""
from __future__ import annotations

import math
import torch
import torch.nn as nn

from .. import _checks
from ..reference import (Mamba2Dims, Mamba2Params, ordered_reference_mamba2, reference_conv_state,
                         reference_gated_rmsnorm, reference_mamba2_layer)
from . import _decode, _parity
from ._layout import pad_to_multiple, sequence_rows

__all__ = ["OrderedMamba2", "GatedRMSNorm", "cuda_path_available"]

_REFERENCE_DTYPES = (torch.float32, torch.float64)
_CUDA_DTYPES = _checks.CUDA_DTYPES
_BACKENDS = (None, "cuda", "reference")
_cuda_status = None


def _cuda_path_status():
    global _cuda_status
    if _cuda_status is None:
        if not torch.cuda.is_available():
            _cuda_status = (False, "no CUDA device", RuntimeError)
        else:
            try:
                import csrc_bindings

                csrc_bindings.check_native()
                _cuda_status = (True, "", None)
            except (ImportError, RuntimeError) as e:
                _cuda_status = (False, str(e), type(e))
    return _cuda_status


def cuda_path_available():
    """``(True, "")`` if the ordered CUDA path can run here (a CUDA device, triton, mamba-ssm 2.3.2.post1 and
    causal-conv1d 1.7.0 with the expected kernel signatures), else ``(False, reason)``. Checked once per process."""
    return _cuda_path_status()[:2]


def _cuda_path_ok() -> bool:
    """``_cuda_path_status()[0]``; a constant for ``torch.compile`` once :func:`_mark_native_check_constant` ran
    (dynamo then calls it instead of tracing the first-use import and version check of the native extras)."""
    return _cuda_path_status()[0]


def _mark_native_check_constant() -> None:
    """Mark :func:`_cuda_path_ok` with ``torch.compiler.assume_constant_result`` (idempotent). Called by
    ``OrderedMamba2.__init__`` where CUDA is available, not at import: the mark imports ``torch._dynamo`` (seconds),
    and off CUDA ``backend_for`` never reaches the check."""
    if not getattr(_cuda_path_ok, "_ordered_ssd_marked", False):
        torch.compiler.assume_constant_result(_cuda_path_ok)
        _cuda_path_ok._ordered_ssd_marked = True


class GatedRMSNorm(nn.Module):
    """Parameter holder with the layout of mamba-ssm's ``layernorm_gated.RMSNorm``.

    ``weight`` [hidden_size] initialised to ones; ``bias`` registered as None; ``eps``,
    ``group_size``, ``norm_before_gate`` as attributes. ``OrderedMamba2`` applies it inside its
    fused layer function; calling it directly computes the reference gated RMSNorm.
    """

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def forward(self, x, z=None):
        group = self.group_size if self.group_size is not None else x.shape[-1]
        return reference_gated_rmsnorm(x, z, self.weight, self.eps, group, self.norm_before_gate)


class OrderedMamba2(nn.Module):
    """Mamba-2 mixer layer whose gradients are bitwise reproducible.

    Constructor: exactly ``mamba_ssm.modules.mamba2.Mamba2`` (2.3.2.post1), same defaults.
    ``process_group`` (tensor parallelism) is not supported and raises ``NotImplementedError``;
    ``use_mem_eff_path`` is accepted and stored (both settings compute the same function).

    Parameters (``state_dict`` keys): ``in_proj.weight`` [d_in_proj, d_model] (``in_proj.bias``
    with ``bias=True``), ``conv1d.weight`` [conv_dim, 1, d_conv], ``conv1d.bias`` [conv_dim] (with
    ``conv_bias=True``), ``dt_bias`` [H], ``A_log`` [H], ``D`` [H] or [d_ssm] (``D_has_hdim``),
    ``norm.weight`` [d_ssm] (with ``rmsnorm=True``), ``out_proj.weight`` [d_model, d_inner]
    (``out_proj.bias`` with ``bias=True``); ``d_in_proj = 2 d_inner + 2 G N + H``,
    ``conv_dim = d_ssm + 2 G N``.

    Raises (at construction, before any parameter is allocated): ``TypeError`` / ``ValueError``
    naming the argument for non-int or non-positive sizes, ``d_ssm`` not a multiple of
    ``headdim`` or larger than ``d_inner``, ``nheads`` not a multiple of ``ngroups``,
    ``dt_limit`` or ``A_init_range`` with min > max (or NaN), a flag (``bias``, ``rmsnorm``, ``use_mem_eff_path``,
    ...) that is not a truth value as ``Mamba2`` takes it (a bool, 0/1, a numpy or 0-d torch bool, None), a
    ``dtype`` that is not a floating ``torch.dtype``, a ``device`` torch cannot parse or a CUDA device without CUDA.
    Any ``chunk_size >= 1`` and ``d_conv >= 1`` is accepted here; the CUDA path needs ``d_conv`` in 2..4 and checks
    it in :meth:`forward` (the constructor cannot know where the layer will run).

    Determinism: the gradients of every parameter are fp32 (fp64 for fp64 parameters) lexical
    folds of per-example partials (example 0 first, :mod:`ordered_ssd.fold`; on the reference path per sequence, a
    row or a run of ``seq_idx``, each computed alone, chunk by chunk: docs/guarantees.md, "A sequence's bits are
    its own"), so two runs with the same inputs give the same bits, and the partial of an example does not depend
    on the rest of the batch. Scope: same torch build, same device type; on CPU also the same number of threads.
    Compute path (:meth:`backend_for`): ``"cuda"`` for CUDA inputs of dtype fp32/bf16/fp16: mamba-ssm's Triton
    SSD kernels and causal-conv1d's CUDA kernels with pinned launch configurations (:mod:`ordered_ssd.ops`);
    ``"reference"`` for CPU and fp64 inputs: the pure-PyTorch reference (:mod:`ordered_ssd.reference`, fp32/fp64
    only). Never a silent fallback: on CUDA without the native extras (or with other versions) the forward raises
    ``ImportError`` / ``RuntimeError`` with the reason and the install command, unless ``layer.backend =
    "reference"`` asks for the reference explicitly (``layer.backend = None``, the default, chooses as above).
    Set ``layer.literal = True`` to run the CUDA backward with one kernel launch per example (slower, same bits:
    for tests and benchmarks).
    Set ``layer.sequence_invariant = True`` (``convert_to_ordered(..., invariant_linears=True)`` does; experimental on
    CUDA: not yet run on a GPU) for a
    sequence's canonical bits on the CUDA path too: the projections run the row-count-invariant GEMM
    (:mod:`ordered_ssd.ops.row_invariant_gemm`) instead of cuBLAS, and each run of ``seq_idx`` is computed as its own
    row (:mod:`ordered_ssd.modules._layout`; one host read per ``seq_idx`` tensor, so ``torch.compile`` breaks the
    graph there). Off by default on CUDA (cuBLAS's speed, native's bits, no host read); the reference path is
    always per sequence.
    Set ``layer.validate_seq_idx = True`` to check that ``seq_idx`` rows are non-decreasing in every forward
    (reads them on the host; off by default so that a step has no host synchronisation).
    ``torch.compile(model, fullgraph=True)`` traces the layer without a graph break (every computation is a
    ``torch.library`` custom op) and gives the eager bits; see ``docs/compile.md``.

    Decoding (as ``Mamba2``): :meth:`allocate_inference_cache`, :meth:`_get_states_from_cache`, :meth:`step` and
    ``forward(..., inference_params=...)`` (a prefill at ``seqlen_offset == 0`` writes the cache, later calls run
    :meth:`step`); the cache is ``conv_state`` [B, conv_dim, d_conv] and ``ssm_state`` [B, H, P, N]. See
    ``docs/decoding.md``. ``layer.decode_mode = "parity"`` (the reference path) decodes with the training
    forward's bits instead: every decoded position is the bits of the forward over the finished sequence
    (:mod:`ordered_ssd.modules._parity`; its own cache); ``"recurrent"`` (the default) is ``Mamba2``'s step.
    """

    def __init__(
        self,
        d_model,
        d_state=128,
        d_conv=4,
        conv_init=None,
        expand=2,
        headdim=64,
        d_ssm=None,
        ngroups=1,
        A_init_range=(1, 16),
        D_has_hdim=False,
        rmsnorm=True,
        norm_before_gate=False,
        dt_min=0.001,
        dt_max=0.1,
        dt_init_floor=1e-4,
        dt_limit=(0.0, float("inf")),
        bias=False,
        conv_bias=True,
        chunk_size=256,
        use_mem_eff_path=True,
        layer_idx=None,
        process_group=None,
        sequence_parallel=True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if process_group is not None:
            raise NotImplementedError("OrderedMamba2: process_group (tensor parallelism) is not supported; pass None")
        for name, value in (("d_model", d_model), ("d_state", d_state), ("d_conv", d_conv), ("expand", expand),
                            ("headdim", headdim), ("ngroups", ngroups), ("chunk_size", chunk_size)):
            _checks.check_int(name, value)
        d_inner = expand * d_model
        if d_ssm is None:
            if d_inner % headdim != 0:
                raise ValueError(f"headdim: expected a divisor of d_ssm = expand * d_model = {d_inner}, got {headdim}")
            d_ssm = d_inner
        _checks.check_int("d_ssm", d_ssm)
        if d_ssm > d_inner:
            raise ValueError(f"d_ssm: expected at most d_inner = expand * d_model = {d_inner}, got {d_ssm}")
        if d_ssm % headdim != 0:
            raise ValueError(f"d_ssm: expected a multiple of headdim={headdim}, got {d_ssm}")
        nheads = d_ssm // headdim
        if nheads % ngroups != 0:
            raise ValueError(f"ngroups: expected a divisor of nheads = d_ssm / headdim = {nheads}, got {ngroups}")
        a_lo, a_hi = _checks.check_range("A_init_range", A_init_range, positive=True)
        dt_min_f = _checks.check_real("dt_min", dt_min, positive=True)
        dt_max_f = _checks.check_real("dt_max", dt_max, positive=True)
        if dt_min_f > dt_max_f:
            raise ValueError(f"dt_min: expected dt_min <= dt_max={dt_max}, got {dt_min}")
        _checks.check_real("dt_init_floor", dt_init_floor)
        _checks.check_range("dt_limit", dt_limit, allow_inf_max=True)
        if conv_init is not None:
            _checks.check_real("conv_init", conv_init, positive=True)
        for name, value in (("D_has_hdim", D_has_hdim), ("rmsnorm", rmsnorm), ("norm_before_gate", norm_before_gate),
                            ("bias", bias), ("conv_bias", conv_bias), ("use_mem_eff_path", use_mem_eff_path)):
            _checks.check_flag(name, value)
        _checks.check_factory(device, dtype)

        factory_kwargs = {"device": device, "dtype": dtype}
        self.d_model = d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.conv_init = conv_init
        self.expand = expand
        self.process_group = process_group
        self.sequence_parallel = sequence_parallel
        self.world_size = 1
        self.local_rank = 0
        self.d_inner = d_inner
        self.headdim = headdim
        self.d_ssm = d_ssm
        self.ngroups = ngroups
        self.nheads = nheads
        self.D_has_hdim = D_has_hdim
        self.rmsnorm = rmsnorm
        self.norm_before_gate = norm_before_gate
        self.dt_limit = dt_limit
        self.activation = "silu"
        self.chunk_size = chunk_size
        self.use_mem_eff_path = use_mem_eff_path
        self.layer_idx = layer_idx

        # Parameters are created, and random numbers drawn, in the same order as in Mamba2.
        d_in_proj = 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads
        self.in_proj = nn.Linear(self.d_model, d_in_proj, bias=bias, **factory_kwargs)

        conv_dim = self.d_ssm + 2 * self.ngroups * self.d_state
        self.conv1d = nn.Conv1d(in_channels=conv_dim, out_channels=conv_dim, bias=conv_bias, kernel_size=d_conv,
                                groups=conv_dim, padding=d_conv - 1, **factory_kwargs)
        if self.conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -self.conv_init, self.conv_init)

        self.act = nn.SiLU()

        # dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max], floored at dt_init_floor.
        dt = torch.exp(torch.rand(self.nheads, **factory_kwargs) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min))
        dt = torch.clamp(dt, min=dt_init_floor)
        inv_dt = dt + torch.log(-torch.expm1(-dt))
        self.dt_bias = nn.Parameter(inv_dt)
        self.dt_bias._no_weight_decay = True

        A = torch.empty(self.nheads, dtype=torch.float32, device=device).uniform_(a_lo, a_hi)
        self.A_log = nn.Parameter(torch.log(A).to(dtype=dtype))
        self.A_log._no_weight_decay = True

        # As in Mamba2, D is created in fp32 whatever `dtype` is.
        self.D = nn.Parameter(torch.ones(self.d_ssm if self.D_has_hdim else self.nheads, device=device))
        self.D._no_weight_decay = True

        if self.rmsnorm:
            self.norm = GatedRMSNorm(self.d_ssm, eps=1e-5, norm_before_gate=self.norm_before_gate,
                                     group_size=self.d_ssm // ngroups, **factory_kwargs)

        self.out_proj = nn.Linear(self.d_inner, self.d_model, bias=bias, **factory_kwargs)
        self.literal = False
        self.validate_seq_idx = False
        self.sequence_invariant = False
        self.backend = None
        self.decode_mode = "recurrent"
        if torch.cuda.is_available():
            _mark_native_check_constant()

    # ------------------------------------------------------------------ helpers
    @property
    def dims(self) -> Mamba2Dims:
        """The static sizes and options as a :class:`ordered_ssd.reference.Mamba2Dims`."""
        return Mamba2Dims(
            d_model=self.d_model, d_inner=self.d_inner, d_ssm=self.d_ssm, headdim=self.headdim,
            ngroups=self.ngroups, d_state=self.d_state, d_conv=self.d_conv, chunk_size=self.chunk_size,
            dt_limit=tuple(float(v) for v in self.dt_limit), rmsnorm=self.rmsnorm,
            norm_before_gate=self.norm_before_gate, norm_eps=self.norm.eps if self.rmsnorm else 1e-5,
            D_has_hdim=self.D_has_hdim)

    def layer_params(self) -> Mamba2Params:
        """The parameters as a :class:`ordered_ssd.reference.Mamba2Params` (the tensors themselves)."""
        return Mamba2Params(
            in_proj_weight=self.in_proj.weight, in_proj_bias=self.in_proj.bias,
            conv1d_weight=self.conv1d.weight, conv1d_bias=self.conv1d.bias,
            dt_bias=self.dt_bias, A_log=self.A_log, D=self.D,
            norm_weight=self.norm.weight if self.rmsnorm else None,
            out_proj_weight=self.out_proj.weight, out_proj_bias=self.out_proj.bias)

    # ------------------------------------------------------------------ forward
    def forward(self, u, seqlen=None, seq_idx=None, cu_seqlens=None, inference_params=None):
        """Apply the layer.

        Args:
            u: [B, L, d_model] (or [B * L, d_model] with ``seqlen=L``) on the device of ``in_proj.weight``.
                Dtype: on the CUDA path fp32, bf16 or fp16, the dtype of ``in_proj.weight`` (or any of those
                under CUDA autocast, which then decides the compute dtype); on the reference path fp32 or fp64,
                the dtype of ``in_proj.weight``.
            seqlen: None, or L when ``u`` is flattened to [B * L, d_model].
            seq_idx: None or [B, L] integer ids of packed sequences, non-decreasing along L; the
                conv and the SSM state do not cross a change of id. Its shape, dtype and device are checked;
                its values only with ``self.validate_seq_idx = True`` (a host read: see
                :func:`ordered_ssd.validate_seq_idx`).
            cu_seqlens: None or [S + 1] integer offsets of S sequences packed into one example (B == 1), strictly
                increasing from 0 to L. As upstream, it matters only with ``inference_params``: the prefill then
                writes one cache entry per sequence (``seq_idx`` must mark the same sequences).
            inference_params: None or mamba-ssm's ``InferenceParams`` (``key_value_memory_dict``, ``seqlen_offset``;
                needs ``layer_idx``). At ``seqlen_offset == 0`` (prefill) the output is computed as without it (the
                non-fused path, as upstream) and this layer's cache (:meth:`_get_states_from_cache`) receives the
                conv inputs and the SSM state after the last position (per sequence with ``cu_seqlens``); at
                ``seqlen_offset > 0``, ``u`` is one token per example ([B, 1, d_model]) and :meth:`step` runs.

        Returns:
            Tensor of the shape of ``u``.

        Raises:
            TypeError / ValueError (naming the argument) for a wrong type, rank, shape, dtype or
            device, before any computation: also ``cu_seqlens`` (not a 1-d integer tensor, not from 0 to B * L,
            not strictly increasing, B != 1, ids of ``seq_idx`` changing elsewhere, or ``seq_idx`` missing with
            ``inference_params``), ``inference_params`` without ``key_value_memory_dict``/``seqlen_offset``,
            ``layer_idx`` None, a cached state of another batch size, several tokens at ``seqlen_offset > 0``. On
            the CUDA path also ValueError for ``d_conv`` outside 2..4 (causal-conv1d's kernels; the reference path
            takes any width) or an input so large that a tensor of the path would reach 2**31 elements (the
            kernels' 32-bit offsets; :func:`ordered_ssd._checks.cuda_path_sizes`). The path is never switched to
            work around either. NaN or inf in ``u`` or in a parameter are not checked; they propagate (per
            example for ``u``: ``docs/guarantees.md``).
        """
        if inference_params is not None and _decode.check_inference_params(inference_params) > 0:
            if cu_seqlens is not None:
                _checks.check_tensor("cu_seqlens", cu_seqlens)
                if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
                    raise ValueError(f"cu_seqlens: expected a 1-d tensor of S + 1 >= 2 offsets, got shape "
                                     f"{tuple(cu_seqlens.shape)}")
            u3 = u if seqlen is None else u.reshape(-1, seqlen, u.shape[-1])
            batch = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else u3.shape[0]
            if _parity.check_decode_mode(self) == "parity":
                _checks.check_tensor("hidden_states", u3)
                if u3.dim() != 3 or u3.shape[1] != 1:
                    raise ValueError(f"hidden_states: expected [B, 1, d_model] (one token per sequence), got "
                                     f"{tuple(u3.shape)}")
                backend = self.backend_for(u3)
                out = _parity.parity_step(self, u3, self._get_states_from_cache(inference_params, batch), backend)
                return out if seqlen is None else out.reshape(u.shape[0], -1)
            conv_state, ssm_state = self._get_states_from_cache(inference_params, batch)
            out, _, _ = self.step(u3, conv_state, ssm_state)
            return out if seqlen is None else out.reshape(u.shape[0], -1)
        flat = seqlen is not None
        if flat:
            _checks.check_int("seqlen", seqlen)
            _checks.check_tensor("u", u)
            if u.dim() != 2 or u.shape[0] % seqlen != 0:
                raise ValueError(f"u: with seqlen={seqlen}, expected a 2-d tensor [B * {seqlen}, d_model], "
                                 f"got shape {tuple(u.shape)}")
            u = u.reshape(u.shape[0] // seqlen, seqlen, u.shape[1])
        w = self.in_proj.weight
        _checks.check_tensor("u", u)
        _checks.check_int("chunk_size", self.chunk_size)  # an attribute a user may set after construction
        backend = self.backend_for(u)
        autocast = u.device.type == "cuda" and torch.is_autocast_enabled("cuda")
        _checks.check_layer_input(u, d_model=self.d_model, dtype=None if autocast else w.dtype, device=w.device,
                                  allowed_dtypes=self._input_dtypes(backend), backend=self.backend)
        Bsz, L, _ = u.shape
        _checks.check_seq_idx(seq_idx, batch=Bsz, seqlen=L, device=u.device, values=self.validate_seq_idx)
        if cu_seqlens is not None:
            _checks.check_cu_seqlens(cu_seqlens, batch=Bsz, seqlen=L, device=u.device, seq_idx=seq_idx)
            if inference_params is not None and seq_idx is None:
                raise ValueError("seq_idx: required with cu_seqlens and inference_params (the packed sequences must "
                                 "not see each other in the conv and the scan), got None")
        cache = None
        if inference_params is not None:
            batch = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else Bsz
            cache = self._get_states_from_cache(inference_params, batch)
            if isinstance(cache, _parity.ParityCache):  # the output is the forward's; the cache is the chunk's
                _parity.parity_prefill(self, u, seq_idx, cache, backend)
                cache = None
        if backend == "cuda":
            self._check_cuda_path(Bsz, L)
            out = self._forward_cuda(u, seq_idx, cache, cu_seqlens)
        else:
            out = self._forward_reference(u, seq_idx, cache, cu_seqlens)
        if flat:
            out = out.reshape(Bsz * L, -1)
        return out

    def backend_for(self, u: torch.Tensor) -> str:
        """The compute path for input ``u``: ``layer.backend`` when set (``"cuda"`` or ``"reference"``), else
        ``"cuda"`` (:mod:`ordered_ssd.ops` on the native kernels) for CUDA tensors of dtype fp32/bf16/fp16 and
        ``"reference"`` for CPU or fp64 tensors.

        Raises:
            ValueError: ``layer.backend`` is not None, ``"cuda"`` or ``"reference"``; ``"cuda"`` for a non-CUDA
                ``u``.
            ImportError / RuntimeError: ``"cuda"`` chosen (or asked for) but the CUDA path cannot run here (no
                CUDA device, mamba-ssm / causal-conv1d / triton missing or of other versions): the message gives
                the reason, the install command, and ``layer.backend = "reference"`` as the explicit way out.
        """
        backend = self.backend
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected None, 'cuda' or 'reference', got {backend!r}")
        if backend is None:
            backend = "cuda" if u.device.type == "cuda" and u.dtype != torch.float64 else "reference"
        if backend == "cuda":
            if u.device.type != "cuda":
                raise ValueError(f"u: expected a CUDA tensor (layer.backend is 'cuda'), got device {u.device}")
            if not _cuda_path_ok():  # a constant for torch.compile (see _mark_native_check_constant)
                _, why, exc = _cuda_path_status()
                raise exc(f"OrderedMamba2: the ordered CUDA path cannot run here: {why.rstrip('.')}. Install the "
                          "native extras as the README's GPU section says, or set layer.backend = 'reference' to "
                          "run the pure-PyTorch reference (fp32/fp64, slow) on this device.")
        return backend

    def _check_cuda_path(self, batch: int, seqlen: int) -> None:
        """What the CUDA path needs beyond what the reference accepts, checked before any kernel: ``d_conv`` in
        2..4 (causal-conv1d's widths) and every tensor under 2**31 elements (the kernels' 32-bit offsets)."""
        _checks.check_conv_width("d_conv", self.d_conv)
        _checks.check_cuda_path_sizes(batch=batch, seqlen=seqlen, nheads=self.nheads, headdim=self.headdim,
                                      dstate=self.d_state, chunk_size=self.chunk_size,
                                      zxbcdt_width=self.in_proj.weight.shape[0])

    @staticmethod
    def _input_dtypes(backend: str):
        """The input dtypes of a path: fp32/bf16/fp16 on ``"cuda"``, fp32/fp64 on ``"reference"``."""
        return _CUDA_DTYPES if backend == "cuda" else _REFERENCE_DTYPES

    def _reference_params(self, dtype: torch.dtype) -> Mamba2Params:
        """The parameters for the reference path, each cast to ``dtype`` where it differs (e.g. the fp32 ``D``)."""
        return Mamba2Params(*(p if p is None or p.dtype == dtype else p.to(dtype) for p in self.layer_params()))

    def _forward_reference(self, u, seq_idx, cache, cu_seqlens):
        params = self._reference_params(u.dtype)
        out = ordered_reference_mamba2(u, params, self.dims, seq_idx)  # each sequence's canonical bits
        if cache is not None:  # a prefill: write the cache (no gradient flows into it)
            with torch.no_grad():
                _, conv_state, ssm_state = reference_mamba2_layer(u, params, self.dims, seq_idx,
                                                                  return_states=True, cu_seqlens=cu_seqlens)
            cache[0].copy_(conv_state)
            cache[1].copy_(ssm_state)
        return out

    def _forward_cuda(self, u, seq_idx, cache=None, cu_seqlens=None):
        from .. import ops

        invariant = bool(getattr(self, "sequence_invariant", False))
        if invariant and cache is None:
            if seq_idx is not None:
                rows = sequence_rows(seq_idx, self.chunk_size)
                if rows is not None:  # each run of seq_idx its own row, in whole chunks
                    self._check_cuda_path(rows.S, rows.Lrow)  # before anything is moved
                    return rows.from_rows(self._forward_cuda(rows.to_rows(u), None))
                seq_idx = None  # one run per row: the rows are the sequences
            L = u.shape[1]
            if L % self.chunk_size:  # whole chunks, as in every layout of a sequence (_layout.pad_to_multiple)
                self._check_cuda_path(u.shape[0], -(-L // self.chunk_size) * self.chunk_size)
                return self._forward_cuda(pad_to_multiple(u, self.chunk_size), None)[:, :L].contiguous()
        seq_idx = seq_idx.to(torch.int32).contiguous() if seq_idx is not None else None
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous() if cu_seqlens is not None else None
        zxbcdt = ops.ordered_linear(u, self.in_proj.weight, self.in_proj.bias, row_invariant=invariant)
        A = ops.ordered_A_from_log(self.A_log)  # -exp(A_log.float()), opaque to inductor (eager bits when compiled)
        D = self.D.reshape(self.nheads, self.headdim) if self.D_has_hdim else self.D
        conv_w = self.conv1d.weight.reshape(self.conv1d.weight.shape[0], self.conv1d.weight.shape[2])
        if self.use_mem_eff_path and cache is None:
            out_w = None if invariant else self.out_proj.weight  # invariant: the out_proj below, row-invariant
            y = ops.ordered_mamba_split_conv1d_scan_combined(
                zxbcdt, conv_w, self.conv1d.bias, self.dt_bias, A, D=D, chunk_size=self.chunk_size, seq_idx=seq_idx,
                activation=self.activation, rmsnorm_weight=self.norm.weight if self.rmsnorm else None,
                rmsnorm_eps=self.norm.eps if self.rmsnorm else 1e-6, outproj_weight=out_w,
                outproj_bias=self.out_proj.bias if out_w is not None else None,
                headdim=None if self.D_has_hdim else self.headdim, ngroups=self.ngroups,
                norm_before_gate=self.norm_before_gate, dt_limit=self.dt_limit, literal=self.literal)
            if out_w is not None:
                return y
            return ops.ordered_linear(y, self.out_proj.weight, self.out_proj.bias, row_invariant=True)
        d_mlp = self.d_inner - self.d_ssm
        z0, x0, z, xBC, dt = torch.split(
            zxbcdt, [d_mlp, d_mlp, self.d_ssm, self.d_ssm + 2 * self.ngroups * self.d_state, self.nheads], dim=-1)
        if cache is not None:  # the prefill's conv state: the last d_conv conv inputs (per sequence with cu_seqlens)
            cache[0].copy_(reference_conv_state(xBC.detach(), self.d_conv, cu_seqlens))
        xBC = ops.ordered_causal_conv1d(xBC.transpose(1, 2), conv_w, self.conv1d.bias, seq_idx=seq_idx,
                                       activation=self.activation).transpose(1, 2)
        x, B, C = torch.split(xBC, [self.d_ssm, self.ngroups * self.d_state, self.ngroups * self.d_state], dim=-1)
        y = ops.ordered_mamba_chunk_scan_combined(
            x.reshape(*x.shape[:-1], self.nheads, self.headdim), dt, A,
            B.reshape(*B.shape[:-1], self.ngroups, self.d_state), C.reshape(*C.shape[:-1], self.ngroups, self.d_state),
            chunk_size=self.chunk_size, D=D,
            z=None if self.rmsnorm else z.reshape(*z.shape[:-1], self.nheads, self.headdim),
            dt_bias=self.dt_bias, dt_softplus=True, seq_idx=seq_idx, dt_limit=self.dt_limit, literal=self.literal,
            cu_seqlens=cu_seqlens if cache is not None else None, return_final_states=cache is not None,
            return_varlen_states=cache is not None and cu_seqlens is not None)
        if cache is not None:
            y, last_state, *rest = y
            cache[1].copy_((rest[0] if cu_seqlens is not None else last_state).detach())
        y = y.reshape(*y.shape[:-2], self.d_ssm)
        if self.rmsnorm:
            y = ops.ordered_gated_rmsnorm(y, self.norm.weight, z, eps=self.norm.eps, group_size=self.norm.group_size,
                                         norm_before_gate=self.norm_before_gate, chunk_size=self.chunk_size)
        if d_mlp > 0:
            y = torch.cat([ops.ordered_silu_mul(z0, x0), y], dim=-1)
        return ops.ordered_linear(y, self.out_proj.weight, self.out_proj.bias, row_invariant=invariant)

    # ------------------------------------------------------------------ decoding
    def step(self, hidden_states, conv_state, ssm_state):
        """One decoding step (``Mamba2.step``): ``hidden_states`` [B, 1, d_model] -> ``(out [B, 1, d_model],
        conv_state, ssm_state)``, the cache updated in place.

        ``conv_state`` [B, conv_dim, d_conv] and ``ssm_state`` [B, H, P, N] as :meth:`allocate_inference_cache` makes
        them (after a prefill through ``forward(..., inference_params=...)``). CUDA path: causal-conv1d's
        ``causal_conv1d_update`` and mamba-ssm's ``selective_state_update`` (:mod:`ordered_ssd.ops.decode`; the
        ``conv_state`` must have the dtype of ``hidden_states``), the projections and the gated RMSNorm as in the
        forward; elsewhere the reference (:func:`ordered_ssd.reference.reference_mamba2_step`). Unlike upstream,
        ``dt_limit`` is applied (so a step equals the forward over the same tokens for every setting). Runs without
        autograd: decoding is inference, and the native step kernels have no backward.

        Determinism: no kernel of a step sums across programs or examples (see :mod:`ordered_ssd.ops.decode`), so
        steps are bitwise repeatable and an example's output does not depend on the rest of the batch.

        Raises:
            TypeError / ValueError (naming the argument): ``hidden_states`` not [B, 1, d_model] of the layer's dtype
            and device; a cache tensor of another shape, device, or (CUDA) dtype.
        """
        if _parity.check_decode_mode(self) == "parity":
            raise ValueError("step: decode_mode 'parity' keeps its own cache and the position of each sequence; "
                             "decode with forward(hidden_states, inference_params=...)")
        out = _decode.step(self, hidden_states, conv_state, ssm_state)
        return out, conv_state, ssm_state

    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None, **kwargs):
        """``(conv_state [batch_size, conv_dim, d_conv], ssm_state [batch_size, H, P, N])``, zeros on the device of
        ``out_proj.weight``: ``conv_state`` a transposed view of a contiguous [B, d_conv, conv_dim] tensor in
        ``dtype`` or ``conv1d.weight``'s dtype, ``ssm_state`` in ``dtype`` or ``in_proj.weight``'s dtype (as
        ``Mamba2``). ``max_seqlen`` is unused (the state does not grow).

        Raises:
            TypeError / ValueError: ``batch_size`` not an int >= 1; ``dtype`` not a floating torch.dtype.
        """
        _checks.check_int("batch_size", batch_size)
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise TypeError(f"dtype: expected None or a floating torch.dtype, got {dtype!r}")
        if _parity.check_decode_mode(self) == "parity":
            if dtype is not None and dtype != self.in_proj.weight.dtype:
                raise TypeError(f"dtype: decode_mode 'parity' keeps its cache in the layer's dtype "
                                f"{self.in_proj.weight.dtype} (another dtype would change the bits), got {dtype}")
            return _parity.new_parity_cache(self, batch_size, self.out_proj.weight.device, self.in_proj.weight.dtype)
        return _decode.new_cache(self, batch_size, self.out_proj.weight.device,
                                 self.conv1d.weight.dtype if dtype is None else dtype,
                                 self.in_proj.weight.dtype if dtype is None else dtype)

    def _get_states_from_cache(self, inference_params, batch_size, initialize_states=False):
        """This layer's ``(conv_state, ssm_state)`` in ``inference_params.key_value_memory_dict[layer_idx]``,
        allocated (zeros, the parameters' device and dtypes) on first use, zeroed with ``initialize_states``.

        Raises:
            ValueError: ``layer_idx`` is None; a cached state of another batch size. TypeError: ``inference_params``
            without ``key_value_memory_dict`` / ``seqlen_offset``.
        """
        if _parity.check_decode_mode(self) == "parity":
            return _decode.cached_states(
                self, inference_params, batch_size, initialize_states,
                check=lambda c: _parity.check_parity_cache(self, c, batch_size),
                allocate=lambda: _parity.new_parity_cache(self, batch_size, self.in_proj.weight.device,
                                                          self.in_proj.weight.dtype))
        return _decode.states_from_cache(self, inference_params, batch_size, initialize_states)
