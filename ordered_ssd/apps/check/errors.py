"""The check's user-facing failure."""
from ..errors import AppError


class CheckError(AppError):
    """A user-facing failure of the check (one-line message, nonzero exit)."""


def first_line(e: BaseException) -> str:
    """The first non-blank line of ``e``'s message (stripped; ``""`` for an empty one): the part of a library's
    multi-line error that fits in the check's one-line errors."""
    return next((line for line in str(e).splitlines() if line.strip()), "").strip()
