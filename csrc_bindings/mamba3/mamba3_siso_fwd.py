"""Launcher for the Mamba-3 SISO forward (``mamba3_siso_fwd_kernel``): the mirror of
``mamba_ssm/ops/triton/mamba3/mamba3_siso_fwd.py``.

One program per ``(head, example)`` runs the example's chunks in order (the inter-chunk state in registers): no sum
across examples or programs. The launcher passes the kernel exactly what upstream's ``mamba3_siso_fwd`` passes for
the same call (the same ``None`` pointers, the same zero-initialised buffers), so the pinned launch computes
upstream's function; only the configuration differs from upstream's autotuned one.
"""
from __future__ import annotations

import torch

from .._spec import KernelSpec
from .._util import cdiv, check, check_shape, next_pow2, prefixed_strides
from .._plans import alloc
from ._runtime import launch_kernel, planned_launcher

MODULE = "mamba_ssm.ops.triton.mamba3.mamba3_siso_fwd"
_CANDIDATES = tuple(({}, w, s) for s in (1, 2, 3) for w in (2, 4, 8))


@planned_launcher
def launch_mamba3_siso_fwd(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, *, chunk_size: int,
                           store_for_backward: bool = True, return_final_states: bool = False, config=None) -> dict:
    """The Mamba-3 SISO scan. Source: ``mamba3_siso_fwd_kernel`` (no initial states, not varlen).

    Args:
        Q, K: [B, L, G, N] (``C`` and ``B`` after the RMSNorm), V: [B, L, H, P], Z: [B, L, H, P] or None, Angles:
            [B, L, H, S] (the cumulative angles of :func:`launch_angle_dt_fwd`): contiguous, of one 16-bit dtype (the
            layer casts them to bf16, as upstream). ADT, DT, Trap (before the sigmoid): [B, H, L], contiguous.
            Q_bias, K_bias: [H, N] fp32. D: [H] fp32 or None. chunk_size: the layer's.
        store_for_backward: also write what the backward reads (upstream's ``store_states_adt_outv``).
        return_final_states: also write the final SSM state and the last chunk's K (the prefill's cache).
        config: explicit ``{"num_warps": .., "num_stages": ..}`` or None (pinned).
    Returns:
        dict: ``out`` [B, L, H, P] (V's dtype); with ``store_for_backward`` also ``out_v`` (before the gate),
        ``ssm_states`` [B, H, P, nchunks N] bf16, ``da_cs`` [B, H, L], ``da_cs_sum`` [B, H, nchunks] fp32; always
        ``q_rot``, ``k_scaled`` [B, L, H, N], ``qk_dot``, ``scale``, ``gamma`` [B, H, L] fp32; with
        ``return_final_states`` ``final_ssm`` [B, H, P, N] fp32, ``final_k`` [B, H, N] fp32 and ``final_v`` [B, H, P].
    Raises:
        ValueError: shapes that do not match, non-contiguous inputs, ``H`` not a multiple of ``G``, ``S > N / 2``
            or odd ``S``.
    """
    batch, seqlen, ngroups, n = Q.shape
    _, _, nheads, p = V.shape
    check_shape("K", K, Q.shape, "the shape of Q")
    check(nheads % ngroups == 0, f"V: expected a number of heads that is a multiple of G={ngroups}, got {nheads}")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        check_shape(name, t, (batch, nheads, seqlen), "[B, H, L]")
    check_shape("Q_bias", Q_bias, (nheads, n), "[H, N]")
    check_shape("K_bias", K_bias, (nheads, n), "[H, N]")
    s = Angles.shape[-1]
    check_shape("Angles", Angles, (batch, seqlen, nheads, s), "[B, L, H, S]")
    check(s <= n // 2 and s % 2 == 0, f"Angles: expected an even S <= N / 2 = {n // 2}, got S={s}")
    if Z is not None:
        check_shape("Z", Z, V.shape, "the shape of V")
    for name, t in (("Q", Q), ("K", K), ("V", V), ("ADT", ADT), ("DT", DT), ("Trap", Trap), ("Angles", Angles),
                    ("Z", Z), ("Q_bias", Q_bias), ("K_bias", K_bias), ("D", D)):
        check(t is None or t.is_contiguous(), f"{name}: expected a contiguous tensor (the kernel's TMA descriptors)")
    dev = Q.device
    nchunks = cdiv(seqlen, chunk_size)
    out = alloc((batch, seqlen, nheads, p), V.dtype, dev)
    res = {"out": out}
    if store_for_backward:
        res.update(ssm_states=alloc((batch, nheads, p, nchunks * n), torch.bfloat16, dev, zero=True),
                   da_cs=alloc((batch, nheads, seqlen), torch.float32, dev),
                   da_cs_sum=alloc((batch, nheads, nchunks), torch.float32, dev, zero=True),
                   out_v=alloc((batch, seqlen, nheads, p), V.dtype, dev))
    res.update(q_rot=alloc((batch, seqlen, nheads, n), Q.dtype, dev),
               k_scaled=alloc((batch, seqlen, nheads, n), K.dtype, dev),
               qk_dot=alloc((batch, nheads, seqlen), torch.float32, dev),
               scale=alloc((batch, nheads, seqlen), torch.float32, dev),
               gamma=alloc((batch, nheads, seqlen), torch.float32, dev))
    final_ssm = final_k = None
    if return_final_states:
        final_ssm = alloc((batch, nheads, p, n), torch.float32, dev)
        final_k = alloc((batch, nheads, chunk_size, n), torch.float32, dev)
    g = res.get
    args = dict(Q=Q, K=K, V=V, ADT=ADT, DT=DT, Trap=Trap, Q_bias=Q_bias, K_bias=K_bias, Angles=Angles, D=D, Z=Z,
                Initial_SSM_State=None, Initial_K_State=None, Initial_V_State=None, Cu_Seqlens=None, Out=out,
                Out_v=g("out_v"), SSM_States=g("ssm_states"), DA_CS_Store=g("da_cs"), DA_CS_SUM_Store=g("da_cs_sum"),
                Q_store=res["q_rot"], K_store=res["k_scaled"], QK_store=res["qk_dot"], Scale_store=res["scale"],
                Gamma_store=res["gamma"], Final_SSM_State=final_ssm, Final_K_State=final_k)
    args.update(prefixed_strides("stride_q", "batch seqlen head qkdim", Q),
                **prefixed_strides("stride_k", "batch seqlen head qkdim", K),
                **prefixed_strides("stride_v", "batch seqlen head vdim", V),
                **prefixed_strides("stride_adt", "batch head seqlen", ADT),
                **prefixed_strides("stride_dt", "batch head seqlen", DT),
                **prefixed_strides("stride_trap", "batch head seqlen", Trap),
                **prefixed_strides("stride_q_bias", "head qkdim", Q_bias),
                **prefixed_strides("stride_k_bias", "head qkdim", K_bias),
                **prefixed_strides("stride_angles", "batch seqlen head qkdim", Angles),
                **prefixed_strides("stride_d", "head", D),
                **prefixed_strides("stride_z", "batch seqlen head vdim", Z),
                **prefixed_strides("stride_init_ssm_state", "seq head vdim qkdim", None),
                **prefixed_strides("stride_init_k_state", "seq head qkdim", None),
                **prefixed_strides("stride_init_v_state", "seq head vdim", None), stride_cu_seqlen=0,
                **prefixed_strides("stride_o", "batch seqlen head vdim", out),
                **prefixed_strides("stride_o_v", "batch seqlen head vdim", g("out_v")),
                **prefixed_strides("stride_ssm_states", "batch head vdim qkdim", g("ssm_states")),
                **prefixed_strides("stride_da_cs_store", "batch head seqlen", g("da_cs")),
                **prefixed_strides("stride_da_cs_sum_store", "batch head seqlen", g("da_cs_sum")),
                **prefixed_strides("stride_q_store", "batch seqlen head qkdim", res["q_rot"]),
                **prefixed_strides("stride_k_store", "batch seqlen head qkdim", res["k_scaled"]),
                **prefixed_strides("stride_qk_store", "batch head seqlen", res["qk_dot"]),
                **prefixed_strides("stride_scale_store", "batch head seqlen", res["scale"]),
                **prefixed_strides("stride_gamma_store", "batch head seqlen", res["gamma"]),
                **prefixed_strides("stride_final_ssm_state", "seq head vdim qkdim", final_ssm),
                **prefixed_strides("stride_final_k_state", "seq head chunk qkdim", final_k),
                seqlen=seqlen, nheads_qk=ngroups, headdim_qk=n, headdim_v=p, headdim_angles=s,
                CHUNK_SIZE=chunk_size, HEADDIM_QK=next_pow2(n), HEADDIM_V=next_pow2(p),
                STORE_SSM_STATES_ADT_OUTV=bool(store_for_backward), HAS_INITIAL_STATES=False,
                RETURN_FINAL_STATES=bool(return_final_states), HAS_D=D is not None, HAS_Z=Z is not None,
                IS_VARLEN=False)
    launch_kernel(MAMBA3_SISO_FWD, (nheads, batch), args, Q, config)
    if return_final_states:
        res.update(final_ssm=final_ssm, final_k=final_k[:, :, (seqlen - 1) % chunk_size, :], final_v=V[:, -1])
    return res


MAMBA3_SISO_FWD = KernelSpec(
    name="mamba3_siso_fwd", module=MODULE, attr="mamba3_siso_fwd_kernel",
    arg_names=(
        "Q K V ADT DT Trap Q_bias K_bias Angles D Z Initial_SSM_State Initial_K_State Initial_V_State Cu_Seqlens Out "
        "Out_v SSM_States DA_CS_Store DA_CS_SUM_Store Q_store K_store QK_store Scale_store Gamma_store "
        "Final_SSM_State Final_K_State stride_q_batch stride_q_seqlen stride_q_head stride_q_qkdim stride_k_batch "
        "stride_k_seqlen stride_k_head stride_k_qkdim stride_v_batch stride_v_seqlen stride_v_head stride_v_vdim "
        "stride_adt_batch stride_adt_head stride_adt_seqlen stride_dt_batch stride_dt_head stride_dt_seqlen "
        "stride_trap_batch stride_trap_head stride_trap_seqlen stride_q_bias_head stride_q_bias_qkdim "
        "stride_k_bias_head stride_k_bias_qkdim stride_angles_batch stride_angles_seqlen stride_angles_head "
        "stride_angles_qkdim stride_d_head stride_z_batch stride_z_seqlen stride_z_head stride_z_vdim "
        "stride_init_ssm_state_seq stride_init_ssm_state_head stride_init_ssm_state_vdim "
        "stride_init_ssm_state_qkdim stride_init_k_state_seq stride_init_k_state_head stride_init_k_state_qkdim "
        "stride_init_v_state_seq stride_init_v_state_head stride_init_v_state_vdim stride_cu_seqlen stride_o_batch "
        "stride_o_seqlen stride_o_head stride_o_vdim stride_o_v_batch stride_o_v_seqlen stride_o_v_head "
        "stride_o_v_vdim stride_ssm_states_batch stride_ssm_states_head stride_ssm_states_vdim "
        "stride_ssm_states_qkdim stride_da_cs_store_batch stride_da_cs_store_head stride_da_cs_store_seqlen "
        "stride_da_cs_sum_store_batch stride_da_cs_sum_store_head stride_da_cs_sum_store_seqlen "
        "stride_q_store_batch stride_q_store_seqlen stride_q_store_head stride_q_store_qkdim stride_k_store_batch "
        "stride_k_store_seqlen stride_k_store_head stride_k_store_qkdim stride_qk_store_batch stride_qk_store_head "
        "stride_qk_store_seqlen stride_scale_store_batch stride_scale_store_head stride_scale_store_seqlen "
        "stride_gamma_store_batch stride_gamma_store_head stride_gamma_store_seqlen stride_final_ssm_state_seq "
        "stride_final_ssm_state_head stride_final_ssm_state_vdim stride_final_ssm_state_qkdim "
        "stride_final_k_state_seq stride_final_k_state_head stride_final_k_state_chunk stride_final_k_state_qkdim "
        "seqlen nheads_qk headdim_qk headdim_v headdim_angles CHUNK_SIZE HEADDIM_QK HEADDIM_V "
        "STORE_SSM_STATES_ADT_OUTV HAS_INITIAL_STATES RETURN_FINAL_STATES HAS_D HAS_Z IS_VARLEN"),
    autotune_key=("CHUNK_SIZE", "HEADDIM_QK", "HEADDIM_V", "STORE_SSM_STATES_ADT_OUTV", "HAS_D", "HAS_Z",
                  "HAS_INITIAL_STATES", "RETURN_FINAL_STATES", "IS_VARLEN"),
    candidates=_CANDIDATES,
)
