"""Per-module gradient digests of ``ordered-ssd check``: where runs disagree, which module's gradient differs first.

A parameter belongs to the module named by its name up to the first numeric component (``model.layers.3`` for
``model.layers.3.mamba.in_proj.weight``, ``mixers.0`` for ``mixers.0.in_proj.weight``), else the name without
its last component (``model.embed_tokens``, ``lm_head``, ``norm_f``), else itself (``embedding``): one block of a
layer stack, the embeddings, the final norm, the head. Model order is the order of ``named_parameters()``
(registration order). A module's digest is the SHA-256 of its parameters' gradient digests, in order.
"""
from __future__ import annotations

import hashlib
import os
from typing import Dict, List

import torch

from .errors import CheckError

#: Testing only: ``"MODULE"`` adds noise from a generator seeded from ``os.urandom`` (different in every process)
#: to the gradient of every parameter of module ``MODULE`` (a name of :func:`module_of`), so the tests can provoke a
#: run that is not reproducible in one known module. Never set it for real runs.
TEST_GRAD_NOISE_ENV = "ORDERED_SSD_TEST_GRAD_NOISE"


def module_of(name: str) -> str:
    """The module a parameter named ``name`` is grouped under (see the module docstring)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) or name


def module_names(param_names: List[str]) -> List[str]:
    """The modules of ``param_names``, each once, in the order of their first parameter."""
    return list(dict.fromkeys(module_of(n) for n in param_names))


def module_digests(grads: Dict[str, str], param_names: List[str]) -> Dict[str, str]:
    """Per module: the SHA-256 of ``"name:digest"`` lines of its parameters' gradient digests, in order."""
    lines: Dict[str, List[str]] = {}
    for name in param_names:
        lines.setdefault(module_of(name), []).append(f"{name}:{grads[name]}\n")
    return {m: hashlib.sha256("".join(ls).encode()).hexdigest() for m, ls in lines.items()}


def add_test_grad_noise(model: torch.nn.Module) -> None:
    """Where :data:`TEST_GRAD_NOISE_ENV` names a module of ``model``: hooks that add noise to its gradients.

    Raises:
        CheckError: the variable names no module of ``model``.
    """
    target = os.environ.get(TEST_GRAD_NOISE_ENV)
    if not target:
        return
    params = [p for n, p in model.named_parameters() if module_of(n) == target]
    if not params:
        raise CheckError(f"{TEST_GRAD_NOISE_ENV}={target}: no such module; modules: "
                         f"{module_names([n for n, _ in model.named_parameters()])}")
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))

    def noisy(grad: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(grad.shape, generator=gen, dtype=grad.dtype) * 1e-6
        return grad + noise.to(grad.device)

    for p in params:
        p.register_hook(noisy)
