"""Small helpers shared by the CPU tests (bit comparisons, digests, layer factories)."""
from __future__ import annotations

import torch

from ordered_ssd import OrderedMamba2
from ordered_ssd.digest import bit_view, tensor_sha256
from ordered_ssd.reference import Mamba2Params


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of a tensor's bytes, for bitwise comparison with torch.equal (:func:`ordered_ssd.digest.bit_view`)."""
    return bit_view(t)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def sha256(t: torch.Tensor) -> str:
    return tensor_sha256(t)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are zero)."""
    den = b.abs().max().item()
    num = (a - b).abs().max().item()
    return num / den if den > 0 else num


def make_layer(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    base = dict(d_model=16, d_state=8, d_conv=4, headdim=8, chunk_size=8)
    base.update(kw)
    layer = OrderedMamba2(**base).to(dtype)
    # Move every parameter away from its constant initialisation so each gradient path is exercised.
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def layer_step(layer, u, dout) -> dict:
    """One training step of ``layer`` on a fresh copy of ``u`` with output gradient ``dout``: ``{"out", "u"`` (the
    input gradient), and every parameter's gradient by name``}``."""
    layer.zero_grad(set_to_none=True)
    uu = u.clone().requires_grad_(True)
    out = layer(uu)
    out.backward(dout)
    res = {"out": out.detach(), "u": uu.grad.detach()}
    res.update({n: p.grad.detach() for n, p in layer.named_parameters()})
    return res


def grads_of(layer) -> dict:
    return {name: p.grad.detach().clone() for name, p in layer.named_parameters()}


def params_tuple(layer) -> Mamba2Params:
    return layer.layer_params()


def to_fake_cuda(layer, dtype=None):
    """Replace every parameter of ``layer`` by an empty CUDA tensor of its shape (of ``dtype``, or its own), without
    gradient. Call inside a ``FakeTensorMode``: the tensors are fake, so no GPU is needed (the checks of a forward
    and the tracing of the CUDA path run; nothing can be computed)."""
    for mod in layer.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=dtype or p.dtype, device="cuda"), requires_grad=False)
    return layer
