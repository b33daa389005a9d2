"""Parity decoding of :class:`~ordered_ssd.OrderedMamba2` (``layer.decode_mode = "parity"``; the reference path):
every decoded position gets the bits the training forward gives it over the finished sequence.

A step recomputes the sequence's current chunk (its rows so far and the new one, zero-padded) from the SSM state
and the conv inputs entering that chunk, with the canonical computation (:mod:`ordered_ssd.reference.canonical`);
when the chunk is whole, its state and conv inputs become the next chunk's. Its cost grows with ``chunk_size``
(a whole chunk per token), not with the sequence. The cache (:class:`ParityCache`) replaces ``Mamba2``'s
``(conv_state, ssm_state)`` in this mode. CUDA: not implemented yet (``NotImplementedError``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _checks
from ..reference.canonical import canonical_mamba2_prefill, canonical_mamba2_step, sequence_spans

__all__ = ["ParityCache", "DECODE_MODES", "check_decode_mode", "new_parity_cache", "parity_prefill", "parity_step"]

#: ``layer.decode_mode`` values: ``"recurrent"`` (``Mamba2``'s step, the default) or ``"parity"``.
DECODE_MODES = ("recurrent", "parity")


class ParityCache(NamedTuple):
    """One layer's parity cache, per row (sequence) ``b``:

    * ``rows`` [B, chunk_size, d_model]: the inputs of the current chunk so far (zeros after them);
    * ``state`` [B, H, P, N]: the SSM state entering the current chunk (zeros in the first chunk);
    * ``carry`` [B, d_conv - 1, conv_dim]: the conv inputs of the positions before the current chunk;
    * ``count`` [B] int64: the tokens of the sequence so far.
    """
    rows: torch.Tensor
    state: torch.Tensor
    carry: torch.Tensor
    count: torch.Tensor


def check_decode_mode(layer) -> str:
    mode = layer.decode_mode
    if mode not in DECODE_MODES:
        raise ValueError(f"decode_mode: expected one of {DECODE_MODES}, got {mode!r}")
    return mode


def new_parity_cache(layer, batch: int, device, dtype) -> ParityCache:
    return ParityCache(torch.zeros(batch, layer.chunk_size, layer.d_model, device=device, dtype=dtype),
                       torch.zeros(batch, layer.nheads, layer.headdim, layer.d_state, device=device, dtype=dtype),
                       torch.zeros(batch, layer.d_conv - 1, layer.conv1d.weight.shape[0], device=device, dtype=dtype),
                       torch.zeros(batch, dtype=torch.int64, device=device))


def check_parity_cache(layer, cache, batch: int) -> None:
    if not isinstance(cache, ParityCache):
        raise TypeError(f"inference_params: layer {layer.layer_idx}'s cache entry is a {type(cache).__name__}, not "
                        "the ParityCache of decode_mode 'parity' (a cache made in another decode_mode)")
    if cache.rows.shape[0] != batch:
        raise ValueError(f"inference_params: expected the cached states of {batch} sequences, got "
                         f"{cache.rows.shape[0]}")
    want = new_parity_cache(layer, batch, "meta", layer.in_proj.weight.dtype)
    for name, t, w in zip(ParityCache._fields, cache, want):
        if not isinstance(t, torch.Tensor) or t.shape != w.shape or t.dtype != w.dtype or \
                t.device != layer.in_proj.weight.device:
            raise ValueError(f"inference_params: layer {layer.layer_idx}'s ParityCache.{name}: expected shape "
                             f"{tuple(w.shape)}, dtype {w.dtype}, device {layer.in_proj.weight.device} (the layer's), "
                             f"got {getattr(t, 'shape', t)!r}")


def _require_reference(layer, backend: str) -> None:
    if backend != "reference":
        raise NotImplementedError("decode_mode 'parity': not implemented on the CUDA path yet; it runs on the "
                                  "reference path (the CPU, fp64, or layer.backend = 'reference'); "
                                  "decode_mode 'recurrent' decodes on CUDA")


def parity_prefill(layer, u: torch.Tensor, seq_idx, cache: ParityCache, backend: str) -> None:
    """Write ``cache`` from a prefill of ``u`` [B, L, d_model] (one sequence per row, or per run of ``seq_idx``
    with ``cu_seqlens``: the cache's rows are the sequences in order)."""
    _require_reference(layer, backend)
    spans = sequence_spans(u.shape[0], u.shape[1], seq_idx)
    if len(spans) != cache.rows.shape[0]:
        raise ValueError(f"seq_idx: marks {len(spans)} sequences but the cache holds {cache.rows.shape[0]}: a "
                         "prefill of packed sequences needs cu_seqlens (one cache entry per sequence)")
    params = layer._reference_params(u.dtype)
    for i, (b, s, e) in enumerate(spans):
        _, state, carry, rows = canonical_mamba2_prefill(u[b, s:e], params, layer.dims)
        cache.rows[i].zero_()
        cache.rows[i, :rows.shape[0]] = rows
        cache.state[i] = 0 if state is None else state[0]
        cache.carry[i] = carry
        cache.count[i] = e - s


def parity_step(layer, u: torch.Tensor, cache: ParityCache, backend: str) -> torch.Tensor:
    """One token per sequence: ``u`` [B, 1, d_model] -> [B, 1, d_model]; ``cache`` updated in place."""
    _require_reference(layer, backend)
    w = layer.in_proj.weight
    _checks.check_layer_input(u, d_model=layer.d_model, dtype=w.dtype, device=w.device,
                              allowed_dtypes=layer._input_dtypes(backend), name="hidden_states",
                              backend=layer.backend)
    params = layer._reference_params(u.dtype)
    cs = layer.chunk_size
    out = torch.empty_like(u)
    for b, count in enumerate(cache.count.tolist()):
        n = count % cs
        state = cache.state[b:b + 1] if count >= cs else None  # the first chunk starts from no state
        y, state, carry, rows = canonical_mamba2_step(u[b, 0], cache.rows[b, :n], state, cache.carry[b], params,
                                                      layer.dims)
        out[b, 0] = y
        cache.rows[b, n] = u[b, 0]
        if rows.shape[0] == 0:  # the chunk is whole: the next one starts from its state and conv inputs
            cache.rows[b].zero_()
            cache.state[b] = state[0]
            cache.carry[b] = carry
        cache.count[b] = count + 1
    return out
