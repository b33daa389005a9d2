"""``benchmarks/invariance.py``: the layouts hold every sequence's tokens exactly once, the canonical run repeats
with 0 differing tokens, and the counts add up (CPU, the reference path)."""
import json
import os
import random
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import invariance  # noqa: E402

SMALL = ["--device", "cpu", "--seqs", "9", "--min-len", "5", "--max-len", "70", "--pack-len", "150",
         "--d-model", "32", "--d-state", "8", "--headdim", "16", "--chunk-size", "16", "--max-batch", "4"]


class _Echo(torch.nn.Module):
    """A "model" whose per-token losses are the token ids (to check the layouts' bookkeeping exactly)."""

    def forward(self, tokens, seq_idx=None):
        return torch.nn.functional.one_hot(tokens, invariance.VOCAB).float() * 50.0


def test_every_layout_returns_each_sequences_own_positions():
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 256, (n,), generator=g) for n in (5, 40, 17, 70, 3, 33)]
    model = _Echo()
    want = invariance.canonical(model, seqs)
    assert [w.numel() for w in want] == [s.numel() - 1 for s in seqs]
    for got in (invariance.batched(model, seqs, random.Random(1), 4),
                invariance.packed(model, seqs, random.Random(2), 60)):
        assert [g_.numel() for g_ in got] == [w.numel() for w in want]
        # each position's "loss" depends only on its own and the next token: equal bits iff the right positions
        assert all(torch.equal(g_, w) for g_, w in zip(got, want))


def test_a_cpu_run_reports_every_layout_and_the_canonical_run_repeats(tmp_path, capsys):
    out = tmp_path / "inv.json"
    assert invariance.main(SMALL + ["--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r["mixers"]) == {"ordered", "plain"} and r["invariant_head"] == {"ordered": True, "plain": False}
    for kind, rows in r["mixers"].items():
        assert set(rows) == {"canonical again", "batched", "packed"}
        tokens = rows["canonical again"]["tokens"]
        assert tokens > 0 and all(v["tokens"] == tokens and v["sequences"] == 9 for v in rows.values())
        assert rows["canonical again"]["tokens_differing"] == 0 and rows["canonical again"]["sequences_differing"] == 0
        for v in rows.values():
            assert 0 <= v["tokens_differing"] <= tokens and v["token_fraction"] == v["tokens_differing"] / tokens
    # the reference path with the invariant head: every sequence has its canonical bits in every layout; the
    # vectorised control does not (packing moves its chunk grid)
    assert all(v["tokens_differing"] == 0 for v in r["mixers"]["ordered"].values())
    assert r["mixers"]["plain"]["packed"]["tokens_differing"] > 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 6 and printed[0].strip().startswith("ordered  canonical again:       0 of")
