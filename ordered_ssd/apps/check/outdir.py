"""What a check finds in and leaves in its output directory (``--out``).

A run writes ``report.json`` (last), ``loss.png`` and ``runs/`` (specs, records, logs, checkpoints). Before it is
accepted, what an earlier run left there is checked (:func:`check_earlier_results`, read only): an entry of the
wrong kind (``runs`` a file, ``report.json`` a directory, ``runs/a.json`` a directory, ...) or a file that no check
writes in ``runs/`` refuses the run with one line, and nothing is changed. Once it is accepted and starts
(:func:`set_aside_earlier_results`), the earlier run's files leave the places of the new ones: a finished earlier
run (it wrote ``report.json``) is moved, whole, to ``previous/`` (replacing the one before it); an unfinished one's
``runs/`` and ``loss.png`` are removed. So ``--out`` holds this run's files and at most the last finished run
before it, never a mix.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

from .errors import CheckError, describe_path

REPORT, PLOT, RUNS, PREVIOUS = "report.json", "loss.png", "runs", "previous"
RESULTS = (REPORT, PLOT, RUNS)
#: what a check writes in ``runs/``: files with these endings (specs and records, logs, checkpoints; the
#: temporary files of atomic writes end alike) and folders with this prefix (sharded checkpoints)
RUN_FILE_SUFFIXES = (".json", ".log", ".pt")
RUN_DIR_PREFIX = "checkpoints-"


def _check_files(folder: str) -> None:
    """CheckError unless what ``folder`` holds of :data:`RESULTS` has the kinds a check writes."""
    for name, what in ((REPORT, "the verdict"), (PLOT, "the loss plot")):
        path = os.path.join(folder, name)
        if os.path.lexists(path) and not os.path.isfile(path):
            raise CheckError(f"--out: expected {path} to be a regular file ({what} of an earlier check) or absent, "
                             f"got {describe_path(path)}; move it away or choose another --out")
    runs = os.path.join(folder, RUNS)
    if not os.path.lexists(runs):
        return
    if os.path.islink(runs) or not os.path.isdir(runs):
        kind = "a symbolic link" if os.path.islink(runs) else describe_path(runs)
        raise CheckError(f"--out: expected {runs} to be a directory (the runs of an earlier check) or absent, got "
                         f"{kind}; move it away or choose another --out")
    try:
        entries = sorted(os.listdir(runs))
    except OSError as e:
        raise CheckError(f"--out: expected a readable directory, got {runs}: {e.strerror}") from None
    for entry in entries:
        path = os.path.join(runs, entry)
        if entry.startswith(RUN_DIR_PREFIX):
            ok, want = os.path.isdir(path) and not os.path.islink(path), "a directory (a checkpoint folder)"
        elif entry.endswith(RUN_FILE_SUFFIXES):
            ok, want = os.path.isfile(path), "a regular file (a spec, record, log or checkpoint)"
        else:
            raise CheckError(f"--out: expected only the files of an earlier check in {runs} (*.json, *.log, *.pt, "
                             f"{RUN_DIR_PREFIX}*), got {entry}; move it away or choose another --out")
        if not ok:
            raise CheckError(f"--out: expected {path} to be {want}, got {describe_path(path)}; move it away or "
                             f"choose another --out")


def check_earlier_results(out_dir: str) -> None:
    """Refuse (one :class:`CheckError` line naming the path, what was expected and what is there; nothing changed)
    an ``--out`` whose ``report.json``, ``loss.png`` or ``runs/`` are of the wrong kind or hold what no check writes,
    and, where the earlier run finished (it has ``report.json``, so it would be moved to ``previous/``), a
    ``previous`` that is not an earlier check's results (it would be replaced)."""
    _check_files(out_dir)
    previous = os.path.join(out_dir, PREVIOUS)
    if not os.path.lexists(os.path.join(out_dir, REPORT)) or not os.path.lexists(previous):
        return
    if os.path.islink(previous) or not os.path.isdir(previous):
        raise CheckError(f"--out: expected {previous} to be a directory (an earlier check's results, replaced by "
                         f"the last run's) or absent, got {describe_path(previous)}; move it away or choose another "
                         f"--out")
    try:
        other = sorted(set(os.listdir(previous)) - set(RESULTS))
    except OSError as e:
        raise CheckError(f"--out: expected a readable directory, got {previous}: {e.strerror}") from None
    if other:
        raise CheckError(f"--out: expected {previous} to hold only an earlier check's {', '.join(RESULTS)} (it is "
                         f"replaced by the last run's), got {', '.join(other)}; move it away or choose another --out")
    _check_files(previous)


def set_aside_earlier_results(out_dir: str) -> Optional[str]:
    """Clear the places of this run's files (the run is accepted and starts; :func:`check_earlier_results` passed):
    a finished earlier run moves to ``previous/``, an unfinished one's files are removed. Returns a line saying what
    was done, or None where ``--out`` held none.

    Raises:
        CheckError: a file cannot be moved or removed (e.g. no permission); where the move fails, what had moved is
            put back.
    """
    present = [name for name in RESULTS if os.path.lexists(os.path.join(out_dir, name))]
    if not present:
        return None
    if REPORT not in present:  # an unfinished run (report.json is written last): its files are of no verdict
        for name in present:
            path = os.path.join(out_dir, name)
            try:
                if name == RUNS:
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            except OSError as e:
                raise CheckError(f"--out: expected to remove the unfinished earlier run's {path}, got "
                                 f"{e.strerror or e}") from None
        return f"earlier run: unfinished (no {REPORT}); its {' and '.join(present)} removed"
    previous = os.path.join(out_dir, PREVIOUS)
    staging = tempfile.mkdtemp(dir=out_dir, prefix=".previous-")
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(staging, 0o777 & ~mask)  # mkdtemp makes 0700
    moved = []
    try:
        for name in (RUNS, PLOT, REPORT):  # runs/ first: moving a folder needs write permission on it too
            if name in present:
                os.rename(os.path.join(out_dir, name), os.path.join(staging, name))
                moved.append(name)
    except OSError as e:
        failed = os.path.join(out_dir, name)
        for back in reversed(moved):
            os.rename(os.path.join(staging, back), os.path.join(out_dir, back))
        os.rmdir(staging)
        raise CheckError(f"--out: expected to move the earlier run's {failed} to {previous}, got "
                         f"{e.strerror or e}; nothing was moved") from None
    try:
        if os.path.lexists(previous):
            shutil.rmtree(previous)
        os.rename(staging, previous)
    except OSError as e:
        raise CheckError(f"--out: expected to replace {previous} (the run before the earlier one) by the earlier "
                         f"run's results, got {e.strerror or e}; the earlier run's results are in {staging}") from None
    return f"earlier run: its {', '.join(sorted(moved))} moved to {previous}"
