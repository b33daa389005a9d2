"""Decoding with OrderedMamba2 on the CPU (reference path): a prefill through ``forward(inference_params=...)`` then
one ``step`` per token == the forward over all tokens; greedy generation of a tiny LM built here == the argmax of a
full forward over the same tokens (fp64 and fp32); varlen prefill (cu_seqlens) == each sequence alone."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from ordered_ssd import OrderedMamba2
from tests.helpers import make_layer, rel_err

TOL = {torch.float64: 1e-11, torch.float32: 2e-5}


def _params():
    """A stand-in for mamba-ssm's InferenceParams (the two fields the layer reads)."""
    return SimpleNamespace(key_value_memory_dict={}, seqlen_offset=0)


class TinyLM(nn.Module):
    """Embedding -> residual OrderedMamba2 layers -> linear head (what MambaLMHeadModel's decode loop needs)."""

    def __init__(self, vocab=37, d_model=16, n_layers=2, dtype=torch.float64, seed=0, **kw):
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(vocab, d_model)
        kw = {"chunk_size": 4, **kw}
        self.layers = nn.ModuleList([OrderedMamba2(d_model, d_state=8, headdim=8, layer_idx=i, **kw)
                                     for i in range(n_layers)])
        self.head = nn.Linear(d_model, vocab)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))
        self.to(dtype)

    def forward(self, ids, inference_params=None):
        h = self.embedding(ids)
        for layer in self.layers:
            h = h + layer(h, inference_params=inference_params)
        return self.head(h)


def _greedy(model, prompt, new_tokens):
    params = _params()
    logits = [model(prompt, inference_params=params)[:, -1]]
    tokens = [logits[-1].argmax(-1)]
    params.seqlen_offset = prompt.shape[1]
    for _ in range(new_tokens - 1):
        logits.append(model(tokens[-1][:, None], inference_params=params)[:, -1])
        tokens.append(logits[-1].argmax(-1))
        params.seqlen_offset += 1
    return torch.stack(tokens, 1), torch.stack(logits, 1), params


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("opts", [dict(), dict(ngroups=2, rmsnorm=False), dict(d_ssm=16, D_has_hdim=True),
                                  dict(dt_limit=(0.01, 0.2))], ids=["default", "g2-nonorm", "mlp-Dhdim", "dt_limit"])
def test_greedy_generation_equals_the_argmax_of_a_full_forward(dtype, opts):
    model = TinyLM(dtype=dtype, **opts)
    prompt = torch.randint(0, 37, (3, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens, logits, params = _greedy(model, prompt, new_tokens=9)
        full = model(torch.cat([prompt, tokens[:, :-1]], 1))[:, prompt.shape[1] - 1:]
    assert set(params.key_value_memory_dict) == {0, 1}
    assert torch.equal(tokens, full.argmax(-1))
    assert rel_err(logits, full) < TOL[dtype]
    assert len(set(tokens.flatten().tolist())) > 1  # the generation is not degenerate


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("prompt", [1, 3, 4, 10])
def test_prefill_and_steps_equal_the_forward(dtype, prompt):
    layer = make_layer(seed=prompt, dtype=dtype, layer_idx=0, chunk_size=4)
    u = torch.randn(2, prompt + 5, layer.d_model, dtype=dtype, generator=torch.Generator().manual_seed(2))
    params = _params()
    with torch.no_grad():
        full = layer(u)
        pre = layer(u[:, :prompt], inference_params=params)
        assert torch.equal(pre, layer(u[:, :prompt]))  # the prefill's output is the forward's
        conv_state, ssm_state = params.key_value_memory_dict[0]
        assert conv_state.shape == (2, layer.conv1d.weight.shape[0], 4) and conv_state.stride(1) == 1
        params.seqlen_offset = prompt
        for t in range(prompt, prompt + 5):
            y = layer(u[:, t:t + 1], inference_params=params)
            assert rel_err(y, full[:, t:t + 1]) < TOL[dtype], t
            params.seqlen_offset += 1
        # step() itself, on a copy of the cache, gives the same bits as forward at seqlen_offset > 0
        cs, ss = conv_state.clone(), ssm_state.clone()
        out, cs2, ss2 = layer.step(u[:, -1:], cs, ss)
        assert cs2 is cs and ss2 is ss and not torch.equal(cs, conv_state)
        assert torch.equal(out, layer(u[:, -1:], inference_params=params))
        assert torch.equal(cs, conv_state) and torch.equal(ss, ssm_state)


def test_varlen_prefill_writes_one_cache_entry_per_sequence():
    layer = make_layer(seed=5, layer_idx=7, chunk_size=4, ngroups=2)
    lengths = [3, 6, 2]
    u = torch.randn(1, sum(lengths), layer.d_model, dtype=torch.float64)
    cu = torch.tensor([0, 3, 9, 11], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor(lengths))[None]
    nxt = torch.randn(3, 1, layer.d_model, dtype=torch.float64)
    params = _params()
    with torch.no_grad():
        out = layer(u, seq_idx=seq_idx, cu_seqlens=cu, inference_params=params)
        assert torch.equal(out, layer(u, seq_idx=seq_idx))
        params.seqlen_offset = 1
        steps = layer(nxt, inference_params=params)  # one step of each of the 3 sequences
        for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            alone = layer(torch.cat([u[:, lo:hi], nxt[i:i + 1]], 1))
            assert rel_err(steps[i], alone[0, -1:]) < 1e-11, i


def test_allocate_inference_cache_layout_and_initialize_states():
    layer = OrderedMamba2(16, d_state=8, headdim=8, layer_idx=1)
    conv_state, ssm_state = layer.allocate_inference_cache(3, 100)
    assert conv_state.shape == (3, 48, 4) and conv_state.stride() == (4 * 48, 1, 48)  # transposed [B, W, D]
    assert ssm_state.shape == (3, 4, 8, 8) and ssm_state.dtype == torch.float32
    assert not conv_state.any() and not ssm_state.any()
    c64, s64 = layer.allocate_inference_cache(1, 8, dtype=torch.float64)
    assert c64.dtype == s64.dtype == torch.float64
    params = _params()
    c, s = layer._get_states_from_cache(params, 2)
    assert params.key_value_memory_dict[1][0] is c
    c.fill_(1.0)
    s.fill_(2.0)
    c_again, s_again = layer._get_states_from_cache(params, 2)
    assert c_again is c and bool((s_again == 2).all())
    layer._get_states_from_cache(params, 2, initialize_states=True)
    assert not c.any() and not s.any()
