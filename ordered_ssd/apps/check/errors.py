"""The check's user-facing failure."""
from ..errors import AppError


class CheckError(AppError):
    """A user-facing failure of the check (one-line message, nonzero exit)."""
