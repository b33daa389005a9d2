"""ordered-ssd: bitwise-reproducible Mamba-2 training.

Layout (each layer rests on the ones below it):

* :mod:`ordered_ssd.modules` -- :class:`OrderedMamba2`, the drop-in layer (training, and ``Mamba2``'s decoding),
  and :class:`OrderedMamba3` (mamba-ssm's Mamba-3, single-input single-output; ``docs/mamba3.md``);
* :mod:`ordered_ssd.ops` -- the ordered operations of its CUDA path, one file per upstream operation
  (composition, ``torch.library`` custom op with its fake and autograd, public function), on the launchers of
  :mod:`csrc_bindings`;
* :mod:`ordered_ssd.reference` -- the pure-PyTorch layer, its ordered backward and its decoding step (the path
  elsewhere, and the oracle of the tests);
* :mod:`ordered_ssd.fold` -- the order of every sum, and every setting that decides it;
* :mod:`ordered_ssd.fingerprint`, :mod:`ordered_ssd.digest`, :mod:`ordered_ssd.distributed` -- what the bits
  depend on, digests of them, the rank-ordered data-parallel reduction;
* :mod:`ordered_ssd.accumulate` -- :class:`TreeGradAccumulator`, the split-invariant gradient accumulation
  (the same bits for every split of a global batch over ranks and accumulation steps);
* :mod:`ordered_ssd.convert` -- :func:`convert_to_ordered` / :func:`convert_to_mamba2` / :func:`convert_to_hf`:
  swap a model's mamba-ssm ``Mamba2`` layers and Hugging Face Mamba-2 mixers for ordered ones in place, and back;
* :mod:`ordered_ssd.hf` -- :class:`~ordered_ssd.hf.OrderedHFMamba2Mixer`, the ordered mixer of ``transformers``
  models (``Mamba2ForCausalLM``, Bamba, NemotronH, GraniteMoeHybrid, FalconH1, Zamba2);
* :mod:`ordered_ssd.apps` -- the applications (``ordered-ssd check``, ``bench``, the CLI), resting on the above.

Importing this package does not import mamba-ssm, causal-conv1d or triton, and changes no global
state of torch or of those libraries; it registers its own custom ops in the ``ordered_ssd`` namespace of
``torch.library`` (``torch.ops.ordered_ssd.*``), nothing else.
"""
from .fold import LexicalFold, accumulation_dtype, lexical_fold
from .modules import (GatedRMSNorm, InvariantLinear, InvariantRMSNorm, OrderedMamba2, OrderedMamba3, invariant_linear,
                      invariant_rms_norm)
from . import digest  # ordered_ssd.digest.tensor_sha256 (a public submodule, listed in __all__)
from .reference import Mamba2Dims, Mamba2Params
from .accumulate import TreeGradAccumulator, tree_sum
from ._checks import validate_seq_idx
from .convert import convert_to_hf, convert_to_mamba2, convert_to_ordered
# Both modules are imported by the lines above already (accumulate imports distributed, convert imports hf), and
# neither imports transformers: exporting these names adds no import.
from .distributed import init_distributed, rank_fingerprint
from .hf import audit_model
from ._version import __version__

__all__ = [
    "OrderedMamba2",
    "OrderedMamba3",
    "GatedRMSNorm",
    "InvariantLinear",
    "invariant_linear",
    "InvariantRMSNorm",
    "invariant_rms_norm",
    "Mamba2Dims",
    "Mamba2Params",
    "LexicalFold",
    "lexical_fold",
    "accumulation_dtype",
    "TreeGradAccumulator",
    "tree_sum",
    "validate_seq_idx",
    "convert_to_ordered",
    "convert_to_mamba2",
    "convert_to_hf",
    "audit_model",
    "init_distributed",
    "rank_fingerprint",
    "digest",
    "__version__",
]
