"""A converted ``Mamba2ForCausalLM`` (``convert_to_ordered(model, invariant_linears=True)``) gives each sequence its
canonical per-token losses whether it is trained alone, in a right-padded batch (``attention_mask``) or packed by
``DataCollatorWithFlattening(return_seq_idx=True)``, and the mixers' parameter gradients are the same bits padded
and packed for the same sequences in the same order (the CPU reference path; docs/guarantees.md)."""
import random

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from ordered_ssd import InvariantLinear, convert_to_ordered  # noqa: E402
from tests.helpers import bits_equal  # noqa: E402
from tests.hf.models import CASE_IDS, CASES, VOCAB, build, mixer_param_names, ordered_mixers  # noqa: E402

transformers.logging.set_verbosity_error()


def _model(variant="g2_bias"):
    model = build("mamba2", variant, seed=3)
    head_weight = model.lm_head.weight
    model = convert_to_ordered(model, invariant_linears=True).train()
    assert type(model.lm_head) is InvariantLinear and model.lm_head.weight is head_weight
    return model


def _token_losses(model, input_ids, **kw):
    """Per-position next-token losses [B, L - 1] (fp32), through the backbone and the head (every supported version
    passes ``seq_idx`` to the backbone's mixers)."""
    h = model.backbone(input_ids, use_cache=False, **kw).last_hidden_state
    logits = model.lm_head(h)
    B, L, V = logits.shape  # one row of the vocabulary per position, as transformers' loss (log_softmax over the
    # last, contiguous dimension: the same computation for every row)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1), reduction="none").view(B, -1)


def _sequences(n, seed):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (rng.randint(2, 45),), generator=g) for _ in range(n)]


def _padded(seqs, extra=3):
    width = max(s.numel() for s in seqs) + extra
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, :s.numel()], mask[r, :s.numel()] = s, 1
    return ids, mask


def _packed(seqs):
    collator = transformers.DataCollatorWithFlattening(return_seq_idx=True, return_tensors="pt")
    batch = collator([{"input_ids": s.tolist()} for s in seqs])
    return batch["input_ids"], batch["seq_idx"].to(torch.int32)


def test_per_token_losses_are_canonical_padded_and_packed():
    model = _model()
    seqs = _sequences(14, 1)
    with torch.no_grad():
        want = [_token_losses(model, s[None])[0] for s in seqs]
        for members in ([0], [3, 1, 2], list(range(14)), [13, 5, 9, 0, 11]):
            ids, mask = _padded([seqs[m] for m in members], extra=members[0] % 5)
            got = _token_losses(model, ids, attention_mask=mask)
            for r, m in enumerate(members):
                assert bits_equal(got[r, :seqs[m].numel() - 1], want[m]), ("padded", members, m)
            ids, seq_idx = _packed([seqs[m] for m in members])
            got = _token_losses(model, ids, seq_idx=seq_idx)[0]
            start = 0
            for m in members:
                n = seqs[m].numel()
                assert bits_equal(got[start:start + n - 1], want[m]), ("packed", members, m)
                start += n


def _mixer_grads(model, losses_of_sequences):
    model.zero_grad(set_to_none=True)
    torch.stack([l.sum() for l in losses_of_sequences]).sum().backward()
    names = mixer_param_names(model, "OrderedHFMamba2Mixer")
    params = dict(model.named_parameters())
    return {n: params[n].grad.clone() for n in names}


def test_mixer_gradients_are_the_same_padded_and_packed():
    model = _model()
    seqs = _sequences(9, 2)
    ids, mask = _padded(seqs)
    losses = _token_losses(model, ids, attention_mask=mask)
    padded = _mixer_grads(model, [losses[r, :s.numel() - 1] for r, s in enumerate(seqs)])
    ids, seq_idx = _packed(seqs)
    losses = _token_losses(model, ids, seq_idx=seq_idx)[0]
    bounds = torch.tensor([0] + [s.numel() for s in seqs]).cumsum(0).tolist()
    packed = _mixer_grads(model, [losses[a:b - 1] for a, b in zip(bounds[:-1], bounds[1:])])
    assert padded and sorted(padded) == sorted(packed)
    for n in padded:
        assert bits_equal(padded[n], packed[n]), n
    assert any(float(g.abs().max()) > 0 for g in padded.values())


def test_a_compiled_mixer_gives_the_eager_bits_and_a_dropout_is_refused_there():
    model = _model()
    mixer = model.backbone.layers[0].mixer
    u = torch.randn(2, 37, 32, generator=torch.Generator().manual_seed(4))
    dout = torch.randn(2, 37, 32, generator=torch.Generator().manual_seed(5))
    seq_idx = torch.tensor([[0] * 20 + [1] * 17, [0] * 37], dtype=torch.int32)

    def step(fn):
        mixer.zero_grad(set_to_none=True)
        x = u.clone().requires_grad_(True)
        fn(x, seq_idx=seq_idx).backward(dout)
        return [x.grad] + [p.grad.clone() for p in mixer.parameters()]

    eager = step(mixer)
    torch._dynamo.reset()
    compiled = step(torch.compile(mixer, fullgraph=True, backend="aot_eager"))
    assert len(eager) == len(compiled) > 5
    assert all(bits_equal(a, b) for a, b in zip(eager, compiled))
    mixer.lora_like_dropout = torch.nn.Dropout(0.1)  # where PEFT keeps a LoRA dropout: a submodule of the mixer
    torch._dynamo.reset()
    with pytest.raises(Exception, match="dropout inside the mixer"):
        step(torch.compile(mixer, fullgraph=True, backend="aot_eager"))


@pytest.mark.parametrize("family,variant", CASES, ids=CASE_IDS)
def test_every_familys_mixer_gives_each_sequence_its_own_bits(family, variant):
    """The mixer alone (every family and variant: grouped norms, FalconH1's multipliers and norm options, biases):
    each sequence's output and input gradient alone, right-padded with a mask, and packed by seq_idx; the mixer's
    parameter gradients the same padded and packed."""
    model = convert_to_ordered(build(family, variant, seed=5)).train()
    mixer = ordered_mixers(model)[0][1]
    d = mixer.in_proj.weight.shape[1]
    g = torch.Generator().manual_seed(6)
    lengths = [5, 23, 1, 17]
    seqs = [torch.randn(n, d, generator=g) for n in lengths]
    douts = [torch.randn(n, d, generator=g) for n in lengths]

    def run(u, dout, **kw):
        mixer.zero_grad(set_to_none=True)
        u = u.clone().requires_grad_(True)
        mixer(u, **kw).backward(dout)
        return u.grad, {n: p.grad.clone() for n, p in mixer.named_parameters() if p.grad is not None}

    with torch.no_grad():
        alone = [mixer(s[None])[0] for s in seqs]
    dalone = [run(s[None], dd[None])[0][0] for s, dd in zip(seqs, douts)]
    width = max(lengths) + 3
    u = torch.randn(len(seqs), width, d, generator=g)
    dout = torch.zeros_like(u)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for r, (s, dd) in enumerate(zip(seqs, douts)):
        u[r, :s.shape[0]], dout[r, :s.shape[0]], mask[r, :s.shape[0]] = s, dd, 1
    with torch.no_grad():
        out = mixer(u, attention_mask=mask)
    du, padded = run(u, dout, attention_mask=mask)
    for r, n in enumerate(lengths):
        assert bits_equal(out[r, :n], alone[r]) and bits_equal(du[r, :n], dalone[r]), ("padded", r)
    packed_u, packed_d = torch.cat(seqs)[None], torch.cat(douts)[None]
    seq_idx = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor(lengths))[None]
    with torch.no_grad():
        out = mixer(packed_u, seq_idx=seq_idx)[0]
    du, packed = run(packed_u, packed_d, seq_idx=seq_idx)
    start = 0
    for r, n in enumerate(lengths):
        assert bits_equal(out[start:start + n], alone[r]) and bits_equal(du[0, start:start + n], dalone[r]), r
        start += n
    assert sorted(padded) == sorted(packed) and len(padded) >= 7
    for name in padded:
        assert bits_equal(padded[name], packed[name]), name


def _left_padded(seqs, extra=2):
    """Rows padded on the left (and, every other row, one position on the right too); returns ids, mask, starts."""
    width = max(s.numel() for s in seqs) + extra
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    starts = []
    for r, s in enumerate(seqs):
        start = width - s.numel() - (r % 2)
        ids[r, start:start + s.numel()], mask[r, start:start + s.numel()] = s, 1
        starts.append(start)
    return ids, mask, starts


def test_left_padded_rows_get_their_canonical_per_token_losses():
    """A left-padded row (the layout of batched generation prompts) is computed from its first real token where
    ``in_proj`` has no bias: each run of the mask is its own sequence (a mask with holes keeps the masked path; with
    a bias the original's padded positions feed it into the first real tokens, and so does the converted mixer)."""
    from ordered_ssd.hf.mixer import _mask_runs

    seqs = _sequences(7, 4)
    ids, mask, starts = _left_padded(seqs)
    for variant, canonical in (("base", True), ("g2_bias", False)):
        model = _model(variant)
        with torch.no_grad():
            want = [_token_losses(model, s[None])[0] for s in seqs]
            got = _token_losses(model, ids, attention_mask=mask)
        same = [bits_equal(got[r, start:start + s.numel() - 1], want[r]) for r, (s, start) in
                enumerate(zip(seqs, starts))]
        assert same == [canonical] * len(seqs), (variant, same)
    assert _mask_runs(torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]]), None).tolist() == [[0, 1, 1, 2], [0, 0, 0, 0]]
    assert _mask_runs(torch.tensor([[1, 0, 1, 1]]), None) is None  # a hole: not one sequence
    packed = torch.tensor([[0, 0, 1, 1]], dtype=torch.int32)
    assert _mask_runs(torch.tensor([[0, 1, 1, 1]]), packed).tolist() == [[0, 1, 2, 2]]
