"""Tiny ``transformers`` models of the six families whose Mamba-2 mixers ``convert_to_ordered`` converts.

Imported only by the tests of this folder, each of which skips first when ``transformers`` is missing. Every
config is small (hidden 32/64, 2-4 layers) and has a chunk size smaller than the test length ``L`` (37, a
multiple of neither chunk size), so the scans run several chunks with a short last one.
"""
from __future__ import annotations

import copy

import torch
import transformers as T

from ordered_ssd.hf import OrderedHFMamba2Mixer

VOCAB = 64
L = 37  # not a multiple of any chunk size below (16, 8)

#: family -> (model class name, the original mixer class name)
FAMILIES = {
    "mamba2": ("Mamba2ForCausalLM", "Mamba2Mixer"),
    "bamba": ("BambaForCausalLM", "BambaMixer"),
    "nemotron_h": ("NemotronHForCausalLM", "NemotronHMamba2Mixer"),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridMambaLayer"),
    "falcon_h1": ("FalconH1ForCausalLM", "FalconH1Mixer"),
    "zamba2": ("Zamba2ForCausalLM", "Zamba2MambaMixer"),
}

_ATTN = dict(num_attention_heads=4, num_key_value_heads=2)


def _config(family: str, variant: str):
    g2 = variant != "base"  # the second variant: two groups (or FalconH1's norm options), biases, chunk 8
    chunk = 8 if g2 else 16
    if family == "mamba2":
        return T.Mamba2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=8, num_heads=4,
                              head_dim=16, n_groups=2 if g2 else 1, expand=2, chunk_size=chunk, conv_kernel=4,
                              use_bias=g2, time_step_limit=(0.0, 0.2) if g2 else (0.0, float("inf")))
    if family == "bamba":
        return T.BambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=64, **_ATTN,
                             attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2 if g2 else 1,
                             mamba_d_state=8, mamba_expand=2, mamba_chunk_size=chunk, mamba_proj_bias=g2)
    if family == "nemotron_h":
        return T.NemotronHConfig(vocab_size=VOCAB, hidden_size=32, hybrid_override_pattern="M*M-", **_ATTN,
                                 head_dim=8, intermediate_size=64, mamba_num_heads=4, mamba_head_dim=16,
                                 n_groups=2 if g2 else 1, ssm_state_size=8, chunk_size=chunk, use_bias=g2)
    if family == "granitemoehybrid":
        return T.GraniteMoeHybridConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                                        **_ATTN, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
                                        mamba_n_groups=2 if g2 else 1, mamba_d_state=8, mamba_expand=2,
                                        mamba_chunk_size=chunk, mamba_proj_bias=g2, num_local_experts=0,
                                        shared_intermediate_size=64)
    if family == "falcon_h1":
        # base: gated norm over 2 groups, gate before the norm; "norm_first": norm before the gate, proj bias;
        # "no_norm": mamba_rms_norm=False (the gate in the scan). All with non-1 ssm multipliers.
        return T.FalconH1Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=64, **_ATTN,
                                head_dim=8, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2 if variant == "base" else 1,
                                mamba_d_state=8, mamba_expand=2, mamba_chunk_size=chunk, mamba_d_ssm=64,
                                mamba_rms_norm=variant != "no_norm", mamba_norm_before_gate=variant == "norm_first",
                                mamba_proj_bias=variant == "norm_first", ssm_in_multiplier=0.5,
                                ssm_out_multiplier=1.3, ssm_multipliers=[1.5, 0.5, 2.0, 0.7, 1.2])
    if family == "zamba2":
        return T.Zamba2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=4, attention_head_dim=16, mamba_headdim=16, n_mamba_heads=4,
                              mamba_ngroups=2 if g2 else 1, mamba_d_state=8, mamba_expand=2, chunk_size=chunk,
                              layers_block_type=["mamba", "hybrid"], num_mem_blocks=1, use_mem_rope=False,
                              add_bias_linear=g2)
    raise KeyError(family)


#: (family, variant) of every config the parametrized tests run.
CASES = [(f, "base") for f in FAMILIES] + [(f, "g2_bias") for f in FAMILIES if f != "falcon_h1"] + [
    ("falcon_h1", "norm_first"), ("falcon_h1", "no_norm")]
CASE_IDS = [f"{f}-{v}" for f, v in CASES]


def build(family: str, variant: str = "base", seed: int = 0, dtype=torch.float32):
    """A freshly initialised model (eval mode, seeded), its random init perturbed so that no parameter keeps a
    symmetric init value (A_log, D, dt_bias, norm weights all ones...), which would hide a swapped operand."""
    torch.manual_seed(seed)
    model = getattr(T, FAMILIES[family][0])(_config(family, variant))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.to(dtype).eval()


def mixers(model, cls_name: str):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ == cls_name]


def ordered_mixers(model):
    return [(n, m) for n, m in model.named_modules() if type(m) is OrderedHFMamba2Mixer]


def clone(model):
    return copy.deepcopy(model)


def ids(batch: int = 2, length: int = L, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)  # above the special ids 0-2


def grads(model, names):
    params = dict(model.named_parameters())
    return {n: params[n].grad.detach().clone() for n in names}


def mixer_param_names(model, cls_name: str):
    """A few parameters of the first Mamba mixer plus the embedding (their grads cross the mixer)."""
    first = mixers(model, cls_name)[0][0]
    names = [f"{first}.{leaf}" for leaf in ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D",
                                             "out_proj.weight")]
    params = dict(model.named_parameters())
    if f"{first}.norm.weight" in params:
        names.append(f"{first}.norm.weight")
    emb = model.get_input_embeddings().weight
    names.append(next(n for n, p in params.items() if p is emb))
    return names


def cache_kw(model) -> str:
    """The name of the cache argument of ``model``'s forward (and of its output's field): ``cache_params`` before
    ``transformers`` 5.24 (Mamba2's backbone and causal LM), ``cache`` from 5.24; the hybrids take
    ``past_key_values``."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return next(n for n in ("cache", "cache_params", "past_key_values") if n in params)
