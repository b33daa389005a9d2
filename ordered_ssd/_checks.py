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


def check_int(name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


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


def check_layer_input(u, *, d_model: int, dtype: Optional[torch.dtype], device: torch.device,
                      allowed_dtypes: Sequence[torch.dtype]) -> None:
    """``u`` must be a [B, L, d_model] floating tensor with B, L >= 1 on the layer's device and of the layer's
    dtype (``dtype=None``, under autocast: any of ``allowed_dtypes``)."""
    check_tensor("u", u)
    if u.dim() != 3:
        raise ValueError(f"u: expected a 3-d tensor [B, L, d_model={d_model}], got shape {tuple(u.shape)}")
    Bsz, L, d = u.shape
    if d != d_model:
        raise ValueError(f"u: expected last dimension d_model={d_model}, got shape {tuple(u.shape)}")
    if Bsz < 1 or L < 1:
        raise ValueError(f"u: expected B >= 1 and L >= 1, got shape {tuple(u.shape)}")
    if u.dtype not in allowed_dtypes:
        names = ", ".join(str(t) for t in allowed_dtypes)
        raise TypeError(f"u: expected dtype in ({names}) on {u.device.type}, got {u.dtype}")
    if dtype is not None and u.dtype != dtype:
        raise TypeError(f"u: expected dtype {dtype} (the dtype of the layer's parameters), got {u.dtype}")
    if u.device != device:
        raise ValueError(f"u: expected device {device} (the device of the layer's parameters), got {u.device}")


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
    ``OrderedMamba2.validate_seq_idx = True`` to run it in every forward (eager mode only). Without it, a
    decreasing row is not detected in the forward; the CUDA backward with ``seq_idx`` still refuses it
    (:func:`csrc_bindings.sequence_segments`).

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
