"""Sharded training checkpoints that a run can resume from on another number of ranks, written atomically and
loaded only after validation.

A checkpoint is a directory ``<root>/step-<step:08d>`` written through ``torch.distributed.checkpoint`` (DCP):
the model and optimizer state as ``torch.distributed.checkpoint.state_dict.get_state_dict`` gives them (FSDP2's
sharded DTensors, or a plain / DDP model's tensors, which DCP writes once), every rank's RNG state, the step, the
caller's JSON ``app_state`` (e.g. the data position) and the determinism fingerprint, with a ``manifest.json``
holding the size and SHA-256 of every file. Loading reshards to the current world size (DCP), so a run stopped on
``R`` ranks resumes on ``R'``.

Atomic: every rank writes into ``<root>/.step-<step>.tmp-<nonce>``; after a barrier rank 0 writes the manifest
(last, fsynced) and renames the directory into place. A run killed at any point leaves either no
``step-*`` directory for that step or a complete one: :func:`latest_checkpoint` only returns directories with a
manifest, and :func:`load_checkpoint` refuses, before touching the model, a directory whose files do not match
their sizes and digests (a truncated or changed shard), whose parameters differ from the model's (another model),
or whose fingerprint differs in anything but the world size (another machine or library version).

Collective when a process group is initialised (every rank calls with the same arguments); without one, a
1-process checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from typing import Any, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "checkpoint_step",
           "MANIFEST", "CHECKPOINT_FORMAT"]

MANIFEST = "manifest.json"
CHECKPOINT_FORMAT = "ordered-ssd-dcp-1"
_PREFIX = "step-"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, incomplete, changed, or of another model or machine (one line,
    naming the checkpoint and what is wrong)."""


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _world() -> int:
    return dist.get_world_size() if _distributed() else 1


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _broadcast(obj):
    """rank 0's ``obj`` on every rank."""
    if not _distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(obj) -> list:
    if not _distributed():
        return [obj]
    every: List[Any] = [None] * _world()
    dist.all_gather_object(every, obj)
    return every


def _rng_state(device: Optional[torch.device]) -> dict:
    state = {"torch": torch.random.get_rng_state().numpy().tobytes().hex()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device).numpy().tobytes().hex()
    return state


def _set_rng_state(state: dict, device: Optional[torch.device]) -> None:
    as_tensor = lambda h: torch.frombuffer(bytearray.fromhex(h), dtype=torch.uint8).clone()  # noqa: E731
    torch.random.set_rng_state(as_tensor(state["torch"]))
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(as_tensor(state["cuda"]), device)


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files_of(path: str) -> Dict[str, dict]:
    return {name: {"bytes": os.path.getsize(os.path.join(path, name)), "sha256": _file_digest(os.path.join(path, name))}
            for name in sorted(os.listdir(path)) if name != MANIFEST}


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _states(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer]):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def _param_table(model_sd: dict) -> Dict[str, list]:
    """``{name: [global shape, dtype]}`` of a model state dict (DTensors by their global shape)."""
    return {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in model_sd.items()
            if isinstance(v, torch.Tensor)}


def checkpoint_step(path: str) -> int:
    """The step of a checkpoint directory named ``step-<step>`` (ValueError for another name)."""
    name = os.path.basename(os.path.normpath(path))
    if not name.startswith(_PREFIX) or not name[len(_PREFIX):].isdigit():
        raise ValueError(f"path: expected a checkpoint directory named {_PREFIX}<step>, got {name!r}")
    return int(name[len(_PREFIX):])


def save_checkpoint(root: str, step: int, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    *, app_state: Optional[dict] = None, fingerprint: Optional[dict] = None,
                    device: Optional[torch.device] = None) -> str:
    """Write the checkpoint of ``step`` to ``<root>/step-<step:08d>`` atomically; return its path (every rank).

    Args:
        root: the checkpoints' directory (made if missing).
        step: the number of optimizer steps done (an int >= 0); an existing checkpoint of that step is replaced
            (atomically: first the new one is complete, then the old one is removed).
        model, optimizer: saved through ``get_state_dict`` (sharded where the model is ``fully_shard``-ed).
        app_state: JSON-serialisable state of the caller (e.g. the data position); returned by
            :func:`load_checkpoint`.
        fingerprint: the determinism fingerprint (:func:`ordered_ssd.fingerprint.determinism_fingerprint` or a
            rank's :func:`ordered_ssd.distributed.rank_fingerprint`), compared when loading.
        device: the training device, whose RNG state is saved with the CPU generator's (every rank's).

    Raises:
        ValueError / TypeError: a negative ``step``, ``app_state`` that is not JSON-serialisable (before anything
            is written).
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step: expected an int >= 0, got {step!r}")
    try:
        app_json = json.dumps(app_state if app_state is not None else {}, sort_keys=True)
        fp_json = json.dumps(fingerprint, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"app_state / fingerprint: expected JSON-serialisable values, got one that is not ({e})"
                        ) from None
    import torch.distributed.checkpoint as dcp

    final = os.path.join(root, f"{_PREFIX}{step:08d}")
    tmp = _broadcast(os.path.join(root, f".{_PREFIX}{step:08d}.tmp-{uuid.uuid4().hex[:12]}"))
    if _rank() == 0:
        os.makedirs(tmp)
    _barrier()
    states = _states(model, optimizer)
    dcp.save(states, checkpoint_id=tmp, no_dist=not _distributed())
    rngs = _gather(_rng_state(device))
    _barrier()  # every rank's files are written
    if _rank() == 0:
        manifest = {"format": CHECKPOINT_FORMAT, "step": step, "world_size": _world(), "torch": torch.__version__,
                    "params": _param_table(states["model"]), "optimizer": optimizer is not None,
                    "app_state": json.loads(app_json), "fingerprint": json.loads(fp_json), "rng": rngs,
                    "files": _files_of(tmp)}
        with open(os.path.join(tmp, MANIFEST), "w") as fh:
            json.dump(manifest, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        old = None
        if os.path.exists(final):
            old = f"{tmp}.old"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def latest_checkpoint(root: str) -> Optional[str]:
    """The complete checkpoint (a ``step-*`` directory with a manifest) of the highest step under ``root``, or
    None (no such directory, or ``root`` missing). Temporary directories of interrupted writes are ignored."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return None
    best = None
    for name in names:
        path = os.path.join(root, name)
        try:
            step = checkpoint_step(path)
        except ValueError:
            continue
        if os.path.isfile(os.path.join(path, MANIFEST)) and (best is None or step > best[0]):
            best = (step, path)
    return None if best is None else best[1]


def _read_manifest(path: str) -> dict:
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path}: expected a checkpoint directory, got "
                              f"{'a file' if os.path.exists(path) else 'no such directory'}")
    try:
        with open(mpath) as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path}: expected a complete checkpoint, got a directory without "
                              f"{MANIFEST} (an interrupted write?)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: expected {MANIFEST} in JSON, got one that does not read ({e})"
                              ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"checkpoint {path}: expected format {CHECKPOINT_FORMAT}, got {got!r}")
    return manifest


def _verify_files(path: str, manifest: dict) -> None:
    files = manifest.get("files") or {}
    present = {n for n in os.listdir(path) if n != MANIFEST}
    missing = sorted(set(files) - present)
    if missing:
        raise CheckpointError(f"checkpoint {path}: expected the files of its manifest, got {len(missing)} missing "
                              f"({', '.join(missing[:3])})")
    for name, want in sorted(files.items()):
        full = os.path.join(path, name)
        size = os.path.getsize(full)
        if size != want["bytes"]:
            raise CheckpointError(f"checkpoint {path}: file {name}: expected {want['bytes']} bytes, got {size} "
                                  f"(truncated or changed)")
        if _file_digest(full) != want["sha256"]:
            raise CheckpointError(f"checkpoint {path}: file {name}: expected SHA-256 {want['sha256'][:16]}..., got "
                                  f"another (changed or corrupt)")


def _check_params(path: str, manifest: dict, model_sd: dict) -> None:
    saved, have = manifest.get("params") or {}, _param_table(model_sd)
    missing, extra = sorted(set(have) - set(saved)), sorted(set(saved) - set(have))
    if missing or extra:
        raise CheckpointError(f"checkpoint {path}: expected the parameters of this model, got a checkpoint without "
                              f"{missing[:3]} and with {extra[:3]} (another model?)")
    for name in sorted(have):
        if have[name] != saved[name]:
            raise CheckpointError(f"checkpoint {path}: parameter {name}: expected shape {have[name][0]} "
                                  f"{have[name][1]} (this model), got {saved[name][0]} {saved[name][1]} "
                                  f"(another model?)")


def _check_fingerprint(path: str, manifest: dict, fingerprint: Optional[dict], ignore: Iterable[str]) -> None:
    if fingerprint is None:
        return
    saved = manifest.get("fingerprint") or {}
    skip = set(ignore)
    diff = {k: (saved.get(k), fingerprint.get(k)) for k in sorted(set(saved) | set(fingerprint))
            if k not in skip and saved.get(k) != fingerprint.get(k)}
    if diff:
        raise CheckpointError(f"checkpoint {path}: expected the determinism fingerprint of this run (apart from "
                              f"{', '.join(sorted(skip)) or 'nothing'}), got one that differs in {diff}: resuming "
                              f"would not continue with the same bits")


def load_checkpoint(path: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                    fingerprint: Optional[dict] = None, ignore: Iterable[str] = ("world_size",),
                    device: Optional[torch.device] = None, restore_rng: bool = True) -> dict:
    """Validate the checkpoint at ``path`` and load it into ``model`` (and ``optimizer``), resharded to this world
    size; return its manifest (``step``, ``app_state``, ``world_size``, ...).

    Validation, before the model is touched (rank 0 reads the files; every rank raises the same error): the
    manifest exists and has this format; every file has its recorded size and SHA-256; the parameter names,
    global shapes and dtypes are the model's; with ``fingerprint``, the saved fingerprint equals it in every field
    except ``ignore`` (default: the world size, which a restart may change).

    RNG (``restore_rng``): on the same world size every rank gets its own saved state; on another, every rank
    gets the one state all saved ranks share, and the load is refused if they differ (a rank-dependent stream has
    no counterpart on another world size).

    Raises:
        CheckpointError: as said (nothing loaded).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    error = None
    manifest = None
    if _rank() == 0:
        try:
            manifest = _read_manifest(path)
            _verify_files(path, manifest)
            _check_fingerprint(path, manifest, fingerprint, ignore)
            if optimizer is not None and not manifest.get("optimizer"):
                raise CheckpointError(f"checkpoint {path}: expected an optimizer state, got a checkpoint without one")
        except CheckpointError as e:
            error = str(e)
    error, manifest = _broadcast((error, manifest))
    if error is not None:
        raise CheckpointError(error)
    states = _states(model, optimizer)
    _check_params(path, manifest, states["model"])  # the same on every rank (global shapes)
    rngs = manifest["rng"]
    if restore_rng:
        if len(rngs) == _world():
            rng = rngs[_rank()]
        elif all(r == rngs[0] for r in rngs):
            rng = rngs[0]
        else:
            raise CheckpointError(f"checkpoint {path}: written by {len(rngs)} ranks whose RNG states differ; they "
                                  f"cannot be given to {_world()} ranks (pass restore_rng=False to keep this "
                                  f"run's)")
    dcp.load(states, checkpoint_id=path, no_dist=not _distributed())
    if optimizer is not None:
        set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optimizer"])
    else:
        set_model_state_dict(model, states["model"])
    if restore_rng:
        _set_rng_state(rng, device)
    _barrier()
    return manifest
