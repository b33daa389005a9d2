"""The converted model computes what the original computes (CPU, fp32): logits and every mixer's output in eval
mode, loss and gradients in train mode, padded batches, packed (padding-free) batches, gradient checkpointing."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from ordered_ssd import convert_to_ordered  # noqa: E402
from tests.helpers import bits_equal, rel_err  # noqa: E402
from tests.hf.models import (CASE_IDS, CASES, FAMILIES, build, clone, grads, ids, mixer_param_names,  # noqa: E402
                             mixers, ordered_mixers)

transformers.logging.set_verbosity_error()

TOL = 1e-5  # max |a - b| / max |b| in fp32 (measured: <= 1e-6)


def _capture(named_mixers):
    """Record the output of each mixer, by name, on every call."""
    outs = {}
    handles = [m.register_forward_hook(lambda mod, args, out, n=n: outs.setdefault(n, []).append(out.detach()))
               for n, m in named_mixers]
    return outs, handles


@pytest.mark.parametrize("family,variant", CASES, ids=CASE_IDS)
def test_eval_logits_and_every_mixer_output_match_the_original(family, variant):
    orig = build(family, variant)
    conv = convert_to_ordered(clone(orig))
    x = ids()
    ref_outs, h1 = _capture(mixers(orig, FAMILIES[family][1]))
    outs, h2 = _capture(ordered_mixers(conv))
    with torch.no_grad():
        ref = orig(x).logits
        out = conv(x).logits
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert rel_err(out, ref) < TOL
    assert list(outs) == list(ref_outs) and len(outs) >= 1
    for name in ref_outs:
        (o,), (r,) = outs[name], ref_outs[name]
        assert r.abs().max() > 0
        assert rel_err(o, r) < TOL, name
    # the comparison can fail: a mixer with another D gives other outputs
    m = ordered_mixers(conv)[0][1]
    with torch.no_grad():
        m.D.add_(0.5)
        assert rel_err(conv(x).logits, ref) > 100 * TOL


@pytest.mark.parametrize("family", list(FAMILIES))
def test_train_mode_loss_and_gradients_match_the_original(family):
    variant = "no_norm" if family == "falcon_h1" else "g2_bias"
    orig = build(family, variant).train()
    conv = convert_to_ordered(clone(orig))
    names = mixer_param_names(orig, FAMILIES[family][1])
    x = ids()
    ref_loss = orig(x, labels=x).loss
    ref_loss.backward()
    loss = conv(x, labels=x).loss
    loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= TOL * abs(ref_loss.item())
    ref_g, g = grads(orig, names), grads(conv, names)
    for n in names:
        assert ref_g[n].abs().max() > 0, n
        assert rel_err(g[n], ref_g[n]) < 1e-4, n


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_fp64_model_runs_the_reference_in_fp64(family):
    orig = build(family, dtype=torch.float64)
    conv = convert_to_ordered(clone(orig))
    x = ids()
    outs, _ = _capture(ordered_mixers(conv))
    with torch.no_grad():
        ref, out = orig(x).logits, conv(x).logits
    assert all(o.dtype == torch.float64 for v in outs.values() for o in v)
    assert rel_err(out, ref) < TOL  # (the original's torch scan computes in fp32)


# ------------------------------------------------------------------------------------------- padded batches
PAD = 9  # left padding of the second row


@pytest.mark.parametrize("family,variant", CASES, ids=CASE_IDS)
def test_a_left_padded_batch_gives_the_originals_logits_and_the_unpadded_ones(family, variant):
    orig = build(family, variant)
    conv = convert_to_ordered(clone(orig))
    x = ids()
    pad_id = orig.config.pad_token_id if orig.config.pad_token_id is not None else 0
    padded = x.clone()
    padded[1, :PAD] = pad_id
    mask = torch.ones_like(x)
    mask[1, :PAD] = 0
    with torch.no_grad():
        ref = orig(padded, attention_mask=mask).logits
        out = conv(padded, attention_mask=mask).logits
        alone = conv(x[1:, PAD:]).logits[0]
        no_mask = conv(padded).logits
    assert torch.isfinite(out).all()
    assert rel_err(out[0], ref[0]) < TOL and rel_err(out[1, PAD:], ref[1, PAD:]) < TOL
    assert rel_err(no_mask[1, PAD:], out[1, PAD:]) > 100 * TOL  # the mask matters
    in_proj_bias = ordered_mixers(conv)[0][1].in_proj.bias is not None
    if not in_proj_bias:
        assert rel_err(out[1, PAD:], alone) < TOL
    else:
        # transformers' mixers zero padded hidden states before in_proj, so its bias enters the conv window of the
        # first real tokens: the padded row is not the unpadded sequence (in the original as well)
        with torch.no_grad():
            ref_alone = orig(x[1:, PAD:]).logits[0]
        assert rel_err(out[1, PAD:], alone) > 100 * TOL and rel_err(ref[1, PAD:], ref_alone) > 100 * TOL


# ------------------------------------------------------------------------------------------- packed batches
LA, LB = 23, 14  # two sequences packed along L (LA + LB = 37)


def _packed():
    a, b = ids(1, LA, seed=2), ids(1, LB, seed=3)
    seq_idx = torch.cat([torch.zeros(LA, dtype=torch.int32), torch.ones(LB, dtype=torch.int32)])[None]
    cu = torch.tensor([0, LA, LA + LB], dtype=torch.int32)
    pos = torch.cat([torch.arange(LA), torch.arange(LB)])[None]
    block = torch.zeros(LA + LB, LA + LB, dtype=torch.bool)
    block[:LA, :LA] = True
    block[LA:, LA:] = True
    block &= torch.ones_like(block).tril()  # causal within each sequence
    return a, b, torch.cat([a, b], 1), seq_idx, cu, pos, block[None, None]


@pytest.mark.parametrize("variant", ["base", "g2_bias"])
@pytest.mark.parametrize("packing", ["seq_idx", "cu_seq_lens_q"])
def test_packed_sequences_give_each_sequences_logits_mamba2(packing, variant):
    model = convert_to_ordered(build("mamba2", variant))
    a, b, packed, seq_idx, cu, _, _ = _packed()
    kw = {"seq_idx": seq_idx} if packing == "seq_idx" else {"cu_seq_lens_q": cu}
    with torch.no_grad():
        alone = torch.cat([model(a).logits, model(b).logits], 1)
        # Mamba2ForCausalLM.forward passes extra kwargs to its backbone from 5.25 on; before, call the backbone
        for use_cache in (False, True):
            h = model.backbone(packed, use_cache=use_cache, **kw).last_hidden_state
            assert rel_err(model.lm_head(h), alone) < TOL
        whole = model(packed, use_cache=False, **kw).logits
        if tuple(int(v) for v in transformers.__version__.split(".")[:2]) >= (5, 25):
            assert rel_err(whole, alone) < TOL
        else:  # the kwargs never reach the mixers: the packed row is one sequence
            assert rel_err(whole[:, LA:], alone[:, LA:]) > 100 * TOL
        h = model.backbone(packed, use_cache=False).last_hidden_state
    assert rel_err(model.lm_head(h)[:, LA:], alone[:, LA:]) > 100 * TOL  # without the boundary: the second differs
    assert rel_err(model.lm_head(h)[:, :LA], alone[:, :LA]) < TOL


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "mamba2"])
def test_packed_sequences_in_hybrids(family):
    """The Mamba layers keep the sequences apart with seq_idx / cu_seq_lens_q; the attention layers (sdpa) of
    transformers 5.17 do not infer the boundaries from position_ids, so the whole model gives each sequence's
    logits only with a block-diagonal 4-d attention mask as well."""
    model = convert_to_ordered(build(family))
    a, b, packed, seq_idx, cu, pos, block = _packed()
    first_name, first = ordered_mixers(model)[0]
    outs, _ = _capture([(first_name, first)])
    with torch.no_grad():
        la, lb = model(a).logits, model(b).logits
        alone = torch.cat([la, lb], 1)
        first_alone = torch.cat(outs.pop(first_name), 1)
        for kw in ({"seq_idx": seq_idx}, {"cu_seq_lens_q": cu}):
            full = model(packed, position_ids=pos, **kw).logits
            # the first layer's mixer (its input is the embedding): each sequence's output
            assert rel_err(outs.pop(first_name)[0], first_alone) < TOL
            assert rel_err(full[:, :LA], la) < TOL  # the first sequence sees nothing of the second anyway
            assert rel_err(full[:, LA:], lb) > 100 * TOL  # the attention layers see across the boundary
            blocked = model(packed, position_ids=pos, attention_mask=block, **kw).logits
            outs.clear()
            assert rel_err(blocked, alone) < TOL
        without = model(packed, position_ids=pos, attention_mask=block).logits
        assert rel_err(outs.pop(first_name)[0][:, LA:], first_alone[:, LA:]) > 100 * TOL
        assert rel_err(without[:, LA:], lb) > 100 * TOL


def test_bad_packed_inputs_are_refused_by_name():
    model = convert_to_ordered(build("mamba2"))
    x = ids(2, 12)
    with pytest.raises(ValueError, match=r"seq_idx: expected shape \(B, L\) = \(2, 12\), got \(2, 11\)"):
        model.backbone(x, use_cache=False, seq_idx=torch.zeros(2, 11, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seq_lens_q: expected a padding-free batch \(B == 1"):
        model.backbone(x, use_cache=False, cu_seq_lens_q=torch.tensor([0, 12], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seq_lens_q: expected a 1-d integer tensor"):
        model.backbone(x[:1], use_cache=False, cu_seq_lens_q=torch.tensor([0.0, 12.0]))


# ------------------------------------------------------------------------------------------- checkpointing
def _train_step(model, x):
    model.zero_grad(set_to_none=True)
    loss = model(x, labels=x).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradient_checkpointing_gives_the_same_loss_and_gradients_bitwise(family):
    model = convert_to_ordered(build(family)).train()
    x = ids()
    loss, g = _train_step(model, x)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_gradient_checkpointing
    loss_ck, g_ck = _train_step(model, x)
    assert bits_equal(loss_ck, loss)
    assert list(g_ck) == list(g) and len(g) == len(list(model.parameters()))
    for n in g:
        assert bits_equal(g_ck[n], g[n]), n
