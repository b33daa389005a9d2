"""The fresh processes of ``ordered-ssd check``: a run in a new interpreter (``python -m ordered_ssd _train``),
or under ``python -m torch.distributed.run`` with one process per rank."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, List, Optional, Tuple

from .errors import CheckError, plural, writing

ERROR_PREFIX = "ordered-ssd _train: error: "
#: an uncaught exception's last line, in a rank's output ``[rankN]: XError: ...`` (torch prefixes the ranks' lines)
_RANK_EXCEPTION = re.compile(r"^\[rank\d+\]: [A-Za-z_.]*(Error|Exception|Interrupt)\b.*")
#: an uncaught exception's last line (``IsADirectoryError: [Errno 21] ...``), or argparse's ``prog: error: ...``
_EXCEPTION = re.compile(r"^(\[rank\d+\]: )?([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*|[\w .-]+: error: .+)$")
#: torchrun's own lines about a failed group (not the reason a rank failed)
_TORCHRUN_OWN = ("ChildFailedError", "torch.distributed.elastic")
#: torchrun's lines about a rank killed by a signal: ``Signal 9 (SIGKILL) received by PID 123``, else
#: ``exitcode  : -9 (pid: 123)``
_SIGNALS = (re.compile(r"Signal \d+ \(\w+\) received by PID \d+"), re.compile(r"exitcode\s*:\s*-\d+.*"))
REASON_CHARS = 500  # a reason longer than this is cut (the log holds all of it)
#: seconds a precompile worker may run before it is killed (its compiles are then the control's to do; the
#: workers of a Mamba-3 control took about 105 s on an H100)
WORKER_TIMEOUT_S = 900.0


def _train_command(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool) -> List[str]:
    return (["-m", "ordered_ssd", "_train", "--spec", spec_path, "--record", record_path, "--label", label]
            + extra + ([] if progress else ["--quiet"]))


def failure_reason(lines: List[str], returncode: int) -> str:
    """Why a child run failed, in one line, from its output ``lines``: the ``ordered-ssd _train: error:`` messages of
    its ranks (each once); else the last line of an uncaught exception (with ranks, the first rank's); else the
    signal that killed it (torchrun's report of a rank, or a negative ``returncode``); else its last non-blank line
    that is not a progress line or a rule; else that it printed nothing."""
    errors: List[str] = []
    for line in lines:
        for msg in line.split(ERROR_PREFIX)[1:]:  # ranks write concurrently: one line may hold several messages
            msg = msg.strip()
            if msg and msg not in errors:
                errors.append(msg)
    if errors:
        return " | ".join(errors)[:REASON_CHARS]
    stripped = [line.strip() for line in lines if line.strip()]
    ranks = [line for line in stripped if _RANK_EXCEPTION.match(line)]
    if ranks:
        return ranks[0][:REASON_CHARS]
    crashes = [line for line in stripped if _EXCEPTION.match(line) and not any(t in line for t in _TORCHRUN_OWN)]
    if crashes:
        return crashes[-1][:REASON_CHARS]
    for pattern in _SIGNALS:
        found = [m.group(0) for m in map(pattern.search, stripped) if m]
        if found:
            return f"killed: {found[0]}"[:REASON_CHARS]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (out of memory?) without an error message"
    rest = [line for line in stripped if not _is_progress_line(line) and set(line) - set("=-*")]
    return rest[-1][:REASON_CHARS] if rest else "it printed nothing"


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``proc``, or to its whole process group where it leads one (a precompile worker:
    :func:`_run_to_log`), so that what it started goes too; nothing once it has been waited for (its pid may
    then be another process's)."""
    if proc.returncode is not None:
        return
    try:
        if hasattr(os, "killpg") and os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


def _end(proc: subprocess.Popen) -> None:
    """Terminate ``proc`` (:func:`_signal`), and kill it if it has not ended 30 s later."""
    _signal(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()


def _run_logged(cmd: List[str], log_path: str, progress: bool, env: Optional[dict] = None,
                started: Optional[Callable] = None) -> Tuple[int, List[str]]:
    """Run ``cmd`` with its stdout and stderr written to ``log_path`` (and kept), its progress lines forwarded to
    this process's stderr when ``progress``; ``(exit status, output lines)``. An interrupt (or any error here)
    terminates the child (torchrun forwards SIGTERM to its ranks) and is raised again. ``started(proc)`` is called
    with the child's ``Popen`` once it runs, and ``started(None)`` when it has ended.

    Raises:
        CheckError: the log cannot be written (``log_path`` names a directory, no permission).
    """
    lines: List[str] = []
    with writing("run log", log_path):
        log = open(log_path, "w")
    with log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, env=env, bufsize=1, errors="replace")
        if started is not None:
            started(proc)
        try:
            for line in proc.stdout:
                log.write(line)
                lines.append(line)
                if progress and _is_progress_line(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            returncode = proc.wait()
        except BaseException:
            _end(proc)
            raise
        finally:
            if started is not None:
                started(None)
    return returncode, lines


def _run_to_log(cmd: List[str], log_path: str, env: Optional[dict], timeout: float,
                started: Callable) -> Tuple[Optional[int], List[str]]:
    """Run ``cmd`` in a process group of its own (POSIX), with its stdout and stderr written straight to
    ``log_path`` (no pipe: nothing a child leaves running can hold this up); after ``timeout`` seconds the group is
    killed. ``(exit status, or None if it was killed at the timeout; the log's lines)``. ``started(proc)`` /
    ``started(None)`` as in :func:`_run_logged`; an interrupt (or any error here) terminates the group and is raised
    again (Ctrl-C does not reach a group of its own: :meth:`Launcher.stop` ends it).

    Raises:
        CheckError: the log cannot be written.
    """
    with writing("run log", log_path):
        log = open(log_path, "w")
    with log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=hasattr(os, "killpg"))
        started(proc)
        try:
            try:
                returncode: Optional[int] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait()
                returncode = None
        except BaseException:
            _end(proc)
            raise
        finally:
            started(None)
    with open(log_path, errors="replace") as fh:
        return returncode, fh.readlines()


def _fresh_failure(label: str, returncode: int, lines: List[str], log_path: str) -> str:
    """The one line that says run ``label`` (a fresh process) exited with ``returncode``, why
    (:func:`failure_reason`) and where its log is."""
    return (f"run {label} (a fresh process) failed with exit code {returncode}: "
            f"{failure_reason(lines, returncode)} (full output: {log_path})")


def threads_env(threads: Optional[int]) -> Optional[dict]:
    """The environment of a fresh training process: this one's, with ``OMP_NUM_THREADS`` set to ``threads`` where
    given (the training sets the same count from its spec: :func:`.train.spec_threads`); None (inherit) without."""
    return None if threads is None else dict(os.environ, OMP_NUM_THREADS=str(threads))


def run_fresh_process(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool,
                      log_path: str, started: Optional[Callable] = None, threads: Optional[int] = None) -> None:
    """Run ``ordered-ssd _train`` in a fresh process (with ``OMP_NUM_THREADS=threads`` where given); its output
    goes to ``log_path``, its progress lines to stderr.

    Raises:
        CheckError: the process exits non-zero (the message names the run, the exit code, the reason
            (:func:`failure_reason`) and the log).
    """
    cmd = [sys.executable] + _train_command(spec_path, record_path, label, extra, progress)
    returncode, lines = _run_logged(cmd, log_path, progress, env=threads_env(threads), started=started)
    if returncode != 0:
        raise CheckError(_fresh_failure(label, returncode, lines, log_path))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def child_threads(nproc: int) -> int:
    """Intra-op threads per rank on CUDA when neither ``--threads`` nor OMP_NUM_THREADS says: the usable cores
    split between the ranks."""
    return max(1, usable_cores() // nproc)


def _is_progress_line(line: str) -> bool:
    return line.lstrip().startswith("[") and "step/s" in line and "|" in line


def run_torchrun(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool, nproc: int,
                 log_path: str, threads: Optional[int] = None, max_restarts: int = 0) -> None:
    """Run ``ordered-ssd _train`` under ``python -m torch.distributed.run`` with ``nproc`` processes (and
    ``max_restarts`` restarts of the whole group when a rank fails).

    Each rank gets ``threads`` intra-op threads (``OMP_NUM_THREADS``; without ``threads``, OMP_NUM_THREADS as set,
    else :func:`child_threads`).
    torchrun's and the ranks' output goes to ``log_path``; rank 0's progress lines are forwarded to stderr.

    Raises:
        CheckError: torchrun exits non-zero; the message holds the reason (:func:`failure_reason`: the ranks'
            one-line errors, deduplicated, or the first rank's uncaught exception) and the log's path.
    """
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--max-restarts", str(max_restarts)] + _train_command(spec_path, record_path, label, extra, progress))
    env = threads_env(threads) or dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(child_threads(nproc)))
    returncode, lines = _run_logged(cmd, log_path, progress, env=env)
    if returncode != 0:
        raise CheckError(f"run {label} ({plural(nproc, 'process', 'processes')} under torchrun) failed with exit "
                         f"code {returncode}: "
                         f"{failure_reason(lines, returncode)} (full output: {log_path})")


class Launcher:
    """Starts the runs of one check: ``launch(spec_path, name, label, extra)`` trains in fresh processes (one, or
    ``nproc`` under torchrun), writing the record ``runs/<name>.json`` and the run's output ``runs/<name>.log``.
    ``launch(..., nproc=R)`` overrides the number of processes of one run; ``threads``: the intra-op threads
    (``OMP_NUM_THREADS``) of every fresh process and rank (None: as :func:`run_torchrun` says).

    :meth:`alongside` starts chains of single-process runs in the background instead (quiet: their output goes to
    their logs), to overlap them with work in this process; :meth:`stop` terminates every child still running and
    keeps any other from starting."""

    def __init__(self, runs_dir: str, progress: bool, nproc: Optional[int], threads: Optional[int] = None):
        self.runs_dir, self.progress, self.nproc, self.threads = runs_dir, progress, nproc, threads
        #: seconds a precompile worker may run before it is killed (:data:`WORKER_TIMEOUT_S`)
        self.worker_timeout_s = WORKER_TIMEOUT_S
        #: ``{name: seconds}``: the wall time of each run launched, its processes' start-up included
        self.wall_s: dict = {}
        self._children: dict = {}  # the running children of background runs, by run name
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # set by stop(): no background child starts or keeps running after it

    def record(self, name: str) -> str:
        return os.path.join(self.runs_dir, f"{name}.json")

    def __call__(self, spec_path: str, name: str, label: str, extra: List[str], nproc: Optional[int] = None,
                 max_restarts: int = 0) -> None:
        nproc = self.nproc if nproc is None else nproc
        t0 = time.perf_counter()
        try:
            self._launch(spec_path, name, label, extra, nproc, max_restarts)
        finally:
            self.wall_s[name] = time.perf_counter() - t0

    def _launch(self, spec_path, name, label, extra, nproc, max_restarts, progress=None, started=None) -> None:
        progress = self.progress if progress is None else progress
        if nproc is not None:
            run_torchrun(spec_path, self.record(name), label, extra, progress, nproc,
                         os.path.join(self.runs_dir, f"{name}.log"), threads=self.threads, max_restarts=max_restarts)
        else:
            run_fresh_process(spec_path, self.record(name), label, extra, progress,
                              os.path.join(self.runs_dir, f"{name}.log"), started=started, threads=self.threads)

    def alongside(self, chains: List[List[Tuple[str, str, str, List[str]]]],
                  after: Optional[Future] = None) -> List[Future]:
        """Start each chain of runs ``[(spec_path, name, label, extra), ...]`` (one fresh process per run, the
        chain's runs one after another) in a background thread, once ``after`` (a future, e.g. :meth:`precompile`'s)
        is done if given; a future per chain, whose ``result()`` raises the chain's first failure (CheckError),
        after which the chain's later runs are not started."""
        pool = ThreadPoolExecutor(max_workers=max(1, len(chains)), thread_name_prefix="check-run")
        futures = [pool.submit(self._chain, chain, after) for chain in chains]
        pool.shutdown(wait=False)
        return futures

    def precompile(self, spec_path: str, jobs: int) -> Future:
        """Start ``jobs`` precompile workers of ``spec_path`` at once in the background (``_train --precompile I/K``,
        :mod:`.precompile`; outputs in ``runs/precompile-I.log``); a future of ``(seconds until the last ended, the
        failures' one-line descriptions)``, which never raises (a worker that fails only costs its share of the
        compiles). A worker still running after :attr:`worker_timeout_s` seconds is killed and counted as failed;
        :meth:`stop` ends them as it ends the runs."""
        pool = ThreadPoolExecutor(max_workers=max(1, jobs) + 1, thread_name_prefix="check-precompile")
        t0 = time.perf_counter()
        workers = [pool.submit(self._worker, spec_path, i, jobs) for i in range(jobs)]

        def gather() -> Tuple[float, List[str]]:
            failures = [why for why in (w.result() for w in workers) if why is not None]
            return time.perf_counter() - t0, failures
        done = pool.submit(gather)
        pool.shutdown(wait=False)
        return done

    def _worker(self, spec_path: str, index: int, count: int) -> Optional[str]:
        """One precompile worker; None, or why it failed (one line). Its environment lacks
        ``TRITON_CACHE_AUTOTUNING``: the choices of its restricted, untimed autotuners are never written for the
        control's runs to read."""
        from ..bench.requirements import AUTOTUNE_CACHE_ENV  # here: the check imports no bench module otherwise

        name = f"precompile-{index}"
        if self._stopping.is_set():
            return f"{name}: not started (the check was stopping)"
        env = {k: v for k, v in os.environ.items() if k != AUTOTUNE_CACHE_ENV}
        label, log_path = f"precompile {index}/{count}", os.path.join(self.runs_dir, f"{name}.log")
        cmd = [sys.executable] + _train_command(spec_path, self.record(name), label,
                                                ["--precompile", f"{index}/{count}"], False)
        try:
            returncode, lines = _run_to_log(cmd, log_path, env, self.worker_timeout_s, self._on_child(name))
        except CheckError as e:
            return f"{name}: {e}"
        except Exception as e:  # noqa: BLE001: a worker never stops the check (the module docstring)
            return f"{name}: {type(e).__name__}: {e}"
        if returncode is None:
            return (f"{name}: run {label} (a fresh process) was killed after {self.worker_timeout_s:g} s, still "
                    f"running (full output: {log_path})")
        if returncode != 0:
            return f"{name}: {_fresh_failure(label, returncode, lines, log_path)}"
        return None

    def _on_child(self, name: str):
        def on_child(proc):  # the child has started (proc) or ended (None)
            with self._lock:
                if proc is None:
                    self._children.pop(name, None)
                elif self._stopping.is_set():  # stop() came first: this child must not run
                    _signal(proc, signal.SIGTERM)
                else:
                    self._children[name] = proc
        return on_child

    def _chain(self, chain, after: Optional[Future] = None) -> None:
        if after is not None:
            after.result()
        for spec_path, name, label, extra in chain:
            if self._stopping.is_set():
                return
            t0 = time.perf_counter()
            try:
                self._launch(spec_path, name, label, extra, None, 0, progress=False, started=self._on_child(name))
            finally:
                self.wall_s[name] = time.perf_counter() - t0

    def stop(self) -> None:
        """Terminate every background run's child still running (then kill it after 30 s); no background run
        starts after this."""
        with self._lock:
            self._stopping.set()
            procs = list(self._children.values())
        for proc in procs:
            _signal(proc, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
