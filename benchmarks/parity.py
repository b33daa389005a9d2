"""Exact on-policy: do the log-probabilities a sampler computed equal the ones the training forward recomputes?

A small Mamba-2 language model (embedding, ``--layers`` pre-norm residual ``OrderedMamba2`` mixers, final norm, a
head) samples ``--new-tokens`` tokens (temperature ``--temperature``, one seeded generator per sequence,
``ordered_ssd.sampling.sample_tokens``) after ``--prompts`` prompts of mixed lengths, at each batch size of
``--batch-sizes`` (each batch: a packed prefill with ``cu_seqlens``, then one token per sequence per step). Then
the training forward (no cache) over the finished sequences, right-padded in one batch and packed into one row by
``seq_idx``, recomputes every sampled token's log-probability (``ordered_ssd.sampling.token_logprobs``). It prints,
per model, batch size and layout, the fraction of sampled tokens whose log-probability bits differ from the
sampler's, whether every batch size sampled the same tokens, and the generation's tokens per second (the prefill
and the steps; host time on the CPU).

Models (the same weights): ``parity`` (``layer.decode_mode = "parity"``, an ``InvariantLinear`` head) and the
control ``recurrent`` (the default ``decode_mode``, ``Mamba2``'s recurrent step, and an ``nn.Linear`` head). The
reference path (the CPU); parity decoding has no CUDA path yet.

    python benchmarks/parity.py                      # 64 prompts, 256 new tokens, batch sizes 1, 8, 64
    python benchmarks/parity.py --prompts 8 --new-tokens 12 --batch-sizes 1,8 --json out.json

Exit status: 0 when the parity model's log-probabilities differ on no token and its tokens are the same at every
batch size; 1 otherwise (the control's numbers are reported, not judged).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn as nn

from ordered_ssd import InvariantLinear, OrderedMamba2
from ordered_ssd.sampling import sample_tokens, token_logprobs


class LM(nn.Module):
    def __init__(self, vocab, d_model, layers, chunk_size, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(vocab, d_model)
        self.norms = nn.ModuleList([nn.RMSNorm(d_model, eps=1e-5) for _ in range(layers)])
        self.mixers = nn.ModuleList([OrderedMamba2(d_model, d_state=16, headdim=16, chunk_size=chunk_size,
                                                   layer_idx=i) for i in range(layers)])
        self.norm_f = nn.RMSNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, ids, seq_idx=None, cu_seqlens=None, inference_params=None):
        h = self.embedding(ids)
        for norm, mixer in zip(self.norms, self.mixers):
            h = h + mixer(norm(h), seq_idx=seq_idx, cu_seqlens=cu_seqlens, inference_params=inference_params)
        return self.head(self.norm_f(h))


def _packed(seqs):
    ids = torch.cat(seqs)[None]
    lengths = torch.tensor([s.numel() for s in seqs])
    seq_idx = torch.repeat_interleave(torch.arange(len(seqs), dtype=torch.int32), lengths)[None]
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    return ids, seq_idx, cu


@torch.no_grad()
def generate(model, prompts, first, new_tokens, temperature, seed):
    """Sample ``new_tokens`` after ``prompts[first:first + B]``; returns ([tokens [new]], [logprobs [new]])."""
    gens = [torch.Generator().manual_seed(seed * 100003 + first + i) for i in range(len(prompts))]
    params = SimpleNamespace(key_value_memory_dict={}, seqlen_offset=0)
    ids, seq_idx, cu = _packed(prompts)
    logits = model(ids, seq_idx=seq_idx, cu_seqlens=cu, inference_params=params)[0, cu[1:].long() - 1]
    params.seqlen_offset = 1
    tokens, logps = [], []
    for step in range(new_tokens):
        tok, lp = sample_tokens(logits, gens, temperature=temperature)
        tokens.append(tok)
        logps.append(lp)
        if step + 1 < new_tokens:
            logits = model(tok[:, None], inference_params=params)[:, 0]
    return list(torch.stack(tokens, 1)), list(torch.stack(logps, 1))


@torch.no_grad()
def recompute(model, prompts, tokens, temperature, layout):
    """The training forward's log-probabilities of each sequence's sampled tokens."""
    seqs = [torch.cat([p, t]) for p, t in zip(prompts, tokens)]
    out = []
    if layout == "padded":
        width = max(s.numel() for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, :s.numel()] = s
        logits = model(ids)
        for r, (p, t) in enumerate(zip(prompts, tokens)):
            out.append(token_logprobs(logits[r, p.numel() - 1:p.numel() - 1 + t.numel()], t, temperature))
    else:
        ids, seq_idx, cu = _packed(seqs)
        logits = model(ids, seq_idx=seq_idx)[0]
        for start, p, t in zip(cu[:-1].tolist(), prompts, tokens):
            a = start + p.numel() - 1
            out.append(token_logprobs(logits[a:a + t.numel()], t, temperature))
    return out


def _bits(t):
    return t.contiguous().view(torch.int32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--min-prompt", type=int, default=4)
    p.add_argument("--max-prompt", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch-sizes", default="1,8,64")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    rng = random.Random(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, args.vocab, (rng.randint(args.min_prompt, args.max_prompt),), generator=g)
               for _ in range(args.prompts)]
    template = LM(args.vocab, args.d_model, args.layers, args.chunk_size, args.seed)
    results = {"args": vars(args), "models": {}}
    ok = True
    for kind in ("parity", "recurrent"):
        model = LM(args.vocab, args.d_model, args.layers, args.chunk_size, args.seed)
        model.load_state_dict(template.state_dict())
        model.eval()
        if kind == "parity":
            model.head = InvariantLinear.from_linear(model.head)
            for m in model.mixers:
                m.decode_mode = "parity"
        rows, first_tokens = {}, None
        for bs in batch_sizes:
            tokens, logps = [], []
            start = time.perf_counter()
            for i in range(0, len(prompts), bs):
                t, lp = generate(model, prompts[i:i + bs], i, args.new_tokens, args.temperature, args.seed)
                tokens += t
                logps += lp
            seconds = time.perf_counter() - start
            same = first_tokens is None or all(torch.equal(a, b) for a, b in zip(tokens, first_tokens))
            first_tokens = first_tokens or tokens
            n = sum(t.numel() for t in tokens)
            for layout in ("padded", "packed"):
                again = recompute(model, prompts, tokens, args.temperature, layout)
                differ = sum(int((_bits(a) != _bits(b)).sum()) for a, b in zip(again, logps))
                rows[f"batch {bs}, {layout}"] = {"tokens": n, "differing": differ, "fraction": differ / n,
                                                 "same_tokens_as_first_batch_size": same,
                                                 "generated_tokens_per_s": n / seconds}
                print(f"{kind:>9}  batch {bs:>3}  {layout:>6}: {differ:>7} of {n} sampled tokens' log-probabilities "
                      f"differ from the training forward's ({100 * differ / n:.2f}%); tokens "
                      f"{'the same as' if same else 'differ from'} batch size {batch_sizes[0]}'s; "
                      f"{n / seconds:.0f} tokens/s")
                if kind == "parity" and (differ or not same):
                    ok = False
        results["models"][kind] = rows
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
