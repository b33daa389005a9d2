"""The fresh processes of ``ordered-ssd check``: a run in a new interpreter (``python -m ordered_ssd _train``),
or under ``python -m torch.distributed.run`` with one process per rank."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import List, Optional

from .errors import CheckError

ERROR_PREFIX = "ordered-ssd _train: error: "
_RANK_EXCEPTION = re.compile(r"^\[rank\d+\]: [A-Za-z_.]*(Error|Exception|Interrupt)\b.*")


def _train_command(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool) -> List[str]:
    return (["-m", "ordered_ssd", "_train", "--spec", spec_path, "--record", record_path, "--label", label]
            + extra + ([] if progress else ["--quiet"]))


def run_fresh_process(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool) -> None:
    """Run ``ordered-ssd _train`` in a fresh process (its stderr shown).

    Raises:
        CheckError: the process exits non-zero (the message names the run and the exit code).
    """
    cmd = [sys.executable] + _train_command(spec_path, record_path, label, extra, progress)
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True)
    if res.returncode != 0:
        raise CheckError(f"run {label} (a fresh process) failed with exit code {res.returncode}: "
                         f"{res.stdout.strip()[-500:]}")


def child_threads(nproc: int) -> int:
    """Intra-op threads per rank when OMP_NUM_THREADS is unset: the usable cores split between the ranks."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // nproc)


def _is_progress_line(line: str) -> bool:
    return line.lstrip().startswith("[") and "step/s" in line and "|" in line


def run_torchrun(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool, nproc: int,
                 log_path: str, threads: Optional[int] = None, max_restarts: int = 0) -> None:
    """Run ``ordered-ssd _train`` under ``python -m torch.distributed.run`` with ``nproc`` processes (and
    ``max_restarts`` restarts of the whole group when a rank fails).

    If OMP_NUM_THREADS is unset, each rank gets ``threads`` intra-op threads (default :func:`child_threads`).
    torchrun's and the ranks' output goes to ``log_path``; rank 0's progress lines are forwarded to stderr.

    Raises:
        CheckError: torchrun exits non-zero; the message holds the ranks' one-line errors (deduplicated), or the
            log's path.
    """
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--max-restarts", str(max_restarts)] + _train_command(spec_path, record_path, label, extra, progress))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads if threads is not None else child_threads(nproc)))
    errors: List[str] = []
    crash: List[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, env=env, bufsize=1)
        try:
            for line in proc.stdout:
                log.write(line)
                if ERROR_PREFIX in line:
                    # ranks write concurrently: one line may hold several ranks' messages
                    for msg in line.split(ERROR_PREFIX)[1:]:
                        msg = msg.strip()
                        if msg and msg not in errors:
                            errors.append(msg)
                elif _RANK_EXCEPTION.match(line):  # an uncaught exception's last line, "[rankN]: XError: ..."
                    crash.append(line.strip())
                elif progress and _is_progress_line(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            returncode = proc.wait()
        except BaseException:
            proc.terminate()  # torchrun forwards SIGTERM to the ranks
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    if returncode != 0:
        detail = " | ".join(errors) if errors else (
            (crash[0] + f" (full output: {log_path})") if crash else f"see {log_path}")
        raise CheckError(f"run {label} ({nproc} processes under torchrun) failed with exit code {returncode}: "
                         f"{detail}")


class Launcher:
    """Starts the runs of one check: ``launch(spec_path, name, label, extra)`` trains in fresh processes (one, or
    ``nproc`` under torchrun), writing the record ``runs/<name>.json`` (and, under torchrun, ``runs/<name>.log``).
    ``launch(..., nproc=R)`` overrides the number of processes of one run; ``threads``: the intra-op threads of
    every rank under torchrun when OMP_NUM_THREADS is unset."""

    def __init__(self, runs_dir: str, progress: bool, nproc: Optional[int], threads: Optional[int] = None):
        self.runs_dir, self.progress, self.nproc, self.threads = runs_dir, progress, nproc, threads

    def record(self, name: str) -> str:
        return os.path.join(self.runs_dir, f"{name}.json")

    def __call__(self, spec_path: str, name: str, label: str, extra: List[str], nproc: Optional[int] = None,
                 max_restarts: int = 0) -> None:
        nproc = self.nproc if nproc is None else nproc
        if nproc is not None:
            run_torchrun(spec_path, self.record(name), label, extra, self.progress, nproc,
                         os.path.join(self.runs_dir, f"{name}.log"), threads=self.threads, max_restarts=max_restarts)
        else:
            run_fresh_process(spec_path, self.record(name), label, extra, self.progress)
