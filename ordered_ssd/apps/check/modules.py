"""Per-module digests of ``ordered-ssd check``: where runs disagree, which module differs first.

Two kinds per step: the gradient digests of each module's parameters (:func:`module_digests`), and the digests of
each module's forward outputs (:class:`OutputDigests`). A module whose forward is not deterministic makes its own
output differ first, in execution order, and then every gradient; a module whose backward is not deterministic
leaves every output equal and makes the gradients of itself and of the modules before it differ, so it is the last
differing module in model order.

A parameter belongs to the module named by its name up to the first numeric component (``model.layers.3`` for
``model.layers.3.mamba.in_proj.weight``, ``mixers.0`` for ``mixers.0.in_proj.weight``), else the name without
its last component (``model.embed_tokens``, ``lm_head``, ``norm_f``), else itself (``embedding``): one block of a
layer stack, the embeddings, the final norm, the head. Model order is the order of ``named_parameters()``
(registration order). A module's digest is the SHA-256 of its parameters' gradient digests, in order.
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable, Dict, List

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


class OutputDigests:
    """Forward hooks on the modules named ``names`` (those that are submodules of ``model``) that fingerprint
    every tensor they output (the first tensor of a tuple or a model output) during a step; :meth:`take` returns
    ``{module: SHA-256}`` in the order the modules first ran and starts the next step. A module that runs several
    times in a step (accumulation blocks, recomputation) folds all its outputs in, in order.

    The fingerprint of an output is computed on its device, without a host read: its bytes as 32-bit (or 16- or
    8-bit) words ``w_i``, the integer sum of ``w_i * (2654435761 i + 40503)`` modulo 2**64 (exact, whatever the
    order of the additions), so an output of gigabytes (a head's logits) costs one pass over it; the step's
    fingerprints, shapes and dtypes are hashed on the host once per step (:meth:`take`). Two outputs with the same
    bits have the same fingerprint; different bits give a different one but with a chance of 2**-64 per word
    pattern, which the gradient digests (SHA-256 of every byte) do not share."""

    def __init__(self, model: torch.nn.Module, names: List[str]):
        self._sums: Dict[str, torch.Tensor] = {}
        self._meta: Dict[str, List[str]] = {}
        self._handles = []
        for name in names:
            try:
                module = model.get_submodule(name)
            except AttributeError:
                continue  # a parameter of the model itself (no submodule of its own)
            self._handles.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        def record(module, args, output):
            t = _first_tensor(output)
            if t is None:
                return
            fp = _fingerprint(t, _WEIGHT_WORDS)
            prev = self._sums.get(name)
            self._sums[name] = fp if prev is None else prev * 1000003 + fp
            self._meta.setdefault(name, []).append(f"{tuple(t.shape)}:{t.dtype}")
        return record

    def take(self) -> Dict[str, str]:
        """The step's ``{module: SHA-256}`` (one host read, a synchronisation), and the next step starts."""
        return self.take_deferred()()

    def take_deferred(self) -> Callable[[], Dict[str, str]]:
        """What :meth:`take` returns, as a function called later: the step's fingerprints stay on the device (one
        stacked tensor) until it is called, so the training loop does not wait for the device every step. The next
        step starts now."""
        names, meta = list(self._sums), self._meta
        stacked = torch.stack([self._sums[n] for n in names]) if names else None
        self._sums, self._meta = {}, {}

        def resolve() -> Dict[str, str]:
            values = stacked.cpu().tolist() if stacked is not None else []  # one host read
            return {n: hashlib.sha256(f"{v}|{','.join(meta[n])}".encode()).hexdigest() for n, v in zip(names, values)}
        return resolve

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


#: the fingerprint's word weights ``i * 2654435761 + 40503`` (int64) for ``i < len``, per device, grown on demand up
#: to :data:`_WEIGHT_WORDS` (32 MiB a device, kept for the process's life: any chunking gives the same sum)
_WEIGHTS: Dict[torch.device, torch.Tensor] = {}
_WEIGHT_WORDS = 1 << 22
_K, _C = 2654435761, 40503


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """``i * 2654435761 + 40503`` for ``i`` in ``[0, n)``, int64 on ``device`` (a prefix of a cached tensor)."""
    w = _WEIGHTS.get(device)
    if w is None or w.numel() < n:
        w = torch.arange(n, device=device, dtype=torch.int64) * _K + _C
        _WEIGHTS[device] = w
    return w[:n]


def _fingerprint(t: torch.Tensor, chunk: int) -> torch.Tensor:
    """An int64 scalar on ``t``'s device: the weighted sum of ``t``'s bytes as words, modulo 2**64 (see
    :class:`OutputDigests`). Per ``chunk`` words starting at ``s``: ``sum w_i * (i * K + C)`` over the chunk's own
    ``i`` (the cached weights), plus ``s * K * sum w_i``: the same sum modulo 2**64 as the weights of the
    absolute index, in two launches for an output of one chunk (the words widened to int64 inside the product)."""
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=t.device)
    raw = flat.contiguous().view(torch.uint8)
    word = torch.int32 if raw.numel() % 4 == 0 else torch.int16 if raw.numel() % 2 == 0 else torch.uint8
    words = raw.view(word)
    chunk = min(chunk, _WEIGHT_WORDS)
    weights = _weights(min(chunk, words.numel()), t.device)
    acc = None
    for start in range(0, words.numel(), chunk):
        w = words[start:start + chunk]
        part = (w * weights[:w.numel()]).sum()  # int32/16/uint8 * int64: each word widened to int64 first
        if start:
            shift = (start * _K) % (1 << 64)  # as a signed int64: the product wraps modulo 2**64 like the sums
            part = part + w.sum(dtype=torch.int64) * (shift - (1 << 64) if shift >= 1 << 63 else shift)
        acc = part if acc is None else acc + part
    return acc


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor)), None)
    if isinstance(output, dict) or hasattr(output, "values"):  # transformers' ModelOutput
        return next((o for o in output.values() if isinstance(o, torch.Tensor)), None)
    return None
