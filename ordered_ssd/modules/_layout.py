"""Packed sequences as rows, for the CUDA path of a sequence-invariant layer (``sequence_invariant = True``).

mamba-ssm's kernels run a packed row (``seq_idx``) on the row's chunk grid: a sequence that starts inside a chunk
shares that chunk's tiles with the one before it, so its bits depend on where it was packed. A sequence-invariant
layer gives each run of ``seq_idx`` its own row (the sequences in row-major order of their first position, each from
position 0 of its row, the rows right-padded with zeros to the longest, rounded up to whole chunks), runs the row
path on them, and takes the
outputs back to the packed positions. Each sequence is then computed as a row of a batch: the bits it gets alone.

The moves are exact copies both ways (index gathers with a zero row for the positions that have no source), so the
gradient that reaches a packed position is the bits its row position got. Building the layout reads two integers
(the number of sequences and the longest) from the device, once per ``seq_idx`` tensor (kept while that tensor is
alive and unmodified).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

__all__ = ["SequenceRows", "sequence_rows", "pad_to_multiple", "per_tensor"]


def pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """``x`` [B, L, ...] right-padded with zeros along ``L`` to a multiple of ``multiple`` (``x`` itself when it is
    one already). A sequence-invariant layer runs whole chunks: the partitions of some partial sums depend on ``L``
    (the gated norm's row blocks are ``gcd(L, chunk_size)`` rows), so every layout runs at a multiple of
    ``chunk_size``, and the padding adds exact zeros."""
    L = x.shape[1]
    if L % multiple == 0:
        return x
    pad = [0, 0] * (x.dim() - 2) + [0, -(-L // multiple) * multiple - L]
    return torch.nn.functional.pad(x, pad)



@dataclass(frozen=True)
class SequenceRows:
    """Where each packed position goes: position ``i`` of the flattened ``[B * L]`` layout is row position
    ``dst[i]`` of the flattened ``[S * Lrow]`` rows; ``src[j]`` is the packed position of row position ``j``, or
    ``B * L`` (a zero row) for the rows' padding."""
    dst: torch.Tensor
    src: torch.Tensor
    S: int
    Lrow: int
    B: int
    L: int

    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, L, D] -> [S, Lrow, D] (padding zeros), differentiable (the gradient is a gather back)."""
        return _Move.apply(x.reshape(self.B * self.L, -1), self.src, self.dst).reshape(self.S, self.Lrow, -1)

    def from_rows(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` [S, Lrow, D] -> [B, L, D] at the packed positions, differentiable."""
        return _Move.apply(y.reshape(self.S * self.Lrow, -1), self.dst, self.src).reshape(self.B, self.L, -1)


class _Move(torch.autograd.Function):
    """``out = cat(x, 0)[index]``; the gradient ``cat(dout, 0)[inverse]``: bit copies both ways (each position of
    ``x`` appears once in ``out``)."""

    @staticmethod
    def forward(ctx, x, index, inverse):
        ctx.save_for_backward(inverse)
        return torch.cat([x, x.new_zeros(1, x.shape[1])]).index_select(0, index)

    @staticmethod
    def backward(ctx, dout):
        (inverse,) = ctx.saved_tensors
        dout = dout.contiguous()
        return torch.cat([dout, dout.new_zeros(1, dout.shape[1])]).index_select(0, inverse), None, None


_MEMO: dict = {}


def per_tensor(tag: str, t: torch.Tensor, compute):
    """``compute()``, kept under ``tag`` for the last tensor ``t`` while it is alive and unmodified (the layers of a
    model get the same ``seq_idx`` or mask: the work, and its host read, happen once). Not kept for inference
    tensors (no version counter) or while ``torch.compile`` traces."""
    if torch.compiler.is_compiling() or t.is_inference():
        return compute()
    hit = _MEMO.get(tag)
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    value = compute()
    _MEMO[tag] = (weakref.ref(t), t._version, value)
    return value


_LAST: list = [None]  # (weakref to the last seq_idx, its _version, its layout): the layers of a model share one


@torch.compiler.disable  # a host read: under torch.compile the graph breaks here (fullgraph=True refuses)
def sequence_rows(seq_idx: torch.Tensor, multiple: int):
    """The :class:`SequenceRows` of ``seq_idx`` [B, L] (runs of equal ids, each row starting a new run; the rows
    ``Lrow`` long, the longest run rounded up to a multiple of ``multiple``), or None when the layout is already one
    sequence per row (nothing to move). One host read per ``seq_idx`` tensor."""
    cacheable = not seq_idx.is_inference()  # an inference tensor has no version counter
    hit = _LAST[0]
    if cacheable and hit is not None and hit[0]() is seq_idx and hit[1] == seq_idx._version and hit[2] == multiple:
        return hit[3]
    B, L = seq_idx.shape
    if B * L == 0:
        return None
    dev = seq_idx.device
    start = torch.ones(B, L, dtype=torch.bool, device=dev)
    start[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    start = start.reshape(-1)
    seq = torch.cumsum(start.to(torch.int64), 0) - 1  # the sequence of each packed position
    pos = torch.arange(B * L, device=dev)
    # [S] the first packed position of each sequence (S known on the host from the nonzero: the one host read)
    first = torch.nonzero(start).flatten()
    offset = pos - first[seq]  # position inside its sequence
    S = first.shape[0]
    longest = int(torch.diff(first, append=first.new_tensor([B * L])).max())
    if S == B:  # one run per row: already the row layout
        result = None
    else:
        Lrow = -(-longest // multiple) * multiple
        dst = seq * Lrow + offset
        src = torch.full((S * Lrow,), B * L, dtype=torch.int64, device=dev)
        src[dst] = pos
        result = SequenceRows(dst, src, S, Lrow, B, L)
    if cacheable:
        _LAST[0] = (weakref.ref(seq_idx), seq_idx._version, multiple, result)
    return result
