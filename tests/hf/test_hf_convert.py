"""convert_to_ordered / convert_to_hf on tiny transformers models of every family (CPU): what is replaced, what is
kept (parameter objects, state_dict bits, optimizer), what is refused (never a partial conversion), and the round
trips through save_pretrained / from_pretrained / load_state_dict / convert_to_hf."""
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")

from ordered_ssd import convert_to_hf, convert_to_ordered  # noqa: E402
from ordered_ssd.hf import OrderedHFMamba2Mixer  # noqa: E402
from tests.helpers import bits_equal  # noqa: E402
from tests.hf.models import (CASE_IDS, CASES, FAMILIES, build, clone, ids, mixers,  # noqa: E402
                             ordered_mixers)

transformers.logging.set_verbosity_error()


def _sd_copy(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_sd_bits(sd, ref):
    assert list(sd) == list(ref)
    for k in ref:
        assert bits_equal(sd[k], ref[k]), k


@pytest.mark.parametrize("family,variant", CASES, ids=CASE_IDS)
def test_every_mixer_is_replaced_and_the_parameters_are_the_same_objects(family, variant):
    model = build(family, variant)
    cls_name = FAMILIES[family][1]
    before = mixers(model, cls_name)
    assert len(before) >= 1
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    sd = _sd_copy(model)
    rng = torch.get_rng_state()
    assert convert_to_ordered(model) is model
    assert torch.equal(torch.get_rng_state(), rng), "conversion drew random numbers"
    after = ordered_mixers(model)
    assert [n for n, _ in after] == [n for n, _ in before]  # every mixer, under the same name
    assert mixers(model, cls_name) == []
    for (_, old), (_, new) in zip(before, after):
        assert new.layer_idx == old.layer_idx and new.training == old.training
        assert new.in_proj is old.in_proj and new.conv1d is old.conv1d and new.norm is old.norm
    new_params = dict(model.named_parameters())
    assert list(new_params) == list(params)
    for name, p in params.items():
        assert new_params[name] is p, name
    new_buffers = dict(model.named_buffers())
    assert list(new_buffers) == list(buffers)
    for name, b in buffers.items():
        assert new_buffers[name] is b, name
    _assert_sd_bits(model.state_dict(), sd)
    if family == "falcon_h1":  # the mup_vector buffer is carried over and used
        assert all(m._ordered_spec.has_mup_vector for _, m in after)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_optimizer_built_before_the_conversion_steps_the_same_parameters(family):
    model = build(family).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    convert_to_ordered(model)
    x = ids()
    model(x, labels=x).loss.backward()
    before = {n: (p, p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters() if p.grad is not None}
    before_w = {id(p): old for p, old, _ in before.values()}
    mixer_params = {id(p) for _, m in ordered_mixers(model) for p in m.parameters()}
    assert sum(id(p) in mixer_params for p, _, _ in before.values()) == len(mixer_params)  # every one has a grad
    opt.step()
    group_params = {id(p) for g in opt.param_groups for p in g["params"]}
    for name, (p, old, grad) in before.items():
        assert id(p) in group_params, name
        assert bits_equal(p.detach(), torch.add(old, grad, alpha=-0.1)), name  # SGD: p - lr * grad
    for _, m in ordered_mixers(model):  # (a grad may be below the ulp of its parameter, e.g. dt_bias)
        assert not torch.equal(m.in_proj.weight.detach(), before_w[id(m.in_proj.weight)])


def test_import_ordered_ssd_does_not_import_transformers():
    code = ("import sys, ordered_ssd, ordered_ssd.hf, ordered_ssd.convert; "
            "assert 'transformers' not in sys.modules, 'transformers imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------------------- refusals
def test_an_activation_other_than_silu_is_refused_and_nothing_is_replaced():
    model = build("nemotron_h")  # two mixers: the first is fine, the second is refused
    cls_name = FAMILIES["nemotron_h"][1]
    before = mixers(model, cls_name)
    assert len(before) == 2
    before[1][1].activation = "gelu"
    sd = _sd_copy(model)
    with pytest.raises(ValueError, match=r"activation: expected 'silu'.*got 'gelu'"):
        convert_to_ordered(model)
    assert mixers(model, cls_name) == before and ordered_mixers(model) == []  # never partial
    _assert_sd_bits(model.state_dict(), sd)


def test_a_model_without_a_mixer_is_refused():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg)
    with pytest.raises(ValueError, match=r"model: expected at least one .*Mamba-2 mixer module, found none"):
        convert_to_ordered(model)
    with pytest.raises(ValueError, match=r"expected at least one OrderedHFMamba2Mixer module, found none"):
        convert_to_hf(build("bamba"))  # never converted


def test_a_bf16_model_on_the_cpu_is_refused_at_forward():
    model = build("bamba", dtype=torch.bfloat16)
    convert_to_ordered(model)  # converting is fine: the dtype is a property of the forward's path
    with pytest.raises(TypeError, match=r"expected dtype in \(torch.float32, torch.float64\) on cpu, got "
                                        r"torch.bfloat16 \(bf16/fp16 layers run on CUDA only"):
        model(ids())


@pytest.mark.parametrize("version, words", [
    ("5.16.2", r"transformers 5\.16\.2 is older than 5\.17, the oldest version ordered-ssd supports"),
    ("4.57.1", r"transformers 4\.57\.1 is older than 5\.17"),
    ("5.26.0", r"transformers 5\.26\.0 is newer than 5\.25, the newest version ordered-ssd is tested with"),
    ("5.26.0.dev0", r"transformers 5\.26\.0\.dev0 is newer than 5\.25"),
    ("6.0.0", r"transformers 6\.0\.0 is newer than 5\.25"),
    ("unknown", r"transformers: expected a version from 5\.17 to 5\.25, got unknown"),
])
def test_a_transformers_version_outside_the_range_is_refused(version, words, monkeypatch):
    model = build("zamba2")
    cls_name = FAMILIES["zamba2"][1]
    before = mixers(model, cls_name)
    # the module the library reads (transformers 5.17 swaps the sys.modules entry once a model class is touched)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    with pytest.raises(RuntimeError) as e:
        convert_to_ordered(model)
    msg = str(e.value)
    assert re.match(words, msg) and "\n" not in msg
    assert msg.endswith("pip install 'transformers>=5.17,<5.26'")
    assert mixers(model, cls_name) == before
    monkeypatch.undo()
    assert (5, 17) <= tuple(int(v) for v in sys.modules["transformers"].__version__.split(".")[:2]) <= (5, 25)
    convert_to_ordered(model)  # the same model converts with the real version
    assert len(ordered_mixers(model)) == len(before)


@pytest.mark.parametrize("version", ["5.17.0", "5.20.2", "5.25.0", "5.25.3"])
def test_every_version_of_the_range_passes_the_version_check(version, monkeypatch):
    from ordered_ssd.hf.mixer import check_transformers_version

    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    assert check_transformers_version() == version


def test_a_subclass_of_a_mixer_class_is_not_converted():
    model = build("mamba2")
    (_, first), (_, second) = mixers(model, "Mamba2Mixer")
    sub = type("MyMamba2Mixer", (type(first),), {})
    first.__class__ = sub
    convert_to_ordered(model)
    assert type(model.backbone.layers[0].mixer) is sub
    assert type(model.backbone.layers[1].mixer) is OrderedHFMamba2Mixer
    # a model whose only mixer is a subclass: nothing to convert
    solo = build("bamba")
    (_, only), = mixers(solo, "BambaMixer")
    only.__class__ = type("MyBambaMixer", (type(only),), {})
    with pytest.raises(ValueError, match=r"found none"):
        convert_to_ordered(solo)


# ---------------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("family", list(FAMILIES))
def test_save_pretrained_from_pretrained_and_strict_load(family, tmp_path):
    model = build(family)
    convert_to_ordered(model)
    sd = _sd_copy(model)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = type(model).from_pretrained(tmp_path)
    assert len(mixers(loaded, FAMILIES[family][1])) == len(ordered_mixers(model))  # the original classes
    _assert_sd_bits(loaded.state_dict(), sd)
    # the saved weights (as from_pretrained read them) into another converted model (another init), strictly
    other = convert_to_ordered(build(family, seed=7))
    first = next(iter(sd))
    assert not bits_equal(other.state_dict()[first], sd[first])
    result = other.load_state_dict(loaded.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    _assert_sd_bits(other.state_dict(), sd)
    assert len(ordered_mixers(other)) == len(ordered_mixers(model))


@pytest.mark.parametrize("family,variant", CASES, ids=CASE_IDS)
def test_convert_to_hf_restores_the_original_mixers_and_their_outputs_bitwise(family, variant):
    never = build(family, variant)
    model = clone(never)
    cls_name = FAMILIES[family][1]
    before = mixers(model, cls_name)
    x = ids()
    with torch.no_grad():
        ref = never(x).logits
    convert_to_ordered(model)
    assert convert_to_hf(model) is model
    after = mixers(model, cls_name)
    assert [(n, m) for n, m in after] == before  # the very same original mixer objects, under the same names
    assert ordered_mixers(model) == []
    with torch.no_grad():
        out = model(x).logits
    assert bits_equal(out, ref)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_trained_parameters_are_kept_by_convert_to_hf(family):
    model = build(family)
    x = ids()
    convert_to_ordered(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(x, labels=x).loss.backward()
    opt.step()
    trained = _sd_copy(model)
    params = dict(model.named_parameters())
    convert_to_hf(model)
    restored = mixers(model, FAMILIES[family][1])
    assert restored and all(m.training for _, m in restored)  # the train mode is kept
    for name, p in model.named_parameters():
        assert p is params[name], name
    _assert_sd_bits(model.state_dict(), trained)
    # the restored model computes with the trained weights: as a never-converted model loaded with them
    model.eval()
    fresh = build(family, seed=3)
    fresh.load_state_dict(trained, strict=True)
    with torch.no_grad():
        assert bits_equal(model(x).logits, fresh(x).logits)
        assert not bits_equal(model(x).logits, build(family)(x).logits)
