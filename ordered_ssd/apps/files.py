"""What the applications share on disk and on the command line: atomic file writes (temporary file in the target
directory, then a rename), the output directory, argparse value types."""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import tempfile
from typing import Callable, Iterator, Sequence

from .errors import AppError


def prepare_out_dir(path: str) -> str:
    """Create ``path`` if needed, check it is writable and return its absolute path.

    Raises:
        AppError: ``path`` exists and is not a directory, or the folder cannot be created or written (the message
            names ``--out``, the path and why). Nothing is written then.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise AppError(f"--out: expected a directory, got an existing file that is not one: {path}")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise AppError(f"--out: expected a writable output directory, got {path}, which is not writable: "
                       f"{e.strerror or e}") from None
    return os.path.abspath(path)


LOCK_NAME = ".lock"


@contextlib.contextmanager
def locked_out_dir(path: str) -> Iterator[str]:
    """Hold an exclusive, non-blocking ``flock`` on ``path/.lock`` while the block runs (released on exit, also on
    an error; the kernel releases it if the process dies). The lock file stays (removing it would race).

    Raises:
        AppError: another process holds the lock (the message names the folder).
    """
    import fcntl

    lock_path = os.path.join(path, LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)  # not inherited by child processes
    except OSError as e:
        got = "a directory" if os.path.isdir(lock_path) else (e.strerror or str(e))
        raise AppError(f"--out: expected a lock file at {lock_path} (made if absent), got {got}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AppError(f"--out: output directory {path} is in use: another run holds its lock ({lock_path}); "
                           f"wait for it to finish or choose another --out") from None
        try:
            yield path
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[str], None], suffix: str = "") -> None:
    """Call ``write(tmp_path)``, give the file the usual permissions (``0666 & ~umask``; mkstemp makes 0600),
    and rename it to ``path``; on any error the temporary file is removed and ``path`` is left as it was."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix or os.path.basename(path))
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


def atomic_savefig(path: str, fig, dpi: int, layout: bool = True) -> None:
    """Lay out ``fig`` (``tight_layout``; not with ``layout=False``: the caller placed its axes), write it to
    ``path`` as a PNG atomically, and close it (also when writing fails)."""
    import matplotlib.pyplot as plt

    try:
        if layout:
            fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"), suffix=".png")
    finally:
        plt.close(fig)


def _integer(s: str, minimum: int, what: str) -> int:
    try:
        value = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {s!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {value}")
    return value


def positive_int(s: str) -> int:
    """argparse type: an int >= 1."""
    return _integer(s, 1, "positive")


def nonnegative_int(s: str) -> int:
    """argparse type: an int >= 0."""
    return _integer(s, 0, "non-negative")


def positive_float(s: str) -> float:
    """argparse type: a finite float > 0 (not nan, not inf)."""
    try:
        value = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {s!r}")
    return value
