"""The run spec of ``ordered-ssd check`` from its command-line arguments, and the per-device defaults."""
from __future__ import annotations

import os

import torch

from ..errors import plural
from ..lm import DataError

# Defaults per device: CPU finishes in about a minute; CUDA trains a larger model for longer.
DEFAULTS = {
    "cpu": dict(d_model=64, n_layers=2, d_state=16, headdim=16, chunk_size=32, steps=40, batch=4, seq_len=128,
                lr=3e-3, data_bytes=2_000_000),
    "cuda": dict(d_model=512, n_layers=8, d_state=64, headdim=64, chunk_size=128, steps=200, batch=8, seq_len=512,
                 lr=1e-3, data_bytes=16_000_000),
}


#: the byte LM's layer kinds (``--layer``) and how the check names them; ``mamba2`` is the default, which a spec's
#: ``model`` leaves unnamed (the specs, digests and resume checks of earlier runs stay as they were)
LAYERS = {"mamba2": "Mamba-2", "mamba3": "Mamba-3"}
DEFAULT_LAYER = "mamba2"


def layer_of(model: dict) -> str:
    """The layer kind of a spec's byte-LM ``model``: its ``layer``, or ``mamba2`` where it names none."""
    return model.get("layer", DEFAULT_LAYER)


def layer_name(model: dict) -> str:
    """``Mamba-2`` or ``Mamba-3``: how the check's lines name the layers of a spec's byte-LM ``model``."""
    return LAYERS[layer_of(model)]


def rope_angles(d_state: int) -> int:
    """The rotary angles of an ``OrderedMamba3`` of ``d_state`` (``rope_fraction`` 0.5, the check's):
    ``d_state / 2`` rounded down to even, halved (the layer's ``num_rope_angles``)."""
    split = d_state // 2
    return (split - split % 2) // 2


def resolve_device(name: str) -> torch.device:
    """``auto`` / ``cpu`` / ``cuda`` / ``cuda:N`` -> a torch.device; DataError for anything else, a missing GPU, or a
    GPU without the ordered CUDA path (mamba-ssm / causal-conv1d missing or of other versions; the same for
    ``--layer mamba2`` and ``mamba3``). ``auto`` is ``cuda`` where torch sees a GPU (checked as ``cuda`` is: no
    silent fallback to the CPU), else ``cpu``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
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
    hf_config = getattr(args, "hf_config", None)
    layer = getattr(args, "layer", DEFAULT_LAYER)
    device = resolve_device(args.device)
    defaults = DEFAULTS[device.type]
    pick = lambda value, key: defaults[key] if value is None else value  # noqa: E731
    if hf_config is not None:
        return _hf_spec_from_args(args, device, pick)
    if layer not in LAYERS:
        raise DataError(f"--layer: expected one of {', '.join(LAYERS)}, got {layer!r}")
    model = dict(d_model=pick(args.d_model, "d_model"), n_layers=pick(args.n_layers, "n_layers"),
                 d_state=pick(args.d_state, "d_state"), headdim=pick(args.headdim, "headdim"),
                 ngroups=args.ngroups, chunk_size=pick(args.chunk_size, "chunk_size"), expand=2)
    if layer != DEFAULT_LAYER:  # named only when not the default: a mamba2 spec is the spec of earlier versions
        model["layer"] = layer
    if (2 * model["d_model"]) % model["headdim"]:
        raise DataError(f"--headdim: expected a divisor of 2 * d_model = {2 * model['d_model']}, "
                        f"got {model['headdim']}")
    if ((2 * model["d_model"]) // model["headdim"]) % model["ngroups"]:
        raise DataError(f"--ngroups: expected a divisor of the number of heads "
                        f"{(2 * model['d_model']) // model['headdim']}, got {model['ngroups']}")
    if layer == "mamba3" and rope_angles(model["d_state"]) < 1:
        raise DataError(f"--d-state: expected at least 4 with --layer mamba3 (Mamba-3 rotates d_state / 2 channels, "
                        f"rounded down to even, in pairs: at least one rotary angle), got {model['d_state']}")
    if layer == "mamba3" and device.type == "cuda":  # OrderedMamba3's CUDA path (mamba-ssm's Mamba-3 kernels)
        for flag, key in (("--d-state", "d_state"), ("--headdim", "headdim"), ("--chunk-size", "chunk_size")):
            value = model[key]
            if value < 16 or value & (value - 1):
                raise DataError(f"{flag}: expected a power of two >= 16 with --layer mamba3 on CUDA (mamba-ssm's "
                                f"Mamba-3 kernels), got {value}")
    _check_data_native_nproc(args, device, pick, layer)
    return {**_run_fields(args, device, pick), "model": model}


#: the byte LM's shape options, which --hf-config replaces (the config gives the model)
MODEL_FLAGS = (("--d-model", "d_model", None), ("--n-layers", "n_layers", None), ("--d-state", "d_state", None),
               ("--headdim", "headdim", None), ("--ngroups", "ngroups", 1), ("--chunk-size", "chunk_size", None),
               ("--layer", "layer", DEFAULT_LAYER))


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
            "threads": check_threads(getattr(args, "threads", None), device),
            "batch": pick(args.batch, "batch"), "seq_len": pick(args.seq_len, "seq_len"), "lr": pick(args.lr, "lr"),
            "weight_decay": 0.1, "clip": 1.0, "data": None if args.data is None else os.path.abspath(args.data),
            "data_bytes": pick(args.data_bytes, "data_bytes"),
            "val_windows": VAL_WINDOWS if getattr(args, "val_windows", None) is None else args.val_windows}


#: the intra-op threads of a CPU check's training processes where neither --threads nor OMP_NUM_THREADS says
THREADS_DEFAULT = 1


def check_threads(threads, device: torch.device):
    """The intra-op threads of every training process of a check on ``device`` (``spec["threads"]``): ``threads``
    (``--threads``) where given; else on the CPU ``OMP_NUM_THREADS`` where set, else :data:`THREADS_DEFAULT` (one
    thread does not collapse when other processes take the cores: torch's threads wait for each other at every
    parallel region, so on a busy 2-core machine two threads took minutes where one took seconds); on CUDA None
    (torch's default: the GPU's bits do not depend on it). DataError for an ``OMP_NUM_THREADS`` that is not a
    positive integer."""
    if threads is not None or device.type != "cpu":
        return threads
    env = os.environ.get("OMP_NUM_THREADS")
    if env is None or env.strip() == "":
        return THREADS_DEFAULT
    try:
        value = int(env)
    except ValueError:
        value = 0
    if value < 1:
        raise DataError(f"OMP_NUM_THREADS: expected a positive integer (the check's default --threads on the CPU), "
                        f"got {env!r}; unset it or pass --threads N")
    return value


def _check_data_native_nproc(args, device: torch.device, pick, layer: str = DEFAULT_LAYER) -> None:
    """The checks of ``--data``, ``--native`` and ``--nproc`` shared by the byte LM and ``--hf-config``."""
    if args.data is not None and not os.path.exists(args.data):
        raise DataError(f"--data: expected an existing file or directory, got {args.data} (no such file or "
                        f"directory)")
    if args.native and device.type != "cuda":
        got = (f"--device {args.device}" if args.device != "auto" else
               "no CUDA GPU: torch sees none here, so --device auto (the default) chose the CPU")
        raise DataError(f"--native: the native {LAYERS[layer].replace('-', '')} control needs a CUDA device (and "
                        f"mamba-ssm), got {got}")
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        batch = pick(args.batch, "batch")
        if batch % nproc:
            raise DataError(f"--batch: the global batch {batch} is not divisible by --nproc {nproc} "
                            f"(rank r takes rows [r*B/N, (r+1)*B/N) of every step's batch)")
        if device.type == "cuda" and args.device not in ("auto", "cuda"):
            raise DataError(f"--device: with --nproc give cuda (rank r uses cuda:r), not {args.device}")
        if device.type == "cuda" and nproc > torch.cuda.device_count():
            raise DataError(f"--nproc: {plural(nproc, 'process', 'processes')} {'needs' if nproc == 1 else 'need'} "
                            f"{plural(nproc, 'GPU')} (one per rank), {torch.cuda.device_count()} visible")
