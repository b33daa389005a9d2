"""Parity decoding (``layer.decode_mode = "parity"``, the reference path): a prefill of any length followed by
one-token steps gives every position the bits of the training forward over the finished sequence, at any batch
size and row, and for packed prefills (``cu_seqlens``); the recurrent step (the default) does not, which is what
the tests would see without parity."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch

from ordered_ssd import InvariantLinear
from ordered_ssd.modules._parity import ParityCache
from tests.helpers import bits_equal, make_layer, sha256
from tests.modules.test_decoding import TinyLM, _params

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _model(dtype, mode="parity", **kw):
    model = TinyLM(dtype=dtype, **kw)
    model.head = InvariantLinear.from_linear(model.head)
    for layer in model.layers:
        layer.decode_mode = mode
    return model


def _decode(model, ids, prompt):
    """The logits of a prefill of ``prompt`` tokens, then one step per remaining token: [B, L, vocab]."""
    params = _params()
    out = [model(ids[:, :prompt], inference_params=params)]
    params.seqlen_offset = prompt
    for t in range(prompt, ids.shape[1]):
        out.append(model(ids[:, t:t + 1], inference_params=params))
        params.seqlen_offset += 1
    return torch.cat(out, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("opts", [dict(), dict(ngroups=2, rmsnorm=False, chunk_size=3),
                                  dict(d_ssm=16, D_has_hdim=True, chunk_size=5, dt_limit=(0.01, 0.3))],
                         ids=["default", "g2-nonorm-chunk3", "mlp-Dhdim-chunk5"])
def test_prefill_and_steps_give_the_training_forwards_bits(dtype, opts):
    model = _model(dtype, **opts)
    rng = random.Random(str(opts))
    for _ in range(3):
        batch, length = rng.choice([1, 3, 8]), rng.randint(2, 26)
        ids = torch.randint(0, 37, (batch, length), generator=torch.Generator().manual_seed(rng.randrange(99)))
        with torch.no_grad():
            full = model(ids)
            for prompt in sorted({1, rng.randint(1, length), length}):
                assert bits_equal(_decode(model, ids, prompt), full), (batch, length, prompt)
            row = rng.randrange(batch)  # a row alone decodes the bits it had in the batch
            assert bits_equal(_decode(model, ids[row:row + 1], rng.randint(1, length))[0], full[row])


def test_the_recurrent_step_is_not_the_training_forwards_bits():
    """The control: the default decode_mode ('recurrent', Mamba2's step) adds in another order than the chunked
    forward, so most decoded positions have other bits."""
    model = _model(torch.float32, mode="recurrent")
    ids = torch.randint(0, 37, (3, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        differ = (_decode(model, ids, 5) != model(ids))[:, 5:].any(-1).float().mean().item()
    assert differ > 0.3


def test_a_packed_prefill_continues_each_sequence_with_its_own_bits():
    layer = make_layer(seed=4, dtype=torch.float64, d_model=16, chunk_size=4, ngroups=2, layer_idx=0)
    layer.decode_mode = "parity"
    lengths = [3, 9, 4]
    seqs = [torch.randn(n + 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(n)) for n in lengths]
    with torch.no_grad():
        alone = [layer(s[None])[0] for s in seqs]
        u = torch.cat([s[:n] for s, n in zip(seqs, lengths)])[None]
        cu = torch.tensor([0, 3, 12, 16], dtype=torch.int32)
        seq_idx = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor(lengths))[None]
        params = _params()
        pre = layer(u, seq_idx=seq_idx, cu_seqlens=cu, inference_params=params)
        cache = params.key_value_memory_dict[0]
        assert isinstance(cache, ParityCache) and cache.count.tolist() == lengths
        for (a, b), s in zip(zip(cu[:-1].tolist(), cu[1:].tolist()), alone):
            assert bits_equal(pre[0, a:b], s[:b - a])
        params.seqlen_offset = 1
        for k in range(6):
            step = torch.stack([s[n + k] for s, n in zip(seqs, lengths)])[:, None]
            y = layer(step, inference_params=params)
            for i, (s, n) in enumerate(zip(alone, lengths)):
                assert bits_equal(y[i, 0], s[n + k]), (i, k)


def test_modes_and_caches_are_checked():
    layer = make_layer(seed=1, dtype=torch.float32, layer_idx=0)
    layer.decode_mode = "exact"
    with pytest.raises(ValueError, match=r"decode_mode: expected one of \('recurrent', 'parity'\), got 'exact'"):
        layer.allocate_inference_cache(2, 10)
    layer.decode_mode = "parity"
    cache = layer.allocate_inference_cache(2, 10)
    assert isinstance(cache, ParityCache) and cache.rows.shape == (2, layer.chunk_size, layer.d_model)
    with pytest.raises(ValueError, match="step: decode_mode 'parity' keeps its own cache"):
        layer.step(torch.randn(2, 1, layer.d_model), None, None)
    params = _params()
    layer.decode_mode = "recurrent"
    layer(torch.randn(2, 5, layer.d_model), inference_params=params)
    layer.decode_mode = "parity"
    params.seqlen_offset = 5
    with pytest.raises(TypeError, match="not the ParityCache of decode_mode 'parity'"):
        layer(torch.randn(2, 1, layer.d_model), inference_params=params)
    layer.decode_mode = "recurrent"  # and the other way round
    params = _params()
    layer.decode_mode = "parity"
    layer(torch.randn(2, 5, layer.d_model), inference_params=params)
    layer.decode_mode = "recurrent"
    params.seqlen_offset = 5
    with pytest.raises(TypeError, match="not the \\(conv_state, ssm_state\\) of decode_mode 'recurrent'"):
        layer(torch.randn(2, 1, layer.d_model), inference_params=params)
    layer.decode_mode = "parity"
    with pytest.raises(ValueError, match=r"hidden_states: expected \[B, 1, d_model\] \(one token per sequence\)"):
        layer(torch.randn(2, 3, layer.d_model), inference_params=params)
    assert params.key_value_memory_dict[0].count.tolist() == [5, 5]  # nothing was written
    with pytest.raises(TypeError, match="decode_mode 'parity' keeps its cache in the layer's dtype"):
        layer.allocate_inference_cache(2, 10, dtype=torch.float64)
    params.key_value_memory_dict[0] = params.key_value_memory_dict[0]._replace(
        state=params.key_value_memory_dict[0].state.double())
    with pytest.raises(ValueError, match="ParityCache.state: expected shape"):
        layer(torch.randn(2, 1, layer.d_model), inference_params=params)
    seq_idx = torch.tensor([[0, 0, 1, 1, 1]] * 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_idx: marks 4 sequences but the cache holds 2"):
        layer(torch.randn(2, 5, layer.d_model), seq_idx=seq_idx, inference_params=_params())


def _digests():
    model = _model(torch.float32, chunk_size=3)
    ids = torch.randint(0, 37, (4, 14), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return sha256(_decode(model, ids, 4))


def test_parity_decoding_repeats_and_equals_in_a_fresh_process():
    first = _digests()
    assert _digests() == first
    code = f"import sys; sys.path.insert(0, {ROOT!r}); import json; " \
           "from tests.modules.test_parity_decoding import _digests; print(json.dumps(_digests()))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == first
