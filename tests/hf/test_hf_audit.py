"""ordered_ssd.hf.audit_model: what in a model the ordered layers do not cover (CPU; reads the model only)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from ordered_ssd import convert_to_ordered  # noqa: E402
from ordered_ssd.hf import audit_model  # noqa: E402


def _bamba(attn, **kw):
    cfg = transformers.BambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
                                   mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=16,
                                   attn_implementation=attn, **kw)
    torch.manual_seed(0)
    return transformers.BambaForCausalLM(cfg)


def test_a_converted_model_with_eager_attention_has_no_finding():
    model = convert_to_ordered(_bamba("eager"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert audit_model(model) == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # reads only


def test_unconverted_mixers_and_atomic_attention_are_named():
    found = audit_model(_bamba("sdpa"))
    kinds = [(f.kind, f.module) for f in found]
    assert kinds == [("attention", ""), ("unconverted-mamba", "model.layers.0.mamba")], kinds
    assert "attn_implementation='eager'" in found[0].detail and "convert_to_ordered" in found[1].detail


def test_experts_and_dropout_are_named():
    cfg = transformers.GraniteMoeHybridConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
        mamba_d_state=8, mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=64, attn_implementation="eager")
    torch.manual_seed(0)
    model = convert_to_ordered(transformers.GraniteMoeHybridForCausalLM(cfg))
    model.model.layers[0].extra_dropout = torch.nn.Dropout(0.1)
    found = audit_model(model)
    experts = [f.module for f in found if f.kind == "experts"]
    assert experts == ["model.layers.0.block_sparse_moe", "model.layers.1.block_sparse_moe"], found
    assert [f.module for f in found if f.kind == "dropout"] == ["model.layers.0.extra_dropout"]
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module, got int"):
        audit_model(3)


def test_an_unconverted_mixer_under_an_unsupported_version_names_the_version(monkeypatch):
    import sys

    model = _bamba("eager")
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.26.0")
    found = audit_model(model)
    assert [(f.kind, f.module) for f in found] == [("unconverted-mamba", "model.layers.0.mamba")]
    detail = found[0].detail
    assert "convert_to_ordered refuses it: transformers 5.26.0 is newer than 5.25" in detail
    assert "pip install 'transformers>=5.17,<5.26'" in detail and "call ordered_ssd.convert_to_ordered" not in detail


def _kernelizable():
    if not hasattr(transformers.PreTrainedModel, "set_use_kernels"):
        return f"transformers {transformers.__version__} has no hub kernels switch (set_use_kernels)"
    from transformers.utils import is_kernels_available

    if not is_kernels_available():
        return (f"no kernels package of the versions transformers {transformers.__version__} takes is installed "
                f"(5.25 depends on one; CI runs this there)")
    return None


def _hub_kernel_on_act(model):
    """What the kernels package does to a layer it kernelizes (``_replace_forward``: the instance's ``forward`` and
    ``_kernel_repo``), done to every mixer's ``act`` (a ``SiLUActivation``, which 5.25's hub mapping replaces on
    CUDA with its "SiLU" kernel; its mapping has no CPU entry, so on the CPU nothing is replaced by itself)."""
    import types

    class HubSiLU(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x)

    acts = [m.act for m in model.modules() if hasattr(m, "A_log") and isinstance(getattr(m, "act", None),
                                                                                 torch.nn.Module)]
    for act in acts:
        act.forward = types.MethodType(HubSiLU.forward, act)
        act.__dict__["_kernel_repo"] = "kernels-community/activation"
    return acts


def test_a_mixer_whose_act_a_hub_kernel_replaced_converts_and_the_audit_names_only_what_runs():
    """Hub kernels replace the forward of the mixers' ``act`` on CUDA (transformers 5.25 loads with
    use_kernels=True by default): converting is not refused for it (the ordered mixer never calls ``act``), an
    accelerate hook still is, and the audit reports a kernelized module of the unconverted model, not the act of
    an ordered mixer."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    model = _bamba("eager")
    acts = _hub_kernel_on_act(model)
    assert acts
    assert [f.module for f in audit_model(model) if f.kind == "kernels"] == ["model.layers.0.mamba.act"]
    x = torch.randint(3, 64, (2, 21), generator=torch.Generator().manual_seed(0))
    want = convert_to_ordered(_bamba("eager"))(x).logits
    convert_to_ordered(model)
    assert torch.equal(model(x).logits, want)
    assert [f for f in audit_model(model) if f.kind == "kernels"] == []  # the ordered mixer never calls act
    hooked = _bamba("eager")
    _hub_kernel_on_act(hooked)
    add_hook_to_module(hooked.model.layers[0].mamba.act, ModelHook())
    with pytest.raises(ValueError, match=r"\.act: expected a module without accelerate hooks"):
        convert_to_ordered(hooked)


@pytest.mark.skipif(_kernelizable() is not None, reason=str(_kernelizable()))
@pytest.mark.parametrize("order", ["convert_then_kernelize", "kernelize_then_convert"])
def test_use_kernels_keeps_the_ordered_mixers_and_the_audit_reports_it(order):
    """transformers' hub kernels (use_kernels=True; from_pretrained's default from 5.25 where `kernels` is
    installed): kernelizing before or after the conversion keeps the ordered mixers with the same bits, and
    audit_model names the kernelization. On the CPU the hub mapping replaces nothing by itself, so what it does on
    CUDA to the mixers' act is done here as the kernels package does it."""
    from ordered_ssd.hf import OrderedHFMamba2Mixer

    x = torch.randint(3, 64, (2, 21), generator=torch.Generator().manual_seed(0))
    plain = convert_to_ordered(_bamba("eager"))
    want = plain(x).logits
    model = _bamba("eager")
    if order == "convert_then_kernelize":
        convert_to_ordered(model)
        model.set_use_kernels(True)
        _hub_kernel_on_act(model)
    else:
        model.set_use_kernels(True)
        _hub_kernel_on_act(model)
        convert_to_ordered(model)
    assert model.use_kernels
    assert type(model.model.layers[0].mamba) is OrderedHFMamba2Mixer
    assert torch.equal(model(x).logits, want)
    found = audit_model(model)
    assert ("kernels", "") in [(f.kind, f.module) for f in found]
    assert "the ordered mixers are kept" in next(f.detail for f in found if f.kind == "kernels")
    model.set_use_kernels(False)
    assert not any(f.kind == "kernels" and f.module == "" for f in audit_model(model))
