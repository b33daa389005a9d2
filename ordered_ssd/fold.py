"""The lexical fold: the one place where ordered-ssd decides the order of a gradient sum.

Every gradient of a parameter that is shared across examples, chunks or tiles is computed as

    g = fold(+, [p[k] for k in lexical order])      # k = (example b, chunk c, tile t), b slowest

in the *accumulation dtype* (fp32, or fp64 for fp64 parameters), starting from +0.0, one addition
at a time, and cast to the parameter dtype once, at the end. The partition into partials depends
only on the problem shape (batch, sequence length, chunk size, tile sizes), never on the device or
its SM count, so the rounding of the sum, and hence the bits of the gradient, are fixed.

Both the CPU reference path and the GPU path reduce through :class:`LexicalFold` /
:func:`lexical_fold`; nothing else in the package sums partials over a partition axis.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch

__all__ = ["accumulation_dtype", "LexicalFold", "lexical_fold"]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype in which partials of a ``dtype`` gradient are folded: fp64 for fp64, else fp32."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype, got {type(dtype).__name__}")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating-point dtype, got {dtype}")
    return torch.float64 if dtype == torch.float64 else torch.float32


class LexicalFold:
    """Running left fold ``acc = (((+0.0 + p0) + p1) + ...)`` in the accumulation dtype.

    Partials must be added in lexical order (example-major, then chunk, then tile); the object
    does not reorder them. All partials must have the same shape.

    Args:
        dtype: dtype of the final gradient (the parameter's dtype). The accumulator is
            :func:`accumulation_dtype` of it.

    Determinism: for the same sequence of partials (same bits, same order) the result has the
    same bits on any device, in any process. Source: ordered-ssd design, "The contract", item 3.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.acc_dtype = accumulation_dtype(dtype)
        self._acc: Optional[torch.Tensor] = None
        self.count = 0

    def add(self, partial: torch.Tensor) -> None:
        """Add the next partial (any floating dtype; promoted to the accumulation dtype)."""
        if not isinstance(partial, torch.Tensor):
            raise TypeError(f"partial: expected a torch.Tensor, got {type(partial).__name__}")
        p = partial.to(self.acc_dtype)
        if self._acc is None:
            # +0.0 + p: keeps the documented start value (turns a -0.0 partial into +0.0).
            self._acc = torch.zeros_like(p).add_(p)
        else:
            if p.shape != self._acc.shape:
                raise ValueError(
                    f"partial: expected shape {tuple(self._acc.shape)} (the shape of the first partial), "
                    f"got {tuple(p.shape)}")
            self._acc.add_(p)
        self.count += 1

    def result(self, like: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The folded sum, cast once to the gradient dtype.

        Args:
            like: used for shape/device when no partial was added (gives zeros).

        Raises:
            ValueError: no partial was added and ``like`` is None.
        """
        if self._acc is None:
            if like is None:
                raise ValueError("LexicalFold.result: no partial was added and `like` is None")
            return torch.zeros_like(like, dtype=self.dtype)
        return self._acc.to(self.dtype)


def lexical_fold(partials: Iterable[torch.Tensor], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Fold a sequence of same-shaped partials in the given (lexical) order.

    Args:
        partials: an iterable of tensors, or one tensor ``[K, ...]`` whose leading axis is the
            lexical partition index (folded from index 0 up).
        dtype: dtype of the result; default: the dtype of the first partial.

    Returns:
        Tensor of the partials' shape (without the leading axis when a stacked tensor is given).

    Raises:
        ValueError: no partials, or partials of different shapes.
    """
    if isinstance(partials, torch.Tensor):
        if partials.dim() == 0:
            raise ValueError("partials: expected a tensor [K, ...] with a leading partition axis, got a 0-d tensor")
        partials = partials.unbind(0)
    folder: Optional[LexicalFold] = None
    for p in partials:
        if folder is None:
            folder = LexicalFold(dtype if dtype is not None else p.dtype)
        folder.add(p)
    if folder is None:
        raise ValueError("partials: expected at least one partial, got none")
    return folder.result()

