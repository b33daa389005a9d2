"""Launchers for causal-conv1d 1.7.0's C++ ops (``causal_conv1d_cuda.causal_conv1d_fwd`` / ``_bwd`` / ``_update``):
the mirror of
``causal_conv1d/causal_conv1d_interface.py`` (the ``causal_conv1d_fn`` wrappers, which call the same ops through
``causal_conv1d/cpp_functions.py``).

For each op: its launcher, its example runner and its :class:`~csrc_bindings._spec.KernelSpec` (module, op name and
number of arguments of the pybind function, checked at first use; no autotuner).

The forward has no reduction across thread blocks and is called as is (either layout).

**The backward: dx only.** Both backward kernels of causal-conv1d (``csrc/causal_conv1d_bwd.cu``) compute ``dx``
without atomics (every thread block writes its own positions and channels once), and add their per-block weight/bias
gradients into ``dweight``/``dbias`` with ``atomicAdd``, in an order that varies from run to run.
:func:`launch_causal_conv1d_bwd_dx` therefore calls the op once for the whole batch, takes its ``dx``, and gives it
scratch fp32 ``dweight``/``dbias`` buffers that are discarded; ordered-ssd computes the weight/bias gradients with
its own kernel (:func:`ordered_ssd.fold.conv1d_grad_partials`).
"""
from __future__ import annotations

import torch

from ._native import conv_op, device_guard
from ._spec import KernelSpec
from ._util import check, check_shape

UPSTREAM = "causal_conv1d_cuda"


def _check_conv(x, weight, bias):
    check(x.dim() == 3, f"x: expected a 3-d [B, D, L] tensor, got shape {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    check(weight.dim() == 2 and weight.shape[0] == dim,
          f"weight: expected shape [D, W] with D = {dim}, got {tuple(weight.shape)}")
    width = weight.shape[1]
    check(2 <= width <= 4, f"weight: expected a width W in 2..4 (causal-conv1d), got {width}")
    if bias is not None:
        check_shape("bias", bias, (dim,), "[D]")
    return batch, dim, seqlen, width


# ------------------------------------------------------------------------------------------------- causal_conv1d_fwd
def launch_causal_conv1d_fwd(x, weight, bias=None, *, seq_idx=None, initial_states=None, final_states_out=None,
                             silu_activation=True, out=None):
    """Causal depthwise conv1d (+ SiLU). Source: ``causal_conv1d_cuda.causal_conv1d_fwd`` (channel-first or
    channel-last kernel, chosen by causal-conv1d from the strides of ``x``).

    Args:
        x: ``[B, D, L]`` with stride 1 in ``L`` (channel-first) or in ``D`` (channel-last, e.g. a rearranged
            ``[B, L, D]``; then ``D`` and the other strides must be multiples of 8); fp32/fp16/bf16.
        weight: ``[D, W]``, ``W`` in 2..4; bias: ``[D]`` or None.
        seq_idx: ``[B, L]`` int32 or None (channel-last only); initial_states / final_states_out: ``[B, D, W-1]``
            (channel-last only) or None.
        silu_activation: apply SiLU.
        out: optional output with the layout of ``x``, else ``torch.empty_like(x)``.
    Returns:
        ``out`` ``[B, D, L]``. No cross-block reduction: deterministic.
    Raises:
        ValueError: ``x`` not 3-d, ``weight`` not ``[D, W]`` with ``W`` in 2..4, ``bias`` not ``[D]`` (the message names
            the argument, the expected and the actual value).
        RuntimeError: causal-conv1d's own checks (layout, dtype, alignment).
        ImportError, RuntimeError: at the first call, from :func:`csrc_bindings._native.conv_op`: causal-conv1d
            missing, another version, or the op's number of arguments changed.
    """
    _check_conv(x, weight, bias)
    op = conv_op(CAUSAL_CONV1D_FWD)
    if out is None:
        out = torch.empty_like(x)
    with device_guard(x):
        op(x, weight, bias, seq_idx, initial_states, out, final_states_out, bool(silu_activation))
    return out


def _example_causal_conv1d_fwd(p, config=None):
    return (launch_causal_conv1d_fwd(p["conv_x"].transpose(1, 2), p["conv_w"], p["conv_b"], silu_activation=True),)


CAUSAL_CONV1D_FWD = KernelSpec(
    # causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states, out, final_states_out, silu_activation)
    name="causal_conv1d_fwd", module=UPSTREAM, attr="causal_conv1d_fwd", arity=8,
    example=_example_causal_conv1d_fwd,
)


# ------------------------------------------------------------------------------------------------- causal_conv1d_bwd
def launch_causal_conv1d_bwd_dx(x, weight, bias, dout, *, silu_activation=True, seq_idx=None, dx=None):
    """``dx`` of the causal conv1d (+ SiLU), one launch for the whole batch. Source:
    ``causal_conv1d_cuda.causal_conv1d_bwd`` (channel-first or channel-last kernel, chosen by causal-conv1d from the
    strides of ``x``); ``dx`` has no atomics in either kernel, so it is deterministic. The op's weight/bias
    gradients (``atomicAdd``) go to two scratch fp32 buffers (``[D, W]``, ``[D]``), allocated here and discarded. They
    are zeroed first although their values never matter: ``atomicAdd`` reads what it adds to, and compute-sanitizer's
    initcheck reports a read of never-written memory (``benchmarks/sanitize.sh``).

    Args:
        x: ``[B, D, L]`` with stride 1 in ``L`` (channel-first) or in ``D`` (channel-last, e.g. a rearranged
            ``[B, L, D]``; then ``D``, ``x.stride(0)``, ``x.stride(2)`` and ``dout``'s must be multiples of 8);
            fp32/fp16/bf16. weight: ``[D, W]``, ``W`` in 2..4; bias: ``[D]`` or None. dout: ``[B, D, L]``.
        silu_activation: the forward applied SiLU.
        seq_idx: ``[B, L]`` int32 (contiguous) or None; channel-last ``x`` only (taps across an id change are
            masked, as in the forward).
        dx: optional ``[B, D, L]`` output with the layout of ``x``, else ``torch.empty_like(x)``.
    Returns:
        ``dx`` ``[B, D, L]``.
    Raises:
        ValueError: as the forward, ``dout``/``seq_idx``/``dx`` of another shape, ``dout`` of another dtype,
            ``seq_idx`` with a channel-first ``x`` (the message names the argument, expected and actual value).
        RuntimeError: causal-conv1d's own checks (layout, dtype, alignment).
        ImportError, RuntimeError: at the first call, from :func:`csrc_bindings._native.conv_op`: causal-conv1d
            missing, another version, or the op's number of arguments changed.
    """
    batch, dim, seqlen, width = _check_conv(x, weight, bias)
    check_shape("dout", dout, (batch, dim, seqlen), "[B, D, L]")
    check(dout.dtype == x.dtype, f"dout: expected the dtype of x ({x.dtype}), got {dout.dtype}")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
        check(x.stride(1) == 1, f"seq_idx: causal-conv1d masks packed sequences in its channel-last kernel only; "
                                f"expected x with stride 1 in D, got strides {tuple(x.stride())}")
    if dx is None:
        dx = torch.empty_like(x)
    check_shape("dx", dx, (batch, dim, seqlen), "[B, D, L]")
    op = conv_op(CAUSAL_CONV1D_BWD)
    if batch == 0 or seqlen == 0 or dim == 0:
        return dx
    # the op adds its (atomic) weight/bias gradients into these; never read, so never zeroed
    scratch_w = torch.zeros(dim, width, dtype=torch.float32, device=x.device)
    scratch_b = torch.zeros(dim, dtype=torch.float32, device=x.device) if bias is not None else None
    with device_guard(x):
        op(x, weight, bias, dout, seq_idx, None, None, dx, scratch_w, scratch_b, None, bool(silu_activation))
    return dx


def _example_causal_conv1d_bwd(p, config=None):
    return (launch_causal_conv1d_bwd_dx(p["conv_x"].transpose(1, 2), p["conv_w"], p["conv_b"],
                                        p["conv_dout"].transpose(1, 2), silu_activation=True),)


CAUSAL_CONV1D_BWD = KernelSpec(
    # causal_conv1d_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, dweight, dbias,
    #                   dinitial_states, silu_activation)
    name="causal_conv1d_bwd", module=UPSTREAM, attr="causal_conv1d_bwd", arity=12,
    example=_example_causal_conv1d_bwd,
)


# ---------------------------------------------------------------------------------------------- causal_conv1d_update
def launch_causal_conv1d_update(x, conv_state, weight, bias=None, *, silu_activation=True, cache_seqlens=None,
                                conv_state_indices=None, out=None):
    """One decoding step of the conv, in place on ``conv_state``. Source: ``causal_conv1d_cuda.causal_conv1d_update``
    (upstream ``causal_conv1d_update``).

    Args:
        x: ``[B, D]`` or ``[B, D, L]`` new inputs (fp32/fp16/bf16); conv_state: ``[B, D, S]`` with ``S >= W - 1``
            (``Mamba2``'s cache: a transposed view of a contiguous ``[B, S, D]``), shifted left by ``L`` and filled
            with ``x`` in place; weight: ``[D, W]``, ``W`` in 2..4; bias: ``[D]`` or None;
            cache_seqlens / conv_state_indices: ``[B]`` int32 or None (circular buffer; continuous batching).
        silu_activation: apply SiLU.
        out: optional output shaped like ``x``, else ``torch.empty_like(x)``.
    Returns:
        ``out`` (shape of ``x``). One thread per (example, channel) walks its ``W`` taps: no reduction across threads.
    Raises:
        ValueError: ``x`` not 2-d or 3-d, ``conv_state`` not ``[B, D, S]`` with ``S >= W - 1``, ``weight`` not
            ``[D, W]`` with ``W`` in 2..4, ``bias`` not ``[D]`` (the message names the argument, the expected and the
            actual value).
        RuntimeError: causal-conv1d's own checks (dtype, strides).
        ImportError, RuntimeError: at the first call, from :func:`csrc_bindings._native.conv_op`: causal-conv1d
            missing, another version, or the op's number of arguments changed.
    """
    check(x.dim() in (2, 3), f"x: expected a 2-d [B, D] or 3-d [B, D, L] tensor, got shape {tuple(x.shape)}")
    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    _, _, _, width = _check_conv(x3, weight, bias)
    batch, dim = x3.shape[:2]
    check(conv_state.dim() == 3 and conv_state.shape[1] == dim and conv_state.shape[2] >= width - 1,
          f"conv_state: expected shape [B, D, S] with D = {dim} and S >= W - 1 = {width - 1}, "
          f"got {tuple(conv_state.shape)}")
    if conv_state_indices is None:
        check_shape("conv_state", conv_state, (batch, dim, conv_state.shape[2]), "[B, D, S]")
    op = conv_op(CAUSAL_CONV1D_UPDATE)
    if out is None:
        out = torch.empty_like(x3)
    else:
        out = out.unsqueeze(-1) if out.dim() == 2 else out
        check_shape("out", out, x3.shape)
    with device_guard(x):
        op(x3, conv_state, weight, bias, out, bool(silu_activation), cache_seqlens, conv_state_indices)
    return out.squeeze(-1) if x.dim() == 2 else out


def _example_causal_conv1d_update(p, config=None):
    Bsz, D = p["conv_x"].shape[0], p["conv_x"].shape[-1]
    state = p["conv_x"][:, :4].clone().transpose(1, 2)  # [B, D, W] view of a contiguous [B, W, D], as Mamba2's
    return launch_causal_conv1d_update(p["conv_x"][:, 4].reshape(Bsz, D), state, p["conv_w"], p["conv_b"]), state


CAUSAL_CONV1D_UPDATE = KernelSpec(
    # causal_conv1d_update(x, conv_state, weight, bias, out, silu_activation, cache_seqlens, conv_state_indices)
    name="causal_conv1d_update", module=UPSTREAM, attr="causal_conv1d_update", arity=8,
    example=_example_causal_conv1d_update,
)
