"""Argument checks shared by the public entry points.

Every check raises before any computation, with a message naming the argument, the expected and
the actual value. ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong value,
shape or device.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

#: The floating dtypes of the CUDA path's activations and parameters (the native kernels have no fp64).
CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_int(name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_flag(name: str, value) -> bool:
    """A constructor flag, used as a truth value as ``Mamba2`` uses it: a value equal to True or False (a bool, 0
    or 1, a numpy or 0-d torch bool) or None (false); a string or any other value is refused."""
    try:
        ok = value is None or (not isinstance(value, (str, bytes)) and value in (True, False))
    except (TypeError, ValueError, RuntimeError):  # == that cannot give one truth value (e.g. an array)
        ok = False
    if ok:
        return bool(value)
    raise TypeError(f"{name}: expected a bool (or 0/1, or None for False), got {type(value).__name__} {value!r}")


def check_factory(device, dtype) -> None:
    """The ``device`` and ``dtype`` a layer's parameters are created with (both may be None): a floating
    ``torch.dtype``, and a device torch parses (a CUDA one only where ``torch.cuda.is_available()``)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype: expected None or a floating torch.dtype (e.g. torch.float32, torch.bfloat16), "
                        f"got {type(dtype).__name__} {dtype!r}")
    if device is None:
        return
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device: expected None, a torch.device, a str or an int, got {type(device).__name__} "
                        f"{device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"device: expected None, a torch.device or a device string such as 'cuda', "
                         f"got {device!r} ({first})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: expected an available device, got {device!r}, but torch.cuda.is_available() is "
                         f"False (torch {torch.__version__})")


def check_real(name: str, value, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    if math.isnan(value):
        raise ValueError(f"{name}: expected a real number, got nan")
    if positive and not value > 0:
        raise ValueError(f"{name}: expected a positive number, got {value}")
    return float(value)


def check_range(name: str, value, *, positive: bool = False, allow_inf_max: bool = False) -> tuple:
    """A pair ``(lo, hi)`` of reals with ``lo <= hi``."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise TypeError(f"{name}: expected a pair (min, max), got {value!r}")
    lo, hi = value
    lo = check_real(f"{name}[0]", lo, positive=positive)
    if allow_inf_max and isinstance(hi, float) and math.isinf(hi) and hi > 0:
        hi = float(hi)
    else:
        hi = check_real(f"{name}[1]", hi, positive=positive)
    if lo > hi:
        raise ValueError(f"{name}: expected min <= max, got min={lo} > max={hi}")
    return (lo, hi)


def check_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    return value


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    """``"torch.float32, torch.float64"``: the dtypes of an error message."""
    return ", ".join(str(t) for t in dtypes)


def check_layer_input(u, *, d_model: int, dtype: Optional[torch.dtype], device: torch.device,
                      allowed_dtypes: Sequence[torch.dtype], name: str = "u", backend: Optional[str] = None) -> None:
    """``u`` must be a [B, L, d_model] floating tensor with B, L >= 1 on the layer's device and of the layer's
    dtype (``dtype=None``, under autocast: any of ``allowed_dtypes``). ``backend``: ``layer.backend`` where the
    layer was told its path (then a layer ``dtype`` outside ``allowed_dtypes`` can take no input), None where the
    input's device and dtype chose it."""
    check_tensor(name, u)
    if u.dim() != 3:
        raise ValueError(f"{name}: expected a 3-d tensor [B, L, d_model={d_model}], got shape {tuple(u.shape)}")
    Bsz, L, d = u.shape
    if d != d_model:
        raise ValueError(f"{name}: expected last dimension d_model={d_model}, got shape {tuple(u.shape)}")
    if Bsz < 1 or L < 1:
        raise ValueError(f"{name}: expected B >= 1 and L >= 1, got shape {tuple(u.shape)}")
    if u.device != device:  # first: the dtypes allowed depend on the device
        raise ValueError(f"{name}: expected device {device} (the device of the layer's parameters), got {u.device}")
    if dtype is not None and dtype not in allowed_dtypes:  # the layer's dtype has no path here
        if device.type != "cuda":  # no input dtype would do
            raise TypeError(f"the layer's parameters: expected dtype in ({_dtype_names(allowed_dtypes)}) on "
                            f"{device.type}, got {dtype} (bf16/fp16 layers run on CUDA only: move the layer to a "
                            f"CUDA device, or call .float())")
        if backend is not None:  # on CUDA, the path asked for: no input dtype would do either
            other = "the CUDA path" if backend == "reference" else "the reference backend"
            raise TypeError(f"the layer's parameters: expected dtype in ({_dtype_names(allowed_dtypes)}) with "
                            f"layer.backend = {backend!r}, got {dtype} ({dtype} layers run on {other} here: set "
                            f"layer.backend = None, or call .float())")
    if u.dtype not in allowed_dtypes:
        raise TypeError(f"{name}: expected dtype in ({_dtype_names(allowed_dtypes)}) on {u.device.type}, "
                        f"got {u.dtype}")
    if dtype is not None and u.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (the dtype of the layer's parameters), got {u.dtype}")


def check_seq_idx(seq_idx: Optional[torch.Tensor], *, batch: int, seqlen: int, device: torch.device,
                  values: bool = False) -> None:
    """``seq_idx`` must be None or an integer [B, L] tensor on ``device``; with ``values``, also non-decreasing
    along L (:func:`validate_seq_idx`, which reads the tensor on the host)."""
    if seq_idx is None:
        return
    check_tensor("seq_idx", seq_idx)
    if seq_idx.dtype not in _INT_DTYPES:
        raise TypeError(f"seq_idx: expected an integer dtype (torch.int32), got {seq_idx.dtype}")
    if tuple(seq_idx.shape) != (batch, seqlen):
        raise ValueError(f"seq_idx: expected shape (B, L) = ({batch}, {seqlen}), got {tuple(seq_idx.shape)}")
    if seq_idx.device != device:
        raise ValueError(f"seq_idx: expected device {device}, got {seq_idx.device}")
    if values:
        validate_seq_idx(seq_idx)


def validate_seq_idx(seq_idx: torch.Tensor) -> None:
    """Check the values of packed-sequence ids ``seq_idx`` [B, L] (integer): every row non-decreasing along L.

    Opt-in, because it copies a flag to the host (a device synchronisation, which a CUDA graph cannot capture and
    ``torch.compile(fullgraph=True)`` cannot trace): call it on a batch before the training step, or set
    ``OrderedMamba2.validate_seq_idx = True`` to run it in every forward (eager mode only). The functional API
    (:mod:`ordered_ssd.ops`) checks only the type, shape and device of ``seq_idx`` unless asked
    (``validate_seq_idx=True``). Without the check, a decreasing row is not detected anywhere: the kernels compare
    neighbouring ids for equality only, so such a row is computed as some other packing, without an error.

    Raises:
        TypeError: ``seq_idx`` is not an integer tensor. ValueError: it is not 2-d, or a row decreases (the
        message names the first such row and position).
    """
    check_tensor("seq_idx", seq_idx)
    if seq_idx.dtype not in _INT_DTYPES:
        raise TypeError(f"seq_idx: expected an integer dtype (torch.int32), got {seq_idx.dtype}")
    if seq_idx.dim() != 2:
        raise ValueError(f"seq_idx: expected a 2-d tensor [B, L], got shape {tuple(seq_idx.shape)}")
    if seq_idx.shape[1] < 2:
        return
    drops = seq_idx[:, 1:] < seq_idx[:, :-1]
    if bool(drops.any()):
        b, t = (int(v) for v in torch.nonzero(drops)[0])
        raise ValueError(f"seq_idx: expected non-decreasing ids along L (packed sequences), got a decrease in row "
                         f"{b} from {int(seq_idx[b, t])} to {int(seq_idx[b, t + 1])} at position {t + 1}")


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int], dims: str) -> None:
    """``t.shape == expected``, else ``ValueError("x: expected shape [B, L, H, P] = (2, 8, 4, 16), got (2, 8, 4)")``."""
    got, want = tuple(t.shape), tuple(int(v) for v in expected)
    if got != want:
        raise ValueError(f"{name}: expected shape {dims} = {want}, got {got}")


def check_float(name: str, t, allowed: Sequence[torch.dtype]) -> torch.Tensor:
    """``t`` is a tensor whose dtype is one of ``allowed`` (TypeError otherwise)."""
    check_tensor(name, t)
    if t.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype in ({_dtype_names(allowed)}), got {t.dtype}")
    return t


def check_same_device(ref_name: str, ref: torch.Tensor, **tensors) -> None:
    """Every tensor of ``tensors`` that is not None is on ``ref``'s device (ValueError naming the first that is not)."""
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name}: expected device {ref.device} (that of {ref_name}), got {t.device}")


#: Conv widths causal-conv1d 1.7.0's CUDA kernels are compiled for (the CUDA path's ``d_conv``).
CONV_WIDTHS = (2, 3, 4)


def check_conv_width(name: str, width: int) -> None:
    """``width`` in :data:`CONV_WIDTHS` (ValueError otherwise): causal-conv1d has kernels for widths 2..4 only."""
    if width not in CONV_WIDTHS:
        raise ValueError(f"{name}: expected 2, 3 or 4 on the CUDA path (causal-conv1d's kernel widths), got {width}")


#: The CUDA path's kernels compute element offsets in 32-bit integers (the Triton kernels of mamba-ssm 2.3.2.post1
#: multiply ``tl.program_id`` (int32) by int32 strides; causal-conv1d 1.7.0 indexes with 32-bit ``index_t``), so
#: every tensor they index must have fewer than ``2**31`` elements.
INT32_NUMEL = 2 ** 31


def cuda_path_sizes(*, batch: int, seqlen: int, nheads: int, headdim: int, dstate: int,
                    chunk_size: int, zxbcdt_width: int = 0) -> dict:
    """Upper bounds on the element counts of the largest tensors the CUDA path indexes for a ``[B, L]`` input
    (from the sizes alone: nothing is allocated). Partials with a split or tile axis are bounded by their largest
    partition (one split per head, one tile per position), so the bounds are conservative.

    Returns ``{description: numel}``."""
    nchunks = -(-seqlen // chunk_size)
    padded = nchunks * chunk_size
    sizes = {
        "x / dx [B, L, H, P]": batch * seqlen * nheads * headdim,
        "states [B, C, H, P, N]": batch * nchunks * nheads * headdim * dstate,
        "dB / dC partials [B, L, H, N]": batch * seqlen * nheads * dstate,
        "dCB partials [B, C, H, cs, cs]": batch * padded * nheads * chunk_size,
        "dt partials [B, H, C, cs, P]": batch * nheads * padded * headdim,
    }
    if zxbcdt_width:
        sizes["zxbcdt [B, L, d_in_proj]"] = batch * seqlen * zxbcdt_width
    return sizes


def check_cuda_path_sizes(**dims) -> None:
    """Raise ValueError if a tensor of :func:`cuda_path_sizes` reaches :data:`INT32_NUMEL` elements (the limit of
    the kernels' 32-bit offsets), naming the tensor, the shape and the limit. Checked from the sizes alone, before
    anything is allocated or launched."""
    for what, numel in cuda_path_sizes(**dims).items():
        if numel >= INT32_NUMEL:
            raise ValueError(f"B={dims['batch']}, L={dims['seqlen']}: expected fewer than 2**31 elements in every "
                             f"tensor of the CUDA path (its kernels use 32-bit offsets), got {numel} in {what}; "
                             f"split the batch or the sequence")


def check_initial_states(initial_states: Optional[torch.Tensor], *, shape: tuple, device: torch.device) -> None:
    """``initial_states`` must be None or a floating [B, H, P, N] tensor of ``shape`` on ``device``."""
    if initial_states is None:
        return
    check_tensor("initial_states", initial_states)
    if not initial_states.is_floating_point():
        raise TypeError(f"initial_states: expected a floating dtype, got {initial_states.dtype}")
    if tuple(initial_states.shape) != tuple(shape):
        raise ValueError(f"initial_states: expected shape [B, H, P, N] = {tuple(shape)}, "
                         f"got {tuple(initial_states.shape)}")
    if initial_states.device != device:
        raise ValueError(f"initial_states: expected device {device}, got {initial_states.device}")


def check_cu_seqlens(cu_seqlens: torch.Tensor, *, batch: int, seqlen: int, device: torch.device,
                     seq_idx: Optional[torch.Tensor] = None) -> list:
    """``cu_seqlens`` must be a 1-d integer tensor on ``device`` of S + 1 >= 2 offsets of S packed sequences of one
    example (``batch == 1``): starting at 0, strictly increasing (every sequence non-empty: upstream's varlen
    kernels read out of bounds for an empty one), ending at ``seqlen``. With ``seq_idx`` [1, L], the ids must change
    exactly at the offsets. Returns the offsets as a list of ints (reads the tensor: one device sync on CUDA)."""
    check_tensor("cu_seqlens", cu_seqlens)
    if cu_seqlens.dtype not in _INT_DTYPES:
        raise TypeError(f"cu_seqlens: expected an integer dtype (torch.int32), got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens: expected a 1-d tensor of S + 1 >= 2 offsets, got shape "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens: expected device {device}, got {cu_seqlens.device}")
    if batch != 1:
        raise ValueError(f"cu_seqlens: expected batch size 1 (sequences packed into one example), got B={batch}")
    cu = [int(v) for v in cu_seqlens.tolist()]
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens: expected cu_seqlens[0] == 0, got {cu[0]}")
    if any(b <= a for a, b in zip(cu[:-1], cu[1:])):
        raise ValueError(f"cu_seqlens: expected strictly increasing offsets (no empty sequence), got {cu}")
    if cu[-1] != seqlen:
        raise ValueError(f"cu_seqlens: expected cu_seqlens[-1] == B * L = {seqlen}, got {cu[-1]}")
    if seq_idx is not None:
        ids = seq_idx[0].to(torch.long)
        starts = torch.tensor(cu[1:-1], dtype=torch.long, device=ids.device)
        change = torch.zeros(seqlen, dtype=torch.bool, device=ids.device)
        change[1:] = ids[1:] != ids[:-1]
        marked = torch.zeros_like(change)
        marked[starts] = True
        if not bool(torch.equal(change, marked)):
            raise ValueError("seq_idx: expected ids that change exactly at the offsets of cu_seqlens "
                             f"{cu}, got ids that do not")
    return cu
