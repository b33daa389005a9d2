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
