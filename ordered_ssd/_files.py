"""Atomic file writes (temporary file in the target directory, then a rename) and argparse value types."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Callable


def atomic_write(path: str, write: Callable[[str], None], suffix: str = "") -> None:
    """Call ``write(tmp_path)``, give the file the usual permissions (``0666 & ~umask``; mkstemp makes 0600),
    and rename it to ``path``; on any error the temporary file is removed and ``path`` is left as it was."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=suffix or os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: str, data: bytes) -> None:
    def write(tmp):
        with open(tmp, "wb") as fh:
            fh.write(data)

    atomic_write(path, write)


def atomic_write_json(path: str, obj, **dumps_kw) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True, **dumps_kw) + "\n").encode())


def atomic_torch_save(path: str, obj) -> None:
    import torch

    atomic_write(path, lambda tmp: torch.save(obj, tmp), suffix=".pt")


def atomic_savefig(path: str, fig, dpi: int) -> None:
    """Lay out ``fig``, write it to ``path`` as a PNG atomically, and close it (also when writing fails)."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"), suffix=".png")
    finally:
        plt.close(fig)


def _integer(s: str, minimum: int, what: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {s!r}") from None
    if v < minimum:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {v}")
    return v


def positive_int(s: str) -> int:
    """argparse type: an int >= 1."""
    return _integer(s, 1, "positive")


def nonnegative_int(s: str) -> int:
    """argparse type: an int >= 0."""
    return _integer(s, 0, "non-negative")
