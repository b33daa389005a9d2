"""Launchers for SwiGLU (``_swiglu_fwd_kernel``, ``_swiglu_bwd_kernel``): the mirror of
``mamba_ssm/ops/triton/k_activations.py``.

Layout (launcher, example runner, spec per kernel): see :mod:`csrc_bindings._spec`.
"""
from __future__ import annotations

import torch

from ._configs import launch_config
from ._native import launch
from ._spec import KernelSpec
from ._util import cdiv, check, check_last_stride_1, check_shape

UPSTREAM = "mamba_ssm.ops.triton.k_activations"
_INF = float("inf")


def _split_xy(xy: torch.Tensor):
    if xy.stride(-1) != 1:
        xy = xy.contiguous()
    xy2 = xy.reshape(-1, xy.shape[-1])
    check(xy2.shape[-1] % 2 == 0, f"xy: expected an even last dim, got shape {tuple(xy.shape)}")
    x, y = xy2.chunk(2, dim=-1)
    return xy, xy2, x, y


# -------------------------------------------------------------------------------------------------------- swiglu_fwd
def launch_swiglu_fwd(xy, *, config=None, out=None):
    """``out = silu(x) * y`` with ``x, y = xy.chunk(2, -1)``. Source: ``_swiglu_fwd_kernel``.

    Args:
        xy: ``[..., 2 * n]`` (key dtype; copied contiguous if its last dim is strided).
        config: ``BLOCK_N`` config or None (key: ``ncols = n``).
        out: optional ``[..., n]`` output (stride 1 last), else a new tensor.
    Returns:
        ``out`` ``[..., n]``. Elementwise: no reduction.
    Raises:
        ValueError: ``xy`` with an odd last dim; ``out`` of another shape or without stride 1 in the last dim; a
            ``config`` for another kernel or without exactly its block sizes (the message names the argument, the
            expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    xy, xy2, x, y = _split_xy(xy)
    batch_shape = xy.shape[:-1]
    M, N = x.shape
    if out is None:
        out2 = torch.empty_like(x)
    else:
        out2 = out.reshape(-1, out.shape[-1])
        check_shape("out", out2, (M, N), "[..., n] (rows flattened)")
    check_last_stride_1("out", out2)
    args = dict(ncols=N)
    cfg = launch_config(SWIGLU_FWD, args, xy, config)
    args.update(X=x, Y=y, OUT=out2, stride_x_row=x.stride(0), stride_y_row=y.stride(0),
                stride_out_row=out2.stride(0))
    launch(SWIGLU_FWD, (M, cdiv(N, cfg["BLOCK_N"])), args, cfg, xy)
    return out2.reshape(*batch_shape, N)


def _example_swiglu_fwd(p, config=None):
    return (launch_swiglu_fwd(p["xy"], config=config),)


SWIGLU_FWD = KernelSpec(
    name="swiglu_fwd", module=UPSTREAM, attr="_swiglu_fwd_kernel",
    arg_names=("X Y OUT stride_x_row stride_y_row stride_out_row ncols BLOCK_N"),
    autotune_key=("ncols",),
    candidates=(
        ({"BLOCK_N": 32}, 4, 3),
        ({"BLOCK_N": 64}, 4, 3),
        ({"BLOCK_N": 128}, 4, 3),
        ({"BLOCK_N": 256}, 4, 3),
        ({"BLOCK_N": 512}, 4, 3),
        ({"BLOCK_N": 1024}, 4, 3),
    ),
    example=_example_swiglu_fwd,
)


# -------------------------------------------------------------------------------------------------------- swiglu_bwd
def launch_swiglu_bwd(xy, dout, *, recompute_output=False, config=None, dxy=None, out=None):
    """Backward of :func:`launch_swiglu_fwd`. Source: ``_swiglu_bwd_kernel``.

    Args:
        xy: ``[..., 2 * n]``; dout: ``[..., n]``; recompute_output: also write the forward output.
        config: ``BLOCK_N`` config or None (key: ``ncols = n``).
        dxy: optional ``[..., 2 * n]`` output; out: optional ``[..., n]`` (with ``recompute_output``).
    Returns:
        ``dxy`` (and ``out`` when ``recompute_output``), as upstream's ``_swiglu_bwd``. Elementwise.
    Raises:
        ValueError: ``xy`` with an odd last dim; ``dout``, ``dxy`` or ``out`` of another shape, or ``dxy``/``out``
            without stride 1 in the last dim; a ``config`` for another kernel or without exactly its block sizes (the
            message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    xy, xy2, x, y = _split_xy(xy)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    batch_shape = xy.shape[:-1]
    dout2 = dout.reshape(-1, dout.shape[-1])
    M, N = x.shape
    check_shape("dout", dout2, (M, N), "[..., n] (rows flattened)")
    dxy2 = torch.empty_like(xy2) if dxy is None else dxy.reshape(-1, dxy.shape[-1])
    check_shape("dxy", dxy2, xy2.shape, "that of xy (rows flattened)")
    dx, dy = dxy2.chunk(2, dim=-1)
    check(dx.stride(-1) == 1 and dy.stride(-1) == 1,
          f"dxy: expected stride 1 in the last dim, got strides {tuple(dxy2.stride())}")
    if recompute_output:
        out2 = torch.empty_like(x) if out is None else out.reshape(-1, out.shape[-1])
        check_shape("out", out2, (M, N), "[..., n] (rows flattened)")
        check_last_stride_1("out", out2)
    else:
        out2 = None
    args = dict(ncols=N, RECOMPUTE_OUTPUT=out2 is not None)
    cfg = launch_config(SWIGLU_BWD, args, xy, config)
    args.update(X=x, Y=y, DOUT=dout2, OUT=out2, DX=dx, DY=dy, stride_x_row=x.stride(0), stride_y_row=y.stride(0),
                stride_dout_row=dout2.stride(0), stride_out_row=out2.stride(0) if out2 is not None else 0,
                stride_dx_row=dx.stride(0), stride_dy_row=dy.stride(0))
    launch(SWIGLU_BWD, (M, cdiv(N, cfg["BLOCK_N"])), args, cfg, xy)
    dxy_out = dxy2.reshape(*batch_shape, dxy2.shape[-1])
    if not recompute_output:
        return dxy_out
    return dxy_out, out2.reshape(*batch_shape, N)


def _example_swiglu_bwd(p, config=None):
    return launch_swiglu_bwd(p["xy"], p["dsw"], recompute_output=True, config=config)


SWIGLU_BWD = KernelSpec(
    name="swiglu_bwd", module=UPSTREAM, attr="_swiglu_bwd_kernel",
    arg_names=("X Y DOUT OUT DX DY stride_x_row stride_y_row stride_dout_row stride_out_row stride_dx_row "
               "stride_dy_row ncols BLOCK_N RECOMPUTE_OUTPUT"),
    autotune_key=("ncols",),
    candidates=(
        ({"BLOCK_N": 32}, 4, 3),
        ({"BLOCK_N": 64}, 4, 3),
        ({"BLOCK_N": 128}, 4, 3),
        ({"BLOCK_N": 256}, 4, 3),
        ({"BLOCK_N": 512}, 4, 3),
        ({"BLOCK_N": 1024}, 4, 3),
    ),
    example=_example_swiglu_bwd,
)
