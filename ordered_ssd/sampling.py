"""Seeded sampling whose tokens do not depend on the batch: each sequence draws from its own generator.

With parity logits (``layer.decode_mode = "parity"`` and a row-invariant head, ``docs/decoding.md``) a sequence's
logits are the same bits at any batch size and in any row, so :func:`sample_tokens` gives it the same tokens and
log-probabilities too, and :func:`token_logprobs` over a training forward recomputes those log-probabilities bit
for bit (the sampler and the trainer use the same function: a log-softmax over rows of the vocabulary).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

__all__ = ["sample_tokens", "token_logprobs"]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` at ``tokens``, in fp32: logits [..., V], tokens [...] -> [...].

    Computed over rows of the vocabulary (``logits.reshape(-1, V)``, one row per position), so a position's bits
    do not depend on how many positions come with it.

    Raises: TypeError: ``logits`` not floating or ``tokens`` not integer. ValueError: shapes that do not match,
    ``temperature`` not > 0.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits: expected a floating-point tensor [..., V], got {type(logits).__name__}"
                        + (f" of dtype {logits.dtype}" if isinstance(logits, torch.Tensor) else ""))
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise TypeError(f"tokens: expected an integer tensor, got {getattr(tokens, 'dtype', type(tokens).__name__)}")
    if tuple(tokens.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"tokens: expected shape {tuple(logits.shape[:-1])} (logits' without V), got "
                         f"{tuple(tokens.shape)}")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 < temperature < float("inf"):
        raise ValueError(f"temperature: expected a finite number > 0, got {temperature!r}")
    V = logits.shape[-1]
    rows = logits.reshape(-1, V).float() / float(temperature)
    logp = torch.log_softmax(rows, dim=-1)
    return logp.gather(1, tokens.reshape(-1, 1).long()).reshape(tokens.shape)


def sample_tokens(logits: torch.Tensor, generators: Sequence[torch.Generator], *, temperature: float = 1.0,
                  top_k: Optional[int] = None, top_p: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits`` [B, V], row ``b`` drawn with ``generators[b]``; returns ``(tokens [B] int64,
    logprobs [B] fp32)``, the log-probabilities by :func:`token_logprobs` (of the tempered distribution, before
    top-k / top-p).

    Each row is processed alone (temperature, then top-k: the logits at least the ``top_k``-th largest, so every
    logit tied with it is kept; then top-p: the smallest set of the most probable tokens whose probability reaches
    ``top_p``, at least one), then ``torch.multinomial`` with the row's generator: a row's token depends only on its logits'
    bits and its generator's state, never on the other rows.

    Raises: TypeError / ValueError (naming the argument): ``logits`` not a 2-d floating tensor; ``generators`` not
    ``B`` ``torch.Generator`` of the logits' device type; ``temperature`` not > 0; ``top_k`` not an int >= 1;
    ``top_p`` not in (0, 1].
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() != 2:
        raise TypeError(f"logits: expected a 2-d floating-point tensor [B, V], got "
                        f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    B, V = logits.shape
    if (not isinstance(generators, (list, tuple)) or len(generators) != B
            or not all(isinstance(g, torch.Generator) for g in generators)):
        got = f"{len(generators)} objects" if isinstance(generators, (list, tuple)) else type(generators).__name__
        raise TypeError(f"generators: expected a list of {B} torch.Generator (one per row), got {got}")
    if len({id(g) for g in generators}) != B:
        raise ValueError("generators: expected a different generator for every row (one per sequence), got the "
                         "same object for several rows")
    if any(g.device.type != logits.device.type for g in generators):
        raise ValueError(f"generators: expected generators of device type {logits.device.type!r} (the logits')")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 < temperature < float("inf"):
        raise ValueError(f"temperature: expected a finite number > 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k: expected None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p: expected None or a number in (0, 1], got {top_p!r}")
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    for b in range(B):
        row = logits[b].float() / float(temperature)
        if top_k is not None and top_k < V:
            kth = torch.topk(row, top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if top_p is not None and top_p < 1:
            sorted_logits, order = torch.sort(row, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = (probs.cumsum(0) - probs) >= top_p  # keep the tokens before the mass reaches top_p
            row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
        tokens[b] = torch.multinomial(torch.softmax(row, dim=-1), 1, generator=generators[b])[0]
    return tokens, token_logprobs(logits, tokens, temperature)
