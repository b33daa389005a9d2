"""Launchers for mamba-ssm's gated RMSNorm (``mamba_ssm/ops/triton/layernorm_gated.py``) and SwiGLU
(``mamba_ssm/ops/triton/k_activations.py``) Triton kernels.

Same contract as :mod:`csrc_bindings.ssd`: the JIT function is launched directly with a pinned configuration, every
output element has a single writer, and the outputs are bitwise reproducible for fixed inputs, configuration, GPU
model and versions. The RMSNorm weight/bias gradients come back as per-row-block partials whose partition
(``rows_per_program``) is chosen by the caller, so partials can be aligned to examples and chunks instead of the
SM count (upstream derives it from ``multi_processor_count``).
"""
from __future__ import annotations

import torch

from ._configs import KernelConfig, resolve_config, rmsnorm_heuristic
from ._native import launch
from ._util import cdiv, check, out_buffer


def _rms_config(kind: str, group_size: int, x: torch.Tensor, config) -> KernelConfig:
    base = rmsnorm_heuristic(group_size, x.element_size())
    if config is None:
        return KernelConfig(kind, base.meta, base.num_warps, base.num_stages, "heuristic")
    d = config.as_dict() if isinstance(config, KernelConfig) else dict(config)
    block_n = int(d.get("BLOCK_N", base["BLOCK_N"]))
    check(block_n >= group_size and block_n & (block_n - 1) == 0,
          f"BLOCK_N must be a power of two >= group_size ({group_size}), got {block_n}")
    return KernelConfig(kind, (("BLOCK_N", block_n),), int(d.get("num_warps", base.num_warps)),
                        int(d.get("num_stages", base.num_stages)), "explicit")


def _groups(x: torch.Tensor, group_size):
    M, N = x.shape
    group_size = N if group_size is None else int(group_size)
    check(N % group_size == 0, f"N ({N}) must be a multiple of group_size ({group_size})")
    return M, N, group_size, N // group_size


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
        ValueError: bad shapes/strides, or a group wider than 64 KB.
    """
    M, N, group_size, ngroups = _groups(x, group_size)
    check(x.stride(-1) == 1, "x must have stride 1 in its last dim")
    if z is not None:
        check(tuple(z.shape) == (M, N) and z.stride(-1) == 1, "z must be [M, N] with stride 1 in the last dim")
    check(tuple(weight.shape) == (N,) and weight.stride(-1) == 1, "weight must be a contiguous [N]")
    if bias is not None:
        check(tuple(bias.shape) == (N,) and bias.stride(-1) == 1, "bias must be a contiguous [N]")
    cfg = _rms_config("rmsnorm_gated_fwd", group_size, x, config)
    if out is None:
        out = torch.empty_like(x)
    check(tuple(out.shape) == (M, N) and out.stride(-1) == 1, "out must be [M, N] with stride 1 in the last dim")
    rstd = torch.empty((ngroups * M,), dtype=torch.float32, device=x.device)
    args = dict(X=x, Y=out, W=weight, B=bias, Z=z, Mean=None, Rstd=rstd, stride_x_row=x.stride(0),
                stride_y_row=out.stride(0), stride_z_row=z.stride(0) if z is not None else 0, M=M, N=group_size,
                eps=eps, HAS_BIAS=bias is not None, HAS_Z=z is not None, NORM_BEFORE_GATE=bool(norm_before_gate),
                IS_RMS_NORM=True)
    launch("rmsnorm_gated_fwd", (M, ngroups), args, cfg, x)
    return out, rstd


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
    """
    M, N, group_size, ngroups = _groups(x, group_size)
    check(x.stride(-1) == 1 and dy.stride(-1) == 1, "x and dy must have stride 1 in their last dim")
    check(tuple(dy.shape) == (M, N), "dy must be [M, N]")
    check(tuple(rstd.shape) == (ngroups * M,), "rstd must be [ngroups * M]")
    if z is not None:
        check(tuple(z.shape) == (M, N) and z.stride(-1) == 1, "z must be [M, N] with stride 1 in the last dim")
    check(tuple(weight.shape) == (N,) and weight.stride(-1) == 1, "weight must be a contiguous [N]")
    if bias is not None:
        check(tuple(bias.shape) == (N,) and bias.stride(-1) == 1, "bias must be a contiguous [N]")
    rows_per_program = int(rows_per_program)
    check(rows_per_program >= 1, "rows_per_program must be >= 1")
    cfg = _rms_config("rmsnorm_gated_bwd", group_size, x, config)
    nblocks = cdiv(M, rows_per_program)
    if dx is None:
        dx = torch.empty_like(x)
    check(tuple(dx.shape) == (M, N) and dx.stride(-1) == 1, "dx must be [M, N] with stride 1 in the last dim")
    if z is not None:
        if dz is None:
            dz = torch.empty_like(z)
        check(tuple(dz.shape) == (M, N) and dz.stride(-1) == 1, "dz must be [M, N] with stride 1 in the last dim")
    else:
        check(dz is None, "dz given without z")
    if recompute_output:
        if out is None:
            out = torch.empty_like(x)
        check(tuple(out.shape) == (M, N) and out.stride(-1) == 1, "out must be [M, N], stride 1 in the last dim")
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
    launch("rmsnorm_gated_bwd", (nblocks, ngroups), args, cfg, x)
    return dx, dw_partial, db_partial, dz, out


def _split_xy(xy: torch.Tensor):
    if xy.stride(-1) != 1:
        xy = xy.contiguous()
    xy2 = xy.reshape(-1, xy.shape[-1])
    check(xy2.shape[-1] % 2 == 0, "the last dim of xy must be even")
    x, y = xy2.chunk(2, dim=-1)
    return xy, xy2, x, y


def launch_swiglu_fwd(xy, *, config=None, out=None):
    """``out = silu(x) * y`` with ``x, y = xy.chunk(2, -1)``. Source: ``_swiglu_fwd_kernel``.

    Args:
        xy: ``[..., 2 * n]`` (key dtype; copied contiguous if its last dim is strided).
        config: ``BLOCK_N`` config or None (key: ``ncols = n``).
        out: optional ``[..., n]`` output (stride 1 last), else a new tensor.
    Returns:
        ``out`` ``[..., n]``. Elementwise: no reduction.
    """
    xy, xy2, x, y = _split_xy(xy)
    batch_shape = xy.shape[:-1]
    M, N = x.shape
    if out is None:
        out2 = torch.empty_like(x)
    else:
        out2 = out.reshape(-1, out.shape[-1])
        check(tuple(out2.shape) == (M, N), "out must be [..., n]")
    check(out2.stride(-1) == 1, "out must have stride 1 in its last dim")
    cfg = resolve_config("swiglu_fwd", {"ncols": N}, xy.dtype, xy.device, config)
    args = dict(X=x, Y=y, OUT=out2, stride_x_row=x.stride(0), stride_y_row=y.stride(0),
                stride_out_row=out2.stride(0), ncols=N)
    launch("swiglu_fwd", (M, cdiv(N, cfg["BLOCK_N"])), args, cfg, xy)
    return out2.reshape(*batch_shape, N)


def launch_swiglu_bwd(xy, dout, *, recompute_output=False, config=None, dxy=None, out=None):
    """Backward of :func:`launch_swiglu_fwd`. Source: ``_swiglu_bwd_kernel``.

    Args:
        xy: ``[..., 2 * n]``; dout: ``[..., n]``; recompute_output: also write the forward output.
        config: ``BLOCK_N`` config or None (key: ``ncols = n``).
        dxy: optional ``[..., 2 * n]`` output; out: optional ``[..., n]`` (with ``recompute_output``).
    Returns:
        ``dxy`` (and ``out`` when ``recompute_output``), as upstream's ``_swiglu_bwd``. Elementwise.
    """
    xy, xy2, x, y = _split_xy(xy)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    batch_shape = xy.shape[:-1]
    dout2 = dout.reshape(-1, dout.shape[-1])
    M, N = x.shape
    check(tuple(dout2.shape) == (M, N), "dout must be [..., n]")
    dxy2 = torch.empty_like(xy2) if dxy is None else dxy.reshape(-1, dxy.shape[-1])
    check(tuple(dxy2.shape) == tuple(xy2.shape), "dxy must be shaped like xy")
    dx, dy = dxy2.chunk(2, dim=-1)
    check(dx.stride(-1) == 1 and dy.stride(-1) == 1, "dxy must have stride 1 in its last dim")
    if recompute_output:
        out2 = torch.empty_like(x) if out is None else out.reshape(-1, out.shape[-1])
        check(tuple(out2.shape) == (M, N) and out2.stride(-1) == 1, "out must be [..., n], stride 1 last")
    else:
        out2 = None
    cfg = resolve_config("swiglu_bwd", {"ncols": N}, xy.dtype, xy.device, config)
    args = dict(X=x, Y=y, DOUT=dout2, OUT=out2, DX=dx, DY=dy, stride_x_row=x.stride(0), stride_y_row=y.stride(0),
                stride_dout_row=dout2.stride(0), stride_out_row=out2.stride(0) if out2 is not None else 0,
                stride_dx_row=dx.stride(0), stride_dy_row=dy.stride(0), ncols=N,
                RECOMPUTE_OUTPUT=out2 is not None)
    launch("swiglu_bwd", (M, cdiv(N, cfg["BLOCK_N"])), args, cfg, xy)
    dxy_out = dxy2.reshape(*batch_shape, dxy2.shape[-1])
    if not recompute_output:
        return dxy_out
    return dxy_out, out2.reshape(*batch_shape, N)
