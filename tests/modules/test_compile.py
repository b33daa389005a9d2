"""torch.compile(model, fullgraph=True) of OrderedMamba2 on the CPU: no graph break (fullgraph raises on one), and
the compiled forward + backward give the eager bits (output, input gradient, every parameter gradient), repeatedly;
the CUDA path traces without a graph break too (dynamo with fake CUDA tensors: no GPU needed, forward only)."""
import pytest
import torch

from tests.helpers import bits_equal, make_layer, to_fake_cuda
from ordered_ssd import OrderedMamba2

CFG = dict(d_model=16, d_state=8, headdim=8, chunk_size=8)


class TwoLayers(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.a = make_layer(seed=1, dtype=torch.float32, **CFG, **kw)
        self.b = make_layer(seed=2, dtype=torch.float32, **CFG, **kw)

    def forward(self, u, seq_idx=None):
        return self.b(self.a(u, seq_idx=seq_idx), seq_idx=seq_idx)


def _step(model, fn, u, dout, seq_idx):
    model.zero_grad(set_to_none=True)
    uu = u.clone().requires_grad_(True)
    out = fn(uu, seq_idx=seq_idx)
    out.backward(dout)
    res = {"out": out.detach().clone(), "u": uu.grad.clone()}
    res.update({n: p.grad.clone() for n, p in model.named_parameters()})
    return res


def _inputs(seqlen=13):
    g = torch.Generator().manual_seed(5)
    u = torch.randn(3, seqlen, CFG["d_model"], generator=g)
    dout = torch.randn(3, seqlen, CFG["d_model"], generator=g)
    seq_idx = torch.tensor([[0] * 5 + [1] * (seqlen - 5), [0] * seqlen, [0, 1, 2] + [3] * (seqlen - 3)],
                           dtype=torch.int32)
    return u, dout, seq_idx


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kw", [{}, dict(bias=True, D_has_hdim=True, ngroups=2, d_ssm=16, rmsnorm=False)],
                         ids=["default", "options"])
def test_compiled_model_gives_the_eager_bits(backend, kw, fresh_dynamo):
    model = TwoLayers(**kw)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    u, dout, seq_idx = _inputs()
    for s in (None, seq_idx):
        eager = _step(model, model, u, dout, s)
        assert len(eager) == len(list(model.parameters())) + 2
        for _ in range(2):
            comp = _step(model, compiled, u, dout, s)
            for name, t in eager.items():
                assert bits_equal(comp[name], t), (s is not None, name)


def test_compiled_layer_without_input_grad(fresh_dynamo):
    """The first layer of a model gets an input that does not require grad: only the parameter gradients."""
    layer = make_layer(seed=3, dtype=torch.float32, **CFG)
    u, dout, _ = _inputs()
    grads = []
    for fn in (layer, torch.compile(layer, fullgraph=True, backend="aot_eager")):
        layer.zero_grad(set_to_none=True)
        fn(u).backward(dout)
        grads.append({n: p.grad.clone() for n, p in layer.named_parameters()})
    for name, g in grads[0].items():
        assert bits_equal(grads[1][name], g), name


def test_validate_seq_idx_is_opt_in_under_compile(fresh_dynamo):
    """With the default (no host read of seq_idx) the layer traces with fullgraph=True; the opt-in check reads the
    values (a data-dependent branch), so it cannot be traced as one graph."""
    layer = make_layer(seed=3, dtype=torch.float32, **CFG)
    u, _, seq_idx = _inputs()
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(u, seq_idx=seq_idx)
    assert bits_equal(out, layer(u, seq_idx=seq_idx))
    layer.validate_seq_idx = True
    torch._dynamo.reset()
    with pytest.raises(Exception):  # noqa: B017 (dynamo's error type for a data-dependent branch varies)
        torch.compile(layer, fullgraph=True, backend="aot_eager")(u, seq_idx=seq_idx)


def _trace_cuda_path(**kw):
    """Compile an OrderedMamba2 on fake CUDA bf16 tensors with fullgraph=True and a backend that keeps the graph;
    returns ``(out, graphs)``. (A CPU build of torch cannot copy a fake CUDA tensor, so the shapes keep d_in_proj a
    multiple of 8: the conv input needs no copy.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = OrderedMamba2(**{**dict(d_model=64, d_state=16, headdim=16, chunk_size=16), **kw})
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with FakeTensorMode(allow_non_fake_inputs=True):
        to_fake_cuda(layer, torch.bfloat16)
        u = torch.empty(2, 48, 64, dtype=torch.bfloat16, device="cuda")
        seq_idx = torch.zeros(2, 48, dtype=torch.int32, device="cuda")
        assert layer.backend_for(u) == "cuda"
        out = torch.compile(layer, fullgraph=True, backend=backend)(u, seq_idx=seq_idx)
    return out, graphs


@pytest.mark.parametrize("kw", [dict(use_mem_eff_path=True), dict(use_mem_eff_path=False),
                                dict(use_mem_eff_path=False, d_ssm=64, headdim=8, rmsnorm=False, bias=True)],
                         ids=["mem_eff", "unfused", "unfused-mlp-zgate"])
def test_cuda_path_traces_as_one_graph(kw, monkeypatch, fresh_dynamo):
    """Dynamo traces the CUDA path (the custom ops, their fakes, the module code around them) with fake CUDA tensors
    and fullgraph=True, so no GPU is needed; the fakes give the output shape, dtype and strides."""
    import ordered_ssd.modules.mamba2 as mamba2

    monkeypatch.setattr(mamba2, "_cuda_status", (True, "", None))  # as on a machine with the native extras
    out, graphs = _trace_cuda_path(**kw)
    assert out.shape == (2, 48, 64) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
    assert out.stride() == (48 * 64, 64, 1)
    assert len(graphs) == 1
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    expected = {"ordered_ssd.linear.default", "ordered_ssd.A_from_log.default"}
    expected |= ({"ordered_ssd.mamba_split_conv1d_scan_combined.default"} if kw["use_mem_eff_path"] else
                 {"ordered_ssd.causal_conv1d.default", "ordered_ssd.mamba_chunk_scan_combined.default"})
    if kw.get("d_ssm"):
        expected.add("ordered_ssd.silu_mul.default")
    elif not kw["use_mem_eff_path"]:
        expected.add("ordered_ssd.gated_rmsnorm.default")
    assert expected <= targets, targets


def test_native_check_is_a_constant_for_dynamo(monkeypatch, fresh_dynamo):
    """Where CUDA is available, constructing a layer marks the native check (its first use imports and checks the
    extras, which dynamo cannot trace) as a constant: a check that would break the graph if traced is not."""
    import ordered_ssd.modules.mamba2 as mamba2

    def untraceable():
        torch._dynamo.graph_break()
        return (True, "", None)

    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        OrderedMamba2(d_model=16, d_state=8, headdim=8)  # construction where CUDA is available marks the check
    assert getattr(mamba2._cuda_path_ok, "_ordered_ssd_marked", False)
    monkeypatch.setattr(mamba2, "_cuda_path_status", untraceable)
    out, graphs = _trace_cuda_path()
    assert out.shape == (2, 48, 64) and len(graphs) == 1


@pytest.mark.filterwarnings("ignore:ordered-ssd. torch.autocast is on:UserWarning")  # tests/reference/test_autocast.py
def test_reference_path_ignores_cpu_autocast(fresh_dynamo):
    """The reference computes in its parameters' dtype under CPU autocast, eager and compiled alike (custom-op
    bodies run without autocast under torch.compile, and the op says so in eager mode too)."""
    layer = make_layer(seed=3, dtype=torch.float32, **CFG)
    u, dout, _ = _inputs()
    plain = _step(layer, layer, u, dout, None)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for fn in (layer, compiled):
            got = _step(layer, fn, u, dout, None)
            assert got["out"].dtype == torch.float32
            for name, t in plain.items():
                assert bits_equal(got[name], t), name
