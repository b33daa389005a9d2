"""Launchers for causal-conv1d 1.7.0's C++ ops (``causal_conv1d_cuda.causal_conv1d_fwd`` / ``_bwd`` / ``_update``):
the mirror of
``causal_conv1d/causal_conv1d_interface.py`` (the ``causal_conv1d_fn`` wrappers, which call the same ops through
``causal_conv1d/cpp_functions.py``).

For each op: its launcher, its example runner and its :class:`~csrc_bindings._spec.KernelSpec` (module, op name and
number of arguments of the pybind function, checked at first use; no autotuner).

The forward has no reduction across thread blocks and is called as is (either layout).

**Weight/bias gradients without atomics: one example at a time.** Both backward kernels of causal-conv1d add
their per-block weight/bias gradients into ``dweight``/``dbias`` with ``atomicAdd``:

* the *channel-last* kernel (the layout Mamba-2 uses) tiles the sequence into 64/128-position blocks, so even for
  one example several blocks add into the same ``dweight[d, w]``, in an order that varies from run to run;
* the *channel-first* kernel has grid ``(batch, dim)``: one block per (example, channel) walks the whole sequence,
  reduces with a fixed CUB block-reduction tree and then adds its value into ``dweight[d, :]`` / ``dbias[d]``.

Called with ``batch = 1`` on a zeroed fp32 buffer, the channel-first kernel therefore has exactly **one writer per
address**: ``0 + v`` is exact, so the result is the block's value whatever the scheduling, and also whatever
causal-conv1d's own deterministic switch (``torch.use_deterministic_algorithms``) says, since a one-example
partial summed alone is the same value. :func:`launch_causal_conv1d_bwd_per_example` does exactly that for each
example (or each packed sequence, with ``seq_idx``) and returns the per-example partials in fp32; the caller
folds them in its lexical order. The cost: ``B`` (or #sequences) launches of the backward, and channel-first copies
of ``x`` and ``dout`` (and of ``dx`` back) made for a group of examples at a time by one tiled Triton launch each
(:mod:`._layout`; the group's buffers are bounded by ``GROUP_BYTES``, so the group size depends on the shape only;
with ``seq_idx``, each packed sequence is copied into its own fresh buffers).
"""
from __future__ import annotations

import torch

from ._layout import GROUP_BYTES, aligned_channel_first, aligned_example_stride, copy3d, is_aligned_channel_first
from ._native import conv_op, device_guard
from ._spec import KernelSpec
from ._util import check, check_shape, out_buffer

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
def sequence_segments(seq_idx: torch.Tensor):
    """``[(b, start, end), ...]``: the maximal runs of equal ``seq_idx[b]`` values, in (b, start) order.

    Needs a device-to-host copy of ``seq_idx``. Raises ValueError unless every row is non-decreasing (packed
    sequences), because only then is the masked convolution equal to independent per-run convolutions.
    """
    rows = seq_idx.detach().to("cpu", torch.int64)
    segs = []
    for b in range(rows.shape[0]):
        r = rows[b]
        if r.numel() == 0:
            continue
        drops = torch.nonzero(r[1:] < r[:-1]).flatten()
        if drops.numel():
            i = int(drops[0]) + 1
            check(False, f"seq_idx: expected non-decreasing rows (packed sequences), got row {b} falling from "
                         f"{int(r[i - 1])} to {int(r[i])} at position {i}")
        cuts = (torch.nonzero(r[1:] != r[:-1]).flatten() + 1).tolist()
        starts = [0] + cuts
        ends = cuts + [r.numel()]
        segs.extend((b, s, e) for s, e in zip(starts, ends))
    return segs


def launch_causal_conv1d_bwd_per_example(x, weight, bias, dout, *, silu_activation=True, seq_idx=None, dx=None,
                                         dweight_partial=None, dbias_partial=None, group_bytes=GROUP_BYTES):
    """Backward of the causal conv1d with atomic-free weight/bias gradients: causal-conv1d's channel-first backward
    called once per example (or per packed sequence), so each ``dweight``/``dbias`` address has a single writer.
    Source: ``causal_conv1d_cuda.causal_conv1d_bwd`` (channel-first kernel, ``batch = 1``).

    Args:
        x: ``[B, D, L]`` (any layout the forward accepts, e.g. a channel-last view of ``[B, L, D]`` memory).
            Examples are copied, a group at a time, into channel-first buffers with every example 16-byte aligned
            (no copy when ``x`` already is one); weight: ``[D, W]``; bias: ``[D]`` or None; dout: ``[B, D, L]``.
        silu_activation: the forward applied SiLU.
        seq_idx: ``[B, L]`` int32 with non-decreasing rows, or None. With it, every run of equal ids is convolved
            independently (equal to causal-conv1d's masked channel-last kernel); this reads ``seq_idx`` on the host.
        dx: optional ``[B, D, L]`` output (any strides), else ``torch.empty_like(x)``.
        dweight_partial, dbias_partial: optional fp32 ``[S, D, W]`` / ``[S, D]`` buffers.
        group_bytes: without ``seq_idx``, bound on the bytes of the channel-first copies of ``x``, ``dout`` and
            ``dx`` held at once (at least one example). It changes how many copy launches there are, never a value.
            With ``seq_idx`` every packed sequence gets its own buffers (three copy launches per sequence).
    Returns:
        ``(dx, dweight_partial, dbias_partial, segments)``: ``segments`` is ``[(b, start, end)]`` (one per example
        ``(b, 0, L)`` without ``seq_idx``), ``S = len(segments)``; ``dweight_partial[s]`` / ``dbias_partial[s]`` are
        segment ``s``'s gradients in fp32 (``dbias_partial`` None without bias);
        ``dweight = fold(+, dweight_partial[s] for s)`` in segment order, cast once at the end.
    Not supported: initial states / final-state gradients (the channel-first kernel has none).
    Raises:
        ValueError: as the forward, and ``dout``, ``seq_idx`` or ``dx`` of another shape, ``dout`` of another dtype,
            ``group_bytes`` not a positive int, ``seq_idx`` rows not non-decreasing, a given output buffer of another
            shape, dtype or device, a copy past the grid limits of :func:`~csrc_bindings._layout.copy3d` (the message
            names the argument, the expected and the actual value).
        RuntimeError: causal-conv1d's own checks (layout, dtype, alignment).
        ImportError, RuntimeError: at the first call, from :func:`csrc_bindings._native.conv_op`: causal-conv1d
            missing, another version, or the op's number of arguments changed.
    """
    batch, dim, seqlen, width = _check_conv(x, weight, bias)
    check_shape("dout", dout, (batch, dim, seqlen), "[B, D, L]")
    check(dout.dtype == x.dtype, f"dout: expected the dtype of x ({x.dtype}), got {dout.dtype}")
    check(isinstance(group_bytes, int) and group_bytes > 0,
          f"group_bytes: expected a positive int, got {group_bytes!r}")
    op = conv_op(CAUSAL_CONV1D_BWD)
    if seq_idx is None:
        segments = [(b, 0, seqlen) for b in range(batch)]
    else:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
        segments = sequence_segments(seq_idx)
    nseg = len(segments)
    if dx is None:
        dx = torch.empty_like(x)
    check_shape("dx", dx, (batch, dim, seqlen), "[B, D, L]")
    dweight_partial = out_buffer(dweight_partial, (nseg, dim, width), torch.float32, x, "dweight_partial", zero=True)
    if bias is not None:
        dbias_partial = out_buffer(dbias_partial, (nseg, dim), torch.float32, x, "dbias_partial", zero=True)
    else:
        dbias_partial = None
    silu = bool(silu_activation)
    if batch == 0 or seqlen == 0 or dim == 0:
        return dx, dweight_partial, dbias_partial, segments
    with device_guard(x):
        if seq_idx is not None:
            # Packed sequences: each segment straight into its own fresh (aligned) channel-first buffers.
            for s, (b, start, end) in enumerate(segments):
                xs = copy3d(x[b:b + 1, :, start:end], x.new_empty((1, dim, end - start)))
                dos = copy3d(dout[b:b + 1, :, start:end], x.new_empty((1, dim, end - start)))
                dxs = torch.empty_like(xs)
                op(xs, weight, bias, dos, None, None, None, dxs, dweight_partial[s],
                   dbias_partial[s] if dbias_partial is not None else None, None, silu)
                copy3d(dxs, dx[b:b + 1, :, start:end])
            return dx, dweight_partial, dbias_partial, segments
        # Whole examples: a group of them per copy launch, each example an aligned [1, D, L] view of the buffer.
        stride = aligned_example_stride(dim, seqlen, x.element_size())
        group = max(1, min(batch, 65535, group_bytes // (3 * stride * x.element_size())))
        direct_dx = is_aligned_channel_first(dx)
        for g0 in range(0, batch, group):
            g1 = min(batch, g0 + group)
            xg = aligned_channel_first(x[g0:g1])
            dog = aligned_channel_first(dout[g0:g1])
            dxg = dx[g0:g1] if direct_dx else torch.empty_strided(xg.shape, (stride, seqlen, 1), dtype=x.dtype,
                                                                  device=x.device)
            n = g1 - g0  # the per-example [1, D, L] views made in one call each (host time at large B)
            dbs = dbias_partial[g0:g1].unbind(0) if dbias_partial is not None else (None,) * n
            for xs, dos, dxs, dws, db_s in zip(xg.split(1), dog.split(1), dxg.split(1),
                                               dweight_partial[g0:g1].unbind(0), dbs):
                op(xs, weight, bias, dos, None, None, None, dxs, dws, db_s, None, silu)
            if not direct_dx:
                copy3d(dxg, dx[g0:g1])
    return dx, dweight_partial, dbias_partial, segments


def _example_causal_conv1d_bwd(p, config=None):
    return launch_causal_conv1d_bwd_per_example(p["conv_x"].transpose(1, 2), p["conv_w"], p["conv_b"],
                                                p["conv_dout"].transpose(1, 2), silu_activation=True)[:3]


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
