"""ordered-ssd: bitwise-reproducible Mamba-2 training.

Importing this package does not import mamba-ssm, causal-conv1d or triton, and changes no global
state of torch or of those libraries.
"""
from .fold import LexicalFold, accumulation_dtype, lexical_fold
from .mamba2 import GatedRMSNorm, OrderedMamba2
from . import digest  # ordered_ssd.digest.tensor_sha256 (a public submodule, listed in __all__)
from .reference import Mamba2Dims, Mamba2Params

__version__ = "0.1.0.dev0"

__all__ = [
    "OrderedMamba2",
    "GatedRMSNorm",
    "Mamba2Dims",
    "Mamba2Params",
    "LexicalFold",
    "lexical_fold",
    "accumulation_dtype",
    "digest",
    "__version__",
]
