"""Is nn.Embedding's CUDA backward bitwise repeatable? Repeats one backward of an embedding lookup (the two CUDA
kernels: <= 3072 indices and more) and counts distinct gradient digests; prints one line per case."""
import hashlib

import torch

for vocab, tokens in ((256, 2048), (256, 16384), (50280, 16384)):
    emb = torch.nn.Embedding(vocab, 768, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, vocab, (tokens,), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    g = torch.randn(tokens, 768, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(1))
    seen = set()
    for _ in range(10):
        emb.weight.grad = None
        emb(ids).backward(g)
        seen.add(hashlib.sha256(emb.weight.grad.view(torch.uint8).cpu().numpy().tobytes()).hexdigest())
    print(f"embedding vocab={vocab} tokens={tokens}: {len(seen)} distinct gradient digests over 10 repeats")
