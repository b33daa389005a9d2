"""``OrderedHFMamba2Mixer``: the Mamba-2 mixer of Hugging Face ``transformers`` models, with ordered gradients.

One class serves the six families whose mixers share one forward in the supported ``transformers`` versions
(``Mamba2Mixer``, ``BambaMixer``, ``NemotronHMamba2Mixer``, ``GraniteMoeHybridMambaLayer``, ``FalconH1Mixer``,
``Zamba2MambaMixer``); what differs between them is read off the mixer when it is converted (``_Spec``, in
``ordered_ssd/hf/_spec.py``): the gated norm's group size, epsilon and gate order, or no norm (FalconH1's
``mamba_rms_norm=False``), and FalconH1's input multiplier and ``mup_vector``. A mixer whose norm, activation,
attributes or ``forward`` parameters are not one of these is refused, naming what is not supported; the gated norm
is run once on a probe at conversion to prove that it computes what its attributes say.

The forward computes what the original mixer's forward computes (``transformers`` 5.17 to 5.25's
``modeling_<family>.py``; the versions differ in the norm's groups (5.23 made ``MambaRMSNormGated``,
``BambaRMSNormGated`` and ``GraniteMoeHybridRMSNormGated`` normalise over ``intermediate_size // n_groups``
channels), the cache's keyword (``cache_params``, ``cache`` from 5.24) and the cache's methods (5.21, 5.25), each
read off the objects themselves), step by step:

1. ``hidden_states * attention_mask[..., None]`` (padding zeroed), times FalconH1's ``ssm_in_multiplier``;
2. ``zxbcdt = in_proj(.)``, times FalconH1's ``mup_vector``; split ``[z, xBC, dt]``;
3. causal depthwise conv1d + SiLU on ``xBC`` (from the cache's conv state when there is one), the mask again;
4. the SSD scan (``dt = clamp(softplus(dt + dt_bias), time_step_limit)``, ``A = -exp(A_log)``, ``D`` skip), from
   the cache's recurrent state when there is one, writing the final state back;
5. the gated RMSNorm ``norm(y * silu(z))`` over groups of the norm's group size (or ``y * silu(z)`` without a
   norm), then ``out_proj``.

One decoding token (a cache holding the layer's states, and one position) runs causal-conv1d's
``causal_conv1d_update`` and mamba-ssm's ``selective_state_update`` on the cache's tensors in place, as the
original does (without ``time_step_limit``, as the original's step). With 5.25's cache, as there: the step counts
its token (``cache.increase_count``); while the cache records past states (assisted decoding), a step runs on a
copy of the state that it hands to ``cache.update_recurrent_state``, and a multi-token forward runs its last
``cache.get_recurrent_states_to_keep(layer_idx)`` positions as such steps, handing the cache every step's state.

Paths (as :class:`~ordered_ssd.OrderedMamba2`): on CUDA the ordered operations of :mod:`ordered_ssd.ops` on the
native kernels (the fused :func:`~ordered_ssd.ops.ordered_mamba_split_conv1d_scan_combined` where no mask acts, the
scan starts from zeros (no cache, or a prefill into it) and the norm's groups are the scan's groups; else the conv,
the scan, the norm and the projections one by one); elsewhere the pure-PyTorch reference
(:mod:`ordered_ssd.reference`, fp32/fp64) with autograd.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import _checks
from ..modules.mamba2 import _cuda_path_ok, _cuda_path_status, _mark_native_check_constant
from ..reference import reference_causal_conv1d, reference_chunk_scan, reference_gated_rmsnorm
from ..reference.canonical import conv_chunk
from ._canonical import canonical_mixer_forward, register_mixer
from ..modules._layout import pad_to_multiple, per_tensor, sequence_rows
from ..reference.decode import reference_causal_conv1d_update, reference_selective_state_update
from ._spec import (HF_MIXERS, SUPPORTED_TRANSFORMERS, _MODULE_STATE, _spec_of, check_transformers_version,
                   hf_mixer_family)

__all__ = ["OrderedHFMamba2Mixer", "HF_MIXERS", "SUPPORTED_TRANSFORMERS", "hf_mixer_family", "ordered_from_hf",
           "hf_from_ordered"]


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


def _states_to_keep(cache, layer_idx, seqlen: int) -> int:
    """How many of a multi-token forward's last positions the original runs as one-token steps, recording each
    step's recurrent state (5.25's ``cache.get_recurrent_states_to_keep``, set by assisted decoding so that the cache
    can be cropped back): 0 without such a cache, or when it records no past."""
    if cache is None or not hasattr(cache, "get_recurrent_states_to_keep"):
        return 0
    return min(int(cache.get_recurrent_states_to_keep(layer_idx) or 0), seqlen)


@torch.compiler.disable  # a host read
def _right_padding(mask: torch.Tensor) -> bool:
    """Whether every row of ``mask`` [B, L] is ones then zeros (right padding); read once per mask tensor."""
    return per_tensor("hf right padding", mask, lambda: bool((mask[:, 1:] <= mask[:, :-1]).all()))


def _mask_runs(mask: torch.Tensor, seq_idx):
    """For a mask whose every row is zeros, ones, zeros (left and/or right padding around one sequence): ``seq_idx``
    [B, L] int32 whose runs are the runs of the mask (split further where ``seq_idx`` changes), so the sequence is
    computed from its first real token, as alone; None for a mask with more than one run of ones in a row (holes:
    the masked path). One host read (per mask tensor without ``seq_idx``)."""
    def make():
        m = mask.to(torch.bool)
        rises = m.clone()
        rises[:, 1:] &= ~m[:, :-1]
        if int(rises.sum(1).max()) > 1:
            return None
        change = torch.zeros_like(m)
        change[:, 1:] = m[:, 1:] != m[:, :-1]
        if seq_idx is not None:
            change[:, 1:] |= seq_idx[:, 1:] != seq_idx[:, :-1]
        return torch.cumsum(change.to(torch.int32), 1, dtype=torch.int32)

    return per_tensor("hf mask runs", mask, make) if seq_idx is None else make()


class OrderedHFMamba2Mixer(nn.Module):
    """The Mamba-2 mixer of a ``transformers`` model, with ordered gradients (see the module docstring).

    Built by :func:`ordered_from_hf` (through :func:`ordered_ssd.convert_to_ordered`), never directly: it takes
    the original mixer's parameters, buffers and submodules (the same objects, under the same names: ``in_proj``,
    ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``, ``out_proj``, FalconH1's ``mup_vector``) and its other
    attributes (``layer_idx``, ``num_heads``, ``config``, ...), so ``state_dict`` keys, values and dtypes are
    unchanged and an optimizer built before the conversion keeps working.

    ``forward(hidden_states, cache=None, attention_mask=None, **kwargs)`` as the original (the cache also as
    ``cache_params=``, its name before ``transformers`` 5.24):

    * ``hidden_states`` [B, L, hidden_size]: fp32/bf16/fp16 on CUDA, fp32/fp64 elsewhere, the dtype of
      ``in_proj.weight`` (any of those under CUDA autocast);
    * ``attention_mask`` [B, L] of 0/1 (padding positions zeroed before ``in_proj`` and after the conv) or None;
    * ``cache`` / ``cache_params``: the model's cache object (prefill writes the conv and recurrent states, a
      one-token call after it decodes from them);
    * packed sequences (padding-free batches, B == 1): ``seq_idx`` [1, L] int (``DataCollatorWithFlattening(
      return_seq_idx=True)``), or ``cu_seq_lens_q`` [S + 1] (``return_flash_attn_kwargs=True``), from which
      ``seq_idx`` is made on the device; the conv and the scan do not cross a sequence boundary. Other keyword
      arguments are ignored, as the original ignores those its kernels do not take.

    Returns [B, L, hidden_size] in the dtype of ``hidden_states``.

    Raises (before any kernel): ``TypeError`` / ``ValueError`` naming the argument for a wrong rank, width,
    dtype or device of ``hidden_states``, a ``seq_idx`` / ``cu_seq_lens_q`` of the wrong shape, dtype or device,
    ``attention_mask`` not [B, L], packed sequences continuing from the cache, two different caches as ``cache``
    and ``cache_params``; ``NotImplementedError`` for a one-token step from the cache (or assisted decoding's steps)
    in training mode with autograd on (the step runs without autograd, as
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
    #: On the CUDA path: the projections by the row-count-invariant GEMM and each run of ``seq_idx`` computed as
    #: its own row, so a sequence gets its canonical bits (``OrderedMamba2.sequence_invariant``; set by
    #: ``convert_to_ordered(..., invariant_linears=True)``). The reference path is always per sequence.
    sequence_invariant = False

    def __init__(self):  # pragma: no cover - guarded: use ordered_from_hf
        raise TypeError("OrderedHFMamba2Mixer: build it from a transformers mixer with ordered_ssd.convert_to_ordered("
                        "model) (or ordered_ssd.hf.ordered_from_hf(mixer)), not directly")

    def __setstate__(self, state):  # deepcopy and unpickling: the copy must be findable by the compiled path's ops
        super().__setstate__(state)
        register_mixer(self)

    # ------------------------------------------------------------------ forward
    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        cache_params = kwargs.pop("cache_params", None)
        if cache_params is not None:
            if cache is not None and cache is not cache_params:
                raise ValueError("cache / cache_params: expected one cache (cache_params is the name of cache before "
                                 "transformers 5.24), got two different objects")
            cache = cache_params
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
        conv_state, ssm_state, recording = _cache_states(cache, self.layer_idx) if cache is not None else (None,) * 3
        use_prev = ssm_state is not None
        if use_prev and seq_idx is not None:
            raise ValueError("seq_idx / cu_seq_lens_q: packed sequences continuing from the cache are not "
                             "supported (the cache holds one state per row, of the last sequence); prefill or train "
                             "a packed batch from an empty cache, or with use_cache=False")
        keep = _states_to_keep(cache, self.layer_idx, L) if not (use_prev and L == 1) else 0
        if (use_prev and L == 1) or keep:
            if self.training and torch.is_grad_enabled():
                raise NotImplementedError(f"{type(self).__name__}: one-token steps from the cache in training mode "
                                          "(a decoding step, or the steps of assisted decoding, run without "
                                          "autograd, as OrderedMamba2.step); call model.eval(), or train on whole "
                                          "sequences")
        if use_prev and L == 1:  # the original's recurrent form (its conv through the cache while it records past)
            return self._decode_step(u, mask, cache, conv_state, ssm_state, backend, conv_through_cache=recording)
        return self._forward_seq(u, mask, seq_idx, cache, ssm_state, backend, keep)

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
            # one int32 tensor for every mixer of the model (sequence_rows keeps its layout per tensor)
            return per_tensor("hf seq_idx", seq_idx, lambda: seq_idx.to(torch.int32))
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
        def make():
            pos = torch.arange(L, device=device, dtype=cu.dtype)
            return torch.bucketize(pos, cu[1:].contiguous(), right=True).to(torch.int32).unsqueeze(0)

        return per_tensor(f"hf cu_seq_lens_q L={L}", cu, make)

    # ------------------------------------------------------------------ pieces
    def _project_in(self, u, mask, backend):
        spec = self._ordered_spec
        if mask is not None:
            u = (u * mask[:, :, None]).to(u.dtype)
        if spec.in_multiplier is not None:
            u = u * spec.in_multiplier
        if backend == "cuda" and type(self.in_proj) is nn.Linear:
            from .. import ops

            zxbcdt = ops.ordered_linear(u, self.in_proj.weight, self.in_proj.bias,
                                        row_invariant=bool(getattr(self, "sequence_invariant", False)))
        else:
            zxbcdt = self.in_proj(u)
        if spec.has_mup_vector:
            zxbcdt = zxbcdt * self.mup_vector
        return zxbcdt

    def _project_out(self, y, dtype, backend):
        y = y.to(dtype)
        if backend == "cuda" and type(self.out_proj) is nn.Linear:
            from .. import ops

            return ops.ordered_linear(y, self.out_proj.weight, self.out_proj.bias,
                                      row_invariant=bool(getattr(self, "sequence_invariant", False)))
        return self.out_proj(y)

    def _A(self, backend, dtype):
        if backend == "cuda":
            from .. import ops

            return ops.ordered_A_from_log(self.A_log)
        return -torch.exp(self.A_log.to(torch.float64 if dtype == torch.float64 else torch.float32))

    def _fused_ok(self, mask, use_prev, keep) -> bool:
        """The fused op computes the layer from ``zxbcdt`` when no mask acts between the conv and the scan, the scan
        starts from zeros and covers every position (no one-token steps at the end, ``keep == 0``), and the norm's
        groups are the scan's groups."""
        spec = self._ordered_spec
        return (mask is None and not use_prev and not keep and
                (spec.norm == "none" or spec.norm_group_size == spec.d_ssm // spec.ngroups))

    def _runs_of(self, mask, seq_idx):
        """:func:`_mask_runs` where computing each run of the mask alone is the masked computation's mathematics:
        ``in_proj`` an ``nn.Linear`` without a bias (a masked position then gives the conv window zeros, as a start
        from zeros does); with a bias the original's padded positions feed ``bias`` into the first real tokens'
        conv window, and the masked path keeps that. None otherwise, or without a mask."""
        if mask is None or type(self.in_proj) is not nn.Linear or self.in_proj.bias is not None:
            return None
        return _mask_runs(mask, seq_idx)

    def _forward_seq(self, u, mask, seq_idx, cache, initial, backend, keep=0):
        if backend == "reference" and initial is None and not keep:  # whole sequences from zeros
            if cache is not None:  # a prefill (also training with use_cache): the plain path writes the cache
                with torch.no_grad():
                    self._forward_plain(u, mask, seq_idx, cache, initial, backend, keep)
            runs = self._runs_of(mask, seq_idx)  # left padding: from the first real token
            return self._forward_canonical(u, mask, runs if runs is not None else seq_idx)
        if (backend == "cuda" and getattr(self, "sequence_invariant", False) and cache is None and initial is None
                and not keep):
            if mask is not None and _right_padding(mask):
                # a right-padding mask changes no real position (they never see a later one): the path of the
                # sequence alone (the fused op, no mask), so a padded row gets the canonical bits at its real positions
                mask = None
            runs = self._runs_of(mask, seq_idx)
            if runs is not None:  # left padding: the sequence as its own run, from its first real token
                seq_idx, mask = runs, None
            cs = self._ordered_spec.chunk_size
            if seq_idx is not None:
                rows = sequence_rows(seq_idx, cs)
                if rows is not None:  # each run of seq_idx its own row, in whole chunks
                    self._check_cuda_path(rows.S, rows.Lrow)  # before anything is moved
                    mask_rows = None if mask is None else rows.to_rows(mask[:, :, None])[..., 0]
                    return rows.from_rows(self._forward_plain(rows.to_rows(u), mask_rows, None, None, None, backend))
                seq_idx = None  # one run per row: the rows are the sequences
            L = u.shape[1]
            if L % cs:  # whole chunks, as in every layout of a sequence (modules._layout.pad_to_multiple)
                mask = None if mask is None else pad_to_multiple(mask[:, :, None], cs)[..., 0]
                return self._forward_plain(pad_to_multiple(u, cs), mask, None, None, None, backend)[:, :L].contiguous()
        return self._forward_plain(u, mask, seq_idx, cache, initial, backend, keep)

    def _forward_plain(self, u, mask, seq_idx, cache, initial, backend, keep=0):
        use_prev = initial is not None
        spec = self._ordered_spec
        H, P, G, N = spec.nheads, spec.headdim, spec.ngroups, spec.d_state
        Bsz, L, _ = u.shape
        dtype = u.dtype
        zxbcdt = self._project_in(u, mask, backend)
        conv_w = self.conv1d.weight.squeeze(1)
        if backend == "cuda":
            self._check_cuda_path(Bsz, L)
            if self._fused_ok(mask, use_prev, keep):
                from .. import ops

                if cache is not None:  # a prefill: the cache keeps the last d_conv conv inputs, as the original's
                    xBC = zxbcdt[..., spec.d_ssm:2 * spec.d_ssm + 2 * G * N]
                    cache.update_conv_state(xBC.transpose(1, 2), self.layer_idx, conv_kernel_size=spec.d_conv)
                # sequence-invariant: the out_proj after the op, by the row-invariant GEMM (_project_out)
                plain_out = type(self.out_proj) is nn.Linear and not getattr(self, "sequence_invariant", False)
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
                return y if plain_out else self._project_out(y, dtype, backend)
        z, xBC, dt = torch.split(zxbcdt, [spec.d_ssm, spec.d_ssm + 2 * G * N, H], dim=-1)
        xBC = self._conv(xBC, conv_w, seq_idx, cache, use_prev, backend)
        if mask is not None:
            xBC = (xBC * mask[:, :, None]).to(xBC.dtype)
        x, B, C = torch.split(xBC, [spec.d_ssm, G * N, G * N], dim=-1)
        z_gate = z.reshape(Bsz, L, H, P) if spec.norm == "none" else None
        x, dt, B, C = x.reshape(Bsz, L, H, P), dt, B.reshape(Bsz, L, G, N), C.reshape(Bsz, L, G, N)
        n = L - keep  # the positions the chunked scan computes; the last ``keep`` run as one-token steps
        final = initial
        ys = []
        if n > 0:
            kw = dict(D=self.D, z=None if z_gate is None else z_gate[:, :n], dt_bias=self.dt_bias, dt_softplus=True,
                      dt_limit=spec.dt_limit, seq_idx=seq_idx, initial_states=initial,
                      return_final_states=cache is not None)
            args = (x[:, :n], dt[:, :n], self._A(backend, dtype), B[:, :n], C[:, :n], spec.chunk_size)
            if backend == "cuda":
                from .. import ops

                y = ops.ordered_mamba_chunk_scan_combined(*args, **kw)
            else:
                y = reference_chunk_scan(*args, **kw)
            if cache is not None:
                y, final = y
            ys.append(y)
        if keep:
            y, final = self._steps(x[:, n:], dt[:, n:], B[:, n:], C[:, n:],
                                   None if z_gate is None else z_gate[:, n:], final, backend, dtype)
            ys.append(y)
        if cache is not None:
            cache.update_recurrent_state(final, layer_idx=self.layer_idx)
        y = (ys[0] if len(ys) == 1 else torch.cat(ys, 1)).reshape(Bsz, L, spec.d_ssm)
        y = self._gate(y, z, backend)
        return self._project_out(y, dtype, backend)

    def _forward_canonical(self, u, mask, seq_idx):
        """The reference path without a cache: each sequence (each row, or each run of ``seq_idx``) computed alone,
        chunk by chunk, with the ordered backward of :mod:`ordered_ssd.reference.canonical` over the mixer's
        parameters that require a gradient (folded over the sequences in order)."""
        return canonical_mixer_forward(self, u, mask, seq_idx)

    def _chunk(self, u_c, mask_c, carry, state):
        """One chunk of :meth:`_forward_canonical` (``chunk_fn`` of ``chunked_graphs``): the steps of the module
        docstring on ``u_c`` [chunk_size, d_model] from the conv ``carry`` and the SSM ``state``."""
        spec = self._ordered_spec
        H, P, G, N, cs = spec.nheads, spec.headdim, spec.ngroups, spec.d_state, spec.chunk_size
        dtype = u_c.dtype
        zxbcdt = self._project_in(u_c[None], None if mask_c is None else mask_c[None], "reference")[0]
        z, xBC, dt = torch.split(zxbcdt, [spec.d_ssm, spec.d_ssm + 2 * G * N, H], dim=-1)
        xBC_ext = torch.cat([carry, xBC], dim=0)
        carry_out = xBC_ext[xBC_ext.shape[0] - (spec.d_conv - 1):]
        xBC = conv_chunk(xBC_ext, self.conv1d.weight.squeeze(1), self.conv1d.bias, cs)
        if mask_c is not None:
            xBC = (xBC * mask_c[:, None]).to(xBC.dtype)
        x, B, C = torch.split(xBC, [spec.d_ssm, G * N, G * N], dim=-1)
        y, state_out = reference_chunk_scan(
            x.reshape(1, cs, H, P), dt.reshape(1, cs, H), self._A("reference", dtype), B.reshape(1, cs, G, N),
            C.reshape(1, cs, G, N), cs, D=self.D, z=z.reshape(1, cs, H, P) if spec.norm == "none" else None,
            dt_bias=self.dt_bias, dt_softplus=True, dt_limit=spec.dt_limit, initial_states=state,
            return_final_states=True)
        y = self._gate(y.reshape(1, cs, spec.d_ssm), z[None], "reference")
        return self._project_out(y, dtype, "reference")[0], carry_out, state_out

    @torch.no_grad()
    def _steps(self, x, dt, B, C, z, state, backend, dtype):
        """The last positions of a forward as one-token steps from ``state`` (None: zeros), as the original runs them
        while the cache records past states for assisted decoding (transformers 5.25): ``x`` [B, k, H, P], ``dt``
        [B, k, H], ``B``, ``C`` [B, k, G, N], ``z`` [B, k, H, P] or None. Returns the outputs [B, k, H, P] and the
        list of the states after each step (the last one is the layer's new state; the cache keeps them all)."""
        spec = self._ordered_spec
        Bsz, k = x.shape[:2]
        if state is None:
            state = torch.zeros(Bsz, spec.nheads, spec.headdim, spec.d_state, device=x.device, dtype=torch.float32)
        update = self._state_update(backend)
        A = self._A(backend, dtype)
        ys, states = [], []
        for t in range(k):
            state = state.clone()
            ys.append(update(state, x[:, t], dt[:, t], A, B[:, t], C[:, t], D=self.D,
                             z=None if z is None else z[:, t], dt_bias=self.dt_bias, dt_softplus=True))
            states.append(state)
        return torch.stack(ys, 1), states

    @staticmethod
    def _state_update(backend):
        if backend == "cuda":
            from .. import ops

            return ops.ordered_selective_state_update
        return reference_selective_state_update

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
                    raise TypeError(f"cache conv state: expected dtype {xBC.dtype} (causal-conv1d's update "
                                    f"kernel), got {conv_state.dtype}")
                xBC = ops.ordered_causal_conv1d_update(xBC, conv_state, conv_w, self.conv1d.bias, "silu")
        elif not conv_through_cache:
            xBC = reference_causal_conv1d_update(xBC, conv_state, conv_w, self.conv1d.bias, "silu")
        if mask is not None:  # the model passes no mask for one token; a caller's mask acts as in the original
            xBC = (xBC * mask[:, -1:]).to(xBC.dtype)
        x, B, C = torch.split(xBC, [spec.d_ssm, G * N, G * N], dim=-1)
        # transformers 5.25's cache counts tokens: a step whose conv updates the state in place says so itself; and
        # it keeps each recorded step's state (for a rollback): the step then runs on a copy handed to the cache
        counts = hasattr(cache, "increase_count")
        if counts and not conv_through_cache:
            cache.increase_count(self.layer_idx, 0)
        state = ssm_state.clone() if counts and conv_through_cache else ssm_state
        y = self._state_update(backend)(state, x.reshape(Bsz, H, P), dt, self._A(backend, dtype),
                                        B.reshape(Bsz, G, N), C.reshape(Bsz, G, N), D=self.D, z=z_gate,
                                        dt_bias=self.dt_bias, dt_softplus=True)
        if state is not ssm_state:
            cache.update_recurrent_state(state, layer_idx=self.layer_idx)
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
    register_mixer(new)
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

