"""What checking costs: ``ordered-ssd check``'s training loop against the same training without any check.

Usage::

    python benchmarks/check_overhead.py [--device cuda] [--steps 200] [--rounds 2] [--parts] [--digest-threads N]
        [--hasher process|threads] [--json PATH] [--profile PATH] [check flags...]

Both run in this process on the check's model and data (the device's defaults unless flags say otherwise):

* **plain**: the same model, optimizer, batches and steps (forward, backward, clip, AdamW), nothing else;
* **check**: :func:`ordered_ssd.apps.check.train.train_loop` as run ``a`` of the check runs it: every step's loss
  read, the SHA-256 of every gradient (:class:`ordered_ssd.apps.check.digests.StepDigests`), the forward
  outputs' fingerprints, the progress line off; the final parameters' digests, but not the validation.

Timed interleaved (plain, check, plain, check, ...; ``--rounds`` each), after a warm-up of both; the time of a
mode is its median over rounds of the wall time of all its steps, synchronised at the end. Prints the ratio
check / plain (the target: at most 1.3 on the H200), and the time the check loop's ``StepDigests.submit`` took per
step in its last round, of it the time waiting for earlier submissions' hashing (``StepDigests.stats``): a hashing
that falls behind the training shows there. ``--digest-threads N`` sets the hashing threads, ``--hasher`` where they
run (``StepDigests``' ``hasher``: a hashing process, the default, or threads of the training process).

``--parts`` also times, in the same rounds, the check's loop with one part left out or done another way
(:data:`PARTS`), to see where its overhead goes. Those variants are measurements only: they swap the check's classes
in this process for the length of their run, and their records are not checks.

``--profile PATH`` runs the check's loop once more after the timed rounds under :mod:`cProfile` (the training
thread's Python calls; the profiler slows every call, so its times are shares, not costs) and writes the functions
by their own time and by their cumulative time to ``PATH`` (text).
"""
import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from _torchrun import sync  # noqa: E402


#: ``--parts``: the check's loop with one part left out or done another way
PARTS = {
    "other_hasher": "with the hashing where --hasher does not put it (process <-> threads)",
    "no_outputs": "without the forward outputs' fingerprints (OutputDigests)",
    "no_norms": "without the float64 norms of the gradients and parameters",
    "no_digests": "without the SHA-256 digests and norms (StepDigests)",
}


class _NoOutputs:
    def __init__(self, model, names):
        pass

    def take_deferred(self):
        return dict

    def remove(self):
        pass


class _NoDigests:
    """StepDigests' interface, hashing nothing."""

    def __init__(self, device, *args, **kwargs):
        self._results, self._count = {}, 0

    def reserve(self, tensors):
        pass

    def submit(self, tensors, norms=False):
        from ordered_ssd.apps.check.digests import StepResult

        self._count += 1
        self._results[self._count] = StepResult({name: "not hashed" for name in tensors}, {})
        return self._count

    def result(self, key):
        return self._results.pop(key)

    def close(self):
        pass


@contextlib.contextmanager
def _without(part):
    """The check's classes swapped for the length of the block, so that its loop leaves ``part`` out."""
    from ordered_ssd.apps.check import digests, train

    saved = (train.OutputDigests, train.StepDigests, digests.StepDigests.submit)
    submit = saved[2]
    try:
        if part == "other_hasher":
            pass  # not a swap: _checked's hasher argument
        elif part == "no_outputs":
            train.OutputDigests = _NoOutputs
        elif part == "no_norms":
            digests.StepDigests.submit = lambda self, tensors, norms=False: submit(self, tensors, norms=False)
        elif part == "no_digests":
            train.StepDigests = _NoDigests
        else:
            raise ValueError(f"part: expected one of {', '.join(PARTS)}, got {part!r}")
        yield
    finally:
        train.OutputDigests, train.StepDigests, digests.StepDigests.submit = saved


#: the help's last lines of the benchmarks that take the check's flags (:func:`check_setup`)
CHECK_FLAGS = ("Every other flag is passed to ordered-ssd check's parser (ordered-ssd check --help), e.g. --device "
               "cuda, --steps N, --batch B, --seq-len L: the model, data and steps of the check's loop.")


def check_setup(check_argv):
    """``(spec, device, data)`` of the check's flags ``check_argv``: its spec (with ``data_sha256``), device and
    :class:`~ordered_ssd.apps.lm.ByteData`."""
    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.cli import build_parser
    from ordered_ssd.apps.lm import ByteData, load_corpus

    spec = spec_from_args(build_parser().parse_args(["check", *check_argv]))
    corpus, _, cut = load_corpus(spec["data"], spec["data_bytes"])
    data = ByteData(corpus, spec["seq_len"], cut=cut)
    spec["data_sha256"] = data.sha256
    return spec, torch.device(spec["device"]), data


def plain_step(spec, data, device, model, optimizer, step):
    """One step of plain training, nothing checked: forward, backward, clip, AdamW on step ``step``'s batch."""
    from ordered_ssd.apps.lm import batch_to, lm_loss

    optimizer.zero_grad(set_to_none=True)
    x, y = data.batch(spec["seed"], step, spec["batch"])
    lm_loss(model(batch_to(x, device)), batch_to(y, device)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"], foreach=False)
    optimizer.step()


def _plain(spec, data, device, steps, after_step=None):
    """Seconds for ``steps`` steps of the same training, nothing checked; ``after_step()`` is called after each
    step's optimizer step, inside the time."""
    from ordered_ssd.apps.check.train import build_model

    model, optimizer = build_model(spec, device)
    sync(device)
    t0 = time.perf_counter()
    for step in range(steps):
        plain_step(spec, data, device, model, optimizer, step)
        if after_step is not None:
            after_step()
    sync(device)
    return time.perf_counter() - t0


def _checked(spec, device, steps, out, threads=None, hasher=None):
    """``(seconds, stats)``: the seconds of :func:`train_loop`'s steps (its own ``train_s``: the loop, the digests
    resolved, synchronised) and its ``StepDigests.stats`` (time in ``submit`` and, of it, waiting for the hashing;
    empty where the class was swapped out). ``threads``, ``hasher``: the StepDigests' hashing threads and where they
    run (default: its own)."""
    from ordered_ssd.apps.check import digests, train
    from ordered_ssd.apps.check.world import world_of

    made = []
    cls = train.StepDigests

    def recording(*args, **kwargs):
        if cls is digests.StepDigests:
            if threads is not None:
                kwargs["threads"] = threads
            if hasher is not None:
                kwargs["hasher"] = hasher
        d = cls(*args, **kwargs)
        made.append(d)
        return d

    spec = dict(spec, steps=steps, val_windows=1)
    train.StepDigests = recording
    try:
        with world_of(spec) as world:
            record = train.train_loop(world, spec, os.path.join(out, "record.json"), label="a", progress=False)
    finally:
        train.StepDigests = cls
    return record["train_s"], (dict(getattr(made[-1], "stats", {})) if made else {})


def _write_profile(profiler, path, steps):
    """The profile's functions by own time, then by cumulative time (the first 60 of each), into ``path``."""
    text = io.StringIO()
    text.write(f"cProfile of the check's loop, {steps} steps (times inflated by the profiler)\n")
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(60)
    stats.sort_stats("cumulative").print_stats(60)
    with open(path, "w") as fh:
        fh.write(text.getvalue())


def main(argv=None) -> int:
    from ordered_ssd.apps.check.train import build_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=CHECK_FLAGS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--parts", action="store_true", help="also time the loop with one part left out (PARTS)")
    p.add_argument("--digest-threads", type=int, default=None,
                   help="the check loop's hashing threads (default: StepDigests' default, half the cores, 4 to 8)")
    p.add_argument("--hasher", choices=["process", "threads"], default=None,
                   help="where the check loop's hashing runs (default: StepDigests' default, a process on POSIX)")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="after the timed rounds, profile one more run of the check's loop (cProfile) into PATH")
    a, rest = p.parse_known_args(argv)
    from ordered_ssd.apps.check.digests import default_hasher

    hasher = a.hasher or default_hasher()
    other = {"process": "threads", "threads": "process"}[hasher]
    spec, device, data = check_setup(rest)
    steps = spec["steps"]
    parts = list(PARTS) if a.parts else []
    times = {"plain": [], "check": [], **{part: [] for part in parts}}
    with tempfile.TemporaryDirectory() as out:
        _plain(spec, data, device, min(steps, 5))  # warm-up (compilation, allocator)
        _checked(spec, device, min(steps, 5), out, a.digest_threads, hasher)
        for _ in range(a.rounds):
            times["plain"].append(_plain(spec, data, device, steps))
            seconds, stats = _checked(spec, device, steps, out, a.digest_threads, hasher)  # stats: the last round's
            times["check"].append(seconds)
            for part in parts:
                with _without(part):
                    how = other if part == "other_hasher" else hasher
                    times[part].append(_checked(spec, device, steps, out, a.digest_threads, how)[0])
        if a.profile:
            profiler = cProfile.Profile()
            profiler.runcall(_checked, spec, device, steps, out, a.digest_threads, hasher)
            _write_profile(profiler, a.profile, steps)
    plain, check = statistics.median(times["plain"]), statistics.median(times["check"])
    n_params = sum(p.numel() for p in build_model(spec, torch.device("cpu"))[0].parameters())
    result = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "n_params": n_params, "steps": steps, "batch": spec["batch"],
              "seq_len": spec["seq_len"], "rounds": a.rounds, "digest_threads": a.digest_threads, "hasher": hasher,
              "plain_s": times["plain"], "check_s": times["check"],
              "plain_ms_per_step": 1000 * plain / steps, "check_ms_per_step": 1000 * check / steps,
              "ratio": check / plain,
              "parts_ms_per_step": {part: 1000 * statistics.median(times[part]) / steps for part in parts},
              "parts_s": {part: times[part] for part in parts}}
    print(f"check_overhead: {device} {result['gpu'] or ''} torch {torch.__version__}; {n_params / 1e6:.2f}M params, "
          f"{steps} steps of batch {spec['batch']} x {spec['seq_len']}; median of {a.rounds} interleaved rounds; "
          f"hashing in {'a process' if hasher == 'process' else 'threads'}")
    print(f"  plain training {result['plain_ms_per_step']:.2f} ms/step, check's loop {result['check_ms_per_step']:.2f}"
          f" ms/step: x{result['ratio']:.3f}")
    result["digest_stats"] = stats
    if stats.get("submits"):
        print(f"  in its last round, StepDigests.submit took {1000 * stats['submit_s'] / steps:.2f} ms/step, of which "
              f"{1000 * stats['wait_s'] / steps:.2f} ms/step waiting for the hashing of earlier submissions")
    for part in parts:
        ms = result["parts_ms_per_step"][part]
        what = f"with the hashing in {'a process' if other == 'process' else 'threads'}" \
            if part == "other_hasher" else PARTS[part]
        print(f"  the check's loop {what}: {ms:.2f} ms/step: x{ms / result['plain_ms_per_step']:.3f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
