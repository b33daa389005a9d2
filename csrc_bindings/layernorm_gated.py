"""Launchers for mamba-ssm's gated RMSNorm: the mirror of ``mamba_ssm/ops/triton/layernorm_gated.py``.

For each kernel: its launcher, its example runner and its :class:`~csrc_bindings._spec.KernelSpec` (see
:mod:`csrc_bindings.ssd_chunk_state`). The kernels have no autotuner: the configuration follows upstream's launch
heuristic (:func:`rmsnorm_heuristic`). Every output element has a single writer, and the outputs are bitwise
reproducible for fixed inputs, configuration, GPU model and versions. The weight/bias gradients come back as
per-row-block partials whose partition (``rows_per_program``) is chosen by the caller, so partials can be aligned to
examples and chunks instead of the SM count (upstream derives it from ``multi_processor_count``).
"""
from __future__ import annotations

import torch

from ._configs import KernelConfig
from ._native import launch
from ._plans import alloc, alloc_like, planned
from ._spec import KernelSpec
from ._util import cdiv, check, check_last_stride_1, check_rows, check_shape, next_pow2, out_buffer

UPSTREAM = "mamba_ssm.ops.triton.layernorm_gated"


def rmsnorm_heuristic(group_size: int, element_size: int) -> KernelConfig:
    """Upstream's gated-RMSNorm launch rule: ``BLOCK_N = next_pow2(group_size)`` (≤ 64 KB), warps = BLOCK_N/256 in
    [1, 8], 3 stages. Raises ValueError when a group does not fit in one block (upstream raises too)."""
    max_fused = 65536 // element_size
    block_n = min(max_fused, next_pow2(group_size))
    if group_size > block_n:
        raise ValueError(f"group_size: expected at most {max_fused} elements (64 KB per row, upstream's limit), "
                         f"got {group_size}")
    warps = min(max(block_n // 256, 1), 8)
    return KernelConfig("rmsnorm_gated", (("BLOCK_N", block_n),), warps, 3, "heuristic")


def _rms_config(kind: str, group_size: int, x: torch.Tensor, config) -> KernelConfig:
    base = rmsnorm_heuristic(group_size, x.element_size())
    if config is None:
        return KernelConfig(kind, base.meta, base.num_warps, base.num_stages, "heuristic")
    d = config.as_dict() if isinstance(config, KernelConfig) else dict(config)
    block_n = int(d.get("BLOCK_N", base["BLOCK_N"]))
    check(block_n >= group_size and block_n & (block_n - 1) == 0,
          f"BLOCK_N: expected a power of two >= group_size ({group_size}), got {block_n}")
    return KernelConfig(kind, (("BLOCK_N", block_n),), int(d.get("num_warps", base.num_warps)),
                        int(d.get("num_stages", base.num_stages)), "explicit")


def _groups(x: torch.Tensor, group_size):
    M, N = x.shape
    group_size = N if group_size is None else int(group_size)
    check(N % group_size == 0, f"group_size: expected a divisor of N ({N}), got {group_size}")
    return M, N, group_size, N // group_size


# ------------------------------------------------------------------------------------------------- rmsnorm_gated_fwd
@planned
def launch_rmsnorm_gated_fwd(x, weight, eps, *, z=None, bias=None, group_size=None, norm_before_gate=True,
                             config=None, out=None):
    """Gated (grouped) RMSNorm forward: ``y = rmsnorm(x) * w (+ b)``, times ``silu(z)`` after the norm
    (``norm_before_gate``) or applied to ``x`` before it. Source: ``_layer_norm_fwd_1pass_kernel`` with
    ``IS_RMS_NORM=True``.

    Args:
        x: ``[M, N]`` (rows = ``B * L``; stride 1 in the last dim); weight: ``[N]``; eps: float;
        z: ``[M, N]`` or None; bias: ``[N]`` or None; group_size: normalised group width (default N; Mamba-2 uses
        ``nheads * headdim // ngroups``).
        config: ``{"BLOCK_N", "num_warps", "num_stages"}`` or None for upstream's heuristic (``BLOCK_N =
        next_pow2(group_size)``, ``num_warps = clamp(BLOCK_N // 256, 1, 8)``, 3 stages).
        out: optional ``[M, N]`` output (stride 1 last), else ``empty_like(x)``.
    Returns:
        ``(out, rstd)``: ``rstd`` ``[ngroups * M]`` fp32 (group-major). One program per (row, group): no reduction
        across programs.
    Raises:
        ValueError: ``group_size`` not dividing ``N``; ``z``, ``weight``, ``bias`` or ``out`` of another shape or
            without stride 1 in the last dim; a group wider than 64 KB; a ``config`` whose ``BLOCK_N`` is not a power of
            two >= ``group_size`` (the message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    M, N, group_size, ngroups = _groups(x, group_size)
    check_last_stride_1("x", x)
    if z is not None:
        check_rows("z", z, (M, N), "[M, N]")
    check_rows("weight", weight, (N,), "[N]")
    if bias is not None:
        check_rows("bias", bias, (N,), "[N]")
    cfg = _rms_config("rmsnorm_gated_fwd", group_size, x, config)
    if out is None:
        out = alloc_like(x)
    check_rows("out", out, (M, N), "[M, N]")
    rstd = alloc((ngroups * M,), torch.float32, x.device)
    args = dict(X=x, Y=out, W=weight, B=bias, Z=z, Mean=None, Rstd=rstd, stride_x_row=x.stride(0),
                stride_y_row=out.stride(0), stride_z_row=z.stride(0) if z is not None else 0, M=M, N=group_size,
                eps=eps, HAS_BIAS=bias is not None, HAS_Z=z is not None, NORM_BEFORE_GATE=bool(norm_before_gate),
                IS_RMS_NORM=True)
    launch(RMSNORM_GATED_FWD, (M, ngroups), args, cfg, x)
    return out, rstd


def _example_rows(p):
    """The example problem's ``(x, z, group_size)`` as ``[B * L, H * P]`` rows."""
    x2 = p["out_x"].reshape(p["batch"] * p["seqlen"], -1)
    z2 = p["z"].reshape(p["batch"] * p["seqlen"], -1)
    return x2, z2, x2.shape[1] // p["ngroups"]


def _example_rmsnorm_gated_fwd(p, config=None):
    x2, z2, group_size = _example_rows(p)
    return launch_rmsnorm_gated_fwd(x2, p["rms_w"], 1e-5, z=z2, group_size=group_size, norm_before_gate=False,
                                    config=config)


RMSNORM_GATED_FWD = KernelSpec(
    name="rmsnorm_gated_fwd", module=UPSTREAM, attr="_layer_norm_fwd_1pass_kernel",
    arg_names=("X Y W B Z Mean Rstd stride_x_row stride_y_row stride_z_row M N eps BLOCK_N HAS_BIAS HAS_Z "
               "NORM_BEFORE_GATE IS_RMS_NORM"),
    autotune_key=None,
    candidates=None,
    example=_example_rmsnorm_gated_fwd,
)


# ------------------------------------------------------------------------------------------------- rmsnorm_gated_bwd
@planned
def launch_rmsnorm_gated_bwd(dy, x, weight, eps, rstd, *, rows_per_program, z=None, bias=None, group_size=None,
                             norm_before_gate=True, recompute_output=False, config=None, dx=None, dz=None, out=None,
                             dw_partial=None, db_partial=None):
    """Gated RMSNorm backward. Source: ``_layer_norm_bwd_kernel`` with ``IS_RMS_NORM=True``.

    Args:
        dy, x: ``[M, N]`` (stride 1 last); weight: ``[N]``; eps: float; rstd: ``[ngroups * M]`` from the forward;
        rows_per_program: rows handled (sequentially, in row order) by one program; the caller picks it, e.g. ``L``
            (one example per row block) or ``chunk_size``; must not depend on the SM count for reproducibility
            across GPUs of one model.
        z, bias, group_size, norm_before_gate: as in the forward.
        recompute_output: also write the forward output into ``out``.
        config: as in the forward (heuristic by default).
        dx, dz, out: optional outputs ``[M, N]``; dz is required-shaped like z.
    Returns:
        ``(dx, dw_partial, db_partial, dz, out)``: ``dw_partial`` ``[R, N]`` fp32 with ``R = ceil(M /
        rows_per_program)``; row ``r`` is the sum over rows ``[r * rows_per_program, (r+1) * rows_per_program)``
        accumulated in row order, and ``dweight = fold(+, dw_partial[r] for r)``. ``db_partial`` likewise (None
        without bias); ``dz`` None without z; ``out`` None unless ``recompute_output``.
    Raises:
        ValueError: as the forward, and ``dy``, ``rstd``, ``dx``, ``dz`` of another shape, ``dz`` without ``z``,
            ``rows_per_program`` < 1, a given output buffer of another shape, dtype or device (the message names the
            argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    M, N, group_size, ngroups = _groups(x, group_size)
    check_last_stride_1("x", x)
    check_rows("dy", dy, (M, N), "[M, N]")
    check_shape("rstd", rstd, (ngroups * M,), "[ngroups * M]")
    if z is not None:
        check_rows("z", z, (M, N), "[M, N]")
    check_rows("weight", weight, (N,), "[N]")
    if bias is not None:
        check_rows("bias", bias, (N,), "[N]")
    rows_per_program = int(rows_per_program)
    check(rows_per_program >= 1, f"rows_per_program: expected >= 1, got {rows_per_program}")
    cfg = _rms_config("rmsnorm_gated_bwd", group_size, x, config)
    nblocks = cdiv(M, rows_per_program)
    if dx is None:
        dx = alloc_like(x)
    check_rows("dx", dx, (M, N), "[M, N]")
    if z is not None:
        if dz is None:
            dz = alloc_like(z)
        check_rows("dz", dz, (M, N), "[M, N]")
    else:
        check(dz is None, "dz: expected None without z, got a tensor")
    if recompute_output:
        if out is None:
            out = alloc_like(x)
        check_rows("out", out, (M, N), "[M, N]")
    else:
        out = None
    dw_partial = out_buffer(dw_partial, (nblocks, N), torch.float32, x, "dw_partial")
    db_partial = out_buffer(db_partial, (nblocks, N), torch.float32, x, "db_partial") if bias is not None else None
    args = dict(X=x, W=weight, B=bias, Z=z, Y=out, DY=dy, DX=dx, DW=dw_partial, DB=db_partial, DZ=dz, Mean=None,
                Rstd=rstd, stride_x_row=x.stride(0), stride_z_row=z.stride(0) if z is not None else 0,
                stride_y_row=out.stride(0) if out is not None else 0, stride_dy_row=dy.stride(0),
                stride_dx_row=dx.stride(0), stride_dz_row=dz.stride(0) if dz is not None else 0,
                stride_dw_row=dw_partial.stride(0), stride_db_row=db_partial.stride(0) if db_partial is not None else 0,
                M=M, N=group_size, eps=eps, rows_per_program=rows_per_program,
                NORM_BEFORE_GATE=bool(norm_before_gate), IS_RMS_NORM=True, HAS_BIAS=bias is not None,
                HAS_Z=z is not None, RECOMPUTE_OUTPUT=out is not None)
    launch(RMSNORM_GATED_BWD, (nblocks, ngroups), args, cfg, x)
    return dx, dw_partial, db_partial, dz, out


def _example_rmsnorm_gated_bwd(p, config=None):
    x2, z2, group_size = _example_rows(p)
    _, rstd = launch_rmsnorm_gated_fwd(x2, p["rms_w"], 1e-5, z=z2, group_size=group_size, norm_before_gate=False)
    return launch_rmsnorm_gated_bwd(p["dy_rms"], x2, p["rms_w"], 1e-5, rstd, rows_per_program=p["seqlen"], z=z2,
                                    group_size=group_size, norm_before_gate=False, config=config)


RMSNORM_GATED_BWD = KernelSpec(
    name="rmsnorm_gated_bwd", module=UPSTREAM, attr="_layer_norm_bwd_kernel",
    arg_names=("X W B Z Y DY DX DW DB DZ Mean Rstd stride_x_row stride_z_row stride_y_row stride_dy_row stride_dx_row "
               "stride_dz_row stride_dw_row stride_db_row M N eps rows_per_program NORM_BEFORE_GATE IS_RMS_NORM "
               "HAS_BIAS HAS_Z RECOMPUTE_OUTPUT BLOCK_N"),
    autotune_key=None,
    candidates=None,
    example=_example_rmsnorm_gated_bwd,
)
