"""Conversions and calls the ordered mixer refuses, each with an error naming what is wrong (CPU)."""
import pytest
import torch

pytest.importorskip("transformers")

from ordered_ssd import convert_to_ordered  # noqa: E402
from ordered_ssd.hf import OrderedHFMamba2Mixer  # noqa: E402

from .models import build, cache_kw, ids, mixers  # noqa: E402


def test_a_mixer_dispatched_by_accelerate_is_refused_and_nothing_is_converted():
    from accelerate.hooks import ModelHook, add_hook_to_module

    model = build("bamba")
    add_hook_to_module(model.model.layers[0].mamba.in_proj, ModelHook())
    with pytest.raises(ValueError, match=r"BambaMixer\(layer_idx=0\)\.in_proj: expected a module without "
                                         r"accelerate hooks"):
        convert_to_ordered(model)
    assert not any(type(m) is OrderedHFMamba2Mixer for m in model.modules())


def test_a_mixer_without_a_time_step_limit_is_refused():
    model = build("falcon_h1")
    for _, m in mixers(model, "FalconH1Mixer"):
        m.time_step_limit = None  # FalconH1Config admits None; the original's scan cannot run with it either
    with pytest.raises(ValueError, match=r"time_step_limit: expected a \(min, max\) pair .*got None"):
        convert_to_ordered(model)
    assert mixers(model, "FalconH1Mixer") and not any(type(m) is OrderedHFMamba2Mixer for m in model.modules())


def test_a_short_packed_prefill_with_the_cache_runs_and_a_packed_continuation_is_refused():
    from transformers import DynamicCache

    model = convert_to_ordered(build("mamba2"))
    x = ids(1, 3)  # shorter than d_conv = 4: the cache pads its conv state
    seq_idx = torch.tensor([[0, 0, 1]], dtype=torch.int32)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        out = model.backbone(x, use_cache=True, seq_idx=seq_idx, **{cache_kw(model.backbone): cache}).last_hidden_state
        alone = model.backbone(x, use_cache=False, seq_idx=seq_idx).last_hidden_state
        assert torch.allclose(out, alone, atol=1e-6, rtol=1e-5)
        with pytest.raises(ValueError, match=r"seq_idx / cu_seq_lens_q: packed sequences continuing from "
                                             r"the cache are not supported"):
            model.backbone(ids(1, 2), use_cache=True, seq_idx=torch.zeros(1, 2, dtype=torch.int32),
                           **{cache_kw(model.backbone): cache})


def test_a_one_token_cached_step_in_training_mode_is_refused():
    from transformers import DynamicCache

    model = convert_to_ordered(build("mamba2"))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.backbone(ids(1, 6), use_cache=True, **{cache_kw(model.backbone): cache})
    model.train()
    with pytest.raises(NotImplementedError, match=r"one-token steps from the cache in training mode"):
        model.backbone(ids(1, 1), use_cache=True, **{cache_kw(model.backbone): cache})
    model.eval()
    with torch.no_grad():
        assert model.backbone(ids(1, 1), use_cache=True, **{cache_kw(model.backbone): cache}).last_hidden_state.shape == (1, 1, 32)


def test_a_gated_norm_computing_other_groups_than_its_attributes_say_is_refused(monkeypatch):
    """The norm's groups are read off the instance, then proven by running the norm on a probe: a norm class whose
    forward normalises over other groups (as 5.23's did against 5.22's) is refused, and nothing is converted."""
    model = build("mamba2", "g2_bias")
    (_, first), _ = mixers(model, "Mamba2Mixer")
    norm_cls = type(first.norm)

    def other_groups(self, hidden_states, gate=None):  # groups of 8 channels: neither the whole width nor 32
        h = hidden_states.float() * torch.nn.functional.silu(gate.float())
        g = h.view(*h.shape[:-1], -1, 8)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * g.view(h.shape).to(hidden_states.dtype)

    monkeypatch.setattr(norm_cls, "forward", other_groups)
    with pytest.raises(ValueError, match=rf"Mamba2Mixer\(layer_idx=0\)\.norm \({norm_cls.__name__}\): expected the "
                                         rf"gated RMSNorm over groups of \d+ channels \(gate, then norm\) that its "
                                         rf"attributes describe, got another function"):
        convert_to_ordered(model)
    assert not any(type(m) is OrderedHFMamba2Mixer for m in model.modules())
    monkeypatch.undo()
    assert len([m for m in convert_to_ordered(model).modules() if type(m) is OrderedHFMamba2Mixer]) == 2


def test_a_norm_class_the_mixer_does_not_know_is_refused():
    model = build("bamba")
    (_, mixer), = mixers(model, "BambaMixer")
    mixer.norm = type("MyGatedNorm", (torch.nn.Module,), {})()
    with pytest.raises(ValueError, match=r"BambaMixer\(layer_idx=0\)\.norm: expected one of the gated norms .* got "
                                         r"MyGatedNorm; this mixer cannot be converted"):
        convert_to_ordered(model)


def test_a_mixer_forward_with_another_signature_is_refused(monkeypatch):
    """A mixer class whose forward takes other parameters than 5.17-5.25's is refused by inspecting it (it may
    read them: running it as before could drop what they carry)."""
    model = build("zamba2")
    cls = type(mixers(model, "Zamba2MambaMixer")[0][1])

    def forward(self, hidden_states, cache=None, attention_mask=None, cache_position=None, **kwargs):
        raise AssertionError("not called")

    monkeypatch.setattr(cls, "forward", forward)
    with pytest.raises(TypeError, match=r"Zamba2MambaMixer\(layer_idx=0\)\.forward: expected the parameters "
                                        r"\('hidden_states', 'cache', 'attention_mask', '\*\*kwargs'\) .*got "
                                        r"\('hidden_states', 'cache', 'attention_mask', 'cache_position', "
                                        r"'\*\*kwargs'\); this transformers version's mixer is not supported"):
        convert_to_ordered(model)


@pytest.mark.parametrize("keyword", ["cache", "cache_params"])
def test_the_cache_reaches_the_mixer_under_either_keyword(keyword):
    """5.24 renamed the mixers' cache_params to cache (the decoder layers pass cache=): the ordered mixer takes the
    cache under both names, and refuses two different ones."""
    from transformers import DynamicCache

    model = convert_to_ordered(build("mamba2"))
    mixer = model.backbone.layers[0].mixer
    h = torch.randn(1, 5, 32)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        mixer(h, **{keyword: cache})
    from ordered_ssd.hf.mixer import _cache_states

    conv, rec, _ = _cache_states(cache, 0)
    assert conv is not None and rec is not None and rec.abs().sum() > 0
    with pytest.raises(ValueError, match=r"cache / cache_params: expected one cache"):
        mixer(h, cache=cache, cache_params=DynamicCache(config=model.config))
