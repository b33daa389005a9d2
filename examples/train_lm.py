"""Train a small byte-level Mamba-2 language model and show that its gradients are the same bits on every run.

``nn.Embedding -> n_layers x (h + OrderedMamba2(RMSNorm(h))) -> RMSNorm -> nn.Linear``, trained by AdamW from
``torch.manual_seed`` on the bytes of a standard-library file. Every step prints the loss and one SHA-256 over the
``ordered_ssd.digest.tensor_sha256`` of every gradient; the end prints the digest of the final parameters.

    python examples/train_lm.py            # one run (CUDA if available, else the CPU)
    python examples/train_lm.py --check    # two runs in this process; asserts the same bits: "same bits: True"
    python examples/train_lm.py --check --layer mamba3   # the same with OrderedMamba3 layers (docs/mamba3.md)

The rest of the model must be deterministic too (docs/convert.md). On the CPU and in eager CUDA, ``nn.Embedding``'s
backward, the matmuls, RMSNorm and the cross-entropy repeat bit for bit, so no global flag is set here; under
``torch.compile`` the embedding's backward becomes an atomic scatter-add: call ``torch.use_deterministic_algorithms
(True)`` first. On the CPU the bits also depend on ``torch.get_num_threads()`` (the same in every run, please).
"""
import argparse
import hashlib
import inspect
import textwrap

import torch
import torch.nn as nn
import torch.nn.functional as F

from ordered_ssd import OrderedMamba2, OrderedMamba3
from ordered_ssd.digest import tensor_sha256


class ByteLM(nn.Module):
    """Byte-level LM: ``forward(tokens [B, L] int64, inference_params=None) -> logits [B, L, 256]``."""

    def __init__(self, d_model=64, n_layers=2, device=None, layer="mamba2"):
        super().__init__()
        mixer = OrderedMamba3 if layer == "mamba3" else OrderedMamba2  # the same constructor arguments here
        self.embedding = nn.Embedding(256, d_model, device=device)
        self.norms = nn.ModuleList(nn.RMSNorm(d_model, eps=1e-5, device=device) for _ in range(n_layers))
        self.mixers = nn.ModuleList(mixer(d_model, d_state=16, headdim=16, chunk_size=32, layer_idx=i,
                                          device=device) for i in range(n_layers))
        self.norm_f = nn.RMSNorm(d_model, eps=1e-5, device=device)
        self.lm_head = nn.Linear(d_model, 256, bias=False, device=device)

    def forward(self, tokens, inference_params=None):
        h = self.embedding(tokens)  # [B, L, d_model]
        for norm, mixer in zip(self.norms, self.mixers):  # layer_idx keys each layer's decoding cache
            h = h + mixer(norm(h), inference_params=inference_params)
        return self.lm_head(self.norm_f(h))


def corpus(device):
    """The bytes of ``textwrap.py`` (any text available offline would do) as int64 tokens."""
    with open(inspect.getsourcefile(textwrap), "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).to(device, torch.int64)


def digest(tensors):
    """One SHA-256 over the SHA-256 of every tensor, in order."""
    return hashlib.sha256("".join(tensor_sha256(t) for t in tensors).encode()).hexdigest()


def train(device, steps=4, B=4, L=64, seed=0, verbose=True, layer="mamba2"):
    """``steps`` AdamW steps from ``seed``; returns (model, per-step gradient digests, final parameter digest)."""
    torch.manual_seed(seed)  # before building the model: the initial weights come from it
    model = ByteLM(device=device, layer=layer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = corpus(device)
    batches = torch.Generator().manual_seed(seed)  # the data order, its own generator
    grad_digests = []
    for step in range(steps):
        starts = torch.randint(0, len(data) - L - 1, (B,), generator=batches).tolist()
        window = torch.stack([data[s:s + L + 1] for s in starts])  # [B, L + 1]
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        loss.backward()
        grad_digests.append(digest(p.grad for p in model.parameters()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if verbose:
            print(f"step {step}: loss {loss.item():.4f} grad sha256 {grad_digests[-1][:16]}")
    return model, grad_digests, digest(model.parameters())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="train twice and assert the same bits")
    parser.add_argument("--layer", choices=("mamba2", "mamba3"), default="mamba2", help="the mixer (default mamba2)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, grads, params = train(device, layer=args.layer)
    print(f"final params sha256 {params}")
    if args.check:
        same = train(device, verbose=False, layer=args.layer)[1:] == (grads, params)
        print(f"same bits: {same}")
        assert same, "two runs gave different bits"
