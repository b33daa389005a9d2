"""The check's user-facing failure."""
import contextlib
import os
from typing import Iterator

from ..errors import AppError, plural  # noqa: F401 (plural: the check's modules import it from here)


class CheckError(AppError):
    """A user-facing failure of the check (one-line message, nonzero exit)."""


def first_line(e: BaseException) -> str:
    """The first non-blank line of ``e``'s message (stripped; ``""`` for an empty one): the part of a library's
    multi-line error that fits in the check's one-line errors."""
    return next((line for line in str(e).splitlines() if line.strip()), "").strip()


def describe_path(path: str) -> str:
    """What is at ``path``, for an error line: ``a directory``, ``a regular file``, ``a symbolic link to nothing``,
    ``a FIFO, device or socket`` or ``nothing``."""
    if os.path.islink(path) and not os.path.exists(path):
        return "a symbolic link to nothing"
    if os.path.isdir(path):
        return "a directory"
    if os.path.isfile(path):
        return "a regular file"
    return "a FIFO, device or socket" if os.path.lexists(path) else "nothing"


@contextlib.contextmanager
def writing(what: str, path: str) -> Iterator[None]:
    """Turn an ``OSError`` raised while the block writes ``path`` (a directory in the way, no permission, a full
    disk) into one :class:`CheckError` line naming ``what`` and the path."""
    try:
        yield
    except OSError as e:
        got = "a directory" if os.path.isdir(path) else f"{e.strerror or e} (errno {e.errno})"
        raise CheckError(f"{what} {path}: expected a path where a file can be written, got {got}") from None
