"""Hugging Face ``transformers`` models: the ordered mixer that replaces their Mamba-2 mixers.

:class:`OrderedHFMamba2Mixer` takes the place of the Mamba-2 mixer of ``Mamba2ForCausalLM`` and of the hybrids
built on the same mixer (Bamba, NemotronH, GraniteMoeHybrid / Granite 4.0, FalconH1, Zamba2), keeping the mixer's
parameter objects, buffers, submodules, attributes and forward signature. :func:`ordered_ssd.convert_to_ordered`
swaps them in; :func:`ordered_ssd.convert_to_hf` swaps the original mixers back; :func:`audit_model` lists what in a
model the ordered layers leave non-deterministic or uncovered. ``docs/convert.md`` is the guide.

This package does not import ``transformers``: a mixer is recognised by its class's module and name, and the
version of ``transformers`` is read from the already-imported module when a model is converted.
"""
from .audit import Finding, audit_model
from .mixer import (HF_MIXERS, SUPPORTED_TRANSFORMERS, OrderedHFMamba2Mixer, hf_mixer_family, ordered_from_hf,
                    hf_from_ordered)

__all__ = ["OrderedHFMamba2Mixer", "audit_model", "Finding", "HF_MIXERS", "SUPPORTED_TRANSFORMERS", "hf_mixer_family",
           "ordered_from_hf",
           "hf_from_ordered"]
