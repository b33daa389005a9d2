"""Prove on the GPU which launch-configuration parameters of each native kernel leave every output bit unchanged.

A parameter is **bit-neutral** for a kernel when every value of it gives the same output bits, all other parameters
equal; the others **decide the order** of a sum (a block size along a reduced dimension sets which terms each
program adds and in which groups; Triton's reduction trees follow the tile's layout). Reading the kernels suggests
which is which, but Triton's code generation (wgmma or mma, the layout of a ``tl.sum``) depends on the block shape
and ``num_warps`` too, so the split is measured, never assumed:

1. **Cases**: every kernel of :data:`csrc_bindings._registry.TUNED_KERNELS` at the autotune keys of a few layer
   shapes (:data:`PROOF_SHAPES`: chunk 64 / headdim 32 / d_state 16, chunk 256 / 64 / 128, chunk 128 / 128 / 64,
   chunk 128 / 128 / 256),
   in bf16, fp16 and fp32, on problems with a partial last chunk, ``ngroups`` 2 and a head count that no head
   block divides (:data:`PROBLEM`).
2. **Variants** per case: the pinned configuration; each block size of it halved and doubled (within the range the
   upstream candidates span); ``num_warps`` 2, 4, 8; ``num_stages`` 1 to 5; and every upstream candidate.
3. Each variant runs twice (repeatability) in one of ``--jobs`` worker processes; the SHA-256 of its output bytes is
   recorded. A variant that does not compile or fit is recorded as such and left out.
4. **Verdict** per kernel: a parameter is neutral when, in every case, every two variants that differ in it alone
   give the same digest, and the digest is then a function of the other parameters across *all* variants of every
   case (the candidates vary several parameters at once); a parameter without such a pair anywhere is not neutral.

``python -m csrc_bindings.pinned.neutral --report neutral.json`` writes the evidence (every digest) and
``csrc_bindings/pinned/neutral_params.py`` (:data:`NEUTRAL`: kernel -> its neutral parameters, with provenance),
which the configuration lookup reads (:mod:`csrc_bindings._configs`): only the parameters listed there may be chosen
for speed per shape (:mod:`csrc_bindings.pinned.speed_table`); the others stay pinned. ``--list`` prints the cases
without a GPU. ``--reuse OLD.json`` takes a case's rows from an earlier report instead of running it again when that
report ran the same variants of the same case on the same GPU model, triton and mamba-ssm versions and example
problem (the verdict is still computed over every case; a change of the launchers needs a run without it). Needs
a CUDA GPU and the native extras.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import pprint
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import _configs, _examples, _registry
from .tune import _cfg_dict, unique_configs

MODULE = "csrc_bindings.pinned.neutral"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
NEUTRAL_PATH = Path(__file__).resolve().with_name("neutral_params.py")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
#: (chunk_size, headdim, dstate, nheads, dtypes): the layer shapes whose autotune keys are proven
PROOF_SHAPES = ((64, 32, 16, 6, ("bfloat16", "float16", "float32")),
                (256, 64, 128, 24, ("bfloat16", "float16", "float32")),
                (128, 128, 64, 12, ("bfloat16",)),
                (128, 128, 256, 64, ("bfloat16", "float16", "float32")))
#: the example problem around a key: 2 examples, 2.5 chunks (a partial last chunk), 6 heads in 2 groups
PROBLEM = {"batch": 2, "chunks": 2.5, "nheads": 6, "ngroups": 2}
PARAM_ORDER = ("num_warps", "num_stages")


def params_of(spec) -> tuple:
    """The configuration parameters of a tuned kernel: its block sizes (upstream's names) then warps and stages."""
    return tuple(spec.candidates[0][0]) + PARAM_ORDER


def variants(spec, base: dict) -> list:
    """The configurations tried for one case (see the module docstring), ``base`` first, without duplicates."""
    blocks = tuple(spec.candidates[0][0])
    span = {b: (min(c[0][b] for c in spec.candidates), max(c[0][b] for c in spec.candidates)) for b in blocks}
    out = [dict(base)]
    for b in blocks:
        lo, hi = span[b]
        for v in (base[b] // 2, base[b] * 2):
            if lo <= v <= hi and v >= 1:
                out.append({**base, b: v})
    out += [{**base, "num_warps": w} for w in (2, 4, 8)]
    out += [{**base, "num_stages": s} for s in (1, 2, 3, 4, 5)]
    out += [_cfg_dict(c) for c in spec.candidates]
    if spec.config_error is not None:  # configurations the launcher refuses (the kernel computes them wrongly)
        out = [c for c in out if not spec.config_error(c)]
    return unique_configs(out)


def cases(kernels=None) -> list:
    """``[(kernel, key, dtype_name)]`` of the proof, in a stable order (see :data:`PROOF_SHAPES`)."""
    out, seen = [], set()
    for chunk_size, headdim, dstate, nheads, dtypes in PROOF_SHAPES:
        for kernel, key, role in _registry.layer_keys(chunk_size=chunk_size, headdim=headdim, dstate=dstate,
                                                      nheads=nheads, d_nonssm=0):
            if kernels and kernel not in kernels:
                continue
            for dt in (dtypes if role == "model" else ("float32",)):
                tag = (kernel, tuple(sorted(key.items())), dt)
                if tag not in seen:
                    seen.add(tag)
                    out.append((kernel, dict(key), dt))
    return out


def base_config(kernel, key, dt, arch="sm_90") -> dict:
    """The pinned configuration of the case before any speed choice (table entry, else ``nearest-order-v1``, else
    the ``mincost-v1`` rule)."""
    return _registry.order_config(kernel, key, DTYPES[dt], arch).as_dict()


def _digest(outs) -> str:
    h = hashlib.sha256()
    for t in outs:
        t = t.detach().contiguous()
        h.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def problem(kernel, key, dt):
    chunk_size = int(key.get("chunk_size", 256))
    return _examples.problem_for_key(kernel, key, DTYPES[dt], "cuda", batch=PROBLEM["batch"],
                                     seqlen=int(PROBLEM["chunks"] * chunk_size), nheads=PROBLEM["nheads"],
                                     ngroups=PROBLEM["ngroups"])


def run_case(kernel, key, dt, configs, deadline) -> list:
    """Run every configuration of one case twice; ``[{"config", "digest"} | {"config", "error"}]``."""
    rows = []
    try:
        p = problem(kernel, key, dt)
    except Exception as exc:  # noqa: BLE001 - reported per case
        return [{"config": c, "error": f"problem: {type(exc).__name__}: {str(exc)[:200]}"} for c in configs]
    for cfg in configs:
        if time.time() > deadline:
            rows.append({"config": cfg, "error": "skipped: budget"})
            continue
        try:
            d1 = _digest(_registry.run_kernel(kernel, p, config=cfg))
            d2 = _digest(_registry.run_kernel(kernel, p, config=cfg))
            rows.append({"config": cfg, "digest": d1} if d1 == d2 else
                        {"config": cfg, "error": f"not repeatable: {d1} then {d2}"})
        except Exception as exc:  # noqa: BLE001 - a configuration that does not compile or fit is left out
            rows.append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
    return rows


def worker(tasks_file, out_file, deadline):
    tasks = json.loads(Path(tasks_file).read_text())
    results = []
    for kernel, key, dt, configs in tasks:
        results.append([kernel, key, dt, run_case(kernel, key, dt, configs, deadline)])
        Path(out_file).write_text(json.dumps(results))


def neutral_params(spec, case_rows) -> dict:
    """The verdict for one kernel from its cases' rows (see the module docstring, step 4).

    ``case_rows``: per case, its rows; a row may carry the case's ``"dtype"`` (then a parameter needs a
    one-parameter pair in every dtype). A configuration that did not repeat its own bits makes nothing of the kernel
    neutral. Returns ``{"neutral": [...], "order": [...], "pairs": {param: number of one-parameter pairs},
    "violations": {param: example}}``.
    """
    names = params_of(spec)
    ok = [[r for r in rows if "digest" in r] for rows in case_rows]
    pairs = {n: 0 for n in names}
    violations = {}
    dtypes = [rows[0].get("dtype") if rows else None for rows in case_rows]
    paired = {n: set() for n in names}  # the dtypes in which a one-parameter pair of n was seen
    for dt, rows in zip(dtypes, ok):
        for a, b in itertools.combinations(rows, 2):
            diff = [n for n in names if a["config"][n] != b["config"][n]]
            if len(diff) == 1:
                pairs[diff[0]] += 1
                paired[diff[0]].add(dt)
                if a["digest"] != b["digest"] and diff[0] not in violations:
                    violations[diff[0]] = {"a": a["config"], "b": b["config"]}
    unrepeatable = [r["config"] for rows in case_rows for r in rows if r.get("error", "").startswith("not repeat")]
    if unrepeatable:  # a configuration that does not repeat its own bits: nothing of this kernel is neutral
        violations["not repeatable"] = unrepeatable[0]
    # neutral: a one-parameter pair in every dtype the kernel ran in, none of them differing
    neutral = [n for n in names if not unrepeatable and paired[n] >= set(dtypes) and n not in violations]

    def consistent(neu):
        for rows in ok:
            seen = {}
            for r in rows:
                k = tuple(r["config"][n] for n in names if n not in neu)
                if seen.setdefault(k, r["digest"]) != r["digest"]:
                    return False
        return True
    while neutral and not consistent(neutral):  # an interaction: drop one parameter (the first that suffices)
        fixes = [[m for m in neutral if m != n] for n in neutral]
        neutral = next((f for f in fixes if consistent(f)), neutral[:-1])
    return {"neutral": neutral, "order": [n for n in names if n not in neutral], "pairs": pairs,
            "violations": violations}


def proven_keys(keys) -> dict:
    """The key range a kernel's verdict covers: per autotune-key name, ``[min, max]`` of the sizes its cases ran,
    or the sorted boolean values (:func:`csrc_bindings._configs.speed_entry` applies no speed choice outside it)."""
    out = {}
    for name in keys[0]:
        values = [k[name] for k in keys]
        out[name] = sorted(set(values)) if isinstance(values[0], bool) else [min(values), max(values)]
    return out


def _case_tag(kernel, key, dt) -> tuple:
    return kernel, json.dumps(key, sort_keys=True), dt


def compact_case(case: dict) -> dict:
    """A case as the report stores it: ``{"key", "dtype", "configs": [{**config, "digest" | "error"}]}``."""
    return {"key": case["key"], "dtype": case["dtype"],
            "configs": [{**r["config"], **({"digest": r["digest"]} if "digest" in r else {"error": r["error"]})}
                        for r in case["rows"]]}


def case_rows(case: dict, names) -> list:
    """The rows (``{"config", "digest" | "error"}``) of a stored case (:func:`compact_case`); ``names``: the
    kernel's configuration parameters (:func:`params_of`)."""
    return [{"config": {n: r[n] for n in names},
             **({"digest": r["digest"]} if "digest" in r else {"error": r["error"]})} for r in case["configs"]]


def reusable_cases(report: dict, versions: dict, gpu: str, problem: dict = PROBLEM) -> dict:
    """``{(kernel, key json, dtype): rows}`` of an earlier report's cases that ran to the end (no budget skip or
    problem error), if it ran on GPU model ``gpu`` with ``versions`` and the example ``problem``; ``{}`` otherwise
    (nothing is reused). A kernel the registry no longer has, or a case stored with other parameters than the
    kernel's, is left out. (The report records triton and mamba-ssm, not torch or this package's launchers: a
    launcher change that changes what runs needs a run without ``--reuse``.)"""
    if report.get("gpu") != gpu or report.get("versions") != versions or report.get("problem") != problem:
        return {}
    out = {}
    for kernel, entry in report.get("kernels", {}).items():
        spec = _registry.KERNELS.get(kernel)
        if spec is None:
            continue
        names = params_of(spec)
        for case in entry.get("evidence", []):
            if any(set(r) - {"digest", "error"} != set(names) for r in case["configs"]):
                continue
            rows = case_rows(case, names)
            if any(r.get("error", "").startswith(("skipped", "problem")) for r in rows):
                continue
            out[_case_tag(kernel, case["key"], case["dtype"])] = rows
    return out


def write_module(path, verdicts, meta, arch):
    body = pprint.pformat({k: tuple(v["neutral"]) for k, v in sorted(verdicts.items())}, width=120)
    proven = pprint.pformat({k: v["proven_keys"] for k, v in sorted(verdicts.items()) if v["neutral"]}, width=120)
    text = ('"""Bit-neutral launch-configuration parameters per native kernel (generated by\n``python -m '
            'csrc_bindings.pinned.neutral``; do not edit by hand).\n\n``NEUTRAL[kernel]``: the parameters proven, '
            'on the GPU of ``META``, to leave every output bit unchanged (see\n:mod:`csrc_bindings.pinned.neutral`); '
            'only these may be chosen for speed per shape. A kernel missing here has none.\n"""\n\n'
            f"META = {pprint.pformat(meta, width=120)}\n\n#: the GPU architecture the proof ran on (no speed choice on "
            f"another)\nARCH = {arch!r}\n\nNEUTRAL = {body}\n\n#: per kernel, the key range its cases covered "
            f"(no speed choice outside it)\nPROVEN = {proven}\n")
    Path(path).write_text(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--kernels", default="", help="comma list (default: every tuned kernel)")
    ap.add_argument("--report", default=None, help="write every digest here (JSON)")
    ap.add_argument("--out", default=str(NEUTRAL_PATH), help="the generated module (default: beside this file)")
    ap.add_argument("--reuse", default=None, metavar="REPORT",
                    help="take the cases an earlier --report ran (same GPU, versions and variants) from it")
    ap.add_argument("--list", action="store_true", help="print the cases and variant counts, then exit (no GPU)")
    ap.add_argument("--worker", nargs=3, metavar=("TASKS", "OUT", "DEADLINE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1], float(args.worker[2]))
        return 0
    kernels = [k for k in args.kernels.split(",") if k] or None
    arch = "sm_90" if args.list else _configs.device_arch("cuda")
    todo = [(k, key, dt, variants(_registry.KERNELS[k], base_config(k, key, dt, arch)))
            for k, key, dt in cases(kernels)]
    if args.list:
        for k, key, dt, v in todo:
            print(k, json.dumps(key, sort_keys=True), dt, len(v))
        print(f"{len(todo)} cases, {sum(len(t[3]) for t in todo)} variants")
        return 0
    if not torch.cuda.is_available():
        raise SystemExit(f"python -m {MODULE} needs a CUDA GPU")
    import csrc_bindings as cb
    versions = cb.check_native(conv=False)
    t0 = time.time()
    deadline = t0 + args.budget_s
    by_kernel = {}
    if args.reuse:
        reused = reusable_cases(json.loads(Path(args.reuse).read_text()), versions, torch.cuda.get_device_name(0))
        left = []
        for t in todo:
            rows = reused.get(_case_tag(t[0], t[1], t[2]))
            if rows is not None and [r["config"] for r in rows] == t[3]:
                by_kernel.setdefault(t[0], []).append({"key": t[1], "dtype": t[2], "rows": rows})
            else:
                left.append(t)
        print(f"reused {len(todo) - len(left)} of {len(todo)} cases from {args.reuse}", flush=True)
    else:
        left = todo
    shards = [[] for _ in range(max(1, args.jobs))]
    load = [0] * len(shards)
    for t in sorted(left, key=lambda t: -len(t[3])):
        s = load.index(min(load))
        shards[s].append(t)
        load[s] += len(t[3])
    tmp = Path(tempfile.mkdtemp(prefix="neutral_"))
    procs = []
    for i, shard in enumerate(shards):
        tf, of = tmp / f"tasks{i}.json", tmp / f"out{i}.json"
        tf.write_text(json.dumps(shard))
        procs.append((subprocess.Popen([sys.executable, "-m", MODULE, "--worker", str(tf), str(of), str(deadline)],
                                       cwd=str(PACKAGE_PARENT)), of))
    for proc, of in procs:
        proc.wait()
        if of.exists():
            for kernel, key, dt, rows in json.loads(of.read_text()):
                by_kernel.setdefault(kernel, []).append({"key": key, "dtype": dt, "rows": rows})
    verdicts, report = {}, {"versions": versions, "gpu": torch.cuda.get_device_name(0), "problem": PROBLEM,
                            "kernels": {}}
    expected = {}
    for k, key, dt, _ in todo:
        expected[k] = expected.get(k, 0) + 1
    for kernel in _registry.TUNED_KERNELS:
        got = by_kernel.get(kernel, [])
        if not got:
            continue
        skipped = sum(1 for c in got for r in c["rows"] if r.get("error", "").startswith(("skipped", "problem")))
        if len(got) < expected.get(kernel, 0) or skipped:
            print(f"{kernel}: incomplete evidence ({len(got)} of {expected.get(kernel, 0)} cases, {skipped} "
                  f"configurations skipped): left out of NEUTRAL", flush=True)
            continue
        v = neutral_params(_registry.KERNELS[kernel], [[{**r, "dtype": c["dtype"]} for r in c["rows"]] for c in got])
        v["proven_keys"] = proven_keys([c["key"] for c in got])
        v["cases"] = len(got)
        v["variants_run"] = sum(1 for c in got for r in c["rows"] if "digest" in r)
        v["variants_failed"] = sum(1 for c in got for r in c["rows"] if "error" in r)
        verdicts[kernel] = v
        report["kernels"][kernel] = {**v, "evidence": [compact_case(c) for c in got]}
        print(f"{kernel}: neutral {v['neutral']}, order {v['order']} ({v['cases']} cases, {v['variants_run']} "
              f"variants ran, {v['variants_failed']} did not; one-parameter pairs {v['pairs']}; "
              f"differing {sorted(v['violations'])})", flush=True)
    meta = {"generated_by": f"python -m {MODULE}", "gpu": torch.cuda.get_device_name(0),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "versions": {**versions, "torch": torch.__version__},
            "cases": {k: f"{v['cases']} cases, {v['variants_run']} configurations" for k, v in verdicts.items()},
            "shapes": [f"chunk {c} headdim {p} dstate {n} nheads {h} {','.join(d)}" for c, p, n, h, d in PROOF_SHAPES],
            "problem": PROBLEM}
    write_module(args.out, verdicts, meta, arch)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=0))
    print(f"wrote {args.out} in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
