"""The applications' user-facing failures: one line on stderr, a documented exit status."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn, Tuple, Type

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130


def plural(n: int, word: str, many: str = "") -> str:
    """``n`` and the noun ``word`` agreeing with it, for a printed or error line: ``"1 layer"``, ``"2 layers"``,
    ``"0 layers"``; ``many``: the plural where it is not ``word + "s"`` (``plural(n, "process", "processes")``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


class AppError(RuntimeError):
    """A user-facing failure (bad argument, missing requirement, unwritable output, failed run): one-line
    message, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose usage errors are one line, ``"<prog>: error: <message>"``, and exit
    status 2, without argparse's usage lines before it (``--help`` still prints them). Its subcommands' parsers are
    of this class too (``add_subparsers`` makes them with the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def run_reporting(prog: str, command: Callable[[], int],
                  errors: Tuple[Type[BaseException], ...] = (AppError,)) -> int:
    """``command()``'s exit status; one of ``errors`` becomes ``"<prog>: error: <message>"`` on stderr and exit
    status 2, an interrupt ``"<prog>: interrupted"`` and 130.

    The error line is one write, so that the lines of concurrent ranks (under torchrun) do not interleave.
    """
    try:
        return command()
    except errors as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        sys.stderr.flush()
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

