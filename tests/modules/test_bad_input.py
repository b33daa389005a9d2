"""Every bad argument raises a clear error naming it, before anything is computed or written."""
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import make_layer, to_fake_cuda
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a build or machine without CUDA")
def test_cuda_device_without_cuda_is_refused_before_any_parameter():
    with pytest.raises(ValueError, match=r"^device: expected an available device, got 'cuda', but "
                                         r"torch\.cuda\.is_available\(\) is False"):
        OrderedMamba2(**BASE, device="cuda")


@pytest.mark.parametrize("value", [True, False, 0, 1, torch.tensor(True), None], ids=str)
def test_flags_take_what_mamba2_takes_as_a_truth_value(value):
    """Mamba2 uses its flags as truth values: bools, 0/1, a 0-d bool tensor (numpy bools alike) and None pass."""
    layer = OrderedMamba2(**BASE, bias=value, use_mem_eff_path=value)
    assert (layer.in_proj.bias is not None) == bool(value) and bool(layer.use_mem_eff_path) == bool(value)


@pytest.mark.parametrize("value,kind", [("no", "str"), (2, "int"), (torch.ones(2), "Tensor")])
def test_flags_refuse_other_values(value, kind):
    with pytest.raises(TypeError, match=rf"^rmsnorm: expected a bool \(or 0/1, or None for False\), got {kind} "):
        OrderedMamba2(**BASE, rmsnorm=value)


@pytest.mark.parametrize("device,exc,pattern", [
    (1.5, TypeError, r"^device: expected None, a torch\.device, a str or an int, got float 1\.5$"),
    ("gpu0", ValueError, r"^device: expected None, a torch\.device or a device string such as 'cuda', got 'gpu0' "
                         r"\([^\n]*\)$"),
])
def test_device_errors_are_one_line(device, exc, pattern):
    with pytest.raises(exc, match=pattern):
        OrderedMamba2(**BASE, device=device)


def test_process_group_not_supported():
    with pytest.raises(NotImplementedError, match="process_group"):
        OrderedMamba2(**BASE, process_group=object())


def _params(offset):
    """A stand-in for mamba-ssm's InferenceParams (the fields the layer reads)."""
    return SimpleNamespace(key_value_memory_dict={}, seqlen_offset=offset)


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
        ("inference_params type", lambda: (torch.randn(1, 3, 16, **f32),), dict(inference_params=object()),
         TypeError, r"^inference_params: expected an object with a dict key_value_memory_dict and an int "
                    r"seqlen_offset"),
        ("seqlen_offset < 0", lambda: (torch.randn(1, 3, 16, **f32),), dict(inference_params=_params(-1)),
         ValueError, r"^inference_params.seqlen_offset: expected an int >= 0, got -1"),
        ("layer_idx None", lambda: (torch.randn(1, 3, 16, **f32),), dict(inference_params=_params(0)),
         ValueError, r"^layer_idx: expected an int \(the key of this layer's cache in inference_params\), got None"),
        ("cu_seqlens start", lambda: (torch.randn(1, 3, 16, **f32),), dict(cu_seqlens=torch.tensor([1, 3])),
         ValueError, r"^cu_seqlens: expected cu_seqlens\[0\] == 0, got 1"),
        ("cu_seqlens end", lambda: (torch.randn(1, 3, 16, **f32),), dict(cu_seqlens=torch.tensor([0, 2])),
         ValueError, r"^cu_seqlens: expected cu_seqlens\[-1\] == B \* L = 3, got 2"),
        ("cu_seqlens empty sequence", lambda: (torch.randn(1, 3, 16, **f32),),
         dict(cu_seqlens=torch.tensor([0, 2, 2, 3])), ValueError, r"^cu_seqlens: expected strictly increasing"),
        ("cu_seqlens batch", lambda: (torch.randn(2, 3, 16, **f32),), dict(cu_seqlens=torch.tensor([0, 6])),
         ValueError, r"^cu_seqlens: expected batch size 1 .*got B=2"),
        ("cu_seqlens dtype", lambda: (torch.randn(1, 3, 16, **f32),), dict(cu_seqlens=torch.tensor([0.0, 3.0])),
         TypeError, r"^cu_seqlens: expected an integer dtype"),
        ("cu_seqlens rank", lambda: (torch.randn(1, 3, 16, **f32),), dict(cu_seqlens=torch.tensor([[0, 3]])),
         ValueError, r"^cu_seqlens: expected a 1-d tensor of S \+ 1 >= 2 offsets, got shape \(1, 2\)"),
        ("cu_seqlens vs seq_idx", lambda: (torch.randn(1, 3, 16, **f32),),
         dict(cu_seqlens=torch.tensor([0, 1, 3]), seq_idx=torch.tensor([[0, 0, 1]], dtype=torch.int32)), ValueError,
         r"^seq_idx: expected ids that change exactly at the offsets of cu_seqlens"),
        ("cu_seqlens without seq_idx", lambda: (torch.randn(1, 3, 16, **f32),),
         dict(cu_seqlens=torch.tensor([0, 1, 3]), inference_params=_params(0)), ValueError,
         r"^seq_idx: required with cu_seqlens and inference_params"),
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



def test_backend_attribute_is_validated_and_forces_the_path(monkeypatch):
    layer = OrderedMamba2(d_model=16, d_state=8, headdim=8, chunk_size=8)
    u = torch.randn(1, 4, 16)
    layer.backend = "fast"
    with pytest.raises(ValueError, match=r"backend: expected None, 'cuda' or 'reference', got 'fast'"):
        layer(u)
    layer.backend = "cuda"
    with pytest.raises(ValueError, match=r"u: expected a CUDA tensor \(layer.backend is 'cuda'\), got device cpu"):
        layer(u)
    layer.backend = "reference"
    assert layer.backend_for(u) == "reference"


def test_cuda_without_the_extras_raises_instead_of_falling_back(monkeypatch):
    """A CUDA fp32/bf16/fp16 input never silently runs the reference: without the CUDA path the layer raises the
    probe's own exception type with the reason (checked here with a stand-in probe and a stand-in CUDA tensor)."""
    from ordered_ssd.modules import mamba2 as mod

    layer = OrderedMamba2(d_model=16, d_state=8, headdim=8, chunk_size=8)
    monkeypatch.setattr(mod, "_cuda_status", (False, "mamba_ssm is not installed", ImportError))

    class FakeCuda:
        device = torch.device("cuda")
        dtype = torch.bfloat16

    with pytest.raises(ImportError, match=r"cannot run here: mamba_ssm is not installed\. .*layer.backend = "
                                          r"'reference'"):
        layer.backend_for(FakeCuda())
    layer.backend = "reference"
    assert layer.backend_for(FakeCuda()) == "reference"
    assert mod.cuda_path_available() == (False, "mamba_ssm is not installed")



class _Reached(Exception):
    """Raised by a stand-in for a compute path: the checks let the call through to it."""


def _fake_cuda_layer(dtype, backend):
    """A layer of ``dtype`` whose parameters are fake CUDA tensors (enter a FakeTensorMode first), with
    ``layer.backend`` set and both compute paths replaced by stand-ins that raise :class:`_Reached`."""
    layer = OrderedMamba2(**BASE, device="meta", dtype=dtype)
    layer.backend = backend
    to_fake_cuda(layer)

    def reached(path):
        def stand_in(*args, **kwargs):
            raise _Reached(path)
        return stand_in
    layer._check_cuda_path = lambda *a: None
    layer._forward_cuda, layer._forward_reference = reached("cuda"), reached("reference")
    return layer


_BF16, _FP16, _FP32, _FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
_WRONG_PARAMS = (r"^the layer's parameters: expected dtype in \({}\) with layer\.backend = '{}', got {} \({} layers "
                 r"run on ")
_CUDA_DTYPES = r"torch\.float32, torch\.float16, torch\.bfloat16"
_REF_DTYPES = r"torch\.float32, torch\.float64"


@pytest.mark.parametrize("backend,dtype,u_dtype,outcome", [
    # the path chosen by the input (backend None): a good input reaches its path; else the input is told the
    # layer's dtype, which then reaches a path
    (None, _BF16, _BF16, "cuda"), (None, _FP16, _FP16, "cuda"), (None, _FP32, _FP32, "cuda"),
    (None, _FP64, _FP64, "reference"),
    (None, _BF16, _FP64, r"^u: expected dtype torch\.bfloat16 \(the dtype of the layer's parameters\), got "),
    (None, _BF16, _FP32, r"^u: expected dtype torch\.bfloat16 \(the dtype of the layer's parameters\), got "),
    (None, _FP64, _FP32, r"^u: expected dtype torch\.float64 \(the dtype of the layer's parameters\), got "),
    # the path asked for: a layer dtype it cannot run gets one error, whatever the input's dtype
    ("reference", _FP32, _FP32, "reference"), ("reference", _FP64, _FP64, "reference"),
    *[("reference", d, ud, _WRONG_PARAMS.format(_REF_DTYPES, "reference", "torch\\." + n, "torch\\." + n)
       + r"the CUDA path here: set layer\.backend = None, or call \.float\(\)\)$")
      for d, n in ((_BF16, "bfloat16"), (_FP16, "float16")) for ud in (_BF16, _FP16, _FP32)],
    ("cuda", _BF16, _BF16, "cuda"),
    *[("cuda", _FP64, ud, _WRONG_PARAMS.format(_CUDA_DTYPES, "cuda", r"torch\.float64", r"torch\.float64")
       + r"the reference backend here: set layer\.backend = None, or call \.float\(\)\)$")
      for ud in (_FP64, _FP32)],
])
@pytest.mark.parametrize("entry", ["forward", "step"])
def test_the_layer_dtype_and_the_backend_on_cuda(backend, dtype, u_dtype, outcome, entry, monkeypatch):
    """On CUDA (fake tensors: the checks run before any computation), a layer whose ``backend`` was set to a path
    that cannot run its dtype gets one error that says what to do; with ``backend`` None the input's dtype chooses
    the path and a mismatch names the layer's dtype. The forward and one decoding step check alike."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ordered_ssd.modules import _decode
    from ordered_ssd.modules import mamba2 as mod

    monkeypatch.setattr(mod, "_cuda_status", (True, "", None))  # as on a machine with the native extras
    monkeypatch.setattr(_decode, "_step_cuda", lambda *a: (_ for _ in ()).throw(_Reached("cuda")))
    monkeypatch.setattr(_decode, "reference_mamba2_step", lambda *a: (_ for _ in ()).throw(_Reached("reference")))
    monkeypatch.setattr(_decode, "check_cache", lambda *a: None)
    with FakeTensorMode(allow_non_fake_inputs=True):
        layer = _fake_cuda_layer(dtype, backend)
        u = torch.empty(2, 1 if entry == "step" else 5, 16, dtype=u_dtype, device="cuda")
        call = (lambda: layer.step(u, u, u)) if entry == "step" else (lambda: layer(u))
        if outcome in ("cuda", "reference"):
            with pytest.raises(_Reached) as reached:
                call()
            assert str(reached.value) == outcome
        else:
            with pytest.raises(TypeError, match=outcome.replace("^u:", "^hidden_states:") if entry == "step"
                               else outcome):
                call()


def test_decoding_rejects_bad_input_before_computing():
    layer = make_layer(seed=0, dtype=torch.float32, layer_idx=3, **BASE)
    conv_state, ssm_state = layer.allocate_inference_cache(2, 8)
    u = torch.randn(2, 1, 16)
    cases = [
        (lambda: layer.step(torch.randn(2, 2, 16), conv_state, ssm_state), ValueError,
         r"^hidden_states: expected \[B, 1, d_model\] \(one token per example\), got \(2, 2, 16\)"),
        (lambda: layer.step(u.double(), conv_state, ssm_state), TypeError, r"^hidden_states: expected dtype torch.float32"),
        (lambda: layer.step(u, conv_state[:1], ssm_state), ValueError,
         r"^conv_state: expected shape \(2, 48, 4\), got \(1, 48, 4\)"),
        (lambda: layer.step(u, conv_state, ssm_state[..., :3]), ValueError, r"^ssm_state: expected shape"),
        (lambda: layer.step(u, conv_state, ssm_state.int()), TypeError, r"^ssm_state: expected a floating dtype"),
        (lambda: layer.step(u, conv_state, None), TypeError, r"^ssm_state: expected a torch.Tensor, got NoneType"),
        (lambda: layer.allocate_inference_cache(0, 8), ValueError, r"^batch_size: expected an int >= 1, got 0"),
        (lambda: layer.allocate_inference_cache(2, 8, dtype=torch.int32), TypeError, r"^dtype: expected None or a "
                                                                                     r"floating torch.dtype"),
        (lambda: layer(torch.randn(2, 3, 16), inference_params=_params(1)), ValueError,
         r"^hidden_states: expected \[B, 1, d_model\]"),
    ]
    before = (conv_state.clone(), ssm_state.clone())
    for call, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            call()
    assert torch.equal(conv_state, before[0]) and torch.equal(ssm_state, before[1])
    params = _params(0)
    layer(torch.randn(2, 3, 16), inference_params=params)  # a prefill for 2 examples fills the cache ...
    params.seqlen_offset = 3
    with pytest.raises(ValueError, match=r"^conv_state: expected shape \(3, 48, 4\), got \(2, 48, 4\)"):
        layer(torch.randn(3, 1, 16), inference_params=params)  # ... a step for 3 is refused
