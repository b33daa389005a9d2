"""Reading a restart checkpoint of ``ordered-ssd check`` safely: ``torch.load(..., weights_only=True)`` (no pickled
code runs), and every way a file can be unusable (missing, corrupt, truncated, not a checkpoint, another model's)
becomes one :class:`CheckError` line naming the file and what is wrong, before the model is touched. Reading never
changes the file. (Checkpoints are written with :func:`ordered_ssd.apps.files.atomic_torch_save`: a temporary
file in the same folder, then ``os.replace``, so an interrupted write leaves the previous file whole.)"""
from __future__ import annotations

import os

import torch

from .errors import CheckError, first_line

#: The fields every checkpoint has (a data-parallel one also ``world_size``), besides ``format``.
CKPT_FIELDS = ("step", "data_position", "model", "optimizer", "fingerprint", "fingerprint_info", "spec", "rng")


def read_checkpoint(path: str) -> dict:
    """The checkpoint at ``path``, loaded on the CPU with ``weights_only=True`` (RNG states must stay on the CPU).

    Raises:
        CheckError: no such file; a directory; the file does not load (corrupt, truncated, not written by
            ``torch.save``, or holding objects ``weights_only`` refuses); it is not a dict with the fields of
            :data:`CKPT_FIELDS`.
    """
    if os.path.isdir(path):
        raise CheckError(f"checkpoint {path}: expected a checkpoint file, got a directory")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckError(f"checkpoint {path}: expected a checkpoint file, got no such file") from None
    except Exception as e:  # noqa: BLE001 -- a bad file gives RuntimeError, UnpicklingError, EOFError, ...
        first = first_line(e)
        raise CheckError(f"checkpoint {path}: expected a torch.save file that loads with weights_only=True, got one "
                         f"that does not (corrupt or truncated?): {type(e).__name__}: {first}") from None
    if not isinstance(ckpt, dict):
        raise CheckError(f"checkpoint {path}: expected a dict of checkpoint fields, got {type(ckpt).__name__}")
    missing = [k for k in CKPT_FIELDS if k not in ckpt]
    if missing:
        raise CheckError(f"checkpoint {path}: expected the fields {list(CKPT_FIELDS)}, got {sorted(ckpt)} "
                         f"(missing {missing})")
    return ckpt


def check_model_state(path: str, saved, model: torch.nn.Module) -> None:
    """Raise CheckError unless ``saved`` has exactly ``model``'s state-dict keys, shapes and dtypes (a checkpoint
    of another model, e.g. another ``--d-model``), naming the first difference."""
    expected = model.state_dict()
    if not isinstance(saved, dict):
        raise CheckError(f"checkpoint {path}: expected a model state dict, got {type(saved).__name__}")
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing or extra:
        raise CheckError(f"checkpoint {path}: expected the parameters of this run's model, got a model without "
                         f"{missing[:3]} and with {extra[:3]} (another model?)")
    for name, want in expected.items():
        got = saved[name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            desc = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckError(f"checkpoint {path}: parameter {name}: expected {tuple(want.shape)} {want.dtype} (this "
                             f"run's model), got {desc} (another model?)")


def load_optimizer_state(path: str, optimizer: torch.optim.Optimizer, state) -> None:
    """``optimizer.load_state_dict(state)``, its errors as one CheckError line naming the file."""
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        first = first_line(e)
        raise CheckError(f"checkpoint {path}: expected the optimizer state of this run's model, got one that does "
                         f"not load: {type(e).__name__}: {first}") from None
