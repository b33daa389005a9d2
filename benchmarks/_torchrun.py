"""What the distributed benchmarks share: launching a script under torchrun with itself, and device syncs.

``ddp_hook.py`` and ``fsdp_cost.py`` re-run themselves through ``python -m torch.distributed.run`` when not
already under torchrun (:func:`self_launch`); every timing synchronises the device first (:func:`sync`).
"""
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resolve_device(device: str) -> str:
    """``"auto"``: ``"cuda"`` if available, else ``"cpu"``; other names as they are."""
    return device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")


def self_launch(script: str, nproc: int, device: str) -> int:
    """Run ``script`` with this process's arguments (less ``--nproc``, torchrun's business and an ambiguous
    abbreviation to its parser) under ``torchrun --standalone`` with ``nproc`` processes and ``--device device``;
    returns its exit code, or 2 (a one-line error) when CUDA has fewer GPUs than ``nproc``. Each process gets
    ``OMP_NUM_THREADS = cores // nproc`` unless set, and the repository root on ``PYTHONPATH``."""
    name = os.path.basename(script)
    if device == "cuda" and nproc > torch.cuda.device_count():
        print(f"{name}: error: --nproc {nproc} needs {nproc} GPUs, {torch.cuda.device_count()} visible",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    fwd, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            fwd.append(arg)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", os.path.abspath(script), *fwd, "--device", device]
    return subprocess.run(cmd, env=env).returncode


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
