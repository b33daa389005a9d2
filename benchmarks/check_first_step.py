"""What ``ordered-ssd check``'s first steps cost: the check's model trained for a few steps in this process, each
step timed on its own (synchronised), and the Triton kernels compiled meanwhile counted by name.

Usage::

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/check_first_step.py [--device cuda] [--static] \
        [--first-steps 4] [--steps 40] [--json PATH] [check flags...]

The model, data and optimizer are the check's (its device defaults unless flags say otherwise); each step is
``check_overhead.plain_step``: forward, backward, clip and AdamW. Reported: the seconds of each of
``--first-steps`` steps (the first compiles every kernel, and times every candidate of the kernels that rule
``native-autotune-v1`` covers: ``csrc_bindings._configs``), the mean ms of ``--steps`` more, and the kernels that
Triton compiled into ``TRITON_CACHE_DIR`` (each ``<kernel>.json`` of its cache, counted by name: start from an empty
folder to count them all; none where Triton does not run). ``TRITON_CACHE_AUTOTUNING`` is removed from this
process's environment first, so that no choice is read from disk instead of timed. Only the single-process model
flags matter (``--nproc``, ``--split-invariance`` and the like are accepted and ignored).

``--static`` sets ``csrc_bindings._configs.NATIVE_TIMING`` to False for this process: every key of the ordered
layers launches its static choice (the pinned table, the speed table or its rules) instead of timing upstream's
candidates. The bits are the same by the proof of those kernels' bit-neutral parameters; the speed may differ. A
measurement switch, never set by the library or the check.
"""
import argparse
import collections
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from _torchrun import sync  # noqa: E402
from check_overhead import CHECK_FLAGS, check_setup, plain_step  # noqa: E402


def compiled_kernels(cache_dir) -> dict:
    """``{kernel name: how many compiled}`` in Triton's cache folder ``cache_dir`` (``{}`` if None or absent)."""
    names = collections.Counter()
    if cache_dir and os.path.isdir(cache_dir):
        for sub in sorted(os.listdir(cache_dir)):
            folder = os.path.join(cache_dir, sub)
            if not os.path.isdir(folder):
                continue
            for f in os.listdir(folder):
                if f.endswith(".json") and not f.startswith("__grp__") and not f.endswith(".autotune.json"):
                    names[f[:-len(".json")]] += 1
    return dict(names.most_common())


def main(argv=None) -> int:
    from ordered_ssd.apps.bench.requirements import AUTOTUNE_CACHE_ENV
    from ordered_ssd.apps.check.train import build_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=CHECK_FLAGS)
    p.add_argument("--static", action="store_true", help="launch the static configurations (no timing)")
    p.add_argument("--first-steps", type=int, default=4, help="steps timed one by one (default 4)")
    p.add_argument("--json", default=None)
    a, rest = p.parse_known_args(argv)
    if a.first_steps < 1:
        p.error(f"--first-steps: expected an integer >= 1, got {a.first_steps}")
    os.environ.pop(AUTOTUNE_CACHE_ENV, None)
    if a.static:
        import csrc_bindings._configs as configs
        configs.NATIVE_TIMING = False
    spec, device, data = check_setup(rest)
    model, optimizer = build_model(spec, device)

    def step(i):
        plain_step(spec, data, device, model, optimizer, i)

    first = []
    for i in range(a.first_steps):
        sync(device)
        t0 = time.perf_counter()
        step(i)
        sync(device)
        first.append(time.perf_counter() - t0)
        print(f"check_first_step: step {i}: {first[-1]:.2f} s", flush=True)
    sync(device)
    t0 = time.perf_counter()
    for i in range(a.first_steps, a.first_steps + spec["steps"]):
        step(i)
    sync(device)
    ms = 1000 * (time.perf_counter() - t0) / max(spec["steps"], 1)
    kernels = compiled_kernels(os.environ.get("TRITON_CACHE_DIR"))
    result = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "static": a.static, "first_step_s": first, "steps": spec["steps"], "ms_per_step_after": ms,
              "kernels_compiled": sum(kernels.values()), "by_kernel": kernels}
    print(f"check_first_step: {device} {result['gpu'] or ''}, {'static' if a.static else 'timed'} configurations: "
          f"first steps {', '.join(f'{t:.2f}' for t in first)} s; then {ms:.2f} ms/step over {spec['steps']} "
          f"steps; {result['kernels_compiled']} kernels compiled ({len(kernels)} distinct)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
