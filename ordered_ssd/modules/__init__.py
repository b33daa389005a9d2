"""The layers: :class:`OrderedMamba2` (a drop-in for ``mamba_ssm.modules.mamba2.Mamba2``) and :class:`OrderedMamba3`
(for ``mamba_ssm.modules.mamba3.Mamba3``, single-input single-output), above :mod:`ordered_ssd.ops` (their CUDA
paths) and :mod:`ordered_ssd.reference` (their paths elsewhere)."""
from .mamba2 import GatedRMSNorm, OrderedMamba2, cuda_path_available
from .mamba3 import OrderedMamba3
from .invariant import InvariantLinear, InvariantRMSNorm, invariant_linear, invariant_rms_norm

__all__ = ["OrderedMamba2", "OrderedMamba3", "GatedRMSNorm", "cuda_path_available", "InvariantLinear",
           "invariant_linear", "InvariantRMSNorm", "invariant_rms_norm"]

#: mamba-ssm's layers that the ordered ones replace, by kind: ``(module, class name)`` (nothing is imported here)
NATIVE_LAYERS = {"mamba2": ("mamba_ssm.modules.mamba2", "Mamba2"), "mamba3": ("mamba_ssm.modules.mamba3", "Mamba3")}
