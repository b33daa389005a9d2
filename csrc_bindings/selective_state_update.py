"""Launcher for mamba-ssm's one-token SSM update (``_selective_scan_update_kernel``): the mirror of
``mamba_ssm/ops/triton/selective_state_update.py``.

Layout (launcher, example runner, spec): see :mod:`csrc_bindings._spec`. The kernel has no autotuner (upstream: "we
don't want autotune since it will overwrite the state"): its ``BLOCK_SIZE_M`` / ``num_warps`` follow upstream's
launch rule, a pure function of ``dstate`` (:func:`selective_state_update_rule`), reported with source
``"heuristic"``. The ``@triton.heuristics`` constexprs (``HAS_DT_BIAS``, ``HAS_D``, ``HAS_Z``,
``HAS_STATE_BATCH_INDICES``, ``BLOCK_SIZE_DSTATE``) are passed explicitly, with upstream's values. One program per
(``P`` tile, example, head): the state update is elementwise and the output's sum over ``N`` is one ``tl.sum``
inside the program, so nothing is summed across programs or examples.
"""
from __future__ import annotations

from ._configs import KernelConfig
from ._native import launch
from ._plans import planned
from ._spec import KernelSpec
from ._util import cdiv, check, check_groups, check_shape, next_pow2, out_buffer, strides

UPSTREAM = "mamba_ssm.ops.triton.selective_state_update"


def selective_state_update_rule(dstate: int) -> KernelConfig:
    """Upstream's rule: ``(BLOCK_SIZE_M, num_warps)`` = (32, 4) for ``N <= 16``, (16, 4) for ``<= 32``, (8, 4) for
    ``<= 64``, (4, 4) for ``<= 128``, else (4, 8); ``num_stages`` 3 (triton's default, which upstream leaves)."""
    block_m, warps = ((32, 4) if dstate <= 16 else (16, 4) if dstate <= 32 else (8, 4) if dstate <= 64
                      else (4, 4) if dstate <= 128 else (4, 8))
    return KernelConfig("selective_state_update", (("BLOCK_SIZE_M", block_m),), warps, 3, "heuristic")


def _config(dstate: int, config) -> KernelConfig:
    if config is None:
        return selective_state_update_rule(dstate)
    d = config.as_dict() if isinstance(config, KernelConfig) else dict(config)
    base = selective_state_update_rule(dstate)
    unknown = sorted(set(d) - {"BLOCK_SIZE_M", "num_warps", "num_stages"})
    check(not unknown, f"config: expected only BLOCK_SIZE_M, num_warps, num_stages for selective_state_update, "
                       f"got {unknown}")
    return KernelConfig("selective_state_update", (("BLOCK_SIZE_M", int(d.get("BLOCK_SIZE_M", base["BLOCK_SIZE_M"]))),),
                        int(d.get("num_warps", base.num_warps)), int(d.get("num_stages", base.num_stages)),
                        "explicit")


@planned
def launch_selective_state_update(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                                  state_batch_indices=None, config=None, out=None):
    """One decoding step of the SSM, in place on ``state``. Source: ``_selective_scan_update_kernel`` (upstream
    ``selective_state_update`` with heads).

    Args:
        state: ``[B, H, P, N]`` (updated in place: ``state = exp(A dt) state + dt B x``, in fp32, stored in its dtype).
        x: ``[B, H, P]``; dt: ``[B, H, P]`` (Mamba-2 repeats ``[B, H]`` with stride 0 over ``P``); A: ``[H, P, N]``
        fp32 (stride 0 over ``P`` and ``N`` in Mamba-2); B, C: ``[B, G, N]``; D: ``[H, P]`` or None; z: ``[B, H, P]``
        or None (``out * silu(z)``); dt_bias: ``[H, P]`` or None; dt_softplus: softplus of ``dt + dt_bias``.
        ``TIE_HDIM`` (one ``dt``/``A`` per head) is set as upstream: when ``A``, ``dt`` and ``dt_bias`` have stride 0
        in their last two (one) dims.
        state_batch_indices: ``[B]`` int32 or None (continuous batching; -1 skips the example).
        config: ``{"BLOCK_SIZE_M", "num_warps", "num_stages"}`` or None for upstream's rule
            (:func:`selective_state_update_rule`).
        out: optional ``[B, H, P]`` output, else ``empty_like(x)``.
    Returns:
        ``out`` ``[B, H, P]`` (dtype of ``x``): ``sum_n state[..., n] C[n] (+ D x) (* silu(z))``.
    Raises:
        ValueError: ``nheads`` not a multiple of ``ngroups``; an argument of another shape, ``dt_bias`` missing when
            ``A`` and ``dt`` are tied (upstream reads its strides), a given ``out`` of another shape, dtype or device;
            a ``config`` with other keys (the message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments changed.
    """
    batch, nheads, dim, dstate = state.shape
    check_shape("x", x, (batch, nheads, dim), "[B, H, P]")
    check_shape("dt", dt, (batch, nheads, dim), "[B, H, P]")
    check_shape("A", A, (nheads, dim, dstate), "[H, P, N]")
    ngroups = B.shape[1] if B.dim() == 3 else 0
    check_shape("B", B, (batch, ngroups, dstate), "[B, G, N]")
    check_groups(nheads, ngroups)
    check_shape("C", C, (batch, ngroups, dstate), "[B, G, N]")
    if D is not None:
        check_shape("D", D, (nheads, dim), "[H, P]")
    if z is not None:
        check_shape("z", z, (batch, nheads, dim), "[B, H, P]")
    if dt_bias is not None:
        check_shape("dt_bias", dt_bias, (nheads, dim), "[H, P]")
    if state_batch_indices is not None:
        check_shape("state_batch_indices", state_batch_indices, (batch,), "[B]")
    tie_hdim = A.stride(-1) == 0 and A.stride(-2) == 0 and dt.stride(-1) == 0
    if tie_hdim:
        check(dt_bias is not None, "dt_bias: expected a tensor when A and dt are tied over P (upstream reads its "
                                   "strides), got None")
        tie_hdim = dt_bias.stride(-1) == 0
    cfg = _config(dstate, config)
    out = out_buffer(out, (batch, nheads, dim), x.dtype, x, "out")
    args = dict(state_ptr=state, x_ptr=x, dt_ptr=dt, dt_bias_ptr=dt_bias, A_ptr=A, B_ptr=B, C_ptr=C, D_ptr=D,
                z_ptr=z, out_ptr=out, state_batch_indices_ptr=state_batch_indices, batch=batch, nheads=nheads,
                dim=dim, dstate=dstate, nheads_ngroups_ratio=nheads // ngroups, DT_SOFTPLUS=bool(dt_softplus),
                TIE_HDIM=bool(tie_hdim), HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None, HAS_Z=z is not None,
                HAS_STATE_BATCH_INDICES=state_batch_indices is not None, BLOCK_SIZE_DSTATE=next_pow2(dstate))
    args.update(strides("stride_state_batch stride_state_head stride_state_dim stride_state_dstate", state,
                        (0, 1, 2, 3)))
    args.update(strides("stride_x_batch stride_x_head stride_x_dim", x, (0, 1, 2)))
    args.update(strides("stride_dt_batch stride_dt_head stride_dt_dim", dt, (0, 1, 2)))
    args.update(strides("stride_dt_bias_head stride_dt_bias_dim", dt_bias, (0, 1)))
    args.update(strides("stride_A_head stride_A_dim stride_A_dstate", A, (0, 1, 2)))
    args.update(strides("stride_B_batch stride_B_group stride_B_dstate", B, (0, 1, 2)))
    args.update(strides("stride_C_batch stride_C_group stride_C_dstate", C, (0, 1, 2)))
    args.update(strides("stride_D_head stride_D_dim", D, (0, 1)))
    args.update(strides("stride_z_batch stride_z_head stride_z_dim", z, (0, 1, 2)))
    args.update(strides("stride_out_batch stride_out_head stride_out_dim", out, (0, 1, 2)))
    grid = (cdiv(dim, cfg["BLOCK_SIZE_M"]), batch, nheads)
    launch(SELECTIVE_STATE_UPDATE, grid, args, cfg, x)
    return out


def _example_selective_state_update(p, config=None):
    Bsz, H, P, N = p["batch"], p["nheads"], p["headdim"], p["dstate"]
    state = p["states"][:, 0].clone()  # [B, H, P, N] fp32
    return (launch_selective_state_update(
        state, p["x"][:, 0], p["dt_raw"][:, 0, :, None].expand(Bsz, H, P), p["A"][:, None, None].expand(H, P, N),
        p["Bm"][:, 0], p["Cm"][:, 0], D=p["D"][:, None].expand(H, P), z=p["z"][:, 0],
        dt_bias=p["dt_bias"][:, None].expand(H, P), dt_softplus=True, config=config), state)


SELECTIVE_STATE_UPDATE = KernelSpec(
    name="selective_state_update", module=UPSTREAM, attr="_selective_scan_update_kernel",
    arg_names=("state_ptr x_ptr dt_ptr dt_bias_ptr A_ptr B_ptr C_ptr D_ptr z_ptr out_ptr state_batch_indices_ptr "
               "batch nheads dim dstate nheads_ngroups_ratio stride_state_batch stride_state_head stride_state_dim "
               "stride_state_dstate stride_x_batch stride_x_head stride_x_dim stride_dt_batch stride_dt_head "
               "stride_dt_dim stride_dt_bias_head stride_dt_bias_dim stride_A_head stride_A_dim stride_A_dstate "
               "stride_B_batch stride_B_group stride_B_dstate stride_C_batch stride_C_group stride_C_dstate "
               "stride_D_head stride_D_dim stride_z_batch stride_z_head stride_z_dim stride_out_batch "
               "stride_out_head stride_out_dim DT_SOFTPLUS TIE_HDIM BLOCK_SIZE_M HAS_DT_BIAS HAS_D HAS_Z "
               "HAS_STATE_BATCH_INDICES BLOCK_SIZE_DSTATE"),
    autotune_key=None,
    candidates=None,
    example=_example_selective_state_update,
)
