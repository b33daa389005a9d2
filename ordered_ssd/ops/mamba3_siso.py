"""Mamba-3 single-input single-output (SISO) on mamba-ssm's Triton kernels with ordered parameter gradients: the
ordered twin of upstream's ``mamba_ssm/ops/triton/mamba3/mamba3_siso_combined.py`` (``mamba3_siso_combined``).

Layers: composition (:func:`ordered_mamba3_siso_fwd`, :func:`ordered_mamba3_siso_bwd`; plain functions over the
:mod:`csrc_bindings.mamba3` launchers, no autograd) → an eager ``torch.autograd.Function`` → the public function
:func:`ordered_mamba3_siso_combined`; and :func:`ordered_dt_softplus` (the layer's ``softplus(dd_dt + dt_bias)``,
whose ``dt_bias`` gradient is a sum over examples and positions). No ``torch.library`` custom op yet: these run in
eager mode only (``torch.compile`` would trace into the launchers).

The order of the sums (reduction ``mamba3-v1``, ``docs/native.md``): the kernels compute one program per
``(head, example)`` (forward, ``dqkv``, ``ddt_dtrap``, the angle cumsum) or per ``(chunk, example)`` (rotations and
biases), so no output of theirs mixes examples; the sums across examples and chunks are folded here, in fp32 from
+0.0, example 0 first (:mod:`ordered_ssd.fold`):

* ``dD[h] = fold_b(dD_partial[b, h])``;
* ``dC_bias[h, n] = fold_(b, c)(partial[b, c, h, n])`` and the same for ``dB_bias`` (example-major, then chunk);
* ``dScale``, ``dGamma`` per position: ``fold_k`` over the head-dim blocks ``k`` (upstream: ``torch.sum``);
* ``dt_bias``: :func:`ordered_dt_softplus`, ``fold_b(fold_l(g[b, l, h]))``.

The kernels launch at pinned configurations (never upstream's autotuner), so their bits are a function of the
shape. Hence: gradients bitwise identical across repeats, processes and restarts (same GPU model, versions); an
example's partials do not depend on the rest of the batch; ``literal=True`` (the kernels once per example, the
partials folded in the same order) gives the same bits.

Scope: no initial states, no gradient of final states, no ``cu_seqlens`` (upstream's ``dk_state_post`` kernel adds
a final-K-state gradient with atomic adds: refused, not run).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _checks
from ..fold import fold_example_sums, fold_many
from .common import require_cuda

__all__ = ["ordered_mamba3_siso_fwd", "ordered_mamba3_siso_bwd", "ordered_mamba3_siso_combined",
           "ordered_dt_softplus", "kernel_inputs", "REDUCTION", "mamba3_fingerprint"]

#: the name of the order of this file's sums (``docs/native.md``, "Mamba-3")
REDUCTION = "mamba3-v1"


def mamba3_fingerprint() -> str:
    """``"mamba3-v1 kernels=<hash>"``: this file's order (:data:`REDUCTION`) and what pins the Mamba-3 kernels'
    configurations (each kernel's name, upstream attribute, autotune key and candidate list, from which the
    ``mincost-v1`` rule picks for a key without an entry, and the pinned entries, ``ORDER`` of
    :mod:`csrc_bindings.pinned.mamba3_params`); the ``mamba3`` field of the determinism fingerprint. Imports nothing
    native."""
    import hashlib
    import json

    from csrc_bindings.mamba3 import MAMBA3_SPECS
    from csrc_bindings.pinned.mamba3_params import ORDER
    specs = [[s.name, s.attr, list(s.autotune_key), [[c[0], c[1], c[2]] for c in s.candidates]] for s in MAMBA3_SPECS]
    digest = hashlib.sha256(json.dumps([specs, ORDER], sort_keys=True).encode()).hexdigest()[:12]
    return f"{REDUCTION} kernels={digest}"


def _bindings():
    from csrc_bindings import mamba3
    return mamba3


# ------------------------------------------------------------------------------------------------ composition
def ordered_mamba3_siso_fwd(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, *, chunk_size: int,
                            store_for_backward: bool = True, return_final_states: bool = False) -> dict:
    """The forward: the cumulative angles (``angle_dt_fwd_kernel``), then the scan (``mamba3_siso_fwd_kernel``).

    Args: as :func:`ordered_mamba3_siso_combined` after its casts (contiguous; Q, K, V, Trap, Angles, Z bf16).
    Returns:
        the dict of :func:`csrc_bindings.mamba3.launch_mamba3_siso_fwd` plus ``theta`` (the cumulative angles) and,
        with ``return_final_states``, ``final_angle`` [B, H, S].
    """
    b = _bindings()
    theta, final_angle = b.launch_angle_dt_fwd(Angles, DT, chunk_size, return_output_state=return_final_states)
    res = b.launch_mamba3_siso_fwd(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, theta, D, Z, chunk_size=chunk_size,
                                   store_for_backward=store_for_backward, return_final_states=return_final_states)
    res.update(theta=theta, final_angle=final_angle)
    return res


def _bwd_partials(dout, Q, K, V, DT, Trap, Q_bias, K_bias, Angles, D, Z, saved: dict, chunk_size: int,
                  fold_shared: bool = False) -> dict:
    """The kernels' gradients, the cross-example partials unfolded (``dD`` [B, H], biases [B, nchunks, H, N]); with
    ``fold_shared`` (the fast path: every example in one batch) folded instead, in the same
    :func:`~ordered_ssd.fold.fold_many` launch as ``dscale`` and ``dgamma`` (each result has the bits of its own
    :func:`~ordered_ssd.fold.fold_dims`, as :func:`_fold_partials` gives them: one launch fewer)."""
    b = _bindings()
    if Z is not None:
        dZ, do = b.launch_dzdo(dout, Z, saved["out_v"])
    else:
        dZ, do = None, dout
    g = b.launch_dqkv(saved["q_rot"], saved["k_scaled"], V, saved["da_cs"], saved["da_cs_sum"], saved["qk_dot"],
                      saved["ssm_states"], do, D, chunk_size=chunk_size)
    r = b.launch_rotary_bias_angles(Q, K, saved["scale"], saved["gamma"], Q_bias, K_bias, saved["theta"], g["dq"],
                                    g["dk"], g["dqk"], chunk_size=chunk_size)
    shared = [g["dD"], r["dq_bias"], r["dk_bias"]]
    requests = [(r["dscale"], 2, torch.float32), (r["dgamma"], 2, torch.float32)]
    if fold_shared:
        requests += _shared_requests(*shared, Q_bias, K_bias, D)
    dscale, dgamma, *folded = fold_many(requests)
    ddt, dtrap = b.launch_ddt_dtrap(dscale, dgamma, DT, Trap.float().contiguous())
    dangles, ddt_angle = b.launch_angle_dt_bwd(r["dtheta"], Angles, DT, chunk_size)
    dD, dQ_bias, dK_bias = folded if fold_shared else shared
    return dict(dQ=r["dq"], dK=r["dk"], dV=g["dv"], dADT=g["dadt"], dDT=ddt + ddt_angle, dTrap=dtrap,
                dAngles=dangles, dZ=dZ, dD=dD, dQ_bias=dQ_bias, dK_bias=dK_bias)


def _shared_requests(dD, dQ_bias, dK_bias, Q_bias, K_bias, D) -> list:
    """The :func:`~ordered_ssd.fold.fold_many` requests of the shared parameters' gradients ``[dD, dQ_bias,
    dK_bias]`` from their partials (the module docstring's order: ``dD`` over examples, the biases over examples
    then chunks), each in its parameter's dtype."""
    return [(dD, 0, D.dtype) if D is not None else None,
            (dQ_bias, (0, 1), Q_bias.dtype), (dK_bias, (0, 1), K_bias.dtype)]


def _fold_partials(p: dict, Q_bias, K_bias, D) -> dict:
    """The ordered sums across examples and chunks (the module docstring's list), in one launch on CUDA
    (:func:`~ordered_ssd.fold.fold_many`: each result has the bits of its own
    :func:`~ordered_ssd.fold.fold_dims`)."""
    out = dict(p)
    out["dD"], out["dQ_bias"], out["dK_bias"] = fold_many(
        _shared_requests(p["dD"], p["dQ_bias"], p["dK_bias"], Q_bias, K_bias, D))
    return out


def ordered_mamba3_siso_bwd(dout, Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, saved: dict, *,
                            chunk_size: int, literal: bool = False) -> dict:
    """The backward: ``dZ`` (``dzdo``), the scan's gradients (``dqkv``), back through rotations and biases
    (``rotary_bias_angles``), ``dDT``/``dTrap`` (``ddt_dtrap``), the angles (``angle_dt_bwd``); then the ordered
    folds. ``literal``: the kernels once per example (batch slices of everything), the same folds.

    Returns:
        dict ``dQ``, ``dK`` [B, L, G, N], ``dV`` [B, L, H, P], ``dADT``, ``dDT``, ``dTrap`` [B, H, L] fp32,
        ``dAngles`` [B, L, H, S], ``dZ`` or None, ``dD`` [H] or None, ``dQ_bias``, ``dK_bias`` [H, N] (the
        parameters' dtypes).
    """
    args = (Q, K, V, DT, Trap, Q_bias, K_bias, Angles, D, Z)
    if not literal:
        return _bwd_partials(dout, *args, saved, chunk_size, fold_shared=True)
    batch = dout.shape[0]
    per_example = []
    for i in range(batch):
        def one(t, shared=False):
            return t if t is None or shared else t[i:i + 1].contiguous()
        sliced = (one(Q), one(K), one(V), one(DT), one(Trap), Q_bias, K_bias, one(Angles), D, one(Z))
        saved_i = {k: one(v) for k, v in saved.items() if isinstance(v, torch.Tensor)}
        per_example.append(_bwd_partials(one(dout), *sliced, saved_i, chunk_size))
    joined = {k: (torch.cat([p[k] for p in per_example], dim=0) if per_example[0][k] is not None else None)
              for k in per_example[0]}
    return _fold_partials(joined, Q_bias, K_bias, D)


# ------------------------------------------------------------------------------------------------ autograd
_SAVED = ("out_v", "ssm_states", "da_cs", "da_cs_sum", "q_rot", "k_scaled", "qk_dot", "scale", "gamma", "theta")


class _OrderedMamba3Siso(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, chunk_size, literal):
        res = ordered_mamba3_siso_fwd(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, chunk_size=chunk_size,
                                      store_for_backward=True)
        ctx.chunk_size, ctx.literal, ctx.has_D, ctx.has_Z = chunk_size, literal, D is not None, Z is not None
        ctx.save_for_backward(Q, K, V, DT, Trap, Q_bias, K_bias, Angles, D, Z, *(res[k] for k in _SAVED))
        return res["out"]

    @staticmethod
    def backward(ctx, dout):
        Q, K, V, DT, Trap, Q_bias, K_bias, Angles, D, Z, *rest = ctx.saved_tensors
        saved = dict(zip(_SAVED, rest))
        g = ordered_mamba3_siso_bwd(dout.contiguous(), Q, K, V, None, DT, Trap, Q_bias, K_bias, Angles, D, Z, saved,
                                    chunk_size=ctx.chunk_size, literal=ctx.literal)
        return (g["dQ"], g["dK"], g["dV"], g["dADT"], g["dDT"], g["dTrap"], g["dQ_bias"], g["dK_bias"],
                g["dAngles"], g["dD"], g["dZ"], None, None)


def _check(name, t, shape, dims):
    if t is not None:
        _checks.check_tensor(name, t)
        _checks.check_shape(name, t, shape, dims)


def kernel_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None) -> tuple:
    """The arguments as the kernels take them, in this order: ``Q``, ``K``, ``V``, ``Trap``, ``Angles``, ``Z`` cast
    to bf16 (as upstream's ``mamba3_siso_combined`` casts them), every tensor contiguous (the TMA descriptors);
    None stays None."""
    def bf16(t):
        return None if t is None else t.to(torch.bfloat16).contiguous()

    def plain(t):
        return None if t is None else t.contiguous()
    return (bf16(Q), bf16(K), bf16(V), plain(ADT), plain(DT), bf16(Trap), plain(Q_bias), plain(K_bias), bf16(Angles),
            plain(D), bf16(Z))


def ordered_mamba3_siso_combined(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, chunk_size=64, *,
                                 literal: bool = False):
    """``mamba3_siso_combined`` (mamba-ssm 2.3.2.post1) without states, with ordered gradients (module docstring).

    Args:
        Q, K: [B, L, G, N] (``C`` and ``B`` after their RMSNorm). V: [B, L, H, P]. ADT (``A dt``), DT: [B, H, L]
            fp32. Trap: [B, H, L] (before the sigmoid). Q_bias, K_bias: [H, N] fp32. Angles: [B, L, H, S] (the
            rotary angle rates before the tanh; S even, ``2 S <= N``). D: [H] fp32 or None. Z: [B, L, H, P] (the
            gate: ``out * silu(Z)``) or None. chunk_size: int. Q, K, V, Trap, Angles and Z are cast to bf16 first,
            as upstream does (the kernels' dtype); ``H`` a multiple of ``G``.
        literal: run the backward's kernels once per example (the same bits, slower: tests and benchmarks).

    Returns:
        [B, L, H, P] bf16.

    Raises:
        TypeError / ValueError: an argument of another type or shape (named), a tensor not on CUDA; before any
        kernel.

    Determinism: bitwise repeatable gradients, per-example partials independent of the batch, ``literal`` == fast
    (same GPU model and versions; reduction ``mamba3-v1``). Source: ``mamba3_siso_combined``'s kernels.
    """
    require_cuda("Q", Q)
    if Q.dim() != 4 or V.dim() != 4:
        raise ValueError(f"Q, V: expected [B, L, G, N] and [B, L, H, P], got {tuple(Q.shape)} and {tuple(V.shape)}")
    batch, seqlen, ngroups, n = Q.shape
    nheads = V.shape[2]
    if V.shape[:2] != (batch, seqlen) or nheads % ngroups:
        raise ValueError(f"V: expected [B={batch}, L={seqlen}, H, P] with H a multiple of G={ngroups}, "
                         f"got {tuple(V.shape)}")
    _check("K", K, Q.shape, "[B, L, G, N]")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        _check(name, t, (batch, nheads, seqlen), "[B, H, L]")
    _check("Q_bias", Q_bias, (nheads, n), "[H, N]")
    _check("K_bias", K_bias, (nheads, n), "[H, N]")
    _check("D", D, (nheads,), "[H]")
    _check("Z", Z, V.shape, "[B, L, H, P]")
    if not isinstance(Angles, torch.Tensor):
        raise TypeError(f"Angles: expected a torch.Tensor, got {type(Angles).__name__}")
    if Angles.dim() != 4 or Angles.shape[:3] != (batch, seqlen, nheads) or Angles.shape[3] % 2 \
            or not 0 < 2 * Angles.shape[3] <= n:
        raise ValueError(f"Angles: expected [B, L, H, S] = ({batch}, {seqlen}, {nheads}, S) with S even and "
                         f"0 < 2 S <= N={n}, got {tuple(Angles.shape)}")
    for name, t in (("K", K), ("V", V), ("ADT", ADT), ("DT", DT), ("Trap", Trap), ("Q_bias", Q_bias),
                    ("K_bias", K_bias), ("Angles", Angles), ("D", D), ("Z", Z)):
        if t is not None:
            require_cuda(name, t)
    return _OrderedMamba3Siso.apply(*kernel_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z),
                                    int(chunk_size), bool(literal))


# ------------------------------------------------------------------------------------------------ dt
class _OrderedDtSoftplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dd_dt, dt_bias):
        ctx.save_for_backward(dd_dt, dt_bias)
        return F.softplus(dd_dt + dt_bias)

    @staticmethod
    def backward(ctx, g):
        dd_dt, dt_bias = ctx.saved_tensors
        x = dd_dt + dt_bias
        # what autograd runs for F.softplus, written [B, L, H] contiguous: ``g`` arrives in the kernels' [B, H, L]
        # layout, and the fold below reads a position's heads with one coalesced load
        gx = torch.empty(x.shape, dtype=torch.promote_types(g.dtype, x.dtype), device=x.device)
        torch.ops.aten.softplus_backward.grad_input(g, x, 1.0, 20.0, grad_input=gx)
        d_bias = fold_example_sums(gx.reshape(gx.shape[0], -1, gx.shape[-1]), dt_bias.dtype)
        return gx.to(dd_dt.dtype), d_bias


def ordered_dt_softplus(dd_dt: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """``softplus(dd_dt + dt_bias)`` (Mamba-3's ``DT``), with ``d dt_bias = fold_b(fold_l(g[b, l, :]))`` in fp32
    from +0.0, example 0 first (:func:`ordered_ssd.fold.fold_example_sums`); ``d dd_dt`` per position as autograd.

    Args: dd_dt [B, L, H] (the in_proj slice, any float dtype), dt_bias [H] (fp32 in Mamba-3).
    Returns: [B, L, H] in the promoted dtype (fp32 for Mamba-3's fp32 ``dt_bias``).
    """
    if dd_dt.dim() != 3 or dt_bias.shape != dd_dt.shape[-1:]:
        raise ValueError(f"dd_dt, dt_bias: expected [B, L, H] and [H], got {tuple(dd_dt.shape)} and "
                         f"{tuple(dt_bias.shape)}")
    return _OrderedDtSoftplus.apply(dd_dt, dt_bias)
