"""``ordered_ssd.sampling``: a row's token and log-probability depend only on its logits and its generator (not on
the batch), top-k / top-p restrict the draw, and bad arguments are named."""
import pytest
import torch

from ordered_ssd.sampling import sample_tokens, token_logprobs
from tests.helpers import bits_equal


def _gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8),
                                dict(temperature=1.3, top_k=20, top_p=0.9)])
def test_a_rows_token_does_not_depend_on_the_batch(kw):
    logits = torch.randn(9, 101, generator=torch.Generator().manual_seed(0))
    tokens, logps = sample_tokens(logits, _gens(range(9)), **kw)
    for b in range(9):
        t, lp = sample_tokens(logits[b:b + 1], _gens([b]), **kw)
        assert t.item() == tokens[b].item() and bits_equal(lp, logps[b:b + 1])
    assert bits_equal(logps, token_logprobs(logits, tokens, kw.get("temperature", 1.0)))
    assert len(set(tokens.tolist())) > 1


def test_top_k_and_top_p_restrict_the_draw():
    logits = torch.tensor([[5.0, 4.0, 3.0, -2.0, -3.0]]).repeat(200, 1)
    tokens, _ = sample_tokens(logits, _gens(range(200)), top_k=2)
    assert set(tokens.tolist()) == {0, 1}
    probs = torch.softmax(logits[0], -1)  # 0.66, 0.24, 0.09, ...: top_p 0.85 keeps tokens 0 and 1
    assert probs[0] < 0.85 < probs[0] + probs[1]
    tokens, _ = sample_tokens(logits, _gens(range(200)), top_p=0.85)
    assert set(tokens.tolist()) == {0, 1}
    tokens, _ = sample_tokens(logits, _gens(range(200)), top_p=0.5)
    assert set(tokens.tolist()) == {0}


def test_token_logprobs_are_row_invariant():
    logits = torch.randn(4000, 77, generator=torch.Generator().manual_seed(1))
    tokens = torch.randint(0, 77, (4000,), generator=torch.Generator().manual_seed(2))
    many = token_logprobs(logits, tokens)
    for n in (1, 3, 17):
        assert bits_equal(token_logprobs(logits[:n], tokens[:n]), many[:n])
    assert torch.allclose(many, torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0])


def test_bad_arguments_are_named():
    logits = torch.randn(2, 5)
    with pytest.raises(TypeError, match="generators: expected a list of 2 torch.Generator"):
        sample_tokens(logits, _gens([0]))
    with pytest.raises(TypeError, match="generators: expected a list of 2 torch.Generator .*got NoneType"):
        sample_tokens(logits, None)
    g = torch.Generator()
    with pytest.raises(ValueError, match="generators: expected a different generator for every row"):
        sample_tokens(logits, [g, g])
    with pytest.raises(ValueError, match="temperature: expected a finite number > 0"):
        sample_tokens(logits, _gens([0, 1]), temperature=0)
    with pytest.raises(ValueError, match="top_k: expected None or an int >= 1"):
        sample_tokens(logits, _gens([0, 1]), top_k=0)
    with pytest.raises(ValueError, match=r"top_p: expected None or a number in \(0, 1\]"):
        sample_tokens(logits, _gens([0, 1]), top_p=1.5)
    with pytest.raises(TypeError, match="logits: expected a 2-d floating-point tensor"):
        sample_tokens(torch.randn(5), _gens([0]))
    with pytest.raises(ValueError, match=r"tokens: expected shape \(2,\)"):
        token_logprobs(logits, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="tokens: expected an integer tensor"):
        token_logprobs(logits, torch.zeros(2))
