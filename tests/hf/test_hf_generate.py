"""Greedy decoding with the converted model (the mixer's one-token step from the model's cache): the original's
tokens, and bitwise-equal tokens and scores when generating twice."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from ordered_ssd import convert_to_ordered  # noqa: E402
from tests.helpers import bits_equal  # noqa: E402
from tests.hf.models import FAMILIES, build, cache_kw, clone, ids, ordered_mixers  # noqa: E402

transformers.logging.set_verbosity_error()

NEW = 8
PROMPT = 10


def _generate(model, x, mask, **kw):
    with torch.no_grad():
        return model.generate(x, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                              pad_token_id=_pad_id(model), **kw)


def _version():
    return tuple(int(v) for v in transformers.__version__.split(".")[:2])


def _pad_id(model):
    return model.config.pad_token_id if model.config.pad_token_id is not None else 0


def _greedy_no_cache(model, x):
    """Greedy decoding by a full forward of the whole sequence per token (no cache), for one or more rows."""
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(x, use_cache=False).logits[:, -1]
            x = torch.cat([x, logits.argmax(-1, keepdim=True)], 1)
    return x


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generate_gives_the_originals_tokens(family):
    orig = build(family)
    conv = convert_to_ordered(clone(orig))
    x = ids(2, PROMPT)
    mask = torch.ones_like(x)
    steps = []
    for _, m in ordered_mixers(conv):
        m.register_forward_pre_hook(lambda mod, args, kw: steps.append(
            (args[0] if args else kw["hidden_states"]).shape[1]), with_kwargs=True)
    out = _generate(conv, x, mask)
    n_mixers = len(ordered_mixers(conv))
    assert out.shape == (2, PROMPT + NEW)
    assert steps.count(PROMPT) == n_mixers and steps.count(1) == (NEW - 1) * n_mixers  # prefill, then decode steps
    if family != "falcon_h1" or _version() >= (5, 23):
        assert torch.equal(out, _generate(orig, x, mask))
    else:
        # transformers 5.17-5.22's own FalconH1 cached decoding is wrong for batch > 1 (FalconH1RMSNormGated squeezes
        # the sequence dimension of a one-token step and the batched gate broadcasts to [B, B, d]; fixed in 5.23):
        # compare batch 1 with its generate, and batch 2 with the original's greedy loop without a cache
        for row in range(2):
            assert torch.equal(_generate(conv, x[row:row + 1], mask[row:row + 1]),
                               _generate(orig, x[row:row + 1], mask[row:row + 1]))
        assert torch.equal(out, _greedy_no_cache(orig, x))
    assert torch.equal(out, _greedy_no_cache(conv, x))  # the cached steps are the full forward's tokens


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "falcon_h1"])
def test_greedy_generate_from_left_padded_prompts_gives_the_originals_tokens(family):
    orig = build(family)
    conv = convert_to_ordered(clone(orig))
    x = ids(2, PROMPT, seed=5)
    mask = torch.ones_like(x)
    x[1, :3] = _pad_id(orig)
    mask[1, :3] = 0
    assert torch.equal(_generate(conv, x, mask), _generate(orig, x, mask))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generating_twice_gives_bitwise_equal_tokens_and_scores(family):
    model = convert_to_ordered(build(family, "no_norm" if family == "falcon_h1" else "g2_bias"))
    x = ids(2, PROMPT, seed=4)
    mask = torch.ones_like(x)
    runs = [_generate(model, x, mask, output_scores=True, return_dict_in_generate=True) for _ in range(2)]
    a, b = runs
    assert torch.equal(a.sequences, b.sequences)
    assert len(a.scores) == len(b.scores) == NEW
    for sa, sb in zip(a.scores, b.scores):
        assert bits_equal(sa, sb)
    # the scores are the logits of the tokens chosen
    assert torch.equal(torch.stack([s.argmax(-1) for s in a.scores], 1), a.sequences[:, PROMPT:])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_multi_token_forward_continuing_from_the_cache_gives_the_full_forwards_logits(family):
    """Chunked prefill: the mixer starts its conv and scan from the cache's states (several tokens, not a decode
    step). position_ids are passed: transformers 5.17's BambaModel counts them from 0 without a cache offset."""
    from tests.helpers import rel_err

    orig = build(family, "no_norm" if family == "falcon_h1" else "g2_bias")
    conv = convert_to_ordered(clone(orig))
    x = ids(2, 37)
    cut = 20
    results = []
    for model in (orig, conv):
        with torch.no_grad():
            full = model(x).logits
            first = model(x[:, :cut], use_cache=True)
            if family == "mamba2":
                kw = {cache_kw(model): getattr(first, cache_kw(model))}
            else:
                kw = {"past_key_values": first.past_key_values,
                      "position_ids": torch.arange(cut, x.shape[1]).expand(2, -1)}
            second = model(x[:, cut:], use_cache=True, **kw).logits
        results.append(torch.cat([first.logits, second], 1))
        assert rel_err(results[-1], full) < 1e-5
    assert rel_err(results[1], results[0]) < 1e-5


def _layer_states(cache, layer_idx):
    """The conv and recurrent states the cache holds for a Mamba layer, through the installed version's API."""
    from ordered_ssd.hf.mixer import _cache_states

    conv, rec, _ = _cache_states(cache, layer_idx)
    return conv, rec


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_prefill_through_the_models_own_cache_writes_every_mixers_states(family):
    """No silent cache loss: a prefill through the model (its own cache object, passed to the mixers under the
    installed version's keyword) writes each ordered mixer's conv and recurrent states, equal to the original's."""
    orig = build(family, "no_norm" if family == "falcon_h1" else "g2_bias")
    conv = convert_to_ordered(clone(orig))
    x = ids(2, PROMPT)
    caches = []
    for model in (orig, conv):
        with torch.no_grad():
            out = model(x, use_cache=True)
        caches.append(getattr(out, cache_kw(model)) if family == "mamba2" else out.past_key_values)
    layers = [m.layer_idx for _, m in ordered_mixers(conv)]
    assert layers
    for idx in layers:
        (c0, r0), (c1, r1) = _layer_states(caches[0], idx), _layer_states(caches[1], idx)
        assert c1 is not None and r1 is not None, f"layer {idx}: the prefill wrote no state"
        assert c1.abs().sum() > 0 and r1.abs().sum() > 0
        assert c1.shape == c0.shape and r1.shape == r0.shape
        assert torch.allclose(c1, c0, rtol=1e-5, atol=1e-6)
        assert torch.allclose(r1, r0, rtol=1e-4, atol=1e-5)
    assert _seq_length(caches[1]) == _seq_length(caches[0])


def _seq_length(cache):
    """The cache's token count, or the error the installed version raises for it (before 5.25 a cache of linear
    attention layers alone has no length)."""
    try:
        return int(cache.get_seq_length())
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_cache_after_generate_counts_what_the_originals_counts(family):
    """transformers 5.25's cache counts the tokens of in-place decoding steps (cache.increase_count): the converted
    model's cache after generate holds the original's length and states."""
    orig = build(family)
    conv = convert_to_ordered(clone(orig))
    x = ids(1, PROMPT, seed=6)
    mask = torch.ones_like(x)
    outs = [_generate(m, x, mask, return_dict_in_generate=True) for m in (orig, conv)]
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    c0, c1 = (next(getattr(o, k) for k in ("cache", "past_key_values", "cache_params") if getattr(o, k, None)
                   is not None) for o in outs)
    assert _seq_length(c1) == _seq_length(c0)
    if _version() >= (5, 25):
        assert _seq_length(c1) == PROMPT + NEW - 1  # the last token is sampled, never fed back
    for _, m in ordered_mixers(conv):
        (s0, r0), (s1, r1) = _layer_states(c0, m.layer_idx), _layer_states(c1, m.layer_idx)
        assert torch.allclose(s1, s0, rtol=1e-5, atol=1e-6) and torch.allclose(r1, r0, rtol=1e-4, atol=1e-5)


def _assisted_supported(model) -> bool:
    """Whether the installed transformers runs assisted (prompt-lookup) decoding for this stateful model (5.25
    does; before it, generate refuses it for stateful models)."""
    x = ids(1, 6)
    try:
        with torch.no_grad():
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=2, do_sample=False,
                           pad_token_id=_pad_id(model), prompt_lookup_num_tokens=2)
    except ValueError as e:
        assert "assisted generation is not supported with stateful models" in str(e)
        return False
    return True


@pytest.mark.parametrize("family", list(FAMILIES))
def test_assisted_decoding_gives_the_originals_tokens_or_the_originals_refusal(family):
    """Prompt-lookup decoding verifies several draft tokens in one forward from the cache, which records the
    recurrent state of each of them (5.25's get_recurrent_states_to_keep) and is cropped back: the converted model
    gives its plain greedy tokens and the original's, or, where the original refuses it, the same refusal."""
    orig = build(family, "no_norm" if family == "falcon_h1" else "g2_bias")
    conv = convert_to_ordered(clone(orig))
    supported = _assisted_supported(orig)
    assert _assisted_supported(conv) == supported
    if not supported:
        return
    p = ids(1, 6, seed=7)
    x = torch.cat([p, p, p[:, :3]], 1)  # repeats, so that the prompt lookup finds drafts
    mask = torch.ones_like(x)
    plain = _generate(conv, x, mask)
    got = _generate(conv, x, mask, prompt_lookup_num_tokens=3)
    assert torch.equal(got, plain)
    assert torch.equal(got, _generate(orig, x, mask, prompt_lookup_num_tokens=3))


def _record_and_crop(model, family):
    """Prefill 8 tokens, record past states (as assisted decoding does), verify 3 tokens in one forward, crop 2 of
    them, then one recorded one-token step cropped back: the states after each crop, or the installed version's
    error where its cache cannot do this."""
    from transformers import DynamicCache

    x = ids(2, 12, seed=8)
    cache = DynamicCache(config=model.config)
    key = cache_kw(model)
    seen = []
    try:
        with torch.no_grad():
            model(x[:, :8], use_cache=True, **{key: cache})
            try:
                cache.activate_past_recording(recurrent_states_to_keep=3)
            except TypeError:  # before 5.25 it records no recurrent states
                cache.activate_past_recording()
            extra = {} if family == "mamba2" else {"position_ids": torch.arange(8, 11).expand(2, -1)}
            model(x[:, 8:11], use_cache=True, **{key: cache}, **extra)
            cache.crop(-2)
            seen.append([_layer_states(cache, i) for i in _mamba_layers(model)])
            extra = {} if family == "mamba2" else {"position_ids": torch.tensor([[9], [9]])}
            model(x[:, 9:10], use_cache=True, **{key: cache}, **extra)
            cache.crop(-1)
            seen.append([_layer_states(cache, i) for i in _mamba_layers(model)])
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        seen.append(f"{type(e).__name__}: {e}")
    return seen


def _mamba_layers(model):
    return [m.layer_idx for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "layer_idx")]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_recorded_steps_crop_back_to_the_originals_states(family):
    """While the cache records past states (assisted decoding), each step's recurrent state is handed to the cache,
    so that cropping rolls the layer back: after a 3-token verification cropped by 2, and a one-token step cropped
    by 1, the converted model's cache holds the original's states (or raises the original's error)."""
    orig = build(family, "no_norm" if family == "falcon_h1" else "g2_bias")
    conv = convert_to_ordered(clone(orig))
    a, b = _record_and_crop(orig, family), _record_and_crop(conv, family)
    assert len(a) == len(b)
    for sa, sb in zip(a, b):
        if isinstance(sa, str):
            assert sb == sa
            continue
        for (c0, r0), (c1, r1) in zip(sa, sb):
            assert torch.allclose(c1, c0, rtol=1e-5, atol=1e-6) and torch.allclose(r1, r0, rtol=1e-4, atol=1e-5)
