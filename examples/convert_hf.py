"""Convert a Hugging Face ``transformers`` model to ordered Mamba-2 mixers and train it with the same bits every run.

Builds a tiny ``Mamba2ForCausalLM`` (or, with ``--arch bamba``, a Bamba hybrid with one attention layer) from a
config in code (no download; a real checkpoint would come from ``from_pretrained(path,
attn_implementation="eager")``), converts it with ``ordered_ssd.convert_to_ordered`` (the same parameter objects,
so an optimizer built before keeps working), trains a few AdamW steps on bytes of a standard-library file and prints
the gradient digest of every step and the digest of the final parameters; then ``convert_to_hf`` puts the original
mixers back with the trained weights (e.g. for ``save_pretrained``). Needs ``pip install "ordered-ssd[hf]"``.

    python examples/convert_hf.py [--arch mamba2|bamba] [--check]    # --check: train twice, assert the same bits

As docs/convert.md says: build hybrids with ``attn_implementation="eager"`` (on CUDA, SDPA's and flash-attention's
backward add with atomics), pass ``use_cache=False`` when training, seed before building the model and before
training (dropout); ``ordered_ssd.hf.audit_model`` lists what the ordered mixers leave uncovered (here: nothing).
"""
import argparse

import torch
import transformers

from ordered_ssd import convert_to_hf, convert_to_ordered
from ordered_ssd.hf import audit_model
from train_lm import corpus, digest  # examples/train_lm.py

CONFIGS = {  # tiny: vocabulary of 256 bytes, d_model 64, 2 layers, 8 heads of 16, d_state 16, chunk_size 32
    "mamba2": lambda: transformers.Mamba2Config(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, expand=2, state_size=16,
        n_groups=1, chunk_size=32),
    "bamba": lambda: transformers.BambaConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, attn_layer_indices=[1], intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
        mamba_chunk_size=32, attn_implementation="eager"),  # eager attention: no atomics in its CUDA backward
}


def train(arch, device, steps=3, B=4, L=64, seed=0, verbose=True):
    """Build, convert and train ``arch``; returns (per-step gradient digests, final parameter digest)."""
    torch.manual_seed(seed)  # before building: the initial weights come from it
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]()).to(device)
    convert_to_ordered(model)  # the Mamba-2 mixers are now OrderedHFMamba2Mixer
    if verbose:  # the parts of the model the ordered mixers leave non-deterministic or uncovered
        print(f"{type(model).__name__}: audit_model: {audit_model(model) or 'nothing uncovered'}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data, batches = corpus(device), torch.Generator().manual_seed(seed)  # the data order: its own generator
    model.train()
    torch.manual_seed(seed)  # and before training: a random op (dropout, if any) draws from it
    grad_digests = []
    for step in range(steps):
        starts = torch.randint(0, len(data) - L, (B,), generator=batches).tolist()
        ids = torch.stack([data[s:s + L] for s in starts])  # [B, L]; the model shifts the labels itself
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        grad_digests.append(digest(p.grad for p in model.parameters()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if verbose:
            print(f"step {step}: loss {loss.item():.4f} grad sha256 {grad_digests[-1][:16]}")
    convert_to_hf(model)  # the original mixers again, holding the trained parameters
    return grad_digests, digest(model.parameters())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(CONFIGS), default="mamba2")
    parser.add_argument("--check", action="store_true", help="train twice and assert the same bits")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    grads, params = train(args.arch, device)
    print(f"final params sha256 {params}")
    if args.check:
        same = train(args.arch, device, verbose=False) == (grads, params)
        print(f"same bits: {same}")
        assert same, "two runs gave different bits"
