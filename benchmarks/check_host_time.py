"""Where ``ordered-ssd check``'s training loop spends its host time: per step, the wall time and the training
thread's CPU time of plain training and of the check's loop, and of the check's loop with spinning CUDA events.

Usage::

    python benchmarks/check_host_time.py [--device cuda] [--steps N] [--rounds 2] [--json PATH] [check flags...]

In one process, on the check's model and data (the device's defaults unless flags say otherwise: 200 steps on
CUDA), interleaved per round: **plain** (:func:`check_overhead.plain_step`, nothing checked), **check** (the check's
:func:`~ordered_ssd.apps.check.train.train_loop`, as :mod:`check_overhead` runs it) and, on CUDA, **spin_event**
(the same loop with the events of :func:`~ordered_ssd.apps.check.digests.copy_event` made without
``blocking=True``: the threads that wait for each snapshot's copy to the host then busy-wait in
``cudaEventSynchronize``, the driver's default). Each loop is marked after every step (plain: after the optimizer
step; the check: at its progress update, after the step's two submissions). Per step over the steps after the
first :data:`SKIP` (mark to mark, no synchronisation: the same span in every mode): ``wall_ms``, and
``thread_cpu_ms``, the training thread's CPU time (``time.thread_time``). The check's loops also give ``train_ms``,
their own ``train_s`` per step (every step, the digests resolved, synchronised: what :mod:`check_overhead` times),
and ``submit_ms`` / ``wait_ms``, the time a step spent in ``StepDigests.submit`` and, of it, waiting for earlier
submissions' hashing. The training thread's CPU time counts its own busy waits in the driver too: more of it for the
same work says that its calls took longer, not by itself why.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402

import check_overhead  # noqa: E402

#: steps left out at the start of each loop (first launches, the allocator's growth)
SKIP = 5


def _per_step(marks):
    """``(wall ms, thread CPU ms)`` per step over the steps after the first :data:`SKIP`, from ``(perf_counter,
    thread_time)`` marks taken after each step (``marks[i]`` after step ``i``)."""
    if len(marks) <= SKIP:
        raise ValueError(f"marks: expected more than {SKIP} (one after each step), got {len(marks)}")
    first, last, n = marks[SKIP - 1], marks[-1], len(marks) - SKIP
    return 1000 * (last[0] - first[0]) / n, 1000 * (last[1] - first[1]) / n


def _mark(marks):
    marks.append((time.perf_counter(), time.thread_time()))


def plain(spec, data, device, steps):
    """Plain training's marks (:func:`check_overhead._plain`'s loop), one after each step (the device synchronised
    after the last, outside them)."""
    marks = []
    check_overhead._plain(spec, data, device, steps, after_step=lambda: _mark(marks))
    return marks


@contextlib.contextmanager
def _spinning_events():
    """``torch.cuda.Event`` made without ``blocking`` for the length of the block: the events of
    :func:`~ordered_ssd.apps.check.digests.copy_event` (blocking otherwise) spin."""
    made = torch.cuda.Event

    def spinning(*args, **kwargs):
        kwargs.pop("blocking", None)
        return made(*args, **kwargs)

    torch.cuda.Event = spinning
    try:
        yield
    finally:
        torch.cuda.Event = made


def checked(spec, device, steps, out, spin=False):
    """``(marks, train_s, stats)`` of the check's loop: a mark at each step's progress update (after its
    submissions), its ``train_s`` and its ``StepDigests.stats``; ``spin``: its events made spinning
    (:func:`_spinning_events`)."""
    from ordered_ssd.apps.check import train

    marks = []
    progress = train.Progress

    class Marking(progress):
        def update(self, step, loss):
            _mark(marks)
            return super().update(step, loss)

    train.Progress = Marking
    try:
        with _spinning_events() if spin else contextlib.nullcontext():
            train_s, stats = check_overhead._checked(spec, device, steps, out)
    finally:
        train.Progress = progress
    return marks, train_s, stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=check_overhead.CHECK_FLAGS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    a, rest = p.parse_known_args(argv)
    if a.rounds < 1:
        raise ValueError(f"--rounds: expected >= 1, got {a.rounds}")
    spec, device, data = check_overhead.check_setup(rest)
    steps = spec["steps"]
    if steps <= SKIP:
        raise ValueError(f"--steps: expected more than {SKIP} (the first {SKIP} are left out), got {steps}")
    modes = ["plain", "check"] + (["spin_event"] if device.type == "cuda" else [])
    rows = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as out:
        plain(spec, data, device, min(steps, SKIP))  # warm-up (compilation, allocator)
        checked(spec, device, min(steps, SKIP), out)
        for _ in range(a.rounds):
            for mode in modes:
                if mode == "plain":
                    wall, cpu = _per_step(plain(spec, data, device, steps))
                    rows[mode].append({"wall_ms": wall, "thread_cpu_ms": cpu})
                else:
                    marks, train_s, stats = checked(spec, device, steps, out, spin=mode == "spin_event")
                    wall, cpu = _per_step(marks)
                    rows[mode].append({"wall_ms": wall, "thread_cpu_ms": cpu, "train_ms": 1000 * train_s / steps,
                                       "submit_ms": 1000 * stats.get("submit_s", 0.0) / steps,
                                       "wait_ms": 1000 * stats.get("wait_s", 0.0) / steps})
    result = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "steps": steps, "skip": SKIP, "rounds": rows}
    print(f"check_host_time: {device} {result['gpu'] or ''} torch {torch.__version__}; {steps} steps of batch "
          f"{spec['batch']} x {spec['seq_len']}, per step after the first {SKIP}")
    for i in range(a.rounds):
        for mode in modes:
            row = rows[mode][i]
            extra = (f", train_s {row['train_ms']:.2f} ms, submit {row['submit_ms']:.2f} ms (waiting "
                     f"{row['wait_ms']:.2f})" if "train_ms" in row else "")
            print(f"  round {i} {mode:10s} wall {row['wall_ms']:.2f} ms, training thread CPU "
                  f"{row['thread_cpu_ms']:.2f} ms{extra}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
