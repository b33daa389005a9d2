"""torch.compile and CUDA graphs of OrderedMamba2 on the GPU.

* ``torch.compile(model, fullgraph=True)`` (inductor) of a model of two layers traces without a graph break and its
  forward + backward give the eager bits (output, input gradient, every parameter gradient), repeatedly: bf16 and
  fp32, ``use_mem_eff_path`` True and False, with and without ``seq_idx``, the gated-MLP branch, CUDA autocast;
* ``mode="reduce-overhead"`` (CUDA graphs through inductor's cudagraph trees) replays several steps with the eager
  bits, and no graph was skipped, with and without ``seq_idx``;
* one eager training step (forward + backward) captured with ``torch.cuda.graph`` replays with the eager bits, for
  two different inputs copied into the static ones (no host synchronisation in the step), with and without
  ``seq_idx`` (a static ``seq_idx`` tensor; the conv backward reads it on the device only);
* ``torch.cuda.make_graphed_callables`` of the model (forward and backward graphs) replays steps with the eager bits,
  with and without ``seq_idx``;
* a training step, with and without ``seq_idx``, makes no synchronising CUDA call
  (``torch.cuda.set_sync_debug_mode``);
* the custom ops pass ``torch.library.opcheck`` (schema and no undeclared mutation, autograd registration, the
  fakes against the real outputs, AOT dispatch with dynamic shapes against eager).
"""
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ordered_ssd import OrderedMamba2
from tests.helpers import bits_equal

pytestmark = pytest.mark.native_timing  # compile and CUDA-graph capture with the rule's timing on, as users run them

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository root
B, L = 3, 200
BASE = dict(d_model=256, d_state=64, headdim=64, chunk_size=64)


class TwoLayers(torch.nn.Module):
    def __init__(self, dtype, **extra):
        super().__init__()
        torch.manual_seed(0)
        self.a = OrderedMamba2(**BASE, layer_idx=0, device="cuda", **extra)
        self.b = OrderedMamba2(**BASE, layer_idx=1, device="cuda", **extra)
        with torch.no_grad():  # move the constant initialisations so every gradient path carries signal
            for p in self.parameters():
                p.add_(0.05 * torch.randn_like(p))
        self.to(dtype)

    def forward(self, u, seq_idx=None):
        return self.b(self.a(u, seq_idx=seq_idx), seq_idx=seq_idx)


def _inputs(dtype, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    u = torch.randn(B, L, BASE["d_model"], device="cuda", dtype=dtype, generator=g)
    dout = torch.randn(B, L, BASE["d_model"], device="cuda", dtype=dtype, generator=g)
    return u, dout


def _seq_idx():
    rows = [[0] * 70 + [1] * 130, [0] * L, [0] * 5 + [1] * 64 + [2] * 100 + [3] * 31]
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def _step(model, fn, u, dout, seq_idx=None):
    model.zero_grad(set_to_none=True)
    uu = u.clone().requires_grad_(True)
    out = fn(uu, seq_idx=seq_idx)
    out.backward(dout)
    res = {"out": out.detach().clone(), "u": uu.grad.detach().clone()}
    res.update({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    return res


def _assert_bits(got, want, what):
    assert sorted(got) == sorted(want), what
    assert [n for n in want if not bits_equal(got[n], want[n])] == [], what


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


COMPILE_CASES = [
    (torch.bfloat16, dict(use_mem_eff_path=True)),
    (torch.bfloat16, dict(use_mem_eff_path=False)),
    (torch.float32, dict(use_mem_eff_path=True)),
    (torch.float32, dict(use_mem_eff_path=False)),
    (torch.bfloat16, dict(use_mem_eff_path=True, d_ssm=256, bias=True)),  # gated MLP branch, fused
    (torch.bfloat16, dict(use_mem_eff_path=False, d_ssm=256, rmsnorm=False, bias=True)),  # silu_mul, z gate
]
GRAPH_CASES = [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)]
GRAPH_IDS = ["bf16-mem_eff", "bf16-unfused", "fp32-mem_eff"]
COMPILE_IDS = [f"{str(d)[6:]}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for d, kw in COMPILE_CASES]


@pytest.mark.parametrize("dtype,extra", COMPILE_CASES, ids=COMPILE_IDS)
@pytest.mark.parametrize("packed", [False, True], ids=["no-seq_idx", "seq_idx"])
def test_compiled_model_gives_the_eager_bits(dtype, extra, packed, fresh_dynamo):
    model = TwoLayers(dtype, **extra)
    u, dout = _inputs(dtype)
    seq_idx = _seq_idx() if packed else None
    eager = _step(model, model, u, dout, seq_idx)
    assert len(eager) == len(list(model.parameters())) + 2
    assert all(torch.isfinite(t.float()).all() for t in eager.values())
    compiled = torch.compile(model, fullgraph=True)
    for i in range(3):
        _assert_bits(_step(model, compiled, u, dout, seq_idx), eager, f"compiled step {i}")
    _assert_bits(_step(model, model, u, dout, seq_idx), eager, "eager after compiling")


def test_compiled_model_under_autocast_gives_the_eager_bits(fresh_dynamo):
    model = TwoLayers(torch.float32)
    u, dout = _inputs(torch.float32)
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = _step(model, model, u, dout.bfloat16())
        assert eager["out"].dtype == torch.bfloat16 and eager["a.in_proj.weight"].dtype == torch.float32
        for i in range(2):
            _assert_bits(_step(model, compiled, u, dout.bfloat16()), eager, f"compiled autocast step {i}")


def test_compile_first_in_a_fresh_process():
    """In a fresh process whose first call of the layer is the compiled one (the native extras are imported and
    checked while dynamo traces: the check is a constant for it), fullgraph=True works and gives the eager bits."""
    script = textwrap.dedent("""
        import json, torch
        from tests.gpu.modules.test_compile import TwoLayers, _inputs, _step
        from tests.helpers import sha256
        model = TwoLayers(torch.bfloat16)
        u, dout = _inputs(torch.bfloat16)
        comp = _step(model, torch.compile(model, fullgraph=True), u, dout)
        eager = _step(model, model, u, dout)
        print(json.dumps({k: [sha256(comp[k]), sha256(eager[k])] for k in eager}))
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600,
                         cwd=ROOT, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    pairs = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(pairs) == 2 + len(list(TwoLayers(torch.bfloat16).parameters()))
    assert {k: v for k, v in pairs.items() if v[0] != v[1]} == {}


@pytest.mark.parametrize("dtype,mem_eff", GRAPH_CASES, ids=GRAPH_IDS)
@pytest.mark.parametrize("packed", [False, True], ids=["no-seq_idx", "seq_idx"])
def test_reduce_overhead_replays_give_the_eager_bits(dtype, mem_eff, packed, fresh_dynamo):
    """Inductor's CUDA graphs: the first calls warm up and record, the later ones replay; every step (two inputs in
    turn, static shapes) gives the eager bits, no graph was skipped and graphs were recorded (inductor's counters)."""
    from torch._dynamo.utils import counters

    model = TwoLayers(dtype, use_mem_eff_path=mem_eff)
    inputs = [_inputs(dtype, seed=s) for s in (1, 2)]
    seq_idx = _seq_idx() if packed else None
    eager = [_step(model, model, u, dout, seq_idx) for u, dout in inputs]
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for i in range(6):
        torch.compiler.cudagraph_mark_step_begin()
        u, dout = inputs[i % 2]
        _assert_bits(_step(model, compiled, u, dout, seq_idx), eager[i % 2], f"reduce-overhead step {i}")
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    # graphs were recorded (u and dout are copied into static inputs: the counter inductor keeps while recording)
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] > 0, dict(counters["inductor"])


@pytest.mark.parametrize("dtype,mem_eff", GRAPH_CASES, ids=GRAPH_IDS)
@pytest.mark.parametrize("packed", [False, True], ids=["no-seq_idx", "seq_idx"])
def test_cuda_graph_capture_of_a_training_step_gives_the_eager_bits(dtype, mem_eff, packed):
    """torch.cuda.graph of forward + backward of the eager model (warm-up on a side stream first, as the torch
    docs require); replays with two inputs copied into the static ones give the eager bits of each. With
    ``seq_idx`` (a static tensor captured with the graph) the step reads it on the device only."""
    model = TwoLayers(dtype, use_mem_eff_path=mem_eff)
    inputs = [_inputs(dtype, seed=s) for s in (1, 2)]
    seq_idx = _seq_idx() if packed else None
    eager = [_step(model, model, u, dout, seq_idx) for u, dout in inputs]

    static_u = inputs[0][0].clone().requires_grad_(True)
    static_dout = inputs[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            static_u.grad = None
            model(static_u, seq_idx=seq_idx).backward(static_dout)
    torch.cuda.current_stream().wait_stream(side)

    model.zero_grad(set_to_none=True)
    static_u.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_u, seq_idx=seq_idx)
        static_out.backward(static_dout)
    static = {"out": static_out, "u": static_u.grad}
    static.update({n: p.grad for n, p in model.named_parameters()})
    assert all(t is not None for t in static.values())

    for i in range(4):
        u, dout = inputs[i % 2]
        with torch.no_grad():
            static_u.copy_(u)
            static_dout.copy_(dout)
        graph.replay()
        torch.cuda.synchronize()
        _assert_bits({k: v.detach().clone() for k, v in static.items()}, eager[i % 2], f"replay {i}")
    del graph


@pytest.mark.parametrize("mem_eff,packed", [(True, False), (False, True)], ids=["mem_eff", "unfused-seq_idx"])
def test_make_graphed_callables_of_the_model_gives_the_eager_bits(mem_eff, packed):
    """torch.cuda.make_graphed_callables(model, sample_args): the forward and the backward are captured as two
    graphs (after the function's own warm-up iterations) and the module's forward replays them; two inputs in turn,
    each step's output and every gradient (accumulated into ``.grad`` by autograd from the backward graph's static
    outputs) have the eager bits. With ``seq_idx`` it is a positional sample argument (int32, no gradient), the
    way make_graphed_callables takes arguments."""
    dtype = torch.bfloat16
    model = TwoLayers(dtype, use_mem_eff_path=mem_eff)
    inputs = [_inputs(dtype, seed=s) for s in (1, 2)]
    seq_idx = _seq_idx() if packed else None
    eager = [_step(model, model, u, dout, seq_idx) for u, dout in inputs]

    sample = (inputs[0][0].clone().requires_grad_(True),) + ((seq_idx,) if packed else ())
    graphed = torch.cuda.make_graphed_callables(model, sample)
    assert graphed is model and "forward" in vars(model)  # the instance's forward now replays the graphs

    def call(u, seq_idx=None):
        return graphed(u) if seq_idx is None else graphed(u, seq_idx)

    probe = call(inputs[0][0].clone().requires_grad_(True), seq_idx)  # the graphs' autograd function, not eager
    assert type(probe.grad_fn).__name__ == "GraphedBackward", type(probe.grad_fn)
    del probe

    for i in range(4):
        u, dout = inputs[i % 2]
        _assert_bits(_step(model, call, u, dout, seq_idx), eager[i % 2], f"graphed step {i}")


@pytest.mark.parametrize("mem_eff", [True, False])
@pytest.mark.parametrize("packed", [False, True], ids=["no-seq_idx", "seq_idx"])
def test_training_step_has_no_host_synchronisation(mem_eff, packed):
    """A training step, with and without seq_idx (after a first step that compiles the kernels), runs under
    torch.cuda.set_sync_debug_mode("error"), which raises on any synchronising CUDA call; the positive control
    (.item()) shows that the mode is on."""
    model = TwoLayers(torch.bfloat16, use_mem_eff_path=mem_eff)
    u, dout = _inputs(torch.bfloat16)
    seq_idx = _seq_idx() if packed else None
    first = _step(model, model, u, dout, seq_idx)
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        with pytest.raises(RuntimeError, match="synchroniz"):
            torch.ones(1, device="cuda").item()
        model.zero_grad(set_to_none=True)
        uu = u.clone().requires_grad_(True)
        out = model(uu, seq_idx=seq_idx)
        out.backward(dout)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    again = {"out": out.detach(), "u": uu.grad}
    again.update({n: p.grad for n, p in model.named_parameters()})
    _assert_bits(again, first, "step under sync debug mode")


# ------------------------------------------------------------------------------------------------- opcheck
def _t(g, *shape, dtype=torch.bfloat16, scale=0.5, grad=True):
    t = (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)
    return t.requires_grad_(grad)


def _op_cases():
    g = torch.Generator(device="cuda").manual_seed(7)
    Bs, Ls, H, P, G, N, W, cs = 2, 40, 4, 32, 1, 16, 4, 16
    d_ssm = H * P
    conv_dim = d_ssm + 2 * G * N
    inf = math.inf
    A = (-torch.exp(torch.rand(H, device="cuda", generator=g))).requires_grad_(True)
    dt_bias = _t(g, H, dtype=torch.float32, scale=0.1)
    seq_idx = torch.zeros(Bs, Ls, dtype=torch.int32, device="cuda")
    seq_idx[0, 13:] = 1
    seq_idx[1, 30:] = 1
    cases = {
        "linear": (torch.ops.ordered_ssd.linear.default, lambda: (_t(g, Bs, Ls, 64), _t(g, 96, 64), _t(g, 96), None,
                                                                  False)),
        "linear_row_invariant": (torch.ops.ordered_ssd.linear.default, lambda: (
            _t(g, Bs, Ls, 64), _t(g, 96, 64), _t(g, 96), None, True)),
        "causal_conv1d": (torch.ops.ordered_ssd.causal_conv1d.default, lambda: (
            _t(g, Bs, Ls, conv_dim).transpose(1, 2), _t(g, conv_dim, W), _t(g, conv_dim), None, True, None)),
        "causal_conv1d_seq_idx": (torch.ops.ordered_ssd.causal_conv1d.default, lambda: (
            _t(g, Bs, Ls, conv_dim).transpose(1, 2), _t(g, conv_dim, W), _t(g, conv_dim), seq_idx, True, None)),
        "gated_rmsnorm": (torch.ops.ordered_ssd.gated_rmsnorm.default, lambda: (
            _t(g, Bs, Ls, d_ssm), _t(g, d_ssm, scale=1.0), _t(g, Bs, Ls, d_ssm), 1e-5, d_ssm // 2, False, cs, None)),
        # (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit,
        #  return_final_states, return_varlen_states, literal, autocast)
        "chunk_scan": (torch.ops.ordered_ssd.mamba_chunk_scan_combined.default, lambda: (
            _t(g, Bs, Ls, H, P), _t(g, Bs, Ls, H), A, _t(g, Bs, Ls, G, N), _t(g, Bs, Ls, G, N),
            cs, _t(g, H, dtype=torch.float32), _t(g, Bs, Ls, H, P), dt_bias, None, None, None, True, [0.0, inf],
            False, False, False, None)),
        "chunk_scan_states": (torch.ops.ordered_ssd.mamba_chunk_scan_combined.default, lambda: (
            _t(g, Bs, Ls, H, P), _t(g, Bs, Ls, H), A, _t(g, Bs, Ls, G, N), _t(g, Bs, Ls, G, N),
            cs, _t(g, H, dtype=torch.float32), None, dt_bias, _t(g, Bs, H, P, N, dtype=torch.float32), seq_idx,
            None, True, [0.0, inf], True, False, False, None)),
        # (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx, dt_limit,
        #  return_final_states, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias, headdim,
        #  ngroups, norm_before_gate, literal, autocast)
        "split_conv1d_scan": (torch.ops.ordered_ssd.mamba_split_conv1d_scan_combined.default, lambda: (
            _t(g, Bs, Ls, 2 * d_ssm + 2 * G * N + H), _t(g, conv_dim, W), _t(g, conv_dim), dt_bias, A,
            _t(g, H, dtype=torch.float32), cs, None, None, [0.0, inf], False, "silu", _t(g, d_ssm, scale=1.0), 1e-5,
            _t(g, 64, d_ssm, scale=0.05), None, P, G, False, False, None)),
        "split_conv1d_scan_states": (torch.ops.ordered_ssd.mamba_split_conv1d_scan_combined.default, lambda: (
            _t(g, Bs, Ls, 2 * d_ssm + 2 * G * N + H), _t(g, conv_dim, W), _t(g, conv_dim), dt_bias, A,
            _t(g, H, dtype=torch.float32), cs, _t(g, Bs, H, P, N), seq_idx, [0.0, inf], True, "silu",
            _t(g, d_ssm, scale=1.0), 1e-5, _t(g, 64, d_ssm, scale=0.05), None, P, G, False, False, None)),
        "A_from_log": (torch.ops.ordered_ssd.A_from_log.default, lambda: (_t(g, H, dtype=torch.float32),)),
        # under bf16 autocast with fp32 operands: the ops return their casts (saved for the backward) beside the output
        "linear_autocast": (torch.ops.ordered_ssd.linear.default, lambda: (
            _t(g, Bs, Ls, 64, dtype=torch.float32), _t(g, 96, 64, dtype=torch.float32),
            _t(g, 96, dtype=torch.float32), torch.bfloat16, False)),
        "split_conv1d_scan_autocast": (torch.ops.ordered_ssd.mamba_split_conv1d_scan_combined.default, lambda: (
            _t(g, Bs, Ls, 2 * d_ssm + 2 * G * N + H), _t(g, conv_dim, W), _t(g, conv_dim), dt_bias, A,
            _t(g, H, dtype=torch.float32), cs, None, None, [0.0, inf], False, "silu", _t(g, d_ssm, scale=1.0), 1e-5,
            _t(g, 64, d_ssm, scale=0.05, dtype=torch.float32), _t(g, 64, dtype=torch.float32), P, G, False, False,
            torch.bfloat16)),
    }
    return cases


OPS = ["linear", "causal_conv1d", "causal_conv1d_seq_idx", "gated_rmsnorm", "chunk_scan", "chunk_scan_states",
       "split_conv1d_scan", "split_conv1d_scan_states", "A_from_log", "linear_autocast", "split_conv1d_scan_autocast"]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("checks", [("test_schema", "test_autograd_registration", "test_faketensor"),
                                    ("test_aot_dispatch_dynamic",)], ids=["schema-autograd-fake", "aot-dynamic"])
def test_custom_op_passes_opcheck(name, checks):
    op, make_args = _op_cases()[name]
    torch.library.opcheck(op, make_args(), test_utils=checks)
