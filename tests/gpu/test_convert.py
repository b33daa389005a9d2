"""ordered_ssd.convert on a real mamba-ssm MambaLMHeadModel (GPU)."""
import pytest
import torch

from ordered_ssd import OrderedMamba2, convert_to_mamba2, convert_to_ordered


def _model(dtype):
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel

    cfg = MambaConfig(d_model=128, n_layer=2, vocab_size=256, ssm_cfg={"layer": "Mamba2", "d_state": 32,
                      "headdim": 32, "chunk_size": 64}, rms_norm=True, residual_in_fp32=True, fused_add_norm=True,
                      pad_vocab_size_multiple=8)
    torch.manual_seed(0)
    return MambaLMHeadModel(cfg, device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convert_lm_head_model_both_ways(dtype):
    from mamba_ssm.modules.mamba2 import Mamba2

    model = _model(dtype)
    ids = torch.randint(0, 256, (2, 100), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    native_logits = model(ids).logits.float()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    assert convert_to_ordered(model) is model
    mixers = [layer.mixer for layer in model.backbone.layers]
    assert [type(m) for m in mixers] == [OrderedMamba2] * 2 and [m.layer_idx for m in mixers] == [0, 1]
    assert all(p is params[n] for n, p in model.named_parameters())
    ordered_logits = model(ids).logits.float()
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    assert torch.allclose(ordered_logits, native_logits, atol=tol, rtol=tol), \
        (ordered_logits - native_logits).abs().max().item()
    loss = torch.nn.functional.cross_entropy(model(ids).logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    convert_to_mamba2(model)
    assert [type(layer.mixer) for layer in model.backbone.layers] == [Mamba2] * 2
    after = model.state_dict()
    assert list(after) == list(state)
    assert all(torch.equal(after[k], state[k]) for k in state)
