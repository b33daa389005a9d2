"""Small helpers shared by the launchers (no native imports).

Binding errors are ``ValueError``s that name the argument, the expected and the actual value:
``"A: expected shape (H,) = (8,), got (4,)"``.
"""
from __future__ import annotations

import functools

import torch

from ._plans import alloc, note_zeroed


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """``triton.next_power_of_2`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _names(names: str) -> tuple:
    return tuple(names.split())


def strides(names: str, t: torch.Tensor | None, dims) -> dict:
    """``{name_i: t.stride(dim_i)}`` for the space-separated ``names``; all zeros when ``t`` is None."""
    keys = _names(names)  # a launcher passes the same few literals at every launch: split once
    if t is None:
        return dict.fromkeys(keys, 0)
    assert len(keys) == len(dims)
    return dict(zip(keys, map(t.stride().__getitem__, dims)))


@functools.lru_cache(maxsize=None)
def _prefixed(prefix: str, dims: str) -> str:
    return " ".join(f"{prefix}_{d}" for d in dims.split())


def prefixed_strides(prefix: str, dims: str, t: torch.Tensor | None) -> dict:
    """:func:`strides` of every dimension of ``t`` under the names ``{prefix}_{dim}`` for the space-separated
    ``dims`` (``prefixed_strides("stride_q", "batch seqlen", q)`` -> ``{"stride_q_batch": .., "stride_q_seqlen":
    ..}``); all zeros when ``t`` is None."""
    names = _prefixed(prefix, dims)
    return strides(names, t, range(len(_names(names))))


def check(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` unless ``cond``; ``msg`` names the argument, what was expected and what came."""
    if not cond:
        raise ValueError(msg)


def _shape(s) -> tuple:
    return tuple(int(v) for v in s)


def check_shape(name: str, t: torch.Tensor, expected, dims: str | None = None) -> None:
    """``t.shape == expected``, else ``ValueError("name: expected shape [B, L] = (2, 3), got (2, 4)")``
    (``dims`` is the symbolic shape, e.g. ``"[B, H, C, cs]"``; left out when None)."""
    if t.shape == expected:  # torch.Size is a tuple: the common case costs one comparison
        return
    want, got = _shape(expected), _shape(t.shape)
    check(got == want, f"{name}: expected shape {want if dims is None else f'{dims} = {want}'}, got {got}")


def check_last_stride_1(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:  # the message is formatted only for a failure (launchers check at every launch)
        check(False, f"{name}: expected stride 1 in the last dim, got strides {tuple(t.stride())}")


def check_D(D: torch.Tensor, nheads: int, headdim: int) -> None:
    """``D`` of shape ``[H, P]`` or ``[H]`` with stride 1 in its last dim."""
    if D.shape not in ((nheads, headdim), (nheads,)) and _shape(D.shape) not in ((nheads, headdim), (nheads,)):
        check(False, f"D: expected shape [H, P] = {(nheads, headdim)} or [H] = {(nheads,)}, got {_shape(D.shape)}")
    check_last_stride_1("D", D)


def nsplits(nheads: int, ngroups: int, nheads_per_program):
    """``(nheads_per_program, S)``: the heads one program sums (default ``H // G``) and the head-split count."""
    check_groups(nheads, ngroups)
    ratio = nheads // ngroups
    nhpp = ratio if nheads_per_program is None else int(nheads_per_program)
    if not 1 <= nhpp <= ratio:
        check(False, f"nheads_per_program: expected 1 <= nheads_per_program <= nheads // ngroups = {ratio}, "
                     f"got {nhpp}")
    return nhpp, cdiv(ratio, nhpp)


def check_groups(nheads: int, ngroups: int) -> None:
    if nheads % ngroups != 0:
        check(False, f"nheads: expected a multiple of ngroups ({ngroups}), got {nheads}")


def out_buffer(buf, shape, dtype, like: torch.Tensor, name: str, zero: bool = False) -> torch.Tensor:
    """Return ``buf`` (checked: shape, dtype, device) or a new ``torch.empty`` / ``torch.zeros`` buffer."""
    if buf is None:
        return alloc(shape, dtype, like.device, zero=zero)  # kept in the launcher's plan, when one is recorded
    shape = _shape(shape)
    check_shape(name, buf, shape)
    check(buf.dtype == dtype, f"{name}: expected dtype {dtype}, got {buf.dtype}")
    check(buf.device == like.device, f"{name}: expected device {like.device}, got {buf.device}")
    if zero:
        buf.zero_()
        note_zeroed(buf)  # redone by the launcher's plan, when one is being recorded
    return buf


def check_rows(name: str, t: torch.Tensor, expected, dims: str | None = None) -> None:
    """:func:`check_shape`, and stride 1 in the last dim."""
    check_shape(name, t, expected, dims)
    check_last_stride_1(name, t)
