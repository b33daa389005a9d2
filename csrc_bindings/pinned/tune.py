"""Tune the pinned launch-configuration table of ``csrc_bindings`` on the current GPU.

For every native kernel of the Mamba-2 layer and every (layer shape, dtype) asked for, time every candidate
configuration of the kernel's own upstream autotuner (``kernel.configs``, read, never modified) through the
``csrc_bindings`` launcher, but those whose tiles are wider than the key's dimension needs (the spec's
``tile_bounds``, :func:`search_candidates`), and record the fastest *valid* one:

* it compiles and fits the GPU's shared memory / registers (the launch does not raise),
* it runs the deterministic path (the launchers always pass ``DETERMINISTIC_REDUCTION=True`` where it exists)
  and two runs on the same inputs give bitwise-identical, finite outputs.

Phase 1 compiles every candidate in parallel worker processes (filling Triton's on-disk cache), phase 2 times them
one by one in this process (warm-up first, CUDA events, best of 3 trials of 10 launches). The result is written as
a Python dict module (default ``csrc_bindings/pinned/table.py``, beside this file), merged with the entries already
there for other keys; ``--report`` writes every timing as JSON. Writing the package's table drops the speed
table's entries at the keys whose entry it added or changed (:func:`prune_speed`).

This script changes no environment variable and no mamba-ssm state. It refuses to run if the live autotuner lists
differ from the copies in the kernels' specs (``candidates``, beside each launcher; e.g. mamba-ssm's deterministic
mode filtered them).

Example (the GPU gate):
    python -m csrc_bindings.pinned.tune --dtypes bfloat16,float16,float32 --jobs 14 --budget-s 300

The timed problems default to batch 4, 8 chunks, 16 heads; ``--batch``, ``--seqlen-chunks``, ``--problem-nheads``
and ``--ngroups`` size them like a real layer (e.g. bench S2: ``--batch 8 --seqlen-chunks 16 --problem-nheads 64``).
The table is keyed by the autotune key only, so one entry serves every batch and length; ``--also-problem BxCxHxG``
(repeatable) times every valid candidate on further problems too and picks the one whose worst ratio to each
problem's fastest is least (``least-worst-ratio-v1``). ``--list-jobs`` prints the jobs without a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import _configs, _examples, _registry
from .._spec import oversized_tiles
from .live import live_candidates
from .pick import (OUT_OF_MEMORY, ROBUST_RULE, describe_sizes, failure_status,  # noqa: F401 - re-exported
                   least_worst_ratio, pick_entry, problem_list, problem_sizes, worst_ratios)
from .write import (MODULE, SPEED_DOC, SPEED_PATH, TABLE_PATH, _entries, _log,  # noqa: F401 - re-exported
                    _read_module, changed_keys, merge_tables, prune_speed, write_pinned_table, write_table)

#: where the compile workers start (``python -m csrc_bindings.pinned.tune``): the folder that holds this package
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
#: ``--shapes key-space``: every layer shape of the key space the table is meant to cover on sm_90 (chunk_size
#: 64/128/256, headdim 32/64/128, d_state 16 to 256), as ``CHUNKxHEADDIMxDSTATE``
KEY_SPACE = tuple(f"{c}x{p}x{n}" for c in (64, 128, 256) for p in (32, 64, 128) for n in (16, 32, 64, 128, 256))


def build_jobs(args):
    """[(kernel, key, dtype_name)] for the requested shapes, deduplicated, in a stable order.

    Raises:
        ValueError: a ``--shapes`` entry that is not ``CHUNKxHEADDIMxDSTATE`` integers (or the word ``key-space``:
            :data:`KEY_SPACE`), or a ``--nheads`` value that is not an integer (``main`` parses the arguments without
            checking these).
    """
    jobs, seen = [], set()
    wanted = set(args.kernels.split(",")) if args.kernels else None
    shapes = KEY_SPACE if args.shapes == "key-space" else args.shapes.split(",")
    for shape in shapes:
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


def search_candidates(kernel, key, live) -> list:
    """The candidates a pinned-table search times for ``kernel`` at ``key``: the live autotuner list without the
    configurations whose tiles are oversized for the key (:func:`csrc_bindings._spec.oversized_tiles`, from the
    spec's ``tile_bounds``), in the live order."""
    spec = _registry.KERNELS[kernel]
    return [c for c in live[kernel] if not oversized_tiles(spec, key, c[0])]


def oversized_jobs(jobs, arch) -> list:
    """The jobs of ``jobs`` whose pinned-table entry on ``arch`` has an oversized tile (``--oversized-only``): the
    entries a search of :func:`search_candidates` would not choose."""
    table = _configs._table()
    out = []
    for kernel, key, dt in jobs:
        entry = table.get(_registry.table_key(arch, dt, kernel, key))
        if entry is not None and oversized_tiles(_registry.KERNELS[kernel], key, entry):
            out.append((kernel, key, dt))
    return out


def _cfg_dict(cand):
    block, warps, stages = cand
    d = dict(block)
    d["num_warps"], d["num_stages"] = warps, stages
    return d


def unique_configs(configs) -> list:
    """``configs`` (dicts of block sizes + ``num_warps``/``num_stages``) without repeats, first occurrence kept."""
    seen, uniq = set(), []
    for c in configs:
        t = tuple(sorted(c.items()))
        if t not in seen:
            seen.add(t)
            uniq.append(c)
    return uniq


def speed_candidates(kernel, key, dt, live, arch):
    """The candidates of a speed search: the order configuration of the key (table entry, or either rule); it with its
    bit-neutral parameters (``NEUTRAL``) set as in each upstream candidate; it with ``num_warps`` 2/4/8 and with
    ``num_stages`` 1..5 where those are neutral. The order parameters never change. Deduplicated, order config first.
    """
    neutral = _configs._neutral().get(kernel, ())
    base = _registry.order_config(kernel, key, DTYPES[dt], arch).as_dict()
    out = [base]
    for cand in live[kernel]:
        full = _cfg_dict(cand)
        out.append({n: (full[n] if n in neutral else base[n]) for n in base})
    for n, values in (("num_warps", (2, 4, 8)), ("num_stages", (1, 2, 3, 4, 5))):
        if n in neutral:  # around the order configuration only (a full product would be hundreds of compiles)
            out += [{**base, n: v} for v in values]
    blocks = [n for n in base if n not in ("num_warps", "num_stages")]
    return [({n: c[n] for n in blocks}, c["num_warps"], c["num_stages"]) for c in unique_configs(out)]


def _problem(kernel, key, dt, cache, sizes):
    tag = (kernel, tuple(sorted(key.items())), dt, tuple(sorted(sizes.items())))
    if tag not in cache:
        cache.clear()  # one problem alive at a time, its memory handed back (14 workers share the GPU)
        torch.cuda.empty_cache()
        cache[tag] = _examples.problem_for_key(kernel, key, DTYPES[dt], "cuda", batch=sizes["batch"],
                                     seqlen_chunks=sizes["seqlen_chunks"], nheads=sizes["nheads"],
                                     ngroups=sizes["ngroups"], on_device=True)
    return cache[tag]


# ------------------------------------------------------------------------------------------- phase 1 worker
def _run_once(kernel, key, dt, cache, sizes, cfg):
    """One launch on the (cached) problem; no reference to it outlives the call, so :func:`_problem` can free it."""
    _registry.run_kernel(kernel, _problem(kernel, key, dt, cache, sizes), config=cfg)
    torch.cuda.synchronize()


def _check_and_time(kernel, key, dt, cache, sizes, cfg) -> dict:
    """Phase 2 on the first problem: two runs (finite, bitwise equal), then the time if both hold."""
    p = _problem(kernel, key, dt, cache, sizes)
    o1 = _registry.run_kernel(kernel, p, config=cfg)
    o2 = _registry.run_kernel(kernel, p, config=cfg)
    torch.cuda.synchronize()
    finite = all(bool(torch.isfinite(t.float()).all()) for t in o1 if t.is_floating_point())
    same = len(o1) == len(o2) and all(torch.equal(a, b) for a, b in zip(o1, o2))
    out = {"finite": finite, "bitwise_repeat": same}
    if finite and same:
        out["ms"] = _time(lambda: _registry.run_kernel(kernel, p, config=cfg))
    return out


def _time_on(kernel, key, dt, cache, sizes, cfg) -> float:
    p = _problem(kernel, key, dt, cache, sizes)
    return _time(lambda: _registry.run_kernel(kernel, p, config=cfg))


def worker_compile(tasks_file, out_file, deadline):
    """Run every task's candidate once on the first problem (its status: ``ok`` or the error), then the ``ok`` ones
    on each further problem (``more``: their integer sizes may make Triton specialise, and compile, anew); a
    failure there is left to phase 2 to report. One problem alive at a time, built once per (kernel, key, dtype)."""
    spec = json.loads(Path(tasks_file).read_text())
    tasks, problems = spec["tasks"], [spec["sizes"], *spec.get("more", ())]
    cache, results = {}, []
    groups = {}
    for t in tasks:
        groups.setdefault((t[0], json.dumps(t[1], sort_keys=True), t[2]), []).append(t)
    for group in groups.values():
        ok = []
        for j, sizes in enumerate(problems):
            for kernel, key, dt, idx, cand in (group if j == 0 else ok):
                if time.time() > deadline:
                    if j == 0:
                        results.append([kernel, key, dt, idx, "skipped: budget"])
                    continue
                try:
                    _run_once(kernel, key, dt, cache, sizes, _cfg_dict(cand))
                    if j == 0:
                        results.append([kernel, key, dt, idx, "ok"])
                        ok.append([kernel, key, dt, idx, cand])
                except Exception as exc:  # noqa: BLE001 - any failure makes the candidate invalid
                    if j == 0:
                        results.append([kernel, key, dt, idx, failure_status(exc)])
    Path(out_file).write_text(json.dumps(results))


def phase1(jobs, cands, args, deadline):
    """Compile every candidate of every job in ``args.jobs`` worker processes; ``cands(kernel, key, dt)`` lists a
    job's candidates as ``(block kwargs, num_warps, num_stages)``."""
    tasks = []
    for kernel, key, dt in jobs:
        for i, c in enumerate(cands(kernel, key, dt)):
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
    t_start = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="tune_"))
    procs = []
    for s, shard in enumerate(shards):
        shard.sort(key=lambda t: (t[0], json.dumps(t[1], sort_keys=True), t[2], t[3]))
        tf, of = tmp / f"tasks{s}.json", tmp / f"out{s}.json"
        tf.write_text(json.dumps({"sizes": problem_sizes(args), "more": problem_list(args)[1:], "tasks": shard}))
        procs.append((subprocess.Popen([sys.executable, "-m", MODULE, "--worker-compile", str(tf), str(of),
                                        str(deadline)], cwd=str(PACKAGE_PARENT)), of))
    status = {}
    for proc, of in procs:
        proc.wait()
        if of.exists():
            for kernel, key, dt, idx, st in json.loads(of.read_text()):
                status[(kernel, json.dumps(key, sort_keys=True), dt, idx)] = st
    _log(f"phase 1: {len(tasks)} candidate compiles in {nj} workers, "
         f"{sum(1 for v in status.values() if v == 'ok')} ok, {time.time() - t_start:.0f} s")
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


def phase2(jobs, cands, status, deadline, sizes, speed=False, current=None, keep_within=None):
    """Time every compiled candidate of every job in this process; the best valid one per job. ``sizes``: one
    problem (the fastest), or a list (:func:`problem_list`): validity checked on the first, every valid candidate
    timed on each, :func:`least_worst_ratio` picks (none ran on every problem: not written). ``speed``: the entries
    hold only the kernel's bit-neutral parameters (``NEUTRAL``), for the speed table. ``current``: table key -> the
    entry before the search; with ``keep_within`` a key keeps it where :func:`pick_entry` says so."""
    problems = sizes if isinstance(sizes, list) else [sizes]
    sizes = problems[0]
    arch = _configs.device_arch("cuda")
    table, report, cache = {}, [], {}
    for kernel, key, dt in jobs:
        rows = []
        for i, c in enumerate(cands(kernel, key, dt)):
            st = status.get((kernel, json.dumps(key, sort_keys=True), dt, i), "not compiled")
            row = {"candidate": _cfg_dict(c), "compile": st}
            # a compile worker that ran out of memory shared the GPU with 13 others: phase 2, alone, tries again
            runnable = st in ("ok", OUT_OF_MEMORY)
            if runnable and time.time() >= deadline:
                row["timing"] = "skipped: budget"
            elif runnable:
                try:
                    row.update(_check_and_time(kernel, key, dt, cache, sizes, _cfg_dict(c)))
                except Exception as exc:  # noqa: BLE001
                    row["error"] = failure_status(exc)
            rows.append(row)
        for more in problems[1:]:  # the candidates valid on the first problem, on each further one
            for row, c in zip(rows, cands(kernel, key, dt)):
                if "ms" not in row or "error" in row or "error_more" in row or row.get("timing"):
                    continue
                if time.time() >= deadline:
                    row["timing"] = "skipped: budget"
                    continue
                try:
                    row.setdefault("ms_more", []).append(_time_on(kernel, key, dt, cache, more, _cfg_dict(c)))
                except Exception as exc:  # noqa: BLE001
                    status_more = failure_status(exc)
                    row["error_more"] = status_more if status_more == OUT_OF_MEMORY else \
                        f"{type(exc).__name__} (problem {more}): {str(exc)[:200]}"
        nmore = len(problems) - 1
        valid = [r for r in rows if "ms" in r and "error_more" not in r and len(r.get("ms_more", ())) == nmore]
        tkey = _registry.table_key(arch, dt, kernel, key)
        was = (current or {}).get(tkey)  # the key's entry before the search
        # a search that the budget (or a dead compile worker) cut short would replace a complete one with the
        # candidates it reached: keep it out
        cut = sum(1 for r in rows if r.get("timing") == "skipped: budget"
                  or r["compile"] in ("skipped: budget", "not compiled")
                  or OUT_OF_MEMORY in (r.get("error"), r.get("error_more")))
        if cut or (any("error_more" in r for r in rows) and not valid):
            _log(f"{tkey}: {cut} of {len(rows)} candidates not compiled or not timed (budget, out of memory), or none "
                 f"ran on every problem: not written")
        elif valid:
            best = pick_entry(valid, was, keep_within)
            table[tkey] = (best["candidate"] if not speed else
                           {n: best["candidate"][n] for n in _configs._neutral().get(kernel, ())})
            # the baseline: the rule's configuration, or (speed) the key's order configuration, candidate 0
            rule = rows[0]["candidate"] if speed else _registry.rule_config(kernel).as_dict()
            rule_ms = next((r["ms"] for r in valid if r["candidate"] == rule), None)
            ms_more = f" {best['ms_more']}" if nmore else ""
            was_worst = next((w for r, w in zip(valid, worst_ratios(valid)) if r["candidate"] == was), None)
            was_text = "" if was is None else (f"; entry before {'kept' if best['candidate'] == was else 'replaced'}"
                                               f", worst ratio {'n/a' if was_worst is None else '%.3f' % was_worst}")
            _log(f"{tkey}: {best['candidate']} {best['ms']:.4f} ms{ms_more} ({len(valid)}/{len(rows)} valid; "
                 f"{'order config' if speed else 'rule'} {'%.4f ms' % rule_ms if rule_ms is not None else 'n/a'}"
                 f"{was_text})")
        else:
            _log(f"{tkey}: no valid candidate (left to the rule)")
        report.append({"key": tkey, "rows": rows, "chosen": table.get(tkey)})
        if was is not None:
            report[-1]["before"] = was
    return table, report


def shard_jobs(jobs: list, shard) -> list:
    """``jobs[i::n]`` for ``shard == (i, n)`` (``--shard I/N``), all of them for None: N processes tune disjoint
    parts of the same list, which :func:`build_jobs` keeps in a stable order."""
    return list(jobs) if shard is None else list(jobs[shard[0]::shard[1]])


def main():
    """The command line (see the module docstring).

    Raises:
        SystemExit: bad arguments (argparse's exit status 2), no CUDA GPU, or, from :func:`live_candidates`, live
            autotuner lists that differ from the specs.
        ImportError, RuntimeError: the native check (``csrc_bindings.check_native``) fails.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="256x64x128",
                    help="comma list of CHUNKxHEADDIMxDSTATE, or key-space (chunk 64/128/256 x headdim 32/64/128 x "
                         "d_state 16/32/64/128/256)")
    ap.add_argument("--shard", default=None, metavar="I/N",
                    help="tune only jobs I, I+N, I+2N, ... of the job list (0 <= I < N): N processes, e.g. one per "
                         "GPU, each with its own --out, then --merge-from")
    ap.add_argument("--merge-from", nargs="+", default=None, metavar="MODULE",
                    help="measure nothing: merge the entries of these generated table modules (TABLE, or SPEED with "
                         "--speed) into --out (default: the package's table), later files winning")
    ap.add_argument("--nheads", default="24,32,48,64", help="nheads values (only the chunk-cumsum key uses it)")
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--swiglu-cols", type=int, default=0, help="d_nonssm for the swiglu keys (0: skip)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--out", default=None, help="the table module written (default: table.py, or speed_table.py "
                                                  "with --speed)")
    ap.add_argument("--speed", action="store_true",
                    help="tune only the bit-neutral parameters (NEUTRAL) of each key, its order parameters held at "
                         "the pinned ones; write the speed table (kernels without neutral parameters are skipped)")
    ap.add_argument("--report", default=None, help="write all timings here (JSON)")
    ap.add_argument("--replace", action="store_true", help="do not merge with the existing table")
    ap.add_argument("--skip-existing", action="store_true", help="only tune keys that the table does not have yet")
    ap.add_argument("--oversized-only", action="store_true",
                    help="only tune keys whose table entry has a tile wider than its dimension needs (the spec's "
                         "tile_bounds; such candidates are never searched)")
    ap.add_argument("--batch", type=int, default=4, help="batch of the timed problems")
    ap.add_argument("--seqlen-chunks", type=int, default=8, help="sequence length of the timed problems, in chunks")
    ap.add_argument("--problem-nheads", type=int, default=16,
                    help="nheads of the timed problems (keys that contain nheads use their own)")
    ap.add_argument("--ngroups", type=int, default=1, help="ngroups of the timed problems")
    ap.add_argument("--also-problem", action="append", default=None, metavar="BxCxHxG",
                    help="also time every valid candidate on this problem (batch, seqlen in chunks, nheads, ngroups; "
                         f"repeatable) and pick by {ROBUST_RULE}")
    ap.add_argument("--keep-within", type=float, default=None, metavar="R",
                    help="keep a key's table entry where its worst ratio to each problem's fastest is at most R "
                         "(e.g. 1.1): a re-search changes a key's bits only where it buys more than that")
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
    shard = None
    if args.shard is not None:
        try:
            i, n = (int(v) for v in args.shard.split("/"))
        except ValueError:
            i, n = -1, 0
        if not 0 <= i < n:
            ap.error(f"--shard: expected I/N with 0 <= I < N, got {args.shard!r}")
        shard = (i, n)
    if args.keep_within is not None:
        if args.speed or args.merge_from:
            ap.error("--keep-within: applies to a search of the pinned table, not to --speed or --merge-from")
        if not args.keep_within >= 1.0:  # also refuses nan
            ap.error(f"--keep-within: expected a ratio >= 1.0, got {args.keep_within}")
    out = Path(args.out or (SPEED_PATH if args.speed else TABLE_PATH))
    if args.merge_from:
        merged = merge_tables(out, [Path(p) for p in args.merge_from], speed=args.speed,
                              speed_path=SPEED_PATH if out.resolve() == TABLE_PATH else None)
        _log(f"merged {len(args.merge_from)} module(s) into {out}: {merged} entries")
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
    try:
        problems = problem_list(args)
    except ValueError as exc:
        ap.error(str(exc))
    if args.list_jobs:
        for kernel, key, dt in shard_jobs(build_jobs(args), shard):
            print(kernel, json.dumps(key, sort_keys=True), dt)
        print("problem:", describe_sizes(problems))
        return
    if not torch.cuda.is_available():
        raise SystemExit(f"python -m {MODULE} needs a CUDA GPU")
    t0 = time.time()
    deadline = t0 + args.budget_s
    import csrc_bindings as cb
    versions = cb.check_native(conv=False)
    live = live_candidates()
    arch = _configs.device_arch("cuda")
    jobs = shard_jobs(build_jobs(args), shard)
    if args.speed:
        jobs = [j for j in jobs if _configs._neutral().get(j[0])]
        cands = lambda k, key, dt: speed_candidates(k, key, dt, live, arch)  # noqa: E731
    else:
        cands = lambda k, key, dt: search_candidates(k, key, live)  # noqa: E731
    if args.oversized_only:
        jobs = oversized_jobs(jobs, arch)
    if args.skip_existing:
        have = set(_configs._speed() if args.speed else _configs._table())
        jobs = [j for j in jobs if _registry.table_key(arch, j[2], j[0], j[1]) not in have]
    _log(f"tuning {len(jobs)} (kernel, key, dtype) jobs on {torch.cuda.get_device_name(0)} "
         f"({_configs.device_arch('cuda')}); versions {versions}")
    status = phase1(jobs, cands, args, t0 + 0.8 * args.budget_s)
    current = None if args.speed else dict(_configs._table())
    table, report = phase2(jobs, cands, status, deadline, problems, speed=args.speed, current=current,
                           keep_within=args.keep_within)
    meta = {"generated_by": f"python -m {MODULE}",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name(0), "versions": {**versions, "torch": torch.__version__},
            "shapes": args.shapes, "nheads": args.nheads, "dtypes": args.dtypes,
            "timing": f"best of 3 trials x 10 launches, CUDA events, {describe_sizes(problems)}"
                      + (f"; an entry kept where within {args.keep_within}" if args.keep_within else "")}
    if not args.speed and out.resolve() == TABLE_PATH:
        write_pinned_table(out, table, meta, merge=not args.replace, speed_path=SPEED_PATH)
    else:
        write_table(out, table, meta, merge=not args.replace, speed=args.speed)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1))
    import importlib

    from . import speed_table as speed_module
    from . import table as table_module
    importlib.reload(speed_module)  # prune_speed may have rewritten it too
    importlib.reload(table_module)
    _log(f"wrote {len(table)} entries to {out} in {time.time() - t0:.0f} s; table hash {cb.table_hash()}")
    _log("fingerprint:", cb.fingerprint())


if __name__ == "__main__":
    main()
