"""What every ordered op shares: argument checks, the autocast dtype and context, the default ``dt_limit``, the
helpers of the ``torch.library`` custom ops (absent gradients, the custom-op namespace).

Nothing here decides the order of a sum (that is :mod:`ordered_ssd.fold`) or launches a kernel (that is
:mod:`csrc_bindings`).
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional, Sequence, Union

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .. import _checks
from .._checks import check_tensor

__all__ = ["NO_LIMIT", "NAMESPACE", "OP_TAGS", "require_cuda", "autocast_dtype", "autocast_context", "absent",
           "or_none", "as_dtype_of", "auxiliary_outputs", "ordered_custom_op", "register_op_autograd", "plain_eager",
           "call_op", "CUDA_DTYPES", "check_chunk_scan_args",
           "check_split_conv1d_scan_args", "check_causal_conv1d_args", "check_states_args"]

CUDA_DTYPES = _checks.CUDA_DTYPES

#: Upstream's default ``dt_limit``: no clamp of the discretised step.
NO_LIMIT = (0.0, float("inf"))

#: The ``torch.library`` namespace of ordered-ssd's custom ops (``torch.ops.ordered_ssd.*``).
NAMESPACE = "ordered_ssd"

#: Tags of every custom op: inductor passes each tensor argument with the exact strides it has in eager mode (the
#: launchers choose a kernel by layout, e.g. causal-conv1d's channel-last or channel-first one).
OP_TAGS = (torch.Tag.needs_exact_strides,)


def require_cuda(name: str, t) -> None:
    """Check that ``t`` is a CUDA tensor.

    Raises:
        TypeError: ``t`` is not a tensor. ValueError: it is not on a CUDA device (the message names ``name``).
    """
    check_tensor(name, t)
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor (the ordered CUDA path), got device {t.device}")


def autocast_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    """The CUDA autocast dtype when ``t`` is a CUDA tensor and autocast is on, else None."""
    if t.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


def autocast_context(dtype: Optional[torch.dtype]):
    """The CUDA autocast state a custom op's body runs under: on at ``dtype``, or off when ``dtype`` is None.

    The public functions read the caller's state with :func:`autocast_dtype` and pass it to their custom op as an
    argument; the op's forward and backward bodies run under this context. That is what ``torch.amp.custom_fwd``
    / ``custom_bwd`` gave the former ``autograd.Function`` classes (forward under the caller's autocast, backward
    under the forward's), made explicit, because a custom op's body otherwise runs with autocast excluded under
    ``torch.compile`` but not in eager mode.

    Where CUDA autocast cannot be on (torch's own test: no CUDA, e.g. the CPU tests that run these bodies with a
    patched :func:`autocast_dtype`), the state is off without torch's "CUDA is not available ... Disabling
    autocast" warning: ``torch.autocast("cuda", dtype=...)`` would turn itself off there too.
    """
    if dtype is None or torch.cuda.amp.common.amp_definitely_not_available():
        return torch.autocast("cuda", enabled=False)
    return torch.autocast("cuda", dtype=dtype)


def absent(like: torch.Tensor) -> torch.Tensor:
    """The stand-in a custom op returns for an output that does not exist (a gradient of an input that is None):
    an empty fp32 tensor on the device of ``like`` (custom-op schemas cannot return None)."""
    return like.new_empty((0,), dtype=torch.float32)


def or_none(t: torch.Tensor, present) -> Optional[torch.Tensor]:
    """``t`` when ``present`` (the input it belongs to, or a flag) is not None/False, else None (undoes
    :func:`absent`)."""
    return t if present is not None and present is not False else None


def as_dtype_of(grads: Sequence[Optional[torch.Tensor]],
                inputs: Sequence[Optional[Union[torch.Tensor, torch.dtype]]], like: torch.Tensor) -> list:
    """Each gradient contiguous and in the dtype of its input (an input may be given as its dtype); :func:`absent`
    (on the device of ``like``) where the gradient or its input is None. This is what autograd's engine did to the
    former Functions' gradients (a cast of an fp32 fold to the parameter dtype rounds once, as before), done inside
    the custom op so that its fake gives the exact dtypes and strides."""
    return [absent(like) if g is None or inp is None
            else g.to(inp if isinstance(inp, torch.dtype) else inp.dtype).contiguous()
            for g, inp in zip(grads, inputs)]


def autocast_casts(t: Optional[torch.Tensor], autocast: Optional[torch.dtype]) -> bool:
    """Whether a body running under ``autocast`` (:func:`autocast_context`) casts its input ``t``: ``t`` is given
    and of another dtype. Where a custom op returns a :func:`cast_copy` of ``t``, its fake and its
    ``setup_context`` ask this to tell the copy from :func:`absent`."""
    return t is not None and autocast is not None and t.dtype != autocast


def cast_copy(cast: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """What a custom op returns for the autocast copy ``cast`` of its input ``original`` (to be saved for the
    backward): ``cast`` when it is a copy, :func:`absent` when no cast happened (``cast is original``: a custom op's
    output may not alias an input)."""
    return absent(original) if cast is original else cast


def auxiliary_outputs(ctx, *outputs: torch.Tensor) -> None:
    """In a custom op's ``setup_context``: ``outputs`` are returned only to be saved for the backward (``out_x``,
    ``rstd``), not differentiable, and their gradients are not materialised as zeros (no allocation per step)."""
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)


# ------------------------------------------------------------------------ the eager twin of each custom op
# A call of a ``torch.library`` custom op with autograd costs tens of microseconds of Python dispatch (the custom
# op's autograd wrapper, its redispatch, the backward custom op) more than a plain ``torch.autograd.Function``. In
# plain eager mode the public functions therefore apply a Function built from the very same pieces (the forward
# body, ``setup_context``, the backward rule and the backward body), so the two run the same composition code on
# the same tensors; anywhere something may trace or intercept the call (``torch.compile``, a dispatch mode such as
# FakeTensor / functionalization / ``make_fx`` / ``torch.export``, functorch transforms, tensor subclasses) they
# call the custom op, whose fake and schema those need.

def ordered_custom_op(name: str, body: Callable):
    """``torch.library.custom_op`` of ``body`` as ``ordered_ssd::<name>`` (functional, :data:`OP_TAGS`); ``body``
    stays a plain function for the eager twin (:func:`register_op_autograd`)."""
    return torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=(), tags=OP_TAGS)(body)


def register_op_autograd(op, forward: Callable, setup_context: Callable, rule: Callable, backward_op,
                         backward: Callable) -> type:
    """Register ``rule`` as ``op``'s autograd formula and return its eager twin, an ``autograd.Function``.

    Args:
        op: the custom op (``torch.library.custom_op`` of ``forward``).
        forward: the op's body (the undecorated function).
        setup_context: ``setup_context(ctx, inputs, output)``, shared by both.
        rule: ``rule(backward, ctx, *grads)``, the backward formula, calling ``backward`` for the gradients: the
            backward custom op ``backward_op`` for ``op``, its body ``backward`` for the twin.

    Returns:
        The ``autograd.Function`` (once-differentiable, as the custom op: a double backward raises
        ``RuntimeError``, :func:`_once_differentiable`) whose ``apply`` takes ``op``'s arguments positionally.

    The twin's ``forward(ctx, *args)`` calls ``forward`` and then ``setup_context(ctx, args, output)`` itself (the
    arguments completed with ``forward``'s defaults, as torch completes them), rather than declaring
    ``setup_context``: a Function that declares it has ``apply`` build ``inspect.signature(forward)`` and bind the
    arguments at every call (about 50 µs for the 21 arguments of the split-conv1d-scan body, measured on the
    development CPU). The twin runs only in plain eager mode (:func:`call_op`), never under functorch transforms,
    which are what the separate ``setup_context`` is for.
    """
    op.register_autograd(functools.partial(rule, backward_op), setup_context=setup_context)
    name = "Eager_" + forward.__name__.lstrip("_")
    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(_forward_with_context(forward, setup_context)),
        "backward": staticmethod(_once_differentiable(functools.partial(rule, backward))),
        "__doc__": f"Plain-eager twin of the custom op of {forward.__name__} (see ordered_ssd.ops.common).",
    })


def _forward_with_context(forward: Callable, setup_context: Callable) -> Callable:
    """``forward(ctx, *args)`` of the eager twin: ``output = forward(*args)`` then ``setup_context(ctx, args,
    output)``, with ``args`` completed from ``forward``'s defaults when fewer are given (the signature is read
    once, here)."""
    signature = inspect.signature(forward)
    count = len(signature.parameters)

    def with_context(ctx, *args):
        if len(args) != count:  # rare (call_op passes every argument): bind as torch's apply would
            bound = signature.bind(*args)
            bound.apply_defaults()
            args = bound.args
        output = forward(*args)
        setup_context(ctx, args, output)
        return output
    with_context.__name__ = getattr(forward, "__name__", "forward")
    return with_context


def _once_differentiable(rule: Callable) -> Callable:
    """``rule`` run without recording (``torch.autograd.function.once_differentiable``), its gradients marked to raise
    ``RuntimeError`` when differentiated (``create_graph=True``) wherever the custom op's backward would have had
    an input requiring grad (a gradient or a saved tensor): the custom op's backward op has no autograd formula, so
    a double backward through it raises too."""
    def backward(ctx, *grads):
        with torch.no_grad():
            outputs = rule(ctx, *grads)
        if not torch.is_grad_enabled() or not any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (*grads, *ctx.saved_tensors)):
            return outputs
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        err = torch._C._functions.DelayedError(
            b"ordered_ssd: the ordered ops are once-differentiable (their backward runs native kernels); a double "
            b"backward through them is not supported", len(outputs))

        def marked(t):
            if t is None:
                return None
            t = t.detach()
            t.requires_grad = True
            return t
        return err(*[marked(t) for t in outputs])
    return backward


def plain_eager(args: Sequence) -> bool:
    """Whether a call with ``args`` runs in plain eager mode: not under ``torch.compile``, no dispatch mode active
    (FakeTensor, functionalization, ``make_fx``, ``torch.export``'s tracing, ...), no functorch transform, and
    every tensor argument a plain ``torch.Tensor`` / ``nn.Parameter`` (no subclass)."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    if torch._C._are_functorch_transforms_active():
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and type(a) is not torch.Tensor and type(a) is not torch.nn.Parameter:
            return False
    return True


def call_op(op, function: type, *args):
    """``function.apply(*args)`` (the eager twin, :func:`register_op_autograd`) in :func:`plain_eager` mode, else
    ``op(*args)`` (the custom op)."""
    if plain_eager(args):
        return function.apply(*args)
    return op(*args)


# ------------------------------------------------------------------------- checks of the public functions
# They look at types, dtypes, shapes, devices and sizes only (never at values, never at the device type), so they run
# on CPU and ``meta`` tensors too and never synchronise; the public functions call them before ``require_cuda`` and
# before any kernel. The values of ``seq_idx`` are checked only on request (:func:`ordered_ssd.validate_seq_idx`);
# the one exception is ``cu_seqlens`` (:func:`check_states_args`, inference/prefill only), whose offsets are read.
def _batch_seq(name: str, t, rank: int, dims: str):
    _checks.check_float(name, t, CUDA_DTYPES)
    if t.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-d tensor {dims}, got shape {tuple(t.shape)}")
    if t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name}: expected B >= 1 and L >= 1, got shape {tuple(t.shape)}")
    return t.shape


def _optional(name: str, t, expected, dims: str) -> None:
    if t is not None:
        _checks.check_float(name, t, CUDA_DTYPES)
        _checks.check_shape(name, t, expected, dims)


def _check_D(D, nheads: int, headdim: int) -> None:
    _checks.check_float("D", D, CUDA_DTYPES)
    if tuple(D.shape) not in ((nheads,), (nheads, headdim)):
        raise ValueError(f"D: expected shape [H] = {(nheads,)} or [H, P] = {(nheads, headdim)}, got {tuple(D.shape)}")


def check_chunk_scan_args(x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, seq_idx=None,
                          dt_limit=NO_LIMIT) -> None:
    """The arguments of :func:`~ordered_ssd.ops.ordered_mamba_chunk_scan_combined`: x [B, L, H, P], dt [B, L, H],
    A [H], B/C [B, L, G, N] with ``H % G == 0``, D [H] or [H, P], z like x, dt_bias [H], seq_idx [B, L] integer;
    float dtypes of :data:`CUDA_DTYPES`; ``chunk_size`` an int >= 1; ``dt_limit`` a pair min <= max; all on x's
    device; every tensor of the CUDA path under 2**31 elements.

    Raises:
        TypeError: a non-tensor, a wrong dtype, a non-int ``chunk_size``. ValueError: a wrong rank, shape, device,
            ``chunk_size < 1``, or a size past the 32-bit limit (the message names the argument, expected, actual).
    """
    _checks.check_range("dt_limit", dt_limit, allow_inf_max=True)
    Bsz, L, H, P = _batch_seq("x", x, 4, "[B, L, H, P]")
    _checks.check_int("chunk_size", chunk_size)
    _checks.check_float("dt", dt, CUDA_DTYPES)
    _checks.check_shape("dt", dt, (Bsz, L, H), "[B, L, H]")
    _checks.check_float("A", A, CUDA_DTYPES)
    _checks.check_shape("A", A, (H,), "[H]")
    _checks.check_float("B", B, CUDA_DTYPES)
    if B.dim() != 4 or tuple(B.shape[:2]) != (Bsz, L) or B.shape[2] < 1 or H % B.shape[2]:
        raise ValueError(f"B: expected shape [B, L, G, N] = ({Bsz}, {L}, G, N) with G dividing H = {H}, "
                         f"got {tuple(B.shape)}")
    N = B.shape[3]
    _checks.check_float("C", C, CUDA_DTYPES)
    _checks.check_shape("C", C, B.shape, "[B, L, G, N] (that of B)")
    if D is not None:
        _check_D(D, H, P)
    _optional("z", z, x.shape, "[B, L, H, P] (that of x)")
    _optional("dt_bias", dt_bias, (H,), "[H]")
    _checks.check_same_device("x", x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, seq_idx=seq_idx)
    _checks.check_seq_idx(seq_idx, batch=Bsz, seqlen=L, device=x.device)
    _checks.check_cuda_path_sizes(batch=Bsz, seqlen=L, nheads=H, headdim=P, dstate=N,
                                  chunk_size=chunk_size)


def check_split_conv1d_scan_args(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, *, seq_idx=None,
                                 rmsnorm_weight=None, outproj_weight=None, outproj_bias=None, headdim=None,
                                 ngroups=1, dt_limit=NO_LIMIT) -> None:
    """The arguments of :func:`~ordered_ssd.ops.ordered_mamba_split_conv1d_scan_combined` (shapes in its
    docstring): float dtypes of :data:`CUDA_DTYPES`, ``conv1d_weight`` [d_ssm + 2 G N, W] with W in 2..4, a
    ``zxbcdt`` width of ``2 d_mlp + 2 d_ssm + 2 G N + H`` with ``d_mlp >= 0``, one device, sizes under 2**31.

    Raises:
        TypeError / ValueError as :func:`check_chunk_scan_args`, naming the argument, expected and actual value.
    """
    _checks.check_range("dt_limit", dt_limit, allow_inf_max=True)
    Bsz, L, width = _batch_seq("zxbcdt", zxbcdt, 3, "[B, L, 2 d_mlp + 2 d_ssm + 2 G N + H]")
    _checks.check_int("chunk_size", chunk_size)
    _checks.check_int("ngroups", ngroups)
    _checks.check_float("D", D, CUDA_DTYPES)
    if D.dim() == 1:
        if headdim is None:
            raise ValueError("headdim: required when D is 1-d ([H]), got None")
        _checks.check_int("headdim", headdim)
        H, P = D.shape[0], headdim
    elif D.dim() == 2:
        H, P = D.shape
    else:
        raise ValueError(f"D: expected shape [H] or [H, P], got {tuple(D.shape)}")
    if H < 1 or H % ngroups:
        raise ValueError(f"ngroups: expected a divisor of H = {H}, got {ngroups}")
    _checks.check_float("conv1d_weight", conv1d_weight, CUDA_DTYPES)
    dim = H * P
    extra = conv1d_weight.shape[0] - dim if conv1d_weight.dim() == 2 else -1
    if extra <= 0 or extra % (2 * ngroups):
        raise ValueError(f"conv1d_weight: expected shape [d_ssm + 2 G N, W] with d_ssm = H * P = {dim}, G = "
                         f"{ngroups}, N >= 1, got {tuple(conv1d_weight.shape)}")
    N, W = extra // (2 * ngroups), conv1d_weight.shape[1]
    _checks.check_conv_width("conv1d_weight.shape[1] (W)", W)
    d_mlp2 = width - 2 * dim - 2 * ngroups * N - H
    if d_mlp2 < 0 or d_mlp2 % 2:
        raise ValueError(f"zxbcdt: expected last dimension 2 d_mlp + 2 d_ssm + 2 G N + H = 2 d_mlp + "
                         f"{2 * dim + 2 * ngroups * N + H} with d_mlp >= 0 (d_ssm = {dim}, G = {ngroups}, N = {N}, "
                         f"H = {H}), got {width}")
    _optional("conv1d_bias", conv1d_bias, (dim + 2 * ngroups * N,), "[d_ssm + 2 G N]")
    _checks.check_float("dt_bias", dt_bias, CUDA_DTYPES)
    _checks.check_shape("dt_bias", dt_bias, (H,), "[H]")
    _checks.check_float("A", A, CUDA_DTYPES)
    _checks.check_shape("A", A, (H,), "[H]")
    _optional("rmsnorm_weight", rmsnorm_weight, (dim,), "[d_ssm]")
    if outproj_weight is not None:
        _checks.check_float("outproj_weight", outproj_weight, CUDA_DTYPES)
        if outproj_weight.dim() != 2 or outproj_weight.shape[1] != d_mlp2 // 2 + dim:
            raise ValueError(f"outproj_weight: expected shape [d_out, d_mlp + d_ssm] = [d_out, {d_mlp2 // 2 + dim}], "
                             f"got {tuple(outproj_weight.shape)}")
        _optional("outproj_bias", outproj_bias, (outproj_weight.shape[0],), "[d_out]")
    elif outproj_bias is not None:
        raise ValueError("outproj_bias: expected None when outproj_weight is None, got a tensor")
    _checks.check_same_device("zxbcdt", zxbcdt, conv1d_weight=conv1d_weight, conv1d_bias=conv1d_bias,
                              dt_bias=dt_bias, A=A, D=D, seq_idx=seq_idx, rmsnorm_weight=rmsnorm_weight,
                              outproj_weight=outproj_weight, outproj_bias=outproj_bias)
    _checks.check_seq_idx(seq_idx, batch=Bsz, seqlen=L, device=zxbcdt.device)
    _checks.check_cuda_path_sizes(batch=Bsz, seqlen=L, nheads=H, headdim=P, dstate=N,
                                  chunk_size=chunk_size, zxbcdt_width=width)


def check_causal_conv1d_args(x, weight, bias=None, seq_idx=None) -> None:
    """The arguments of :func:`~ordered_ssd.ops.ordered_causal_conv1d`: x [B, D, L], weight [D, W] with W in 2..4,
    bias [D], seq_idx [B, L] integer; float dtypes of :data:`CUDA_DTYPES`; one device; x under 2**31 elements.

    Raises:
        TypeError / ValueError naming the argument, expected and actual value.
    """
    _checks.check_float("x", x, CUDA_DTYPES)
    if x.dim() != 3:
        raise ValueError(f"x: expected a 3-d tensor [B, D, L], got shape {tuple(x.shape)}")
    Bsz, dim, L = x.shape
    _checks.check_float("weight", weight, CUDA_DTYPES)
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise ValueError(f"weight: expected shape [D, W] with D = {dim}, got {tuple(weight.shape)}")
    _checks.check_conv_width("weight.shape[1] (W)", weight.shape[1])
    _optional("bias", bias, (dim,), "[D]")
    _checks.check_same_device("x", x, weight=weight, bias=bias, seq_idx=seq_idx)
    _checks.check_seq_idx(seq_idx, batch=Bsz, seqlen=L, device=x.device)
    if x.numel() >= _checks.INT32_NUMEL:
        raise ValueError(f"x: expected fewer than 2**31 elements (causal-conv1d's 32-bit offsets), got {x.numel()} "
                         f"in shape {tuple(x.shape)}")


def check_states_args(x_shape, dstate: int, device, initial_states=None, cu_seqlens=None, seq_idx=None,
                      return_varlen_states: bool = False) -> None:
    """The state arguments of the public SSD functions, before any kernel: ``initial_states`` [B, H, P, N] floating
    on ``device`` (``x_shape`` is (B, L, H, P), ``dstate`` N); ``cu_seqlens`` required with
    ``return_varlen_states`` and checked by :func:`ordered_ssd._checks.check_cu_seqlens` (which reads its values and
    those of ``seq_idx`` on the host: a device synchronisation, only for the varlen states of inference/prefill).

    Raises:
        TypeError / ValueError naming the argument, expected and actual value.
    """
    Bsz, L, H, P = x_shape
    _checks.check_initial_states(initial_states, shape=(Bsz, H, P, dstate), device=device)
    if return_varlen_states and cu_seqlens is None:
        raise ValueError("cu_seqlens: required with return_varlen_states=True, got None")
    if cu_seqlens is not None:
        _checks.check_cu_seqlens(cu_seqlens, batch=Bsz, seqlen=L, device=device, seq_idx=seq_idx)
