"""Every bad argument raises a clear error naming it, before anything is computed or written."""
import pytest
import torch

from tests.helpers import make_layer
from ordered_ssd import OrderedMamba2, validate_seq_idx

BASE = dict(d_model=16, d_state=8, headdim=8, chunk_size=8)


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(d_model=0), ValueError, r"d_model: expected an int >= 1, got 0"),
    (dict(d_model=2.5), TypeError, r"d_model: expected an int"),
    (dict(d_model=True), TypeError, r"d_model: expected an int"),
    (dict(d_state=-1), ValueError, r"d_state: expected an int >= 1, got -1"),
    (dict(d_conv=0), ValueError, r"d_conv"),
    (dict(expand=0), ValueError, r"expand"),
    (dict(headdim=0), ValueError, r"headdim"),
    (dict(ngroups=0), ValueError, r"ngroups"),
    (dict(chunk_size=0), ValueError, r"chunk_size"),
    (dict(d_ssm=12), ValueError, r"d_ssm: expected a multiple of headdim=8, got 12"),
    (dict(d_ssm=40), ValueError, r"d_ssm: expected at most d_inner = expand \* d_model = 32, got 40"),
    (dict(d_ssm=0), ValueError, r"d_ssm"),
    (dict(ngroups=3), ValueError, r"ngroups: expected a divisor of nheads = d_ssm / headdim = 4, got 3"),
    (dict(dt_limit=(0.1, 0.01)), ValueError, r"dt_limit: expected min <= max, got min=0.1 > max=0.01"),
    (dict(dt_limit=0.1), TypeError, r"dt_limit: expected a pair"),
    (dict(A_init_range=(0, 16)), ValueError, r"A_init_range\[0\]: expected a positive number"),
    (dict(A_init_range=(8, 2)), ValueError, r"A_init_range: expected min <= max"),
    (dict(dt_min=0.1, dt_max=0.01), ValueError, r"dt_min: expected dt_min <= dt_max"),
    (dict(dt_min=0.0), ValueError, r"dt_min: expected a positive number"),
    (dict(conv_init=-1.0), ValueError, r"conv_init"),
])
def test_constructor_rejects(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        OrderedMamba2(**{**BASE, **kwargs})


def test_process_group_not_supported():
    with pytest.raises(NotImplementedError, match="process_group"):
        OrderedMamba2(**BASE, process_group=object())


def _bad_forward_cases():
    f32 = dict(dtype=torch.float32)
    return [
        ("not a tensor", lambda: ([[0.0] * 16],), {}, TypeError, r"u: expected a torch.Tensor, got list"),
        ("rank 2", lambda: (torch.randn(5, 16, **f32),), {}, ValueError, r"u: expected a 3-d tensor"),
        ("rank 4", lambda: (torch.randn(1, 2, 5, 16, **f32),), {}, ValueError, r"u: expected a 3-d tensor"),
        ("d_model", lambda: (torch.randn(2, 5, 15, **f32),), {}, ValueError, r"u: expected last dimension d_model=16"),
        ("empty batch", lambda: (torch.randn(0, 5, 16, **f32),), {}, ValueError, r"u: expected B >= 1 and L >= 1"),
        ("empty length", lambda: (torch.randn(2, 0, 16, **f32),), {}, ValueError, r"u: expected B >= 1 and L >= 1"),
        ("int dtype", lambda: (torch.ones(2, 5, 16, dtype=torch.int64),), {}, TypeError, r"u: expected dtype in"),
        ("bf16 on cpu", lambda: (torch.randn(2, 5, 16, dtype=torch.bfloat16),), {}, TypeError, r"got torch.bfloat16"),
        ("fp64 vs fp32 layer", lambda: (torch.randn(2, 5, 16, dtype=torch.float64),), {}, TypeError,
         r"u: expected dtype torch.float32 \(the dtype of the layer's parameters\), got torch.float64"),
        ("device", lambda: (torch.empty(2, 5, 16, device="meta"),), {}, ValueError, r"u: expected device cpu"),
        ("seqlen mismatch", lambda: (torch.randn(9, 16, **f32),), dict(seqlen=4), ValueError, r"with seqlen=4"),
        ("seqlen type", lambda: (torch.randn(8, 16, **f32),), dict(seqlen=4.0), TypeError, r"seqlen: expected an int"),
        ("seq_idx dtype", lambda: (torch.randn(2, 5, 16, **f32),), dict(seq_idx=torch.zeros(2, 5)), TypeError,
         r"seq_idx: expected an integer dtype"),
        ("seq_idx shape", lambda: (torch.randn(2, 5, 16, **f32),),
         dict(seq_idx=torch.zeros(2, 4, dtype=torch.int32)), ValueError, r"seq_idx: expected shape \(B, L\) = \(2, 5\)"),
        ("seq_idx type", lambda: (torch.randn(1, 3, 16, **f32),), dict(seq_idx=[0, 0, 0]), TypeError,
         r"seq_idx: expected a torch.Tensor"),
        ("inference_params", lambda: (torch.randn(1, 3, 16, **f32),), dict(inference_params=object()),
         NotImplementedError, r"inference_params"),
        ("cu_seqlens", lambda: (torch.randn(1, 3, 16, **f32),), dict(cu_seqlens=torch.tensor([0, 3])),
         NotImplementedError, r"cu_seqlens"),
    ]


@pytest.mark.parametrize("name,make_args,kwargs,exc,pattern", _bad_forward_cases(),
                         ids=[c[0] for c in _bad_forward_cases()])
def test_forward_rejects_before_computing(name, make_args, kwargs, exc, pattern):
    layer = make_layer(seed=0, dtype=torch.float32, **BASE)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.raises(exc, match=pattern):
        layer(*make_args(), **kwargs)
    for k, v in layer.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in layer.parameters())


def test_seq_idx_values_are_checked_only_on_request():
    """The values of seq_idx are read on the host only when asked (validate_seq_idx, or the layer attribute), so a
    forward has no device synchronisation by default; asked, a decreasing row is refused before anything runs."""
    layer = make_layer(seed=0, dtype=torch.float32, **BASE)
    u = torch.randn(2, 4, 16)
    falling = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.int32)
    assert not layer.validate_seq_idx
    assert layer(u, seq_idx=falling).shape == u.shape  # not checked by default (no host read)
    layer.validate_seq_idx = True
    with pytest.raises(ValueError, match=r"^seq_idx: expected non-decreasing ids .* row 1 from 1 to 0 at position 3$"):
        layer(u, seq_idx=falling)
    assert layer(u, seq_idx=torch.tensor([[0, 0, 1, 1], [0, 1, 1, 2]], dtype=torch.int32)).shape == u.shape
    with pytest.raises(ValueError, match=r"^seq_idx: expected non-decreasing ids .* row 1 from 1 to 0 at position 3$"):
        validate_seq_idx(falling)
    validate_seq_idx(torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^seq_idx: expected an integer dtype"):
        validate_seq_idx(falling.float())
    with pytest.raises(ValueError, match=r"^seq_idx: expected a 2-d tensor \[B, L\], got shape \(4,\)"):
        validate_seq_idx(falling[0])


def test_step_and_inference_cache_not_supported():
    layer = OrderedMamba2(**BASE)
    with pytest.raises(NotImplementedError, match="step"):
        layer.step(None, None, None)
    with pytest.raises(NotImplementedError, match="allocate_inference_cache"):
        layer.allocate_inference_cache(1, 8)
