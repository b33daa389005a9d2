"""How much a sequence's bits depend on how it is laid out: the fraction of tokens whose loss bits differ from the
sequence's canonical run.

The canonical run of a sequence is the sequence alone: batch 1, from position 0 (the chunk grid starting at its first
token). Each layout computes the same sequences (the same tokens, the same weights) otherwise:

- ``batched``: rows of random batches (batch sizes drawn from 1 to ``--max-batch``), each sequence in a random row,
  right-padded to its batch's longest sequence (the padding is other tokens; a causal model's real positions never
  see it);
- ``packed``: sequences one after the other in rows of ``--pack-len`` positions, marked by ``seq_idx`` (the conv
  and the scan do not cross a boundary), so most sequences start at an offset that is not a multiple of
  ``chunk_size``.

The model is a small Mamba-2 language model (embedding, ``--layers`` pre-norm residual mixers, final norm, tied
head), built once and copied into each kind of mixer with the same weights: ``ordered`` (``OrderedMamba2`` with
``sequence_invariant = True``, ``InvariantRMSNorm`` norms and the head ``ordered_ssd.invariant_linear``: its CUDA path on a GPU, the pure-PyTorch
reference on the CPU), ``ordered_default`` (``OrderedMamba2`` as constructed, ``sequence_invariant = False``, an
``F.linear`` head: on CUDA native's layout and cuBLAS's projections, with ordered sums) and a control: on a GPU with
mamba-ssm ``native`` (mamba-ssm's ``Mamba2``), elsewhere ``plain`` (the vectorised reference ``reference_mamba2_layer`` over the whole
layout, with an ``F.linear`` head). For each (mixer, layout) it prints the tokens whose per-token loss bits differ from the
canonical run's, and the sequences with at least one such token.

    python benchmarks/invariance.py --device cuda --json out.json
    python benchmarks/invariance.py --device cpu --seqs 16 --max-len 96     # the reference path

This measures; it asserts nothing (``tests/benchmarks/test_invariance.py`` asserts 0 for ``ordered`` on the
CPU). ``docs/guarantees.md`` says which layouts the ordered layer makes irrelevant, and on which path.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from typing import Dict, List

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256


class TinyLM(nn.Module):
    """Embedding, ``n`` pre-norm residual Mamba-2 mixers, final norm, tied head; ``forward(tokens, seq_idx=None)``
    -> logits [B, L, 256]. ``invariant_head``: the head is ``ordered_ssd.invariant_linear`` (row-invariant), else
    ``F.linear``."""

    def __init__(self, mixers: List[nn.Module], d_model: int, invariant_head: bool = False):
        super().__init__()
        self.invariant_head = invariant_head
        self.embedding = nn.Embedding(VOCAB, d_model)
        self.norms = nn.ModuleList([nn.RMSNorm(d_model, eps=1e-5) for _ in mixers])
        self.mixers = nn.ModuleList(mixers)
        self.norm_f = nn.RMSNorm(d_model, eps=1e-5)

    def forward(self, tokens, seq_idx=None):
        h = self.embedding(tokens)
        for norm, mixer in zip(self.norms, self.mixers):
            h = h + mixer(norm(h), seq_idx=seq_idx)
        if self.invariant_head:
            from ordered_ssd import invariant_linear

            return invariant_linear(self.norm_f(h), self.embedding.weight)
        return F.linear(self.norm_f(h), self.embedding.weight)


def token_losses(model, tokens, seq_idx=None):
    """Per-position next-token cross-entropy in fp32, [B, L - 1]."""
    logits = model(tokens, seq_idx=seq_idx)
    B, L, V = logits.shape  # one row per position: a softmax over the strided vocabulary dimension would vectorise
    # over positions, whose number then decides which positions take the vector path
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, V), tokens[:, 1:].reshape(-1),
                           reduction="none").view(B, L - 1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous().view(torch.int32)


def canonical(model, seqs) -> List[torch.Tensor]:
    return [_bits(token_losses(model, s[None]))[0] for s in seqs]


def batched(model, seqs, rng: random.Random, max_batch: int) -> List[torch.Tensor]:
    order = list(range(len(seqs)))
    rng.shuffle(order)
    out: Dict[int, torch.Tensor] = {}
    i = 0
    while i < len(order):
        members = order[i:i + rng.randint(1, max_batch)]
        i += len(members)
        width = max(seqs[m].numel() for m in members)
        rows = torch.randint(0, VOCAB, (len(members), width), device=seqs[0].device,
                             generator=torch.Generator(seqs[0].device).manual_seed(rng.randrange(2 ** 31)))
        for r, m in enumerate(members):
            rows[r, :seqs[m].numel()] = seqs[m]
        losses = _bits(token_losses(model, rows))
        for r, m in enumerate(members):
            out[m] = losses[r, :seqs[m].numel() - 1]
    return [out[k] for k in range(len(seqs))]


def packed(model, seqs, rng: random.Random, pack_len: int) -> List[torch.Tensor]:
    """Sequences in random order into rows of at most ``pack_len`` positions (one row per sequence where it is
    longer), each row's sequences marked by ``seq_idx``; losses of a sequence's own positions."""
    order = list(range(len(seqs)))
    rng.shuffle(order)
    rows, row = [], []
    for m in order:
        if row and sum(seqs[k].numel() for k in row) + seqs[m].numel() > pack_len:
            rows.append(row)
            row = []
        row.append(m)
    rows.append(row)
    out: Dict[int, torch.Tensor] = {}
    device = seqs[0].device
    for row in rows:
        tokens = torch.cat([seqs[m] for m in row])[None]
        seq_idx = torch.cat([torch.full((seqs[m].numel(),), j, dtype=torch.int32, device=device)
                             for j, m in enumerate(row)])[None]
        losses = _bits(token_losses(model, tokens, seq_idx=seq_idx))[0]
        start = 0
        for m in row:
            n = seqs[m].numel()
            out[m] = losses[start:start + n - 1]  # the position after a sequence's last token is the next one's
            start += n
    return [out[k] for k in range(len(seqs))]


def compare(got: List[torch.Tensor], want: List[torch.Tensor]) -> dict:
    tokens = sum(w.numel() for w in want)
    differ = [int((g != w).sum()) for g, w in zip(got, want)]
    return {"tokens": tokens, "tokens_differing": sum(differ), "sequences": len(want),
            "sequences_differing": sum(d > 0 for d in differ),
            "token_fraction": sum(differ) / tokens if tokens else 0.0}


def _plain_reference_class():
    """The control off CUDA: ``OrderedMamba2``'s parameters computed by the vectorised oracle
    ``reference_mamba2_layer`` over the whole layout at once (plain autograd, as a straightforward PyTorch Mamba-2
    would), with an ``F.linear`` head."""
    from ordered_ssd import OrderedMamba2
    from ordered_ssd.reference import reference_mamba2_layer

    class PlainReferenceMamba2(OrderedMamba2):
        def forward(self, u, seq_idx=None):
            return reference_mamba2_layer(u, self.layer_params(), self.dims, seq_idx)

    return PlainReferenceMamba2


def build(kind: str, args, device, dtype, template=None) -> TinyLM:
    kw = dict(d_model=args.d_model, d_state=args.d_state, headdim=args.headdim, chunk_size=args.chunk_size)
    if kind in ("ordered", "ordered_default"):
        from ordered_ssd import OrderedMamba2

        cls = OrderedMamba2
    elif kind == "plain":
        cls = _plain_reference_class()
    else:
        import csrc_bindings

        cls = csrc_bindings.mamba2_class()
    torch.manual_seed(args.seed)
    model = TinyLM([cls(**kw, layer_idx=i) for i in range(args.layers)], args.d_model,
                   invariant_head=kind == "ordered")
    if kind == "ordered":  # the layers' CUDA path per sequence; the norms' mean of squares row-invariant
        from ordered_ssd import InvariantRMSNorm

        for m in model.mixers:
            m.sequence_invariant = True
        model.norms = nn.ModuleList([InvariantRMSNorm.from_module(n) for n in model.norms])
        model.norm_f = InvariantRMSNorm.from_module(model.norm_f)
    if template is not None:
        model.load_state_dict(template.state_dict(), strict=True)
    return model.to(device=device, dtype=dtype).eval()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--seqs", type=int, default=64, help="sequences (default 64)")
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--pack-len", type=int, default=2048)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-state", type=int, default=64)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mixers", default=None,
                   help="of ordered, ordered_default, native (mamba-ssm's Mamba2, CUDA), plain (the vectorised "
                        "reference, the CPU's control); default ordered,ordered_default,native on CUDA, "
                        "ordered,plain elsewhere")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if not 2 <= args.min_len <= args.max_len:
        p.error(f"--min-len/--max-len: expected 2 <= min <= max, got {args.min_len}, {args.max_len}")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    mixers = (args.mixers.split(",") if args.mixers
              else ["ordered"] + (["ordered_default", "native"] if device.type == "cuda" else ["plain"]))
    rng = random.Random(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    seqs = [torch.randint(0, VOCAB, (rng.randint(args.min_len, args.max_len),), generator=g).to(device)
            for _ in range(args.seqs)]
    template = build("ordered", args, torch.device("cpu"), torch.float32)
    results = {"device": str(device), "dtype": str(dtype), "args": vars(args), "mixers": {}}
    with torch.no_grad():
        for kind in mixers:
            model = build(kind, args, device, dtype, template=copy.deepcopy(template))
            want = canonical(model, seqs)
            rows = {"canonical again": compare(canonical(model, seqs), want),
                    "batched": compare(batched(model, seqs, random.Random(args.seed + 1), args.max_batch), want),
                    "packed": compare(packed(model, seqs, random.Random(args.seed + 2), args.pack_len), want)}
            results["mixers"][kind] = rows
            results.setdefault("invariant_head", {})[kind] = model.invariant_head
            for layout, r in rows.items():
                print(f"{kind:>8} {layout:>16}: {r['tokens_differing']:>7} of {r['tokens']} tokens "
                      f"({100 * r['token_fraction']:.2f}%) differ from the canonical bits, in "
                      f"{r['sequences_differing']} of {r['sequences']} sequences")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
