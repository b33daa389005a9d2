"""Greedy generation with the decoding cache of ``OrderedMamba2`` in your own model (not mamba-ssm's
``MambaLMHeadModel``), checked against re-running the full forward on the growing sequence.

The model is ``ByteLM`` of ``train_lm.py`` (its forward passes ``inference_params`` to every layer), trained a few
steps from a seed. Each layer's cache, ``allocate_inference_cache(B, max_seqlen)`` (``conv_state``, ``ssm_state``),
sits in ``inference_params.key_value_memory_dict[layer_idx]``. Decoding is a loop: one prefill of the prompt
(``seqlen_offset == 0``: each layer writes its conv and SSM states into its cache), then one token at a time
(``seqlen_offset > 0``: each layer runs ``OrderedMamba2.step`` on [B, 1, d_model] and updates its cache in place).
Without mamba-ssm installed, ``inference_params`` is any object with a dict ``key_value_memory_dict`` and an int
``seqlen_offset`` (mamba-ssm's ``InferenceParams`` works too).

    python examples/generate.py [--tokens 32]

It prints each prompt and its greedy continuation, ``same tokens: True`` and the largest difference of the logits
(the recurrent step and the chunked scan of the full forward round differently: the logits agree to rounding, not
to the bit).
"""
import argparse
from types import SimpleNamespace

import torch

from train_lm import train  # examples/train_lm.py: ByteLM and its training loop


@torch.no_grad()
def generate_cached(model, prompt, n_tokens):
    """Greedy: prefill ``prompt`` [B, L], then ``n_tokens - 1`` one-token steps. Returns (tokens, per-step logits)."""
    B, L = prompt.shape
    cache = SimpleNamespace(seqlen_offset=0, key_value_memory_dict={  # zeros; the layers also make them on first use
        mixer.layer_idx: mixer.allocate_inference_cache(B, L + n_tokens) for mixer in model.mixers})
    logits = model(prompt, inference_params=cache)[:, -1]  # prefill: [B, 256] for the next token
    tokens, history = [logits.argmax(-1)], [logits]
    cache.seqlen_offset = L  # tokens in the cache: > 0 makes the layers step
    for _ in range(n_tokens - 1):
        logits = model(tokens[-1][:, None], inference_params=cache)[:, -1]  # step: [B, 1] -> [B, 256]
        cache.seqlen_offset += 1
        tokens.append(logits.argmax(-1))
        history.append(logits)
    return torch.stack(tokens, 1), torch.stack(history, 1)


@torch.no_grad()
def generate_full(model, prompt, n_tokens):
    """Greedy without a cache: the whole forward on the growing sequence for every new token."""
    seq, history = prompt, []
    for _ in range(n_tokens):
        logits = model(seq)[:, -1]
        history.append(logits)
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
    return seq[:, prompt.shape[1]:], torch.stack(history, 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _, _ = train(device, steps=30, verbose=False)  # seeded (train_lm.py)
    model.eval()
    prompts = [b"If the text is wrapped, the ", b"Return the lines of text in "]  # equal lengths: no padding
    prompt = torch.tensor([list(p) for p in prompts], device=device)  # [B, L] int64
    cached, cached_logits = generate_cached(model, prompt, args.tokens)
    full, full_logits = generate_full(model, prompt, args.tokens)
    for p, row in zip(prompt.tolist(), cached.tolist()):
        print(f"{bytes(p)!r} -> {bytes(row)!r}")
    print(f"same tokens: {torch.equal(cached, full)}")
    print(f"max |logits difference|: {(cached_logits - full_logits).abs().max().item():.3g}")
    assert torch.equal(cached, full), "cached and full-forward generation differ"
