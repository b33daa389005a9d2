"""The layer: :class:`OrderedMamba2` (a drop-in for ``mamba_ssm.modules.mamba2.Mamba2``), above :mod:`ordered_ssd.ops`
(its CUDA path) and :mod:`ordered_ssd.reference` (its path elsewhere)."""
from .mamba2 import GatedRMSNorm, OrderedMamba2, cuda_path_available

__all__ = ["OrderedMamba2", "GatedRMSNorm", "cuda_path_available"]
