"""Tune the pinned launch-configuration table of ``csrc_bindings`` on the current GPU.

For every native kernel of the Mamba-2 layer and every (layer shape, dtype) asked for, time every candidate
configuration of the kernel's own upstream autotuner (``kernel.configs``, read, never modified) through the
``csrc_bindings`` launcher, and record the fastest *valid* one:

* it compiles and fits the GPU's shared memory / registers (the launch does not raise),
* it runs the deterministic path (the launchers always pass ``DETERMINISTIC_REDUCTION=True`` where it exists)
  and two runs on the same inputs give bitwise-identical, finite outputs.

Phase 1 compiles every candidate in parallel worker processes (filling Triton's on-disk cache), phase 2 times them
one by one in this process (warm-up first, CUDA events, best of 3 trials of 10 launches). The result is written as
a Python dict module (default ``csrc_bindings/pinned/table.py``, beside this file), merged with the entries already
there for other keys; ``--report`` writes every timing as JSON.

This script changes no environment variable and no mamba-ssm state. It refuses to run if the live autotuner lists
differ from the copies in the kernels' specs (``candidates``, beside each launcher; e.g. mamba-ssm's deterministic
mode filtered them).

Example (the GPU gate):
    python -m csrc_bindings.pinned.tune --dtypes bfloat16,float16,float32 --jobs 14 --budget-s 300

The timed problems default to batch 4, 8 chunks, 16 heads; ``--batch``, ``--seqlen-chunks``, ``--problem-nheads``
and ``--ngroups`` size them like a real layer (e.g. bench S2: ``--batch 8 --seqlen-chunks 16 --problem-nheads 64``).
The table is keyed by the autotune key only, so one entry serves every batch and length. ``--list-jobs`` prints
the jobs without a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pprint
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import _configs, _examples, _native, _registry

#: where the compile workers start (``python -m csrc_bindings.pinned.tune``): the folder that holds this package
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
MODULE = "csrc_bindings.pinned.tune"
TABLE_PATH = Path(__file__).resolve().with_name("table.py")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _log(*a):
    print(*a, flush=True)


def build_jobs(args):
    """[(kernel, key, dtype_name)] for the requested shapes, deduplicated, in a stable order.

    Raises:
        ValueError: a ``--shapes`` entry that is not ``CHUNKxHEADDIMxDSTATE`` integers, or a ``--nheads`` value that
            is not an integer (``main`` parses the arguments without checking these).
    """
    jobs, seen = [], set()
    wanted = set(args.kernels.split(",")) if args.kernels else None
    for shape in args.shapes.split(","):
        chunk_size, headdim, dstate = (int(v) for v in shape.split("x"))
        for nheads in (int(v) for v in args.nheads.split(",")):
            for kernel, key, role in _registry.layer_keys(chunk_size=chunk_size, headdim=headdim, dstate=dstate,
                                                          nheads=nheads, d_nonssm=args.swiglu_cols):
                for dt in args.dtypes.split(","):
                    if role == "fp32" and dt != "float32":
                        continue
                    tag = (kernel, tuple(sorted(key.items())), dt)
                    if wanted is not None and kernel not in wanted:
                        continue
                    if tag not in seen:
                        seen.add(tag)
                        jobs.append((kernel, dict(key), dt))
    return jobs


def live_candidates():
    """The autotuners' own config lists, as (block kwargs, num_warps, num_stages); checked against the copy.

    Raises:
        SystemExit: a live list differs from the spec's ``candidates`` (e.g. mamba-ssm's deterministic mode
            filtered it).
        ImportError, RuntimeError: as :func:`csrc_bindings._native.kernel_jit` (extras missing, another mamba-ssm
            version, changed kernel).
    """
    ns = _native.native()
    out = {}
    for name, spec in _registry.KERNELS.items():
        if spec.candidates is None:
            continue
        _native.kernel_jit(spec)  # checks the kernel and fills ns.kernels
        live = tuple((dict(c.kwargs), c.num_warps, c.num_stages) for c in ns.kernels[name].configs)
        if live != spec.candidates:
            raise SystemExit(f"{name}: the live autotuner lists {len(live)} configs that differ from the "
                             f"{len(spec.candidates)} upstream ones (is MAMBA_DETERMINISTIC or "
                             f"torch.use_deterministic_algorithms on, or TRITON_AUTOTUNE_BLOCK_SIZE_* set?). "
                             f"Run the tuner without them.")
        out[name] = live
    return out


class _ZeroRecorder:
    """Stands for one kernel argument in a pre-hook's argument dict; ``zero_()`` records the argument's name."""

    def __init__(self, name, zeroed):
        self.name, self.zeroed = name, zeroed

    def zero_(self):
        self.zeroed.add(self.name)
        return self

    def clone(self):  # a Triton autotuner's own pre-hook copies its ``restore_value`` arguments
        return self


class _RecorderArgs(dict):
    """``{name: _ZeroRecorder}`` for whatever name a pre-hook asks for."""

    def __init__(self, zeroed):
        super().__init__()
        self.zeroed = zeroed

    def __missing__(self, name):
        self[name] = rec = _ZeroRecorder(name, self.zeroed)
        return rec


def live_pre_hook_zero(spec) -> set:
    """The argument names that upstream's live autotuner of Triton kernel ``spec`` zeroes before a launch: every
    config's ``pre_hook`` and the autotuner's own ``pre_hook`` (its ``reset_to_zero``), each called with a dict of
    recorders (no tensor is touched). The launchers zero ``spec.pre_hook_zero`` by hand; the GPU test compares.

    Raises:
        ImportError, RuntimeError: as :func:`csrc_bindings._native.kernel_jit`.
    """
    _native.kernel_jit(spec)  # checks the kernel and fills native().kernels
    kernel = _native.native().kernels[spec.name]
    zeroed: set = set()
    hooks = [c.pre_hook for c in getattr(kernel, "configs", ()) if getattr(c, "pre_hook", None) is not None]
    if getattr(kernel, "pre_hook", None) is not None:
        hooks.append(kernel.pre_hook)
    for hook in hooks:
        hook(_RecorderArgs(zeroed))
    zeroed.update(n for n in (getattr(kernel, "reset_to_zero", None) or ()) if isinstance(n, str))
    return zeroed


def _cfg_dict(cand):
    block, warps, stages = cand
    d = dict(block)
    d["num_warps"], d["num_stages"] = warps, stages
    return d


def problem_sizes(args):
    """The timed problem's sizes besides the autotune key (the key's own sizes win, e.g. chunk-cumsum's nheads)."""
    return {"batch": args.batch, "seqlen_chunks": args.seqlen_chunks, "nheads": args.problem_nheads,
            "ngroups": args.ngroups}


def describe_sizes(sizes):
    return (f"batch {sizes['batch']}, seqlen {sizes['seqlen_chunks']} * chunk_size, nheads {sizes['nheads']} "
            f"(unless keyed), ngroups {sizes['ngroups']}")


def _problem(kernel, key, dt, cache, sizes):
    tag = (kernel, tuple(sorted(key.items())), dt)
    if tag not in cache:
        cache.clear()  # one problem alive at a time
        cache[tag] = _examples.problem_for_key(kernel, key, DTYPES[dt], "cuda", batch=sizes["batch"],
                                     seqlen_chunks=sizes["seqlen_chunks"], nheads=sizes["nheads"],
                                     ngroups=sizes["ngroups"])
    return cache[tag]


# ------------------------------------------------------------------------------------------- phase 1 worker
def worker_compile(tasks_file, out_file, deadline):
    spec = json.loads(Path(tasks_file).read_text())
    tasks, sizes = spec["tasks"], spec["sizes"]
    cache, results = {}, []
    for kernel, key, dt, idx, cand in tasks:
        if time.time() > deadline:
            results.append([kernel, key, dt, idx, "skipped: budget"])
            continue
        try:
            p = _problem(kernel, key, dt, cache, sizes)
            _registry.run_kernel(kernel, p, config=_cfg_dict(cand))
            torch.cuda.synchronize()
            results.append([kernel, key, dt, idx, "ok"])
        except Exception as exc:  # noqa: BLE001 - any failure makes the candidate invalid
            results.append([kernel, key, dt, idx, f"{type(exc).__name__}: {str(exc)[:200]}"])
    Path(out_file).write_text(json.dumps(results))


def phase1(jobs, cands, args, deadline):
    tasks = []
    for kernel, key, dt in jobs:
        for i, c in enumerate(cands[kernel]):
            tasks.append([kernel, key, dt, i, [c[0], c[1], c[2]]])
    # one (kernel, key, dtype) group per worker at a time (its problem is built once); groups spread over the
    # workers longest-first (matmul-like kernels weigh more than the elementwise chunk-cumsum ones)
    nj = max(1, args.jobs)
    groups = {}
    for t in tasks:
        groups.setdefault((t[0], json.dumps(t[1], sort_keys=True), t[2]), []).append(t)
    weight = lambda g: len(g) * (1 if g[0][0].startswith("chunk_cumsum") else 4)  # noqa: E731
    shards, load = [[] for _ in range(nj)], [0] * nj
    for g in sorted(groups.values(), key=weight, reverse=True):
        s = load.index(min(load))
        shards[s].extend(g)
        load[s] += weight(g)
    tmp = Path(tempfile.mkdtemp(prefix="tune_"))
    procs = []
    for s, shard in enumerate(shards):
        shard.sort(key=lambda t: (t[0], json.dumps(t[1], sort_keys=True), t[2], t[3]))
        tf, of = tmp / f"tasks{s}.json", tmp / f"out{s}.json"
        tf.write_text(json.dumps({"sizes": problem_sizes(args), "tasks": shard}))
        procs.append((subprocess.Popen([sys.executable, "-m", MODULE, "--worker-compile", str(tf), str(of),
                                        str(deadline)], cwd=str(PACKAGE_PARENT)), of))
    status = {}
    for proc, of in procs:
        proc.wait()
        if of.exists():
            for kernel, key, dt, idx, st in json.loads(of.read_text()):
                status[(kernel, json.dumps(key, sort_keys=True), dt, idx)] = st
    _log(f"phase 1: {len(tasks)} candidate compiles in {nj} workers, "
         f"{sum(1 for v in status.values() if v == 'ok')} ok")
    return status


# ------------------------------------------------------------------------------------------- phase 2
def _time(fn, reps=10, trials=3):
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def phase2(jobs, cands, status, deadline, sizes):
    run_kernel = _registry.run_kernel
    arch = _configs.device_arch("cuda")
    table, report, cache = {}, [], {}
    for kernel, key, dt in jobs:
        rows = []
        for i, c in enumerate(cands[kernel]):
            st = status.get((kernel, json.dumps(key, sort_keys=True), dt, i), "not compiled")
            row = {"candidate": _cfg_dict(c), "compile": st}
            if st == "ok" and time.time() >= deadline:
                row["timing"] = "skipped: budget"
            elif st == "ok":
                try:
                    p = _problem(kernel, key, dt, cache, sizes)
                    cfg = _cfg_dict(c)
                    o1 = run_kernel(kernel, p, config=cfg)
                    o2 = run_kernel(kernel, p, config=cfg)
                    torch.cuda.synchronize()
                    finite = all(bool(torch.isfinite(t.float()).all()) for t in o1 if t.is_floating_point())
                    same = len(o1) == len(o2) and all(torch.equal(a, b) for a, b in zip(o1, o2))
                    row["finite"], row["bitwise_repeat"] = finite, same
                    if finite and same:
                        row["ms"] = _time(lambda: run_kernel(kernel, p, config=cfg))
                except Exception as exc:  # noqa: BLE001
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
        valid = [r for r in rows if "ms" in r]
        tkey = _registry.table_key(arch, dt, kernel, key)
        # a search that the budget (or a dead compile worker) cut short would replace a complete one with the
        # candidates it reached: keep it out
        cut = sum(1 for r in rows if r.get("timing") == "skipped: budget"
                  or r["compile"] in ("skipped: budget", "not compiled"))
        if cut:
            _log(f"{tkey}: {cut} of {len(rows)} candidates not compiled or not timed (budget): not written")
        elif valid:
            best = min(valid, key=lambda r: r["ms"])
            table[tkey] = best["candidate"]
            rule = _registry.rule_config(kernel).as_dict()
            rule_ms = next((r["ms"] for r in valid if r["candidate"] == rule), None)
            _log(f"{tkey}: {best['candidate']} {best['ms']:.4f} ms ({len(valid)}/{len(rows)} valid; rule "
                 f"{'%.4f ms' % rule_ms if rule_ms is not None else 'n/a'})")
        else:
            _log(f"{tkey}: no valid candidate (left to the rule)")
        report.append({"key": tkey, "rows": rows, "chosen": table.get(tkey)})
    return table, report


def write_table(path, table, meta, merge=True):
    old = {}
    if merge and path.exists():
        ns = {}
        exec(compile(path.read_text(), str(path), "exec"), ns)
        old = dict(ns.get("TABLE", {}))
        if set(old) - set(table) and ns.get("META"):  # entries kept from earlier runs keep their run's META
            meta = {**meta, "earlier": ns["META"]}
    old.update(table)
    body = pprint.pformat(dict(sorted(old.items())), width=120, sort_dicts=True)
    text = ('"""Pinned launch configurations (generated by ``python -m csrc_bindings.pinned.tune``; do not edit by '
            'hand).\n\nKey: ``"{arch}/{dtype}/{kernel}/{autotune key}"``; value: block sizes + ``num_warps`` + '
            '``num_stages``.\nKeys that are missing here use the ``mincost-v1`` rule (see '
            ':mod:`csrc_bindings._configs`).\n"""\n\n'
            f"META = {pprint.pformat(meta, width=120)}\n\nTABLE = {body}\n")
    path.write_text(text)


def main():
    """The command line (see the module docstring).

    Raises:
        SystemExit: bad arguments (argparse's exit status 2), no CUDA GPU, or, from :func:`live_candidates`, live
            autotuner lists that differ from the specs.
        ImportError, RuntimeError: the native check (``csrc_bindings.check_native``) fails.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="256x64x128", help="comma list of CHUNKxHEADDIMxDSTATE")
    ap.add_argument("--nheads", default="24,32,48,64", help="nheads values (only the chunk-cumsum key uses it)")
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--swiglu-cols", type=int, default=0, help="d_nonssm for the swiglu keys (0: skip)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--out", default=str(TABLE_PATH))
    ap.add_argument("--report", default=None, help="write all timings here (JSON)")
    ap.add_argument("--replace", action="store_true", help="do not merge with the existing table")
    ap.add_argument("--skip-existing", action="store_true", help="only tune keys that the table does not have yet")
    ap.add_argument("--batch", type=int, default=4, help="batch of the timed problems")
    ap.add_argument("--seqlen-chunks", type=int, default=8, help="sequence length of the timed problems, in chunks")
    ap.add_argument("--problem-nheads", type=int, default=16,
                    help="nheads of the timed problems (keys that contain nheads use their own)")
    ap.add_argument("--ngroups", type=int, default=1, help="ngroups of the timed problems")
    ap.add_argument("--kernels", default="", help="comma list: tune only these kernels (default: all)")
    ap.add_argument("--list-jobs", action="store_true",
                    help="print the (kernel, key, dtype) jobs and the problem sizes, then exit (no GPU needed; "
                         "lists every job: --skip-existing needs the GPU's arch)")
    ap.add_argument("--worker-compile", nargs=3, metavar=("TASKS", "OUT", "DEADLINE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_compile:
        tf, of, dl = args.worker_compile
        worker_compile(tf, of, float(dl))
        return
    for name in ("batch", "seqlen_chunks", "problem_nheads", "ngroups"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if args.kernels:
        known = {k for k, _, _ in _registry.layer_keys(chunk_size=256, headdim=64, dstate=128, nheads=64,
                                             d_nonssm=args.swiglu_cols or 1)}
        asked = [k.strip() for k in args.kernels.split(",") if k.strip()]
        unknown = [k for k in asked if k not in known]
        if unknown or not asked:
            ap.error(f"--kernels: expected names from {sorted(known)}, got {unknown or args.kernels!r}")
        args.kernels = ",".join(asked)
    if args.problem_nheads % args.ngroups:
        ap.error(f"--problem-nheads ({args.problem_nheads}) must be a multiple of --ngroups ({args.ngroups})")
    if args.list_jobs:
        for kernel, key, dt in build_jobs(args):
            print(kernel, json.dumps(key, sort_keys=True), dt)
        print("problem:", describe_sizes(problem_sizes(args)))
        return
    if not torch.cuda.is_available():
        raise SystemExit(f"python -m {MODULE} needs a CUDA GPU")
    t0 = time.time()
    deadline = t0 + args.budget_s
    import csrc_bindings as cb
    versions = cb.check_native(conv=False)
    cands = live_candidates()
    jobs = build_jobs(args)
    if args.skip_existing:
        arch, have = _configs.device_arch("cuda"), set(_configs._table())
        jobs = [j for j in jobs if _registry.table_key(arch, j[2], j[0], j[1]) not in have]
    _log(f"tuning {len(jobs)} (kernel, key, dtype) jobs on {torch.cuda.get_device_name(0)} "
         f"({_configs.device_arch('cuda')}); versions {versions}")
    status = phase1(jobs, cands, args, t0 + 0.8 * args.budget_s)
    table, report = phase2(jobs, cands, status, deadline, problem_sizes(args))
    meta = {"generated_by": f"python -m {MODULE}",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name(0), "versions": {**versions, "torch": torch.__version__},
            "shapes": args.shapes, "nheads": args.nheads, "dtypes": args.dtypes,
            "timing": f"best of 3 trials x 10 launches, CUDA events, {describe_sizes(problem_sizes(args))}"}
    out = Path(args.out)
    write_table(out, table, meta, merge=not args.replace)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1))
    import importlib

    from . import table as table_module
    importlib.reload(table_module)
    _log(f"wrote {len(table)} entries to {out} in {time.time() - t0:.0f} s; table hash {cb.table_hash()}")
    _log("fingerprint:", cb.fingerprint())


if __name__ == "__main__":
    main()
