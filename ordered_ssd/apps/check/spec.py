"""The run spec of ``ordered-ssd check`` from its command-line arguments, and the per-device defaults."""
from __future__ import annotations

import os

import torch

from ..lm import DataError

# Defaults per device: CPU finishes in about a minute; CUDA trains a larger model for longer.
DEFAULTS = {
    "cpu": dict(d_model=64, n_layers=2, d_state=16, headdim=16, chunk_size=32, steps=40, batch=4, seq_len=128,
                lr=3e-3, data_bytes=2_000_000),
    "cuda": dict(d_model=512, n_layers=8, d_state=64, headdim=64, chunk_size=128, steps=200, batch=8, seq_len=512,
                 lr=1e-3, data_bytes=16_000_000),
}


def resolve_device(name: str) -> torch.device:
    """``auto`` / ``cpu`` / ``cuda`` / ``cuda:N`` -> a torch.device; DataError for anything else, a missing GPU, or a
    GPU without the ordered CUDA path (mamba-ssm / causal-conv1d missing or of other versions)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DataError(f"--device: expected cpu, cuda, cuda:N or auto, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DataError(f"--device: expected a device that is available here, got {name} (no CUDA device)")
    if device.type not in ("cpu", "cuda"):
        raise DataError(f"--device: expected cpu or cuda, got {name!r}")
    if device.type == "cuda":
        from ...modules import cuda_path_available

        ok, why = cuda_path_available()
        if not ok:  # OrderedMamba2 never falls back to the reference on CUDA by itself; say so before training
            raise DataError(f"--device: {device} needs the ordered CUDA path, which cannot run here ({why}); "
                            "install the native extras (README, GPU section) or pass --device cpu")
    return device


def spec_from_args(args) -> dict:
    """The run spec of parsed ``ordered-ssd check`` arguments: the device's :data:`DEFAULTS` where an option is
    not given. Raises DataError (one line) for an impossible combination."""
    device = resolve_device(args.device)
    defaults = DEFAULTS[device.type]
    pick = lambda value, key: defaults[key] if value is None else value  # noqa: E731
    hf_config = getattr(args, "hf_config", None)
    if hf_config is not None:
        return _hf_spec_from_args(args, device, pick)
    model = dict(d_model=pick(args.d_model, "d_model"), n_layers=pick(args.n_layers, "n_layers"),
                 d_state=pick(args.d_state, "d_state"), headdim=pick(args.headdim, "headdim"),
                 ngroups=args.ngroups, chunk_size=pick(args.chunk_size, "chunk_size"), expand=2)
    if (2 * model["d_model"]) % model["headdim"]:
        raise DataError(f"--headdim: expected a divisor of 2 * d_model = {2 * model['d_model']}, "
                        f"got {model['headdim']}")
    if ((2 * model["d_model"]) // model["headdim"]) % model["ngroups"]:
        raise DataError(f"--ngroups: expected a divisor of the number of heads "
                        f"{(2 * model['d_model']) // model['headdim']}, got {model['ngroups']}")
    _check_data_native_nproc(args, device, pick)
    return {**_run_fields(args, device, pick), "model": model}


#: the byte LM's shape options, which --hf-config replaces (the config gives the model)
MODEL_FLAGS = (("--d-model", "d_model", None), ("--n-layers", "n_layers", None), ("--d-state", "d_state", None),
               ("--headdim", "headdim", None), ("--ngroups", "ngroups", 1), ("--chunk-size", "chunk_size", None))


def _hf_spec_from_args(args, device: torch.device, pick) -> dict:
    """The spec of ``--hf-config``: the byte LM's ``model`` is None, ``hf`` describes the Hugging Face model
    (:func:`.hf.hf_spec`: path, config SHA-256, model type, weights, transformers version)."""
    given = [flag for flag, attr, default in MODEL_FLAGS if getattr(args, attr, default) != default]
    if given:
        raise DataError(f"{given[0]}: not with --hf-config (the config gives the model)")
    _check_data_native_nproc(args, device, pick)
    from .hf import hf_spec

    return {**_run_fields(args, device, pick), "model": None, "hf": hf_spec(args.hf_config)}


#: validation windows per run unless ``--val-windows`` says otherwise (spread evenly over the held-out split)
VAL_WINDOWS = 256

#: the batch of step ``s`` is drawn from a generator seeded with ``seed * SEED_STRIDE + s`` (:class:`..lm.ByteData`),
#: which must be a 64-bit signed integer
SEED_STRIDE = 1_000_003


def _run_fields(args, device: torch.device, pick) -> dict:
    """The spec's fields that do not depend on the model: device, seed, schedule, data."""
    steps = pick(args.steps, "steps")
    if abs(args.seed) * SEED_STRIDE + steps >= 2 ** 63:
        raise DataError(f"--seed: expected |seed| * {SEED_STRIDE} + --steps < 2**63 (the batch of step s is drawn "
                        f"from a generator seeded with seed * {SEED_STRIDE} + s), got {args.seed}")
    return {"device": str(device), "mixer": "ordered", "seed": args.seed, "steps": steps,
            "batch": pick(args.batch, "batch"), "seq_len": pick(args.seq_len, "seq_len"), "lr": pick(args.lr, "lr"),
            "weight_decay": 0.1, "clip": 1.0, "data": None if args.data is None else os.path.abspath(args.data),
            "data_bytes": pick(args.data_bytes, "data_bytes"),
            "val_windows": VAL_WINDOWS if getattr(args, "val_windows", None) is None else args.val_windows}


def _check_data_native_nproc(args, device: torch.device, pick) -> None:
    """The checks of ``--data``, ``--native`` and ``--nproc`` shared by the byte LM and ``--hf-config``."""
    if args.data is not None and not os.path.exists(args.data):
        raise DataError(f"--data: expected an existing file or directory, got {args.data} (no such file or "
                        f"directory)")
    if args.native and device.type != "cuda":
        raise DataError(f"--native: the native Mamba2 control needs a CUDA device (and mamba-ssm), got --device "
                        f"{device}")
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        batch = pick(args.batch, "batch")
        if batch % nproc:
            raise DataError(f"--batch: the global batch {batch} is not divisible by --nproc {nproc} "
                            f"(rank r takes rows [r*B/N, (r+1)*B/N) of every step's batch)")
        if device.type == "cuda" and args.device not in ("auto", "cuda"):
            raise DataError(f"--device: with --nproc give cuda (rank r uses cuda:r), not {args.device}")
        if device.type == "cuda" and nproc > torch.cuda.device_count():
            raise DataError(f"--nproc: {nproc} processes need {nproc} GPUs (one per rank), "
                            f"{torch.cuda.device_count()} visible")
