"""``audit_model``: what in a model the ordered layers do not make deterministic (an opt-in report; changes nothing).

The conversion covers the Mamba-2 layers; the rest of the model is computed by torch as before. This looks for the
parts known not to repeat bit for bit on CUDA, or not to be covered at all, and says what to choose instead
(``docs/convert.md``, "The rest of the model must be deterministic too"). It reads module classes, attributes and
the model's config; it runs nothing, imports nothing and sets no flag.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch.nn as nn

from .mixer import HF_MIXERS, OrderedHFMamba2Mixer, check_transformers_version

__all__ = ["Finding", "audit_model"]

#: transformers' attention implementations whose CUDA backward adds partial gradients with atomics.
_ATOMIC_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
_MIXER_NAMES = {name for _, name in HF_MIXERS} | {"Mamba2"}


@dataclass(frozen=True)
class Finding:
    """One part of the model the ordered layers leave non-deterministic or uncovered.

    ``module``: its qualified name (``""`` for the model as a whole); ``kind``: ``"unconverted-mamba"``,
    ``"attention"``, ``"experts"``, ``"dropout"`` or ``"kernels"``; ``detail``: what it is and what to choose
    instead."""

    module: str
    kind: str
    detail: str


def audit_model(model: nn.Module) -> List[Finding]:
    """The parts of ``model`` that are not covered by the ordered layers, in module order.

    Findings:

    * ``unconverted-mamba``: a Mamba-2 layer left as it is (``convert_to_ordered`` not called, or a subclass of a
      supported class, which the conversion does not touch): its backward uses upstream's atomics and autotuning;
    * ``attention``: the model's attention implementation is one whose CUDA backward adds with atomics (SDPA's
      flash and memory-efficient kernels, flash-attention, flex attention): build it with
      ``attn_implementation="eager"``;
    * ``experts``: a mixture-of-experts block (its outputs gathered with ``index_add_``, atomics on CUDA unless
      you set ``torch.use_deterministic_algorithms(True)``);
    * ``dropout``: an ``nn.Dropout`` with ``p > 0`` (it repeats only from the same seed and RNG state);
    * ``kernels``: the model was kernelized with ``transformers``' hub kernels (``use_kernels=True``, the default of
      ``from_pretrained`` from 5.25 where the ``kernels`` package is installed): one finding for the model, and one
      for each module whose forward a hub kernel replaced (their determinism is the kernels' own), but for the
      ordered mixers' submodules that they never call (``act``, ``norm``, ``conv1d``). The ordered mixers are kept:
      their forward calls none of the kernelized functions.

    An unconverted mixer under a ``transformers`` version outside :data:`~ordered_ssd.hf.SUPPORTED_TRANSFORMERS`
    is reported with the version refusal (what to install), not as "call convert_to_ordered".

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    found: List[Finding] = []
    config = getattr(model, "config", None)
    attn = getattr(config, "_attn_implementation", None) if config is not None else None
    has_attention = any("Attention" in type(m).__name__ for m in model.modules())
    if has_attention and attn in _ATOMIC_ATTENTION:
        found.append(Finding("", "attention", f"attn_implementation={attn!r}: its CUDA backward adds partial "
                                              f"gradients with atomics; build the model with "
                                              f"attn_implementation='eager'"))
    if getattr(model, "use_kernels", False) is True:
        found.append(Finding("", "kernels", "use_kernels=True: transformers' hub kernels replace the forward of the "
                                            "modules listed with this kind (their determinism is the kernels' own); "
                                            "the ordered mixers are kept; load with use_kernels=False, or call "
                                            "model.set_use_kernels(False), for torch's own layers"))
    version_refusal = None
    ordered = []  # the ordered mixers' names: of their submodules they call only wrapped projections
    for name, module in model.named_modules():
        cls = type(module)
        if isinstance(module, OrderedHFMamba2Mixer):
            ordered.append(name + ".")
            continue
        inside = next((p for p in ordered if name.startswith(p)), None)
        if inside is not None and name[len(inside):] not in ("in_proj", "out_proj"):
            continue
        if "_kernel_repo" in module.__dict__ and "forward" in module.__dict__:
            found.append(Finding(name, "kernels", f"{cls.__name__}: its forward is a hub kernel's "
                                                  f"({module.__dict__['_kernel_repo']}), not torch's"))
        if any(c.__name__ in _MIXER_NAMES for c in cls.__mro__) and hasattr(module, "A_log"):
            if cls.__name__ in _MIXER_NAMES and cls.__name__ != "Mamba2" and version_refusal is None:
                try:
                    check_transformers_version()
                    version_refusal = ""
                except RuntimeError as e:
                    version_refusal = str(e)
            if cls.__name__ not in _MIXER_NAMES:
                what = "a subclass of a supported class (not converted)"
            elif version_refusal and cls.__name__ != "Mamba2":
                what = f"not converted, and convert_to_ordered refuses it: {version_refusal}"
            else:
                what = "not converted (call ordered_ssd.convert_to_ordered(model))"
            found.append(Finding(name, "unconverted-mamba", f"{cls.__name__}: {what}; its backward adds with "
                                                            f"atomics and its kernels are autotuned"))
        elif cls.__name__.endswith(("Experts", "SparseMoeBlock", "MoE", "Moe")) and not any(
                f.module and name.startswith(f.module + ".") for f in found if f.kind == "experts"):
            found.append(Finding(name, "experts", f"{cls.__name__}: mixture-of-experts outputs gathered with "
                                                  f"index_add_ (atomics on CUDA unless you set "
                                                  f"torch.use_deterministic_algorithms(True))"))
        elif isinstance(module, nn.Dropout) and module.p > 0:
            found.append(Finding(name, "dropout", f"p={module.p}: repeats only from the same seed and RNG state "
                                                  f"(seed before building the model and before training)"))
    return found
