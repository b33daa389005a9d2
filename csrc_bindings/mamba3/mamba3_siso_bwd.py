"""Launchers for the Mamba-3 SISO backward kernels (``mamba3_siso_bwd_kernel_dzdo``, ``..._dqkv``,
``..._rotary_bias_angles``, ``..._ddt_dtrap_dinput_states``): the mirror of
``mamba_ssm/ops/triton/mamba3/mamba3_siso_bwd.py``.

Each launcher passes what upstream's wrapper (``compute_dzdo``, ``compute_dqkv``, ``compute_dqktheta``,
``compute_ddt_dtrap_dinput_states``) passes for a call without initial or final states and without ``cu_seqlens``;
the wrappers' reductions across examples are left out: ``dD`` comes back per example ``[B, H]``, the ``Q``/``K``
bias gradients per example and chunk ``[B, nchunks, H, N]``, ``dScale``/``dGamma`` per head-dim block
``[B, H, nblocks, L]`` (:mod:`ordered_ssd.ops.mamba3_siso` folds them). ``mamba3_siso_bwd_kernel_dk_state_post``
(atomic adds into ``dK``, ``dK_bias`` and the angles' gradient, for a gradient of the final ``K`` state) is not
bound: the ordered path refuses that gradient.
"""
from __future__ import annotations

import torch

from .._spec import KernelSpec
from .._util import cdiv, check, check_shape, next_pow2, prefixed_strides
from .._plans import alloc, alloc_like
from ._runtime import launch_kernel, planned_launcher

MODULE = "mamba_ssm.ops.triton.mamba3.mamba3_siso_bwd"
_CANDIDATES = tuple(({}, w, s) for s in (1, 2, 3) for w in (2, 4, 8))


def _contiguous(**tensors):
    for name, t in tensors.items():
        check(t is None or t.is_contiguous(), f"{name}: expected a contiguous tensor")


# ------------------------------------------------------------------------------------------------------------- dzdo
@planned_launcher
def launch_dzdo(dout, Z, out_v, *, config=None):
    """``(dZ, dout_scaled)`` [B, L, H, P] (dout's dtype) for the gate ``out = out_v * silu(Z)``, elementwise.
    Source: ``mamba3_siso_bwd_kernel_dzdo`` (its ``CHUNK_SIZE`` tiles positions only)."""
    batch, seqlen, nheads, p = dout.shape
    check_shape("Z", Z, dout.shape, "the shape of dout")
    check_shape("out_v", out_v, dout.shape, "the shape of dout")
    _contiguous(dout=dout, Z=Z, out_v=out_v)
    dz = alloc(Z.shape, dout.dtype, Z.device)
    do_scaled = alloc_like(dout)
    args = dict(DO=dout, Z=Z, O=out_v, Dz=dz, DO_scaled=do_scaled,
                **prefixed_strides("stride_do", "batch seqlen head vdim", dout),
                **prefixed_strides("stride_z", "batch seqlen head vdim", Z),
                **prefixed_strides("stride_o", "batch seqlen head vdim", out_v),
                **prefixed_strides("stride_dz", "batch seqlen head vdim", dz),
                **prefixed_strides("stride_do_scaled", "batch seqlen head vdim", do_scaled),
                seqlen=seqlen, headdim_v=p, HEADDIM_V=next_pow2(p))

    def grid(meta):
        return (cdiv(seqlen, meta["CHUNK_SIZE"]), nheads, batch)
    launch_kernel(DZDO, grid, args, dout, config)
    return dz, do_scaled


DZDO = KernelSpec(
    name="mamba3_siso_bwd_dzdo", module=MODULE, attr="mamba3_siso_bwd_kernel_dzdo",
    arg_names=("DO Z O Dz DO_scaled stride_do_batch stride_do_seqlen stride_do_head stride_do_vdim stride_z_batch "
               "stride_z_seqlen stride_z_head stride_z_vdim stride_o_batch stride_o_seqlen stride_o_head stride_o_vdim "
               "stride_dz_batch stride_dz_seqlen stride_dz_head stride_dz_vdim stride_do_scaled_batch "
               "stride_do_scaled_seqlen stride_do_scaled_head stride_do_scaled_vdim seqlen headdim_v CHUNK_SIZE "
               "HEADDIM_V"),
    autotune_key=("HEADDIM_V",),
    candidates=tuple(({"CHUNK_SIZE": cs}, w, s) for cs in (32, 64) for s in (1, 2, 3) for w in (2, 4, 8)),
)


# ------------------------------------------------------------------------------------------------------------- dqkv
@planned_launcher
def launch_dqkv(q_rot, k_scaled, V, da_cs, da_cs_sum, qk_dot, ssm_states, dout, D=None, *, chunk_size: int,
                config=None) -> dict:
    """The scan's gradients. Source: ``mamba3_siso_bwd_kernel_dqkv`` (one program per ``(head, example)``, the
    example's chunks in reverse order).

    Args: the forward's ``q_rot``, ``k_scaled`` [B, L, H, N], ``V`` [B, L, H, P], ``da_cs``, ``qk_dot`` [B, H, L],
    ``da_cs_sum`` [B, H, nchunks], ``ssm_states`` [B, H, P, nchunks N]; ``dout`` [B, L, H, P] (after the gate's
    backward); ``D`` [H] or None. All contiguous.
    Returns:
        dict ``dq``, ``dk`` [B, L, H, N], ``dv`` [B, L, H, P], ``dadt``, ``dqk`` [B, H, L], ``dD`` [B, H] fp32 (one
        partial per example; None without ``D``).
    """
    batch, seqlen, nheads, n = q_rot.shape
    p = V.shape[-1]
    nchunks = cdiv(seqlen, chunk_size)
    check_shape("k_scaled", k_scaled, q_rot.shape, "the shape of q_rot")
    check_shape("ssm_states", ssm_states, (batch, nheads, p, nchunks * n), "[B, H, P, nchunks N]")
    check_shape("da_cs_sum", da_cs_sum, (batch, nheads, nchunks), "[B, H, nchunks]")
    _contiguous(q_rot=q_rot, k_scaled=k_scaled, V=V, da_cs=da_cs, da_cs_sum=da_cs_sum, qk_dot=qk_dot,
                ssm_states=ssm_states, dout=dout, D=D)
    dev = q_rot.device
    res = dict(dq=alloc((batch, seqlen, nheads, n), q_rot.dtype, dev),
               dk=alloc((batch, seqlen, nheads, n), k_scaled.dtype, dev),
               dv=alloc((batch, seqlen, nheads, p), V.dtype, dev),
               dadt=alloc_like(da_cs), dqk=alloc_like(da_cs),
               dD=alloc((batch, nheads), torch.float32, dev) if D is not None else None)
    args = dict(Q=q_rot, K=k_scaled, V=V, DA_CS=da_cs, DA_CS_SUM=da_cs_sum, QK_Dot=qk_dot, D=D, SSM_States=ssm_states,
                dO=dout, d_OSSM_State=None, Cu_Seqlens=None, dQ=res["dq"], dK=res["dk"], dV=res["dv"],
                dADT=res["dadt"], dQK_Dot=res["dqk"], dD=res["dD"], d_ISSM_State=None,
                **prefixed_strides("stride_q", "batch seqlen head qkdim", q_rot),
                **prefixed_strides("stride_k", "batch seqlen head qkdim", k_scaled),
                **prefixed_strides("stride_v", "batch seqlen head vdim", V),
                **prefixed_strides("stride_da_cs", "batch head seqlen", da_cs),
                **prefixed_strides("stride_da_cs_sum", "batch head seqlen", da_cs_sum),
                **prefixed_strides("stride_qk_dot", "batch head seqlen", qk_dot),
                **prefixed_strides("stride_d", "head", D),
                **prefixed_strides("stride_ssm_states", "batch head vdim qkdim", ssm_states),
                **prefixed_strides("stride_do", "batch seqlen head vdim", dout),
                **prefixed_strides("stride_d_ossm_state", "batch head vdim qkdim", None), stride_cu_seqlen=0,
                **prefixed_strides("stride_dq", "batch seqlen head qkdim", res["dq"]),
                **prefixed_strides("stride_dk", "batch seqlen head qkdim", res["dk"]),
                **prefixed_strides("stride_dv", "batch seqlen head vdim", res["dv"]),
                **prefixed_strides("stride_dadt", "batch head seqlen", res["dadt"]),
                **prefixed_strides("stride_dQK_dot", "batch head seqlen", res["dqk"]),
                **prefixed_strides("stride_dd", "batch head", res["dD"]),
                **prefixed_strides("stride_d_issm_state", "batch head vdim qkdim", None),
                seqlen=seqlen, nheads_qk=nheads, headdim_qk=n, headdim_v=p, CHUNK_SIZE=chunk_size,
                HEADDIM_QK=next_pow2(n), HEADDIM_V=next_pow2(p), RECOMPUTE_MASK=False, HAS_D_OSSM_STATE=False,
                RETURN_D_ISSM_STATE=False, IS_VARLEN=False)
    launch_kernel(DQKV, (nheads, batch), args, q_rot, config)
    return res


DQKV = KernelSpec(
    name="mamba3_siso_bwd_dqkv", module=MODULE, attr="mamba3_siso_bwd_kernel_dqkv",
    arg_names=(
        "Q K V DA_CS DA_CS_SUM QK_Dot D SSM_States dO d_OSSM_State Cu_Seqlens dQ dK dV dADT dQK_Dot dD d_ISSM_State "
        "stride_q_batch stride_q_seqlen stride_q_head stride_q_qkdim stride_k_batch stride_k_seqlen stride_k_head "
        "stride_k_qkdim stride_v_batch stride_v_seqlen stride_v_head stride_v_vdim stride_da_cs_batch "
        "stride_da_cs_head stride_da_cs_seqlen stride_da_cs_sum_batch stride_da_cs_sum_head stride_da_cs_sum_seqlen "
        "stride_qk_dot_batch stride_qk_dot_head stride_qk_dot_seqlen stride_d_head stride_ssm_states_batch "
        "stride_ssm_states_head stride_ssm_states_vdim stride_ssm_states_qkdim stride_do_batch stride_do_seqlen "
        "stride_do_head stride_do_vdim stride_d_ossm_state_batch stride_d_ossm_state_head stride_d_ossm_state_vdim "
        "stride_d_ossm_state_qkdim stride_cu_seqlen stride_dq_batch stride_dq_seqlen stride_dq_head stride_dq_qkdim "
        "stride_dk_batch stride_dk_seqlen stride_dk_head stride_dk_qkdim stride_dv_batch stride_dv_seqlen "
        "stride_dv_head stride_dv_vdim stride_dadt_batch stride_dadt_head stride_dadt_seqlen stride_dQK_dot_batch "
        "stride_dQK_dot_head stride_dQK_dot_seqlen stride_dd_batch stride_dd_head stride_d_issm_state_batch "
        "stride_d_issm_state_head stride_d_issm_state_vdim stride_d_issm_state_qkdim seqlen nheads_qk headdim_qk "
        "headdim_v CHUNK_SIZE HEADDIM_QK HEADDIM_V RECOMPUTE_MASK HAS_D_OSSM_STATE RETURN_D_ISSM_STATE IS_VARLEN"),
    autotune_key=("CHUNK_SIZE", "HEADDIM_QK", "HEADDIM_V", "IS_VARLEN"),
    candidates=_CANDIDATES,
)


# ------------------------------------------------------------------------------------------- rotary, bias, angles
@planned_launcher
def launch_rotary_bias_angles(Q, K, scale, gamma, Q_bias, K_bias, theta, dq_mid, dk_mid, dqk, *, chunk_size: int,
                              config=None) -> dict:
    """Back through the rotations and the biases. Source: ``mamba3_siso_bwd_kernel_rotary_bias_angles`` (one
    program per ``(chunk, example)``).

    Args: ``Q``, ``K`` [B, L, G, N] (the forward's inputs), ``scale``, ``gamma``, ``dqk`` [B, H, L] fp32,
    ``Q_bias``, ``K_bias`` [H, N], ``theta`` [B, L, H, S] (the cumulative angles), ``dq_mid``, ``dk_mid``
    [B, L, H, N] (from :func:`launch_dqkv`). All contiguous.
    Returns:
        dict ``dq``, ``dk`` [B, L, G, N], ``dtheta`` [B, L, H, S] (theta's dtype), ``dscale``, ``dgamma``
        [B, H, nblocks, L] fp32 (one partial per head-dim block of ``min(next_pow2(N), 64)``), ``dq_bias``,
        ``dk_bias`` [B, nchunks, H, N] fp32 (one partial per example and chunk).
    """
    batch, seqlen, ngroups, n = Q.shape
    nheads, s = theta.shape[2], theta.shape[3]
    nchunks = cdiv(seqlen, chunk_size)
    check_shape("K", K, Q.shape, "the shape of Q")
    check_shape("dq_mid", dq_mid, (batch, seqlen, nheads, n), "[B, L, H, N]")
    check_shape("dk_mid", dk_mid, (batch, seqlen, nheads, n), "[B, L, H, N]")
    _contiguous(Q=Q, K=K, scale=scale, gamma=gamma, Q_bias=Q_bias, K_bias=K_bias, theta=theta, dq_mid=dq_mid,
                dk_mid=dk_mid, dqk=dqk)
    hq = next_pow2(n)
    block = min(hq, 64)
    dev = Q.device
    res = dict(dq=alloc((batch, seqlen, ngroups, n), dq_mid.dtype, dev),
               dk=alloc((batch, seqlen, ngroups, n), dk_mid.dtype, dev),
               dtheta=alloc((batch, seqlen, nheads, s), theta.dtype, dev),
               dscale=alloc((batch, nheads, hq // block, seqlen), scale.dtype, dev),
               dgamma=alloc((batch, nheads, hq // block, seqlen), gamma.dtype, dev),
               dq_bias=alloc((batch, nchunks, nheads, n), torch.float32, dev),
               dk_bias=alloc((batch, nchunks, nheads, n), torch.float32, dev))
    args = dict(Q=Q, K=K, Scale=scale, Gamma=gamma, Q_bias=Q_bias, K_bias=K_bias, Angles=theta, dQ_in=dq_mid,
                dK_in=dk_mid, dQK=dqk, dQ=res["dq"], dK=res["dk"], dAngles=res["dtheta"], dScale=res["dscale"],
                dGamma=res["dgamma"], dQ_bias=res["dq_bias"], dK_bias=res["dk_bias"],
                **prefixed_strides("stride_q", "batch seqlen head qkdim", Q),
                **prefixed_strides("stride_k", "batch seqlen head qkdim", K),
                **prefixed_strides("stride_scale", "batch head seqlen", scale),
                **prefixed_strides("stride_gamma", "batch head seqlen", gamma),
                **prefixed_strides("stride_q_bias", "head qkdim", Q_bias),
                **prefixed_strides("stride_k_bias", "head qkdim", K_bias),
                **prefixed_strides("stride_angles", "batch seqlen head qkdim", theta),
                **prefixed_strides("stride_dq_in", "batch seqlen head qkdim", dq_mid),
                **prefixed_strides("stride_dk_in", "batch seqlen head qkdim", dk_mid),
                **prefixed_strides("stride_dqk", "batch head seqlen", dqk),
                **prefixed_strides("stride_dq", "batch seqlen head qkdim", res["dq"]),
                **prefixed_strides("stride_dk", "batch seqlen head qkdim", res["dk"]),
                **prefixed_strides("stride_dangles", "batch seqlen head qkdim", res["dtheta"]),
                **prefixed_strides("stride_dscale", "batch head nqkchunks seqlen", res["dscale"]),
                **prefixed_strides("stride_dgamma", "batch head nqkchunks seqlen", res["dgamma"]),
                **prefixed_strides("stride_dq_bias", "batch nchunks head qkdim", res["dq_bias"]),
                **prefixed_strides("stride_dk_bias", "batch nchunks head qkdim", res["dk_bias"]),
                seqlen=seqlen, nheads_qk=ngroups, nheads=nheads, headdim_qk=n, headdim_angles=s,
                CHUNK_SIZE=chunk_size, HEADDIM_QK=hq, BLOCK_HEADDIM_QK=block, GQA_RATIO=nheads // ngroups)
    launch_kernel(ROTARY_BIAS_ANGLES, (nchunks, batch), args, Q, config)
    return res


ROTARY_BIAS_ANGLES = KernelSpec(
    name="mamba3_siso_bwd_rotary_bias_angles", module=MODULE, attr="mamba3_siso_bwd_kernel_rotary_bias_angles",
    arg_names=(
        "Q K Scale Gamma Q_bias K_bias Angles dQ_in dK_in dQK dQ dK dAngles dScale dGamma dQ_bias dK_bias "
        "stride_q_batch stride_q_seqlen stride_q_head stride_q_qkdim stride_k_batch stride_k_seqlen stride_k_head "
        "stride_k_qkdim stride_scale_batch stride_scale_head stride_scale_seqlen stride_gamma_batch stride_gamma_head "
        "stride_gamma_seqlen stride_q_bias_head stride_q_bias_qkdim stride_k_bias_head stride_k_bias_qkdim "
        "stride_angles_batch stride_angles_seqlen stride_angles_head stride_angles_qkdim stride_dq_in_batch "
        "stride_dq_in_seqlen stride_dq_in_head stride_dq_in_qkdim stride_dk_in_batch stride_dk_in_seqlen "
        "stride_dk_in_head stride_dk_in_qkdim stride_dqk_batch stride_dqk_head stride_dqk_seqlen stride_dq_batch "
        "stride_dq_seqlen stride_dq_head stride_dq_qkdim stride_dk_batch stride_dk_seqlen stride_dk_head "
        "stride_dk_qkdim stride_dangles_batch stride_dangles_seqlen stride_dangles_head stride_dangles_qkdim "
        "stride_dscale_batch stride_dscale_head stride_dscale_nqkchunks stride_dscale_seqlen stride_dgamma_batch "
        "stride_dgamma_head stride_dgamma_nqkchunks stride_dgamma_seqlen stride_dq_bias_batch stride_dq_bias_nchunks "
        "stride_dq_bias_head stride_dq_bias_qkdim stride_dk_bias_batch stride_dk_bias_nchunks stride_dk_bias_head "
        "stride_dk_bias_qkdim seqlen nheads_qk nheads headdim_qk headdim_angles CHUNK_SIZE HEADDIM_QK "
        "BLOCK_HEADDIM_QK GQA_RATIO"),
    autotune_key=("CHUNK_SIZE", "BLOCK_HEADDIM_QK", "HEADDIM_QK", "GQA_RATIO"),
    candidates=_CANDIDATES,
)


# ------------------------------------------------------------------------------------------------------ ddt, dtrap
@planned_launcher
def launch_ddt_dtrap(dscale, dgamma, DT, trap, *, config=None):
    """``(dDT, dTrap)`` [B, H, L] fp32 from the gradients of ``scale`` and ``gamma`` [B, H, L] (``trap`` before the
    sigmoid, fp32). Source: ``mamba3_siso_bwd_kernel_ddt_dtrap_dinput_states`` without input states (one program per
    ``(head, example)``; its ``CHUNK_SIZE`` tiles positions; the atomic adds of the input-state branch do not run)."""
    batch, nheads, seqlen = dscale.shape
    for name, t in (("dgamma", dgamma), ("DT", DT), ("trap", trap)):
        check_shape(name, t, dscale.shape, "[B, H, L]")
    _contiguous(dscale=dscale, dgamma=dgamma, DT=DT, trap=trap)
    ddt = alloc(DT.shape, torch.float32, DT.device)
    dtrap = alloc(trap.shape, torch.float32, trap.device)
    args = dict(dScale=dscale, dGamma=dgamma, DT=DT, Trap=trap, d_ISSM_State=dscale, Input_K_State=dscale,
                Input_V_State=dscale, Cu_Seqlens=None, dDT=ddt, dTrap=dtrap, dInput_SSM_State=ddt,
                dInput_K_State=ddt, dInput_V_State=ddt,
                **prefixed_strides("stride_dscale", "batch head seqlen", dscale),
                **prefixed_strides("stride_dgamma", "batch head seqlen", dgamma),
                **prefixed_strides("stride_dt", "batch head seqlen", DT),
                **prefixed_strides("stride_trap", "batch head seqlen", trap),
                **prefixed_strides("stride_d_issm_state", "batch head vdim qkdim", None),
                **prefixed_strides("stride_input_k_state", "batch head qkdim", None),
                **prefixed_strides("stride_input_v_state", "batch head vdim", None), stride_cu_seqlen=0,
                **prefixed_strides("stride_ddt", "batch head seqlen", ddt),
                **prefixed_strides("stride_dtrap", "batch head seqlen", dtrap),
                **prefixed_strides("stride_dinput_ssm_state", "batch head vdim qkdim", None),
                **prefixed_strides("stride_dinput_k_state", "batch head qkdim", None),
                **prefixed_strides("stride_dinput_v_state", "batch head vdim", None),
                seqlen=seqlen, headdim_v=64, headdim_qk=128, HEADDIM_V=64, HEADDIM_QK=128, HAS_INPUT_STATE=False,
                IS_VARLEN=False)
    launch_kernel(DDT_DTRAP, (nheads, batch), args, dscale, config)
    return ddt, dtrap


DDT_DTRAP = KernelSpec(
    name="mamba3_siso_bwd_ddt_dtrap", module=MODULE, attr="mamba3_siso_bwd_kernel_ddt_dtrap_dinput_states",
    arg_names=(
        "dScale dGamma DT Trap d_ISSM_State Input_K_State Input_V_State Cu_Seqlens dDT dTrap dInput_SSM_State "
        "dInput_K_State dInput_V_State stride_dscale_batch stride_dscale_head stride_dscale_seqlen "
        "stride_dgamma_batch stride_dgamma_head stride_dgamma_seqlen stride_dt_batch stride_dt_head stride_dt_seqlen "
        "stride_trap_batch stride_trap_head stride_trap_seqlen stride_d_issm_state_batch stride_d_issm_state_head "
        "stride_d_issm_state_vdim stride_d_issm_state_qkdim stride_input_k_state_batch stride_input_k_state_head "
        "stride_input_k_state_qkdim stride_input_v_state_batch stride_input_v_state_head "
        "stride_input_v_state_vdim stride_cu_seqlen stride_ddt_batch stride_ddt_head stride_ddt_seqlen "
        "stride_dtrap_batch stride_dtrap_head stride_dtrap_seqlen stride_dinput_ssm_state_batch "
        "stride_dinput_ssm_state_head stride_dinput_ssm_state_vdim stride_dinput_ssm_state_qkdim "
        "stride_dinput_k_state_batch stride_dinput_k_state_head stride_dinput_k_state_qkdim "
        "stride_dinput_v_state_batch stride_dinput_v_state_head stride_dinput_v_state_vdim seqlen headdim_v "
        "headdim_qk CHUNK_SIZE HEADDIM_V HEADDIM_QK HAS_INPUT_STATE IS_VARLEN"),
    autotune_key=("HEADDIM_V", "HEADDIM_QK", "HAS_INPUT_STATE", "IS_VARLEN"),
    candidates=tuple(({"CHUNK_SIZE": cs}, w, s) for cs in (64, 128, 256) for s in (1, 2, 3) for w in (2, 4, 8)),
)
