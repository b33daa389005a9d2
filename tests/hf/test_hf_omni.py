"""NemotronH Omni (``nemotron_h_omni``, transformers 5.18 and later): its text model is a NemotronH causal LM whose
``NemotronHMamba2Mixer``s convert like NemotronH's own; the converted model gives the original's text logits,
gradients and greedy tokens (CPU, fp32)."""
import pytest
import torch

T = pytest.importorskip("transformers")

from ordered_ssd import convert_to_ordered  # noqa: E402
from tests.helpers import rel_err  # noqa: E402
from tests.hf.models import _config, clone, ids, ordered_mixers  # noqa: E402

T.logging.set_verbosity_error()

if not hasattr(T, "NemotronH_Omni_Reasoning_V3"):
    pytest.skip(f"transformers {T.__version__} has no nemotron_h_omni (added in 5.18)", allow_module_level=True)


def _build(seed=0):
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2.0, patch_size=16,
                  image_size=32)
    if hasattr(T.AutoConfig.for_model("radio"), "video_temporal_patch_size"):  # 5.25 checks it equals the model's
        vision["video_temporal_patch_size"] = 2
    cfg = T.AutoConfig.for_model("nemotron_h_omni", text_config=_config("nemotron_h", "g2_bias").to_dict(),
                                 vision_config=vision, vision_hidden_size=32, projector_hidden_size=32,
                                 image_token_id=2)
    torch.manual_seed(seed)
    model = T.NemotronH_Omni_Reasoning_V3(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def test_the_text_models_mixers_convert_and_give_the_originals_logits_gradients_and_tokens():
    orig = _build()
    conv = convert_to_ordered(clone(orig))
    names = [n for n, _ in ordered_mixers(conv)]
    assert names == ["language_model.model.layers.0.mixer", "language_model.model.layers.2.mixer"]
    x = ids(2, 29)
    logits = []
    for model in (orig, conv):
        model.zero_grad()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        logits.append(out.logits.detach())
    assert rel_err(logits[1], logits[0]) < 1e-5
    for (n, p0), (_, p1) in zip(orig.named_parameters(), conv.named_parameters()):
        if p0.grad is not None and ".mixer." in n:
            assert rel_err(p1.grad, p0.grad) < 1e-4, n
    prompt = ids(1, 8, seed=3)
    with torch.no_grad():
        a, b = (m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, min_new_tokens=6,
                           do_sample=False, pad_token_id=0) for m in (orig, conv))
    assert torch.equal(a, b)
