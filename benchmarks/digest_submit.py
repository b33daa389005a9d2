"""Where ``StepDigests.submit``'s host time goes: the call, and each of its parts alone, on the check's tensors.

Usage::

    python benchmarks/digest_submit.py [--device cuda] [--repeats 40] [--json PATH] [check flags...]

On the check's model (the device's defaults unless flags say otherwise) the tensors submitted are random tensors of
its parameters' names, shapes and dtypes. Each entry is the median over ``--repeats`` calls (the first five left
out) of the host time of one call, the device synchronised before each (so nothing earlier is waited for):

* ``submit, norms``, ``submit``: :meth:`~ordered_ssd.apps.check.digests.StepDigests.submit` with and without the
  norms (its digests resolved after each call, outside the time);
* ``views``: the tensors viewed as bytes, as ``submit`` views them;
* ``foreach_copy``: the snapshot's one ``torch._foreach_copy_`` into the slot's views, and ``cat``: the same bytes
  by ``torch.cat`` into the buffer (without the padding), for comparison;
* CUDA only (on the CPU the norms are taken from the host copy in other threads, and the snapshot is taken in the
  host buffer itself): ``norms``, the float64 norms of the snapshot
  (:func:`~ordered_ssd.apps.check.norms.planned_norms`); ``copy to host``, the snapshot copied to the slot's host
  buffer on a side stream (non-blocking); ``wait_stream + event``, the side stream made to wait for the current one,
  an event recorded on it;

plus, on CUDA, the copy's bandwidth to the host buffer (GB/s, one synchronised copy) and whether the buffer was
registered with the driver. The parts are measured apart from each other: their sum need not be ``submit``'s time,
which also has the checks of its arguments and the lookup of their layout (not timed apart).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from _torchrun import sync  # noqa: E402
from check_overhead import CHECK_FLAGS, check_setup  # noqa: E402


def _median_of(times):
    """The median in ms of the seconds ``times``, the first five left out (where there are more)."""
    return 1000 * statistics.median(times[5:] if len(times) > 5 else times)


def _median_ms(fn, device, repeats):
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return _median_of(times)


def measure(spec, device, repeats):
    """``{part: ms}`` and facts about the tensors (see the module docstring)."""
    from ordered_ssd.apps.check.digests import StepDigests, _byte_sources, copy_event
    from ordered_ssd.apps.check.norms import planned_norms
    from ordered_ssd.apps.check.train import build_model

    model, _ = build_model(spec, device)
    g = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(p.shape, generator=g).to(device, p.dtype) for name, p in model.named_parameters()}
    del model
    out = {"tensors": len(tensors)}
    with StepDigests(device) as digests:
        for norms in (True, False):
            times = []
            for _ in range(repeats):
                sync(device)
                t = time.perf_counter()
                key = digests.submit(tensors, norms=norms)
                times.append(time.perf_counter() - t)
                digests.result(key)
            out["submit, norms" if norms else "submit"] = _median_of(times)
        (shapes, layout), = digests._layouts.items()
        slot = digests._slots[0]
        targets = slot.targets[shapes]
        values = list(tensors.items())
        sources = _byte_sources(values, layout)
        flat = [v.reshape(-1) for v in sources]
        out["views"] = _median_ms(lambda: _byte_sources(values, layout), device, repeats)
        out["foreach_copy"] = _median_ms(lambda: torch._foreach_copy_(targets, sources), device, repeats)
        total = sum(v.numel() for v in flat)
        out["cat"] = _median_ms(lambda: torch.cat(flat, out=slot.device_buf[:total]), device, repeats)
        n = layout.nbytes
        out["bytes"] = n
        if device.type == "cuda":
            out["norms"] = _median_ms(lambda: planned_norms(slot.device_buf, layout.norm_plan), device, repeats)
            side = torch.cuda.Stream(device)
            event = copy_event()

            def to_host():
                with torch.cuda.stream(side):
                    slot.host_buf[:n].copy_(slot.device_buf[:n], non_blocking=True)
            out["copy to host"] = _median_ms(to_host, device, repeats)
            out["wait_stream + event"] = _median_ms(
                lambda: (side.wait_stream(torch.cuda.current_stream(device)), event.record(side)), device, repeats)
            sync(device)
            t = time.perf_counter()
            to_host()
            side.synchronize()
            out["copy to host GB/s"] = n / (time.perf_counter() - t) / 1e9
            out["registered"] = bool(slot.host is not None and slot.host.registered)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=CHECK_FLAGS)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--json", default=None)
    a, rest = p.parse_known_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats: expected >= 1, got {a.repeats}")
    spec, device, _ = check_setup(rest)
    result = measure(spec, device, a.repeats)
    result.update(device=str(device), torch=torch.__version__, repeats=a.repeats,
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    print(f"digest_submit: {device} {result['gpu'] or ''} torch {torch.__version__}; {result['tensors']} tensors, "
          f"{result['bytes'] / 2**20:.1f} MiB; host ms per call, median of {a.repeats}")
    for key, value in result.items():
        if isinstance(value, float):
            print(f"  {key}: {value:.4f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
