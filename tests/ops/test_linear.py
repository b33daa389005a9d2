"""ordered_ssd.ops.linear on the CPU: the composition, the custom op and the public function give the per-example
lexical fold of the weight and bias gradients (the CPU path of the same algorithm the CUDA path runs for long
sequences), and bad input is refused before anything runs."""
import pytest
import torch

from tests.helpers import bits_equal
from ordered_ssd.fold import LexicalFold, fold_dims
from ordered_ssd.ops.linear import ordered_linear, ordered_linear_bwd, ordered_linear_fwd


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_linear_weight_grad_groups_give_the_per_example_fold(dtype):
    """ordered_linear_weight_grad folds a group of GEMM partials per launch; any group size gives the bits of the
    per-example LexicalFold (the algorithm it replaced), with the GEMMs in the accumulation dtype (fp64 for
    fp64)."""
    from ordered_ssd.ops.linear import ordered_linear_weight_grad

    g = torch.Generator().manual_seed(7)
    B, L, out_f, in_f = 7, 13, 5, 9  # out * in = 45: slots are padded to 64 elements
    dy = (torch.randn(B, L, out_f, generator=g) * torch.logspace(-3, 3, L)[:, None]).to(dtype)
    x = torch.randn(B, L, in_f, generator=g).to(dtype)
    wd = torch.float64 if dtype == torch.float64 else torch.float32
    fw, fb = LexicalFold(wd), LexicalFold(wd)
    for b in range(B):
        fw.add(torch.mm(dy[b].t().to(wd), x[b].to(wd)))
        fb.add(fold_dims(dy[b], 0, dtype=torch.float32))
    ref_w, ref_b = fw.result(), fb.result()
    for group_bytes in (1, 4 * 64 * 2, 4 * 64 * 3, 1 << 30):  # groups of 1, 2, 3 and all 7 (fp64: 1, 1, 1, 7)
        dW, db = ordered_linear_weight_grad(dy, x, wd, wd, group_bytes=group_bytes)
        assert bits_equal(dW, ref_w) and bits_equal(db, ref_b), group_bytes
    dW, db = ordered_linear_weight_grad(dy, x, torch.bfloat16, None)
    assert db is None and bits_equal(dW, ref_w.to(torch.bfloat16))


def _problem(dtype=torch.float32, bias=True):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 9, 6, generator=g, dtype=dtype)
    weight = torch.randn(5, 6, generator=g, dtype=dtype)
    b = torch.randn(5, generator=g, dtype=dtype) if bias else None
    dy = torch.randn(4, 9, 5, generator=g, dtype=dtype)
    return x, weight, b, dy


def test_composition_is_the_per_example_fold():
    x, weight, bias, dy = _problem()
    y, x_saved, w_saved = ordered_linear_fwd(x, weight, bias)
    assert bits_equal(y, torch.nn.functional.linear(x, weight, bias)) and x_saved is x and w_saved is weight
    dx, dW, db = ordered_linear_bwd(dy, x, weight, has_bias=True)
    fold_w, fold_b = LexicalFold(torch.float32), LexicalFold(torch.float32)
    for b in range(x.shape[0]):
        fold_w.add(torch.mm(dy[b].t(), x[b]))
        fold_b.add(fold_dims(dy[b], 0, dtype=torch.float32))
    assert bits_equal(dx, torch.nn.functional.linear(dy, weight.t()))
    assert bits_equal(dW, fold_w.result()) and bits_equal(db, fold_b.result())
    none_dx, _, no_db = ordered_linear_bwd(dy, x, weight, need_dx=False, has_bias=False)
    assert none_dx is None and no_db is None


@pytest.mark.parametrize("bias", [True, False])
def test_function_gradients_equal_the_composition(bias):
    x, weight, b, dy = _problem(bias=bias)
    x, weight = x.requires_grad_(), weight.requires_grad_()
    if b is not None:
        b.requires_grad_()
    ordered_linear(x, weight, b).backward(dy)
    dx, dW, db = ordered_linear_bwd(dy, x.detach(), weight.detach(), has_bias=bias)
    assert bits_equal(x.grad, dx) and bits_equal(weight.grad, dW)
    assert (b is None and db is None) or bits_equal(b.grad, db)


def test_bad_input_is_refused():
    x, weight, _, _ = _problem()
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor"):
        ordered_linear([[1.0]], weight)
    with pytest.raises(ValueError, match=r"^x: expected a 3-d tensor \[B, L, in\], got shape \(9, 6\)"):
        ordered_linear(x[0], weight)


def _casts_of(shape, fn):
    """The number of ``aten::_to_copy`` calls on a tensor of ``shape`` while ``fn`` runs (CPU profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes
               and list(e.input_shapes[0]) == list(shape))


@pytest.mark.parametrize("path", ["eager", "custom_op"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_autocast_casts_each_operand_once_per_step(monkeypatch, path, x_dtype):
    """Under autocast (here bf16, ``autocast_dtype`` patched so the CPU runs the CUDA path's casting) the forward
    returns its casts of ``x`` and ``weight`` and the backward uses them: one cast of the fp32 weight per step (the
    backward cast it again before), and of ``x`` only where it is not already bf16, as native autocast. The
    gradients keep the bits of the backward that cast again, in the dtypes of the inputs."""
    from ordered_ssd.ops import linear

    x, weight, b, dy = _problem()
    x = x.to(x_dtype)
    dy = dy.to(torch.bfloat16)
    monkeypatch.setattr(linear, "autocast_dtype", lambda t: torch.bfloat16)
    if path == "custom_op":  # what torch.compile and dispatch modes call, with the op's fake and autograd
        monkeypatch.setattr(linear, "call_op", lambda op, function, *args: op(*args))
    leaves = [t.clone().requires_grad_() for t in (x, weight, b)]

    def step():
        linear.ordered_linear(*leaves).backward(dy)
    assert _casts_of(weight.shape, step) == 1
    assert leaves[0].grad.dtype == x_dtype and leaves[1].grad.dtype == torch.float32
    xc, wc = x.to(torch.bfloat16), weight.to(torch.bfloat16)
    dx, dW, db = ordered_linear_bwd(dy, xc, wc, has_bias=True)
    assert bits_equal(leaves[0].grad, dx.to(x_dtype)) and bits_equal(leaves[1].grad, dW)
    assert bits_equal(leaves[2].grad, db)
    leaves = [t.clone().requires_grad_() for t in (x, weight, b)]
    # fp32 x: the forward's cast and the cast of dx back to fp32 (the backward cast x again before: 3)
    assert _casts_of(x.shape, step) == (2 if x_dtype == torch.float32 else 0)


def test_linear_op_with_autocast_passes_opcheck(monkeypatch):
    """The op's fake gives the cast outputs' shapes and dtypes (and :func:`absent` where no cast happens)."""
    from ordered_ssd.ops import linear

    monkeypatch.setattr(linear, "autocast_dtype", lambda t: torch.bfloat16)
    x, weight, b, _ = _problem()
    for xx in (x, x.to(torch.bfloat16)):
        torch.library.opcheck(torch.ops.ordered_ssd.linear.default,
                              (xx.clone().requires_grad_(), weight.clone().requires_grad_(), b.clone().requires_grad_(),
                               torch.bfloat16, False),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))
        y, xc, wc = torch.ops.ordered_ssd.linear.default(xx, weight, b, torch.bfloat16, False)
        assert wc.dtype == torch.bfloat16 and bits_equal(wc, weight.to(torch.bfloat16))
        assert xc.numel() == 0 if xx.dtype == torch.bfloat16 else bits_equal(xc, xx.to(torch.bfloat16))
