"""``ordered-ssd check``: train the same spec three times (and the native control) and report the verdict."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, wait
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..files import atomic_write_json, locked_out_dir, prepare_out_dir
from ..lm import ByteData, DataError, load_corpus
from .errors import CheckError, plural, writing
from .launch import Launcher, usable_cores
from .memory import check_memory, device_available, n_params
from .outdir import RUNS, check_earlier_results, set_aside_earlier_results
from .precompile import default_jobs
from .report import load_record, merge_restart, report
from .spec import layer_name
from .train import train_run

DDP_BUCKET_CAP_MB = 25.0  # set explicitly; it changes DDP's bucket layout (speed), never the bits (elementwise fold)


def _check_nproc(spec: dict, nproc: int) -> None:
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise CheckError(f"--nproc: expected a positive integer, got {nproc!r}")
    if spec["batch"] % nproc:
        raise CheckError(f"--batch: the global batch {spec['batch']} is not divisible by --nproc {nproc} "
                         f"(rank r takes rows [r*B/N, (r+1)*B/N) of every step's batch)")
    device = torch.device(spec["device"])
    if device.type == "cuda":
        if device.index is not None:
            raise CheckError(f"--device: with --nproc give cuda, not {spec['device']} (rank r uses cuda:r)")
        if nproc > torch.cuda.device_count():
            raise CheckError(f"--nproc: {plural(nproc, 'process', 'processes')} {'needs' if nproc == 1 else 'need'} "
                             f"{plural(nproc, 'GPU')} (one per rank), {torch.cuda.device_count()} visible")


def run_check(spec: dict, out_dir: str, *, stop_at: int, native: bool, progress: bool = True,
              print_fn=print, nproc: Optional[int] = None) -> int:
    """Run a, b, c (and the native control); print the table and the verdict; write report.json and loss.png.

    Run ``a`` trains in this process, ``b`` in a fresh process, ``c`` in a fresh process stopped after ``stop_at``
    steps and resumed from its checkpoint in another; with ``native``, ``native-1`` and ``native-2`` train
    mamba-ssm's ``Mamba2`` (``Mamba3``) in two fresh processes. On a GPU the fresh runs start alongside ``a``, once
    its first step has compiled the kernels (:func:`concurrent_runs`); the control's runs after its precompile
    workers (:mod:`.precompile`), which start then too; on the CPU they follow it, one after another. With
    ``nproc`` (an int >= 1), every run (a included) is a data-parallel run of ``nproc`` processes launched through
    ``python -m torch.distributed.run`` (gloo on the CPU, nccl on CUDA with one GPU per rank), and the verdict also
    requires every rank of every run to agree bit for bit.

    Returns the exit code: 0 if a, b and c agree bit for bit, 1 otherwise.

    Raises:
        CheckError: bad ``stop_at``, a global batch not divisible by ``nproc``, too few GPUs, unwritable output,
            or a failed run (one-line message).
    """
    if nproc is not None:
        _check_nproc(spec, nproc)
    rows, processes = (spec["batch"], 1) if nproc is None else (spec["batch"] // nproc, nproc)
    # on one GPU, where they fit: a, b and c (c1 then c2) at once; with the control, first its precompile workers
    # beside a, b and c (as many as fit, at least 2), then the control's two runs beside them (5 processes)
    together: Tuple[int, ...] = ()
    if nproc is None and concurrent_runs(spec):
        together = tuple(3 + jobs for jobs in range(default_jobs(), 1, -1)) if native else (3,)
    with prepared_run(spec, out_dir, stop_at, rows=rows, processes=processes, together=together) as run:
        return _run_check(spec, run.out_dir, run.data, run.source, stop_at=stop_at, native=native,
                          progress=progress, print_fn=print_fn, nproc=nproc, notes=run.notes,
                          alongside=run.alongside, workers=run.together - 3 if native and run.alongside else 0)


class PreparedRun(NamedTuple):
    """What :func:`prepared_run` yields: the absolute ``--out``, the data, its description, the lines to print
    about the memory estimate and the earlier run's files, and whether the runs train at once on one GPU."""
    out_dir: str
    data: ByteData
    source: str
    notes: List[str]
    together: int = 0  #: how many processes at once the estimate found room for (0: one after another)

    @property
    def alongside(self) -> bool:
        """Whether the runs train at once on one GPU."""
        return self.together > 0


@contextlib.contextmanager
def prepared_run(spec: dict, out_dir: str, stop_at: int, *, rows: int, processes: int,
                 together: Sequence[int] = ()) -> Iterator[PreparedRun]:
    """Every check of the run before it is accepted, then its start. First, with nothing written: ``--steps`` and
    ``--stop-at`` checked, the corpus read (refused where it would not fit in memory: :func:`load_corpus`), the
    training's memory estimated and refused where it would not fit (:func:`.memory.check_memory`; ``rows`` examples
    per forward in each of ``processes`` processes training at once; with ``together``, a sequence of process
    counts, the first that fits at once on the spec's GPU, else one after another, with a note). Then ``--out``
    created if needed and locked for the run (a second run into the same ``--out`` would compare the first one's
    records), and what an earlier run left there checked (:func:`.outdir.check_earlier_results`). Only then is the
    run accepted: the earlier run's files are set aside (:func:`.outdir.set_aside_earlier_results`) and ``runs/`` is
    made. Shared by :func:`run_check` and :func:`~ordered_ssd.apps.check.split.run_split_check`.

    Raises:
        CheckError / DataError: as said (one line); a refused run changes nothing in ``--out`` (it may create the
            folder and its lock file).
    """
    if spec["steps"] < 2:  # the restart replay stops at a step 0 < k < steps (default: steps // 2)
        raise CheckError(f"--steps: expected at least 2 (the replay restarts from a step in between), "
                         f"got {spec['steps']}")
    if not 0 < stop_at < spec["steps"]:
        raise CheckError(f"--stop-at: expected 0 < k < --steps={spec['steps']}, got {stop_at}")
    host = device_available(torch.device("cpu"), 1)[0]
    corpus, source, cut = load_corpus(spec["data"], spec["data_bytes"], memory=host)
    data = ByteData(corpus, spec["seq_len"], cut=cut)
    del corpus  # ByteData holds its own copy
    fitted = 0
    for count in together:
        try:
            notes = [check_memory(spec, rows=rows, processes=count, corpus_bytes=data.n_bytes, one_gpu=True)]
            fitted = count
            break
        except DataError:  # fewer at once, or one at a time, may still fit
            continue
    if not fitted:  # one after another (else this refuses the run)
        notes = [check_memory(spec, rows=rows, processes=processes, corpus_bytes=data.n_bytes)]
        if together:
            notes.append(f"the runs follow one another: {min(together)} at once would not fit in the GPU's free "
                         f"memory")
    out_dir = prepare_out_dir(out_dir)
    with locked_out_dir(out_dir):
        check_earlier_results(out_dir)
        moved = set_aside_earlier_results(out_dir)  # accepted: from here on this run writes
        if moved is not None:
            notes.append(moved)
        with writing("runs folder", os.path.join(out_dir, RUNS)):
            os.makedirs(os.path.join(out_dir, RUNS))
        yield PreparedRun(out_dir, data, source, notes, fitted)


def thread_lines(threads: Optional[int], processes: int) -> List[str]:
    """The line that says how many intra-op threads every training process has (none where ``threads`` is None:
    torch's default, on CUDA), and, with more than one thread, a note where ``processes`` training at once need
    more threads than there are usable cores, or where the machine is busy (the load average of the last minute
    leaves fewer cores than the threads need): such threads wait for each other at every parallel region, and
    ``--threads 1`` does not."""
    if threads is None:
        return []
    lines = [f"threads: {plural(threads, 'intra-op thread')} in every training process (--threads; the CPU's bits "
             f"depend on the count, so every run uses the same)"]
    cores = usable_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if threads > 1 and threads * processes > cores:
        lines.append(f"note: {plural(processes, 'process', 'processes')} x {plural(threads, 'thread')} at once need "
                     f"more than the {plural(cores, 'usable core')}: the threads wait for each other, and the check "
                     f"may take many times longer; --threads {max(1, cores // processes)} would fit")
    elif threads > 1 and load + threads * processes > cores + 0.5:
        lines.append(f"note: the machine is busy (load average {load:.1f} over the last minute, "
                     f"{plural(cores, 'usable core')}): with {plural(threads, 'thread')} per process the check may "
                     f"take many times longer; --threads 1 does not slow down so")
    return lines


def concurrent_runs(spec: dict) -> bool:
    """Whether the fresh runs (b, c and the native control) start alongside run a, for a run without ``--nproc``:
    on a GPU (the runs share nothing but the GPU and Triton's on-disk cache, and each run's bits are its own), once
    a's first step has finished, so that they load the kernels it compiled instead of compiling them again. On the
    CPU they run one after another (each would take the cores the others use)."""
    return torch.device(spec["device"]).type == "cuda"


@contextlib.contextmanager
def terminated_as_interrupt():
    """Within the block (in the main thread), SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so that the runs
    started alongside are stopped before the check exits (130); the previous handler comes back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _train_alongside(spec: dict, launch: Launcher, futures: list, start_fresh_runs, progress: bool, t0: float,
                     runs: dict) -> None:
    """Run a in this process (the fresh runs start after its first step), then wait for them; any failure or
    interrupt stops every run still going and is raised again. ``runs`` gets a's record."""
    try:
        runs["a"] = train_run(spec, launch.record("a"), label="a", progress=progress,
                              after_first_step=start_fresh_runs)
        runs["a"]["wall_s"] = time.perf_counter() - t0
        if not futures:
            start_fresh_runs()
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)  # a failed run ends the others at once
        for future in futures:
            if future in done and future.exception() is not None:
                raise future.exception()
        for future in futures:
            future.result()
    except BaseException:
        launch.stop()
        raise


def _run_chains(launch: Launcher, chains) -> None:
    for chain in chains:
        for spec_path, name, label, extra in chain:
            launch(spec_path, name, label, extra)


def _run_check(spec: dict, out_dir: str, data: ByteData, source: str, *, stop_at: int, native: bool, progress: bool,
               print_fn, nproc: Optional[int], notes: List[str] = (), alongside: bool = False,
               workers: int = 0) -> int:
    """:func:`run_check` in its locked output directory, on the data already read; ``notes``: lines printed after
    the data's; ``alongside``: the fresh runs start alongside run a (:func:`prepared_run` found they fit);
    ``workers``: the control's precompile workers then (:mod:`.precompile`)."""
    ddp = nproc is not None
    spec = dict(spec, data_sha256=data.sha256)
    if ddp:
        spec = dict(spec, nproc=nproc, ddp={"bucket_cap_mb": DDP_BUCKET_CAP_MB, "hook": "ordered_allreduce_hook",
                                            "backend": "nccl" if torch.device(spec["device"]).type == "cuda"
                                            else "gloo"})
    runs_dir = os.path.join(out_dir, RUNS)
    spec_path = os.path.join(runs_dir, "spec.json")
    with writing("spec", spec_path):
        atomic_write_json(spec_path, spec)
    count = n_params(spec)  # from the byte LM's shape; a Hugging Face model's counted on the meta device
    where = (f"{spec['device']} x {plural(nproc, 'process', 'processes')} ({spec['ddp']['backend']}, "
             f"DistributedDataParallel, ordered gradient hook)" if ddp else spec["device"])
    batch_desc = (f"global batch {spec['batch']} ({plural(spec['batch'] // nproc, 'row')} per rank)" if ddp
                  else f"batch {spec['batch']}")
    if spec.get("hf") is not None:
        from .hf import describe

        what = (f"Hugging Face model {describe(spec['hf'])}, its Mamba-2 mixers converted with convert_to_ordered, "
                f"attention {spec['hf']['attn_implementation']},")
    else:
        what = (f"byte-level {layer_name(spec['model'])} LM ({plural(spec['model']['n_layers'], 'layer')}, "
                f"d_model {spec['model']['d_model']})")
    print_fn(f"ordered-ssd check: {count / 1e6:.2f}M-parameter {what} on {where}, "
             f"{plural(spec['steps'], 'step')} of {batch_desc} x {spec['seq_len']} bytes")
    print_fn(f"data: {source}: {data.n_bytes} bytes, sha256 {data.sha256[:16]}")
    for line in list(notes) + thread_lines(spec.get("threads"), processes=nproc or 1):
        print_fn(line)
    launch = Launcher(runs_dir, progress, nproc, threads=spec.get("threads"))
    ckpt = os.path.join(runs_dir, f"checkpoint-step{stop_at}.pt")

    fresh = [[(spec_path, "b", "b", [])],
             [(spec_path, "c1", "c:1", ["--stop-at", str(stop_at), "--ckpt", ckpt]),
              (spec_path, "c2", "c:2", ["--resume", ckpt])]]
    natives: list = []  # the control's two runs, each a chain of its own
    if native:
        native_spec_path = os.path.join(runs_dir, "spec-native.json")
        with writing("spec", native_spec_path):
            atomic_write_json(native_spec_path, dict(spec, mixer="native"))
        natives = [[(native_spec_path, name, name, [])] for name in ("native-1", "native-2")]
    t0 = time.perf_counter()
    precompiled: list = []  # on one GPU, with the control: the future of its precompile workers
    if ddp:
        launch(spec_path, "a", "a", [])
        runs = {"a": load_record(launch.record("a"))}
        _run_chains(launch, fresh + natives)
    elif not alongside:  # the CPU, or a GPU without the memory for them all at once
        runs = {"a": train_run(spec, launch.record("a"), label="a", progress=progress)}
        runs["a"]["wall_s"] = time.perf_counter() - t0  # in this process: no start-up of its own
        _run_chains(launch, fresh + natives)
    else:  # on one GPU: the fresh runs start once run a, in this process, has finished its first step
        futures: list = []

        def start_fresh_runs():  # a's first step compiled the kernels into Triton's cache: theirs load them
            futures.extend(launch.alongside(fresh))
            if natives:  # mamba-ssm's candidates, compiled in slices by the workers, then timed by the control
                precompiled.append(launch.precompile(native_spec_path, workers))
                futures.extend(launch.alongside(natives, after=precompiled[0]))
        runs = {}
        with terminated_as_interrupt():
            _train_alongside(spec, launch, futures, start_fresh_runs, progress, t0, runs)
    if precompiled:
        seconds, failures = precompiled[0].result()
        print_fn(f"native control: {plural(workers, 'precompile worker')} ran for {seconds:.1f} s, each compiling "
                 f"a share of mamba-ssm's autotuner candidates" +
                 (f"; {len(failures)} failed (the control compiled what was missing): {failures[0]}"
                  if failures else ""))
    runs["b"] = load_record(launch.record("b"))
    runs["c"] = merge_restart(load_record(launch.record("c1")), load_record(launch.record("c2")))
    if native:
        for name in ("native-1", "native-2"):
            runs[name] = load_record(launch.record(name))
    wall = time.perf_counter() - t0
    for name, seconds in launch.wall_s.items():  # a fresh run's wall time, its process start-up included
        run = "c" if name in ("c1", "c2") else name
        if run in runs:
            runs[run]["wall_s"] = (runs[run].get("wall_s") or 0.0) + seconds
    ok = report(runs, spec, out_dir, source=source, n_params=count, stop_at=stop_at, wall=wall, nproc=nproc,
                print_fn=print_fn)
    return 0 if ok else 1
