"""``ordered-ssd check --hf-config PATH``: a Hugging Face ``transformers`` causal LM as the checked model.

``PATH`` is a ``config.json`` file (or a folder holding only a config): the model is built from it with random
weights, ``torch`` seeded with ``--seed`` before construction; or a folder with weights (``*.safetensors``,
``pytorch_model*.bin``): the model is loaded from it. Either way in fp32, with ``attn_implementation="eager"``,
then :func:`ordered_ssd.convert_to_ordered` replaces its Mamba-2 mixers (the ``--native`` control trains the
unconverted model). The byte corpus is the data, so the vocabulary must hold the 256 byte values.

The model trains as built, its own ``nn.Embedding`` included: on the H200 (torch 2.11) its CUDA backward gave one
gradient digest over 10 repeats for 2,048 and 16,384 indices, vocabularies 256 and 50,280
(``benchmarks/embedding_probe.py``); what else in a model is not deterministic shows in the verdict and the
first differing module.

``transformers`` is imported only here, only when ``--hf-config`` is given.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import List, Optional

import torch
import torch.nn as nn

from ..lm import VOCAB, DataError
from .errors import CheckError, first_line

#: the files whose presence makes a folder a checkpoint to load (else it is a config to build from)
WEIGHT_SUFFIXES = (".safetensors", ".bin")
ATTN_IMPLEMENTATION = "eager"
INSTALL_HINT = "pip install 'ordered-ssd[hf]'"
#: the kinds of :func:`ordered_ssd.hf.audit_model`'s findings that repeat on the CPU but not on CUDA (atomics, hub
#: kernels): a CPU verdict says that it does not cover them
CUDA_FINDINGS = ("attention", "experts", "kernels")


def import_transformers():
    """``transformers``; a :class:`DataError` (exit 2, one line) naming the extra to install if it is missing."""
    try:
        import transformers
    except ImportError as e:
        raise DataError(f"--hf-config needs transformers ({e}); install it with: {INSTALL_HINT}") from None
    return transformers


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _weight_files(folder: str) -> List[str]:
    return sorted(f for f in os.listdir(folder)
                  if f.endswith(WEIGHT_SUFFIXES) or f.endswith((".safetensors.index.json", ".bin.index.json")))


def _config_file(path: str) -> str:
    if os.path.isdir(path):
        config = os.path.join(path, "config.json")
        if not os.path.isfile(config):
            raise DataError(f"--hf-config: expected a config.json file or a folder holding one, got the folder "
                            f"{path} without config.json")
        return config
    if os.path.isfile(path):
        return path
    raise DataError(f"--hf-config: expected a config.json file or a model folder, got {path} (no such file or "
                    f"directory)")


def _load_config(transformers, config_file: str):
    try:
        with open(config_file) as fh:
            raw = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"--hf-config: expected a JSON config file, got {config_file} that does not read as one: "
                        f"{type(e).__name__}: {e}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise DataError(f"--hf-config: expected a transformers config with a model_type, got {config_file} without "
                        f"one")
    try:
        return transformers.AutoConfig.from_pretrained(config_file)
    except (ValueError, KeyError, TypeError, OSError) as e:
        first = first_line(e)
        raise DataError(f"--hf-config: {config_file}: transformers cannot build a config from it: "
                        f"{type(e).__name__}: {first}") from None


def hf_spec(path: str) -> dict:
    """The spec's ``hf`` field for ``--hf-config path``, after checking that the model can be checked here: the
    installed ``transformers`` is of the supported versions, the config reads, its vocabulary holds the 256 bytes,
    and the model (built on the meta device, no memory) is a causal LM with at least one Mamba-2 mixer, which
    :func:`ordered_ssd.convert_to_ordered` converts (tried there, on the meta device). The check calls it before
    its header, before reading the corpus and before touching ``--out``. ``not_deterministic_on_cuda`` lists what
    :func:`ordered_ssd.hf.audit_model` finds in the converted model that repeats on the CPU but not on CUDA
    (:data:`CUDA_FINDINGS`): a CPU verdict names them.

    Raises:
        DataError: transformers missing or of an unsupported version; no such path; no config.json; an unreadable
            config; a vocabulary smaller than 256; not a causal LM; no supported Mamba-2 mixer; a mixer that
            convert_to_ordered refuses (an activation other than SiLU, an unknown norm, ...) (one line each).
    """
    transformers = import_transformers()
    from ...hf import hf_mixer_family
    from ...hf.mixer import check_transformers_version

    try:
        check_transformers_version()
    except RuntimeError as e:
        raise DataError(f"--hf-config: {e}") from None
    path = os.path.abspath(path)
    config_file = _config_file(path)
    config = _load_config(transformers, config_file)
    model_type = config.model_type
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < VOCAB:
        raise DataError(f"--hf-config: the check trains on bytes, so the vocabulary must hold the {VOCAB} byte "
                        f"values: expected vocab_size >= {VOCAB}, got {vocab!r} ({model_type}, {config_file})")
    weights = _weight_files(path) if os.path.isdir(path) else []
    meta = _build(transformers, config, None, torch.device("meta"))
    families = sorted({hf_mixer_family(m) for m in meta.modules()} - {None})
    if not families:
        raise DataError(f"--hf-config: expected a model with Mamba-2 mixers that convert_to_ordered converts "
                        f"(Mamba2, Bamba, NemotronH, GraniteMoeHybrid, FalconH1, Zamba2), got {type(meta).__name__} "
                        f"({model_type}) without one")
    n_params = sum(p.numel() for p in meta.parameters())
    from ... import convert_to_ordered

    try:  # on the meta device: what the runs will convert is refused now, before anything is read or written
        convert_to_ordered(meta)
    except (ValueError, TypeError, RuntimeError) as e:
        raise DataError(f"--hf-config: convert_to_ordered refuses {type(meta).__name__} ({model_type}, "
                        f"{config_file}): {first_line(e)}") from None
    from ...hf import audit_model

    cuda_only = [f"{f.module or 'the model'} ({f.kind})" for f in audit_model(meta) if f.kind in CUDA_FINDINGS]
    return {"path": path, "config_file": config_file, "config_sha256": _sha256_file(config_file),
            "model_type": model_type, "architecture": type(meta).__name__, "vocab_size": vocab,
            "mixer_families": families, "n_params": n_params,
            "source": "pretrained" if weights else "config",
            "weights_sha256": (hashlib.sha256("".join(f"{f}:{_sha256_file(os.path.join(path, f))}\n"
                                                       for f in weights).encode()).hexdigest() if weights else None),
            "attn_implementation": ATTN_IMPLEMENTATION, "dtype": "float32", "hub_kernels": False,
            "embedding": "the model's own input embedding",
            "transformers": transformers.__version__, "not_deterministic_on_cuda": cuda_only}


def _build(transformers, config, folder: Optional[str], device: torch.device) -> nn.Module:
    auto = transformers.AutoModelForCausalLM
    try:
        if folder is not None:
            # use_kernels=False: torch's own layers, not hub kernels (5.25's from_pretrained turns them on by
            # default where the kernels package is installed; the check trains and audits what it builds)
            model = auto.from_pretrained(folder, config=config, attn_implementation=ATTN_IMPLEMENTATION,
                                         dtype=torch.float32, use_kernels=False)
            return model.to(device)
        with device:
            return auto.from_config(config, attn_implementation=ATTN_IMPLEMENTATION, dtype=torch.float32)
    except (ValueError, KeyError, TypeError, OSError) as e:
        first = first_line(e)
        raise DataError(f"--hf-config: transformers cannot build a causal LM of {type(config).__name__} "
                        f"({config.model_type}): {type(e).__name__}: {first}") from None


def build_hf_model(spec: dict, device: torch.device) -> nn.Module:
    """The model of ``spec["hf"]`` on ``device`` in training mode: built from the config (torch seeded with
    ``spec["seed"]`` first) or loaded; converted (``spec["mixer"] == "ordered"``: its Mamba-2 mixers ordered) or
    left as it is (``"native"``, the control).

    Raises:
        CheckError: the config file changed since the check started, another transformers version than the
            parent's, or the model does not convert.
    """
    hf = spec["hf"]
    transformers = import_transformers()
    if transformers.__version__ != hf["transformers"]:
        raise CheckError(f"this process has transformers {transformers.__version__}, the check started with "
                         f"{hf['transformers']}")
    if _sha256_file(hf["config_file"]) != hf["config_sha256"]:
        raise CheckError(f"--hf-config: {hf['config_file']} changed since the check started (SHA-256 differs)")
    config = _load_config(transformers, hf["config_file"])
    torch.manual_seed(spec["seed"])
    model = _build(transformers, config, hf["path"] if hf["source"] == "pretrained" else None, device)
    if spec["mixer"] == "ordered":
        from ... import convert_to_ordered

        try:
            convert_to_ordered(model)
        except (ValueError, TypeError, RuntimeError) as e:
            raise CheckError(f"--hf-config: convert_to_ordered refused the model: {e}") from None
    return model.train()


def hf_logits(net: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of an HF causal LM (possibly wrapped in DDP) for ``tokens``: no cache, every position."""
    return net(input_ids=tokens, use_cache=False).logits


def describe(hf: dict) -> str:
    """``bamba (BambaForCausalLM, built from config.json with seeded random weights)``."""
    how = (f"loaded from {hf['path']}" if hf["source"] == "pretrained"
           else f"built from {hf['config_file']} with seeded random weights")
    return f"{hf['model_type']} ({hf['architecture']}, {how})"
