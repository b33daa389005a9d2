"""Conversions and calls the ordered mixer refuses, each with an error naming what is wrong (CPU)."""
import pytest
import torch

pytest.importorskip("transformers")

from ordered_ssd import convert_to_ordered  # noqa: E402
from ordered_ssd.hf import OrderedHFMamba2Mixer  # noqa: E402

from .models import build, ids, mixers  # noqa: E402


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
        out = model.backbone(x, cache_params=cache, use_cache=True, seq_idx=seq_idx).last_hidden_state
        alone = model.backbone(x, use_cache=False, seq_idx=seq_idx).last_hidden_state
        assert torch.allclose(out, alone, atol=1e-6, rtol=1e-5)
        with pytest.raises(ValueError, match=r"seq_idx / cu_seq_lens_q: packed sequences continuing from "
                                             r"cache_params are not supported"):
            model.backbone(ids(1, 2), cache_params=cache, use_cache=True,
                           seq_idx=torch.zeros(1, 2, dtype=torch.int32))


def test_a_one_token_cached_step_in_training_mode_is_refused():
    from transformers import DynamicCache

    model = convert_to_ordered(build("mamba2"))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.backbone(ids(1, 6), cache_params=cache, use_cache=True)
    model.train()
    with pytest.raises(NotImplementedError, match=r"one-token step from cache_params in training mode"):
        model.backbone(ids(1, 1), cache_params=cache, use_cache=True)
    model.eval()
    with torch.no_grad():
        assert model.backbone(ids(1, 1), cache_params=cache, use_cache=True).last_hidden_state.shape == (1, 1, 32)
