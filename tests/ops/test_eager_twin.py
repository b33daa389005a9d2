"""The eager twin of each custom op (``ordered_ssd.ops.common.register_op_autograd``): in plain eager mode the public
functions apply an ``autograd.Function`` built from the custom op's own pieces; wherever something may trace the call
they call the custom op. Checked on the CPU: the two paths give the same bits (outputs and gradients) for the ops that
run on the CPU, and the same launches, argument for argument, for the CUDA compositions with the natives faked; the
dispatch rule; once-differentiability. (``tests/modules/test_compile.py`` checks that the traced graph holds the
custom ops; the GPU suite compares compiled against eager bits.)"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ordered_ssd.ops import common
from tests.helpers import bits_equal


def _twin_name(t):
    return type(t.grad_fn).__name__


def _run(fn, inputs, dout):
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return out, [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_ops_give_the_custom_op_bits_through_the_twin(dtype, monkeypatch):
    from ordered_ssd.ops import elementwise, linear

    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 5, 6, generator=g).to(dtype).requires_grad_()
    w = torch.randn(4, 6, generator=g).to(dtype).requires_grad_()
    b = torch.randn(4, generator=g).to(dtype)  # no grad: the bias gradient is not asked for
    A_log = torch.rand(7, generator=g).to(dtype).requires_grad_()
    z = torch.randn(2, 5, 6, generator=g).to(dtype).requires_grad_()
    cases = [(linear.ordered_linear, (x, w, b), torch.randn(3, 5, 4, generator=g).to(dtype)),
             (elementwise.ordered_A_from_log, (A_log,), torch.randn(7, generator=g)),
             (elementwise.ordered_silu_mul, (z, x[:2]), torch.randn(2, 5, 6, generator=g).to(dtype))]
    for fn, inputs, dout in cases:
        assert common.plain_eager(inputs)
        out_twin, grads_twin = _run(fn, inputs, dout)
        assert _twin_name(out_twin).startswith("Eager_"), _twin_name(out_twin)
        with monkeypatch.context() as m:
            m.setattr(common, "plain_eager", lambda args: False)
            out_op, grads_op = _run(fn, inputs, dout)
        assert _twin_name(out_op).startswith("GeneratedBackwardFor_ordered_ssd_"), _twin_name(out_op)
        assert out_twin.dtype == out_op.dtype and out_twin.stride() == out_op.stride()
        assert bits_equal(out_twin, out_op), fn.__name__
        for gt, go in zip(grads_twin, grads_op):
            assert (gt is None) == (go is None) and (gt is None or bits_equal(gt, go)), fn.__name__


def test_the_rule_picks_the_custom_op_where_something_may_trace():
    x = torch.zeros(2)
    assert common.plain_eager((x, torch.nn.Parameter(x), None, 3, [1.0]))
    with FakeTensorMode() as mode:
        assert not common.plain_eager((mode.from_tensor(x),))
    assert not common.plain_eager((mode.from_tensor(x),))  # a subclass, even outside its mode

    def inside_vmap(t):
        assert not common.plain_eager((t,))
        return t
    torch.func.vmap(inside_vmap)(torch.zeros(3, 2))
    seen = []

    @torch.compile(backend="eager", fullgraph=True)
    def compiled(t):
        seen.append(common.plain_eager((t,)))  # runs while dynamo traces
        return t + 1
    torch._dynamo.reset()
    try:
        compiled(x)
    finally:
        torch._dynamo.reset()
    assert seen == [False]


@pytest.mark.parametrize("twin", [True, False])
def test_a_double_backward_raises_as_through_the_custom_op(twin, monkeypatch):
    """With ``create_graph=True`` the gradients require grad (the inputs do) and differentiating them raises, both
    ways: never a silently missing second-order term."""
    from ordered_ssd.ops import ordered_silu_mul

    if not twin:
        monkeypatch.setattr(common, "plain_eager", lambda a: False)
    z = torch.randn(4, requires_grad=True)
    x = torch.randn(4, requires_grad=True)
    other = torch.randn(4, requires_grad=True)
    out = ordered_silu_mul(z, x)
    assert _twin_name(out).startswith("Eager_" if twin else "GeneratedBackwardFor_")
    (gz,) = torch.autograd.grad(out.sum(), z, create_graph=True)
    assert gz.requires_grad
    with pytest.raises(RuntimeError, match="once-differentiable" if twin else "no autograd formula"):
        (gz.sum() + other.sum()).backward()
    (gz,) = torch.autograd.grad(ordered_silu_mul(z, x).sum(), z)  # without create_graph: a plain gradient
    assert not gz.requires_grad


def test_cuda_compositions_launch_the_same_through_the_twin_and_the_custom_op(monkeypatch):
    """The fused layer op and the chunk-scan op (natives faked: the launch arguments are recorded, nothing is
    computed) launch the same kernels with the same arguments (shapes, strides, dtypes, scalars) both ways."""
    from ordered_ssd.ops import ordered_mamba_chunk_scan_combined, ordered_mamba_split_conv1d_scan_combined
    from tests.csrc_bindings.launch_record import fake_cuda_path

    log = []
    fake_cuda_path(monkeypatch, log)
    Bsz, L, H, P, G, N, CS = 2, 40, 4, 8, 2, 8, 16
    dim, conv_dim = H * P, H * P + 2 * G * N
    g = torch.Generator().manual_seed(3)

    def r(*shape):
        return torch.randn(*shape, generator=g)
    split_args = (r(Bsz, L, 2 * dim + 2 * G * N + H), r(conv_dim, 4), r(conv_dim), r(H), -torch.rand(H, generator=g),
                  r(H), CS)
    split_kw = dict(rmsnorm_weight=r(dim), outproj_weight=r(24, dim), headdim=P, ngroups=G)
    scan_args = (r(Bsz, L, H, P), r(Bsz, L, H), -torch.rand(H, generator=g), r(Bsz, L, G, N), r(Bsz, L, G, N), CS)
    scan_kw = dict(D=r(H), dt_bias=r(H), dt_softplus=True)

    def record(fn, args, kw):
        log.clear()
        leaves = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
        out = fn(*leaves, **kw)
        out.backward(torch.ones_like(out))
        grad_fn = type(out.grad_fn).__name__
        return grad_fn, [(e["kernel"], e.get("grid"), [
            (tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in e["args"]])
            for e in log]

    for fn, args, kw in ((ordered_mamba_split_conv1d_scan_combined, split_args, split_kw),
                         (ordered_mamba_chunk_scan_combined, scan_args, scan_kw)):
        twin_name, twin = record(fn, args, kw)
        with monkeypatch.context() as m:
            m.setattr(common, "plain_eager", lambda a: False)
            op_name, op = record(fn, args, kw)
        assert twin_name.startswith("Eager_") and op_name.startswith("GeneratedBackwardFor_")
        assert len(twin) > 10 and twin == op


def test_twin_forward_calls_setup_context_with_every_argument_and_apply_binds_nothing():
    """The twin's forward runs the body then ``setup_context(ctx, args, output)``, the arguments completed from the
    body's defaults when fewer are given; it declares no ``setup_context`` of its own, so ``Function.apply`` does not
    build ``inspect.signature`` at every call (the reason for the design)."""
    from torch.autograd.function import _is_setup_context_defined

    from ordered_ssd.ops import causal_conv1d, elementwise, layernorm_gated, linear, ssd_combined, ssd_split_conv1d

    seen = []

    def body(a, b, c=3, d=None):
        return a * b + c

    def setup(ctx, inputs, output):
        seen.append((inputs, output))
    fwd = common._forward_with_context(body, setup)
    assert fwd(None, 2, 5) == 13 and seen[-1] == ((2, 5, 3, None), 13)
    assert fwd(None, 2, 5, 1, "x") == 11 and seen[-1] == ((2, 5, 1, "x"), 11)
    with pytest.raises(TypeError):
        fwd(None, 2)  # b has no default: as torch's own binding would
    mods = (causal_conv1d, elementwise, layernorm_gated, linear, ssd_combined, ssd_split_conv1d)
    twins = [v for mod in mods for v in vars(mod).values()
             if isinstance(v, type) and issubclass(v, torch.autograd.Function) and v.__name__.startswith("Eager_")]
    assert len(twins) == 7
    for twin in twins:
        assert not _is_setup_context_defined(twin.setup_context), twin.__name__
