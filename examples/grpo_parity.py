"""A minimal GRPO-style loop whose importance ratio is exactly 1: the log-probabilities the sampler computed are the
bits the training forward recomputes (on-policy RL without a sampler/trainer mismatch).

The policy is a small Mamba-2 language model on the CPU: ``OrderedMamba2`` mixers with ``decode_mode = "parity"``
(each decoded position gets the training forward's bits) and an ``InvariantLinear`` head (a row's logits do not
depend on how many rows come with it). Each update:

1. samples a group of ``--group`` completions for each of ``--prompts`` prompts (one seeded generator per
   completion, ``ordered_ssd.sampling.sample_tokens``, temperature 1), recording each token's log-probability;
2. scores each completion with a toy reward (the fraction of its tokens below 128) and normalises the rewards in
   each group (the advantages);
3. recomputes the sampled tokens' log-probabilities with the training forward over the right-padded batch of
   finished sequences, and checks that the importance ratio ``exp(new - old)`` is exactly 1 on every token of the
   first update (it stops with an error otherwise);
4. takes an AdamW step on the clipped policy-gradient loss.

    python examples/grpo_parity.py [--updates 3]

It prints, per update, the mean reward and how many tokens had a ratio of exactly 1.
"""
import argparse
import sys
from types import SimpleNamespace

import torch
import torch.nn as nn

from ordered_ssd import InvariantLinear, OrderedMamba2
from ordered_ssd.sampling import sample_tokens, token_logprobs

VOCAB = 256


class Policy(nn.Module):
    def __init__(self, d_model=64, layers=2, chunk_size=16):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, d_model)
        self.norms = nn.ModuleList([nn.RMSNorm(d_model) for _ in range(layers)])
        self.mixers = nn.ModuleList([OrderedMamba2(d_model, d_state=16, headdim=16, chunk_size=chunk_size,
                                                   layer_idx=i) for i in range(layers)])
        for m in self.mixers:
            m.decode_mode = "parity"
        self.norm_f = nn.RMSNorm(d_model)
        self.head = InvariantLinear(d_model, VOCAB, bias=False)

    def forward(self, ids, inference_params=None):
        h = self.embedding(ids)
        for norm, mixer in zip(self.norms, self.mixers):
            h = h + mixer(norm(h), inference_params=inference_params)
        return self.head(self.norm_f(h))


@torch.no_grad()
def sample(policy, prompt, n_new, seeds):
    """``len(seeds)`` completions of ``prompt`` [P]: (tokens [G, n_new], log-probabilities [G, n_new])."""
    G = len(seeds)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    params = SimpleNamespace(key_value_memory_dict={}, seqlen_offset=0)
    logits = policy(prompt[None].expand(G, -1), inference_params=params)[:, -1]
    params.seqlen_offset = prompt.numel()
    tokens, logps = [], []
    for step in range(n_new):
        tok, lp = sample_tokens(logits, gens)
        tokens.append(tok)
        logps.append(lp)
        if step + 1 < n_new:
            logits = policy(tok[:, None], inference_params=params)[:, 0]
            params.seqlen_offset += 1
    return torch.stack(tokens, 1), torch.stack(logps, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    policy = Policy()
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in (5, 9, 12, 17)[:args.prompts]]
    for update in range(args.updates):
        seqs, olds, advantages, rewards = [], [], [], []
        for i, prompt in enumerate(prompts):  # 1. sample a group per prompt
            seeds = [update * 10007 + i * 101 + k for k in range(args.group)]
            tokens, logps = sample(policy.eval(), prompt, args.new_tokens, seeds)
            reward = (tokens < 128).float().mean(1)  # 2. a toy reward, normalised in the group
            advantages.append((reward - reward.mean()) / (reward.std() + 1e-6))
            rewards.append(reward)
            for k in range(args.group):
                seqs.append((prompt, tokens[k]))
            olds.append(logps)
        old = torch.cat(olds)  # [prompts * group, new]
        width = max(p.numel() + t.numel() for p, t in seqs)  # 3. the training forward, right-padded
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, (p, t) in enumerate(seqs):
            ids[r, :p.numel() + t.numel()] = torch.cat([p, t])
        policy.train()
        logits = policy(ids)
        new = torch.stack([token_logprobs(logits[r, p.numel() - 1:p.numel() - 1 + t.numel()], t)
                           for r, (p, t) in enumerate(seqs)])
        ratio = torch.exp(new - old)
        exact = int((ratio.detach() == 1).sum())
        if update == 0 and exact != ratio.numel():
            print(f"update 0: the importance ratio is not 1 on {ratio.numel() - exact} of {ratio.numel()} tokens",
                  file=sys.stderr)
            return 1
        adv = torch.cat(advantages)[:, None]
        loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()  # 4. the clipped policy gradient
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"update {update}: mean reward {torch.cat(rewards).mean().item():.4f}, importance ratio exactly 1 on "
              f"{exact} of {ratio.numel()} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
