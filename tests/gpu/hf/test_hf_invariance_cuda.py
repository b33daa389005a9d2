"""On CUDA, a converted ``Mamba2ForCausalLM`` (``convert_to_ordered(model, invariant_linears=True)``: the mixers'
``sequence_invariant``, ``InvariantLinear`` head, ``InvariantRMSNorm`` norms) gives each sequence its canonical
per-token losses alone, right-padded and left-padded (``attention_mask``) and packed (``DataCollatorWithFlattening``), and the mixers'
parameter gradients are the same bits padded and packed (the CPU twin: tests/hf/test_hf_invariance.py)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from ordered_ssd import InvariantLinear, InvariantRMSNorm, convert_to_ordered  # noqa: E402
from tests.helpers import bits_equal  # noqa: E402
from tests.hf.models import build  # noqa: E402
from tests.hf.test_hf_invariance import (_left_padded, _mixer_grads, _packed, _padded, _sequences,  # noqa: E402
                                         _token_losses)

pytestmark = pytest.mark.gpu
transformers.logging.set_verbosity_error()


def _model(dtype, variant="g2_bias"):
    model = build("mamba2", variant, seed=3).to("cuda", dtype)
    model = convert_to_ordered(model, invariant_linears=True).train()
    assert type(model.lm_head) is InvariantLinear and type(model.backbone.norm_f) is InvariantRMSNorm
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_token_losses_are_canonical_padded_and_packed_on_cuda(dtype):
    model = _model(dtype)
    seqs = [s.cuda() for s in _sequences(14, 1)]
    with torch.no_grad():
        want = [_token_losses(model, s[None])[0] for s in seqs]
        for members in ([0], [3, 1, 2], list(range(14)), [13, 5, 9, 0, 11]):
            ids, mask = _padded([seqs[m].cpu() for m in members], extra=members[0] % 5)
            got = _token_losses(model, ids.cuda(), attention_mask=mask.cuda())
            for r, m in enumerate(members):
                assert bits_equal(got[r, :seqs[m].numel() - 1], want[m]), ("padded", members, m)
            ids, seq_idx = _packed([seqs[m].cpu() for m in members])
            got = _token_losses(model, ids.cuda(), seq_idx=seq_idx.cuda())[0]
            start = 0
            for m in members:
                n = seqs[m].numel()
                assert bits_equal(got[start:start + n - 1], want[m]), ("packed", members, m)
                start += n


def test_mixer_gradients_are_the_same_padded_and_packed_on_cuda():
    model = _model(torch.float32)
    seqs = _sequences(9, 2)
    ids, mask = _padded(seqs)
    losses = _token_losses(model, ids.cuda(), attention_mask=mask.cuda())
    padded = _mixer_grads(model, [losses[r, :s.numel() - 1] for r, s in enumerate(seqs)])
    ids, seq_idx = _packed(seqs)
    losses = _token_losses(model, ids.cuda(), seq_idx=seq_idx.cuda())[0]
    bounds = torch.tensor([0] + [s.numel() for s in seqs]).cumsum(0).tolist()
    packed = _mixer_grads(model, [losses[a:b - 1] for a, b in zip(bounds[:-1], bounds[1:])])
    assert padded and sorted(padded) == sorted(packed)
    for n in padded:
        assert bits_equal(padded[n], packed[n]), n
    assert any(float(g.abs().max()) > 0 for g in padded.values())


def test_left_padded_rows_get_their_canonical_per_token_losses_on_cuda():
    """Without an ``in_proj`` bias, each run of a left-padding mask is computed as its own sequence (the CPU twin:
    ``test_left_padded_rows_get_their_canonical_per_token_losses``)."""
    model = _model(torch.bfloat16, "base")
    seqs = _sequences(7, 4)
    ids, mask, starts = _left_padded(seqs)
    with torch.no_grad():
        want = [_token_losses(model, s[None].cuda())[0] for s in seqs]
        got = _token_losses(model, ids.cuda(), attention_mask=mask.cuda())
    for r, (s, start) in enumerate(zip(seqs, starts)):
        assert bits_equal(got[r, start:start + s.numel() - 1], want[r]), r
