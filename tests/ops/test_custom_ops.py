"""The custom ops that run on the CPU (``ordered_ssd::linear``, ``A_from_log``, ``silu_mul``, ``reference_mamba2``):
torch.library.opcheck (schema, fake against the real outputs, autograd registration), and their gradients are the
eager bits of the expression they replace."""
import pytest
import torch
import torch.nn.functional as F

from ordered_ssd.ops import ordered_A_from_log, ordered_linear, ordered_silu_mul
from tests.helpers import bits_equal, make_layer

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_A_from_log_is_the_eager_expression(dtype):
    g = torch.Generator().manual_seed(1)
    A_log = (torch.rand(7, generator=g) * 3).to(dtype)
    a1, a2 = A_log.clone().requires_grad_(), A_log.clone().requires_grad_()
    dA = torch.randn(7, generator=g)
    A = ordered_A_from_log(a1)
    A.backward(dA)
    A_ref = -torch.exp(a2.float())
    A_ref.backward(dA)
    assert A.dtype == torch.float32 and bits_equal(A, A_ref)
    assert a1.grad.dtype == dtype and bits_equal(a1.grad, a2.grad)
    _opcheck(torch.ops.ordered_ssd.A_from_log.default, (A_log.clone().requires_grad_(),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_is_the_eager_expression(dtype):
    g = torch.Generator().manual_seed(2)
    zx = torch.randn(2, 5, 12, generator=g).to(dtype)
    z, x = zx[..., :6], zx[..., 6:]  # strided views, as the layer's split of zxbcdt
    dout = torch.randn(2, 5, 6, generator=g).to(dtype)
    zx1, zx2 = zx.clone().requires_grad_(), zx.clone().requires_grad_()
    out = ordered_silu_mul(zx1[..., :6], zx1[..., 6:])
    out.backward(dout)
    ref = F.silu(zx2[..., :6]) * zx2[..., 6:]
    ref.backward(dout)
    assert bits_equal(out, ref) and bits_equal(zx1.grad, zx2.grad)
    _opcheck(torch.ops.ordered_ssd.silu_mul.default, (z.clone().requires_grad_(), x.clone().requires_grad_()))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_op_passes_opcheck(bias):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 6, generator=g, requires_grad=True)
    w = torch.randn(5, 6, generator=g, requires_grad=True)
    b = torch.randn(5, generator=g, requires_grad=True) if bias else None
    for row_invariant in (False, True):
        _opcheck(torch.ops.ordered_ssd.linear.default, (x, w, b, None, row_invariant))
        y = ordered_linear(x, w, b, row_invariant=row_invariant)
        assert y.shape == (3, 4, 5) and y.is_contiguous()


def test_reference_op_passes_opcheck():
    layer = make_layer(seed=4, dtype=torch.float32, bias=True)
    u = torch.randn(2, 9, 16, requires_grad=True)
    seq_idx = torch.tensor([[0] * 4 + [1] * 5, [0] * 9], dtype=torch.int32)
    from ordered_ssd.reference.ordered import _dims_args

    args = (u, seq_idx, *layer.layer_params(), *_dims_args(layer.dims))
    _opcheck(torch.ops.ordered_ssd.reference_mamba2.default, args)
