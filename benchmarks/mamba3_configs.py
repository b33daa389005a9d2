"""Which launch parameters of the Mamba-3 SISO kernels leave every bit unchanged (the proof), which configuration of
each is fastest per key (the timing), and the generated table that the launchers read
(``csrc_bindings/pinned/mamba3_params.py``).

Usage::

    python benchmarks/mamba3_configs.py --prove [--jobs 12] --report proof.json            # on the GPU
    python benchmarks/mamba3_configs.py --time-all [--jobs 15] --report timing.json        # on the GPU
    python benchmarks/mamba3_configs.py --merge proof.json timing.json docs/results/mamba3_configs.json
    python benchmarks/mamba3_configs.py --write docs/results/mamba3_configs.json          # anywhere

**The proof** (the method of :mod:`csrc_bindings.pinned.neutral`, at the layer instead of a synthetic problem): per
case (one shape of :data:`SHAPES`, one kernel of :data:`csrc_bindings.mamba3.MAMBA3_SPECS`), an ``OrderedMamba3``
(bf16, seed 0) runs a training step on ``B`` 2 and ``L`` 4.5 chunks (a partial last chunk) with the kernel launched
at each of upstream's candidate configurations in turn, every other kernel at its pinned one; the SHA-256 of every
tensor argument of the kernel after its launch (its inputs and outputs) is recorded, twice per configuration
(repeatability). The verdict per kernel is :func:`csrc_bindings.pinned.neutral.neutral_params` over the cases:
a parameter is neutral when every two configurations that differ in it alone give the same digest. Cases run in
``--jobs`` worker processes (compilation dominates).

**The pinned table** (``--time-all``): every candidate of each kernel (order parameters too) is compiled first in
``--jobs`` workers (Triton's cache then holds them); then, in one process, per shape of :data:`SHAPES` at its own
``B`` and ``L``, one training step captures each kernel's launch arguments and each candidate relaunches the kernel:
best of 3 trials of 10 launches, CUDA events. Per kernel and autotune key, the candidate with the smallest sum over
the key's shapes of its time relative to the ``mincost-v1`` configuration's becomes the key's pinned configuration
(``ORDER``). It decides bits, as the Mamba-2 kernels' table does: a new table is a new fingerprint.

``--merge`` joins a proof report and a timing report of the same GPU and versions into one (a timing row without
the dtype of its launches gets it from :func:`launch_keys`, which also checks the row's key). ``--write`` turns
that report (``docs/results/mamba3_configs.json``) into ``csrc_bindings/pinned/mamba3_params.py``: ``ORDER``, which
:mod:`csrc_bindings._configs` reads beside the Mamba-2 kernels' table, and the proof's record (``NEUTRAL``,
``PROVEN``, ``META``). The Mamba-3 kernels get no speed choice at launch: a key outside ``ORDER`` takes the
``mincost-v1`` rule's configuration whole.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import pprint
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: name -> (d_model, d_state, headdim, chunk_size, ngroups, B, L): bench's M1-M6 and the check's CUDA default model
SHAPES = {
    "M1": (512, 32, 32, 32, 1, 8, 1024),
    "M2": (1024, 32, 32, 32, 2, 2, 4096),
    "M3": (1024, 64, 64, 64, 1, 4, 2048),
    "M4": (2048, 64, 64, 64, 2, 16, 1024),
    "M5": (1024, 128, 64, 64, 1, 8, 2048),
    "M6": (2048, 128, 64, 64, 2, 1, 4096),
    "check": (512, 64, 64, 128, 1, 8, 512),
}
#: the proof's problem around a shape: 2 examples, 4.5 chunks
PROOF_BATCH, PROOF_CHUNKS = 2, 4.5
OUT_MODULE = ROOT / "csrc_bindings" / "pinned" / "mamba3_params.py"


def _specs():
    from csrc_bindings.mamba3 import MAMBA3_SPECS
    return {s.name: s for s in MAMBA3_SPECS}


def _cfg(cand) -> dict:
    from csrc_bindings.pinned.tune import _cfg_dict
    return _cfg_dict(cand)


@contextlib.contextmanager
def launches(kernel: str, config=None, sink=None):
    """Within the block: ``kernel`` launches at ``config`` (a dict; None: pinned), and each of its launches appends
    ``(spec, grid, args, ref, key)`` to ``sink`` (a list) after it ran. Launch plans are off in the block (a replay
    would launch the configuration of its first call without passing through either hook)."""
    from csrc_bindings import _configs, _native, _plans
    from csrc_bindings._spec import key_of

    orig_cfg, orig_launch = _configs.launch_config, _native.launch

    def launch_config(spec, args, ref, cfg=None):
        if spec.name == kernel and config is not None:
            cfg = config
        return orig_cfg(spec, args, ref, cfg)

    def launch(spec, grid, args, cfg, ref):
        orig_launch(spec, grid, args, cfg, ref)
        if spec.name == kernel and sink is not None:
            sink.append((spec, grid, args, ref, key_of(spec, args)))
    _configs.launch_config, _native.launch = launch_config, launch
    try:
        with _plans.disabled():
            yield
    finally:
        _configs.launch_config, _native.launch = orig_cfg, orig_launch


def build(shape, batch=None, seqlen=None):
    """An ``OrderedMamba3`` (bf16, CUDA, seed 0) of ``shape`` and a step's ``u``, ``dout`` (seed 1)."""
    import torch

    from ordered_ssd.modules.mamba3 import OrderedMamba3

    d_model, d_state, headdim, chunk, ngroups, B, L = shape
    B = B if batch is None else batch
    L = L if seqlen is None else seqlen
    torch.manual_seed(0)
    layer = OrderedMamba3(d_model=d_model, d_state=d_state, headdim=headdim, chunk_size=chunk, ngroups=ngroups,
                          device="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(B, L, d_model, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(B, L, d_model, device="cuda", dtype=torch.bfloat16, generator=g)
    return layer, u, dout


def step(layer, u, dout):
    x = u.detach().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    layer(x).backward(dout)
    return x


def launch_keys(shape_name: str, mode: str = "train", batch: int = 1, seqlen: int = None) -> list:
    """``[(kernel, autotune key, dtype name)]`` of every kernel launch of ``OrderedMamba3``'s CUDA path at
    ``shape_name`` in ``mode`` (``"train"``: the forward storing for a backward, then the backward; ``"no_grad"``;
    ``"prefill"``: the forward returning final states), recorded on the CPU: the composition of
    :mod:`ordered_ssd.ops.mamba3_siso` runs on CPU tensors with every launch replaced by a recorder (nothing is
    computed; the launchers' arguments and reference tensors are what the GPU gets). No GPU needed."""
    from csrc_bindings._configs import dtype_name
    from csrc_bindings._spec import key_of

    seen = []

    def record(spec, grid, args, ref, config=None):
        seen.append((spec.name, key_of(spec, args), dtype_name(ref.dtype)))
    _recorded_with(shape_name, mode, batch, seqlen, record)
    return seen


def launch_programs(shape_name: str) -> dict:
    """``{kernel: programs(config)}``: per kernel of a training step at ``shape_name``'s own ``B`` and ``L`` (recorded
    on the CPU as :func:`launch_keys` records the keys), a function of a configuration dict giving the launch grid's
    size (programs) at that configuration (a grid of the block sizes, such as ``dzdo``'s, depends on it)."""
    grids = {}

    def record(spec, grid, args, ref, config=None):
        grids.setdefault(spec.name, grid)
    _recorded_with(shape_name, "train", SHAPES[shape_name][5], None, record)
    return {k: (lambda cfg, g=g: math.prod(g(cfg) if callable(g) else g)) for k, g in grids.items()}


def _recorded_with(shape_name: str, mode: str, batch: int, seqlen, record) -> None:
    """Run the composition of :mod:`ordered_ssd.ops.mamba3_siso` at ``shape_name`` (``batch``; ``seqlen``, or the
    shape's ``L`` for None) in ``mode`` on CPU tensors, every launch of a kernel replaced by a call
    ``record(spec, grid, args, ref, config)``."""
    import torch

    from csrc_bindings import _plans
    from csrc_bindings.mamba3 import angle_dt, mamba3_siso_bwd, mamba3_siso_fwd
    from ordered_ssd.apps.check.spec import rope_angles
    from ordered_ssd.ops import mamba3_siso as ops

    d_model, n, p, chunk, g, _, L = SHAPES[shape_name]
    L = L if seqlen is None else seqlen
    h, s = 2 * d_model // p, rope_angles(n)
    mods = (angle_dt, mamba3_siso_fwd, mamba3_siso_bwd)
    saved = [m.launch_kernel for m in mods]
    for m in mods:
        m.launch_kernel = record
    # no launch plan may be kept from a recorded call (its launches never reach _native.launch)
    try:
        with _plans.disabled():
            def t(*shape, dtype=torch.bfloat16):
                return torch.zeros(*shape, dtype=dtype)
            f32 = torch.float32
            args = ops.kernel_inputs(t(batch, L, g, n), t(batch, L, g, n), t(batch, L, h, p), t(batch, h, L, dtype=f32),
                                     t(batch, h, L, dtype=f32), t(batch, h, L), t(h, n, dtype=f32), t(h, n, dtype=f32),
                                     t(batch, L, h, s, dtype=f32), t(h, dtype=f32), t(batch, L, h, p))
            res = ops.ordered_mamba3_siso_fwd(*args, chunk_size=chunk, store_for_backward=mode == "train",
                                              return_final_states=mode == "prefill")
            if mode == "train":
                Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z = args
                ops._bwd_partials(t(batch, L, h, p), Q, K, V, DT, Trap, Q_bias, K_bias, Angles, D, Z, res, chunk)
    finally:
        for m, f in zip(mods, saved):
            m.launch_kernel = f


def _arg_digest(spec, args) -> str:
    import torch

    from csrc_bindings.pinned.neutral import _digest
    return _digest([args[n] for n in spec.arg_names if isinstance(args.get(n), torch.Tensor)])


def run_case(shape_name: str, kernel: str) -> list:
    """Rows ``{"config", "digest" | "error"}`` of one proof case: the kernel's candidates, each run twice."""
    spec = _specs()[kernel]
    shape = SHAPES[shape_name]
    layer, u, dout = build(shape, PROOF_BATCH, int(PROOF_CHUNKS * shape[3]))
    rows = []
    for cand in spec.candidates:
        cfg = _cfg(cand)
        try:
            digests = []
            for _ in range(2):
                sink = []
                with launches(kernel, cfg, sink):
                    step(layer, u, dout)
                digests.append("+".join(_arg_digest(s, a) for s, _, a, _, _ in sink))
            row = {"config": cfg, "digest": digests[0]} if digests[0] == digests[1] else \
                {"config": cfg, "error": f"not repeatable: {digests[0]} then {digests[1]}"}
        except Exception as exc:  # noqa: BLE001 - a configuration that does not compile or fit is left out
            row = {"config": cfg, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        rows.append(row)
    sink = []
    with launches(kernel, None, sink):
        step(layer, u, dout)
    key = sink[0][4]
    return [{"shape": shape_name, "kernel": kernel, "key": key, "rows": rows}]


def warm_case(shape_name: str, kernel: str) -> list:
    """Compile every candidate configuration of ``kernel`` at ``shape_name``'s own ``L`` (two examples): Triton's
    cache then holds what the timing launches. ``[]`` (nothing to report)."""
    shape = SHAPES[shape_name]
    layer, u, dout = build(shape, 2, shape[6])
    for cand in _specs()[kernel].candidates:
        try:
            with launches(kernel, _cfg(cand)):
                step(layer, u, dout)
        except Exception:  # noqa: BLE001 - does not fit: the timing records it
            pass
    return []


def _worker(tasks_file: str, out_file: str, mode: str = "prove") -> None:
    out = []
    for shape_name, kernel in json.loads(Path(tasks_file).read_text()):
        out += (run_case if mode == "prove" else warm_case)(shape_name, kernel)
        Path(out_file).write_text(json.dumps(out))


def prove(shapes, jobs: int, mode: str = "prove", kernels=None) -> list:
    tasks = [(s, k) for s in shapes for k in _specs() if kernels is None or k in kernels]
    # the heaviest kernels first, spread round-robin over the workers
    heavy = {"mamba3_siso_fwd": 0, "mamba3_siso_bwd_dqkv": 1, "mamba3_siso_bwd_rotary_bias_angles": 2}
    tasks.sort(key=lambda t: heavy.get(t[1], 9))
    groups = [tasks[i::jobs] for i in range(jobs)]
    cases, procs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, group in enumerate(g for g in groups if g):
            tf, of = Path(tmp, f"t{i}.json"), Path(tmp, f"o{i}.json")
            tf.write_text(json.dumps(group))
            procs.append((subprocess.Popen([sys.executable, __file__, "--worker", str(tf), str(of), mode]), of))
        for p, of in procs:
            rc = p.wait()
            got = json.loads(of.read_text()) if of.exists() else []
            if rc:
                print(f"worker exited {rc} after {len(got)} cases", file=sys.stderr)
            cases += got
    return cases


def verdicts(cases) -> dict:
    from csrc_bindings.pinned.neutral import neutral_params, proven_keys
    out = {}
    specs = _specs()
    for kernel, spec in specs.items():
        mine = [c for c in cases if c["kernel"] == kernel]
        if not mine:
            continue
        v = neutral_params(spec, [c["rows"] for c in mine])
        v["proven_keys"] = proven_keys([c["key"] for c in mine])
        v["cases"] = len(mine)
        v["errors"] = sum(1 for c in mine for r in c["rows"] if "error" in r)
        out[kernel] = v
    return out


def _time_launch(spec, grid, args, ref, cfg) -> float:
    """ms per launch of ``spec`` at ``cfg`` on the captured arguments, after one untimed launch (the tuner's
    :func:`csrc_bindings.pinned.tune._time`: best of 3 trials of 10)."""
    import torch

    from csrc_bindings._configs import config_from_dict
    from csrc_bindings._native import launch
    from csrc_bindings.mamba3._runtime import allocator
    from csrc_bindings.pinned.tune import _time

    kc = config_from_dict(spec, cfg, "explicit")
    with allocator():
        launch(spec, grid, args, kc, ref)
        torch.cuda.synchronize()
        return _time(lambda: launch(spec, grid, args, kc, ref))


def time_shapes(shapes, kernels=None) -> list:
    """Per (shape, kernel): every candidate's time (ms per launch) and the ``mincost-v1`` configuration's."""
    import torch

    from csrc_bindings._configs import device_arch, dtype_name, order_of
    rows = []
    for name in shapes:
        layer, u, dout = build(SHAPES[name])
        for kernel, spec in _specs().items():
            if kernels is not None and kernel not in kernels:
                continue
            sink = []
            with launches(kernel, None, sink):
                step(layer, u, dout)
            s, grid, args, ref, key = sink[0]
            base = order_of(spec, key, ref.dtype, device_arch(ref.device))
            base_cfg = base.as_dict()
            times = []
            for cand in spec.candidates:
                cfg = _cfg(cand)
                try:
                    times.append({"config": cfg, "ms": _time_launch(s, grid, args, ref, cfg)})
                except Exception as exc:  # noqa: BLE001
                    times.append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            rows.append({"shape": name, "kernel": kernel, "key": key, "dtype": dtype_name(ref.dtype),
                         "pinned": base_cfg, "times": times})
            print(f"{name} {kernel}: pinned "
                  f"{next((t['ms'] for t in times if t['config'] == base_cfg), float('nan')):.4f} ms, best "
                  f"{min((t['ms'] for t in times if 'ms' in t), default=float('nan')):.4f} ms", flush=True)
        del layer, u, dout
        torch.cuda.empty_cache()
    return rows


#: the forward kernels' boolean key values that the layer's modes differ in (training, no-grad, prefill): every
#: combination takes the training forward's entry, so that a forward gives the same bits in every mode
SAME_ENTRY = {"mamba3_siso_fwd": ("STORE_SSM_STATES_ADT_OUTV", "RETURN_FINAL_STATES"),
              "mamba3_angle_dt_fwd": ("RETURN_OUTPUT_STATE",)}


def _with_modes(entries: dict) -> dict:
    """``entries`` plus, for the kernels of :data:`SAME_ENTRY`, the same entry at every combination of those keys."""
    import itertools
    out = dict(entries)
    for tk, cfg in entries.items():
        prefix, key = tk.rsplit("/", 1)
        names = SAME_ENTRY.get(prefix.split("/")[2], ())
        for values in itertools.product((True, False), repeat=len(names)):
            parts = []
            for part in key.split(","):
                n, v = part.split("=")
                parts.append(f"{n}={values[names.index(n)]}" if n in names else part)
            out.setdefault(f"{prefix}/{','.join(parts)}", cfg)
    return dict(sorted(out.items()))


def fastest_entries(timing: list, arch: str) -> dict:
    """``{table key: parameter values}``: per kernel and key (at the dtype its launches use, the row's ``dtype``),
    the fastest by the summed relative time (among the configurations timed at every shape of the key)."""
    import torch

    from csrc_bindings._configs import table_key_of
    specs = _specs()
    by_key = {}
    for r in timing:
        spec = specs[r["kernel"]]
        tk = table_key_of(spec, arch, getattr(torch, r["dtype"]), r["key"])
        base_ms = next((t["ms"] for t in r["times"] if t["config"] == r["pinned"] and "ms" in t), None)
        if base_ms is None:
            continue
        for t in r["times"]:
            if "ms" in t:
                by_key.setdefault(tk, {}).setdefault(json.dumps(t["config"], sort_keys=True), []).append(
                    t["ms"] / base_ms)
    return {tk: best for tk, (best, _, _) in _fastest(by_key).items()}


def _fastest(by_key: dict) -> dict:
    """``{table key: (configuration, summed relative time, shapes)}`` from ``{table key: {configuration JSON:
    [relative time per shape]}}``: the smallest sum among the configurations timed at every shape of the key
    (ties: the first in JSON order)."""
    out = {}
    for tk, cands in sorted(by_key.items()):
        n = max(len(v) for v in cands.values())
        full = {c: sum(v) for c, v in cands.items() if len(v) == n}
        best = min(full, key=lambda c: (full[c], c))
        out[tk] = (json.loads(best), full[best], n)
    return out


#: the smallest gain (summed relative time) for which :func:`few_program_entries` keeps an entry: timing noise of the
#: best of 3 trials is about 1%, and an entry that gains less is not worth a second configuration
FEW_PROGRAMS_MIN_GAIN = 0.03


def few_program_entries(timing: list, arch: str, order: dict, neutral: dict, sms: int) -> dict:
    """``{table key: bit-neutral parameter values}`` for launches whose grid has at most ``sms`` programs (rule
    ``few-programs-v1``, :func:`csrc_bindings._configs.few_programs_config`): per kernel and key, over the timing
    rows of the shapes where the kernel launches that few programs at the entry and at the candidate
    (:func:`launch_programs`), the candidate with the order parameters of the key's ``order`` entry and the smallest
    summed time relative to that entry's; kept only where it differs from the entry in a parameter of ``neutral``
    (the kernel's bit-neutral ones) and gains at least :data:`FEW_PROGRAMS_MIN_GAIN`."""
    import torch

    from csrc_bindings._configs import table_key_of
    specs, programs, by_key = _specs(), {}, {}
    for r in timing:
        kernel, names = r["kernel"], set(neutral.get(r["kernel"], ()))
        if not names:
            continue
        if r["shape"] not in programs:
            programs[r["shape"]] = launch_programs(r["shape"])
        tk = table_key_of(specs[kernel], arch, getattr(torch, r["dtype"]), r["key"])
        entry, count = order.get(tk), programs[r["shape"]][kernel]
        if entry is None or count(entry) > sms:
            continue
        base_ms = next((t["ms"] for t in r["times"] if t["config"] == entry and "ms" in t), None)
        if base_ms is None:
            continue
        for t in r["times"]:  # the entry's order parameters, and as few programs at the candidate too
            if ("ms" in t and all(t["config"][n] == v for n, v in entry.items() if n not in names)
                    and count(t["config"]) <= sms):
                by_key.setdefault(tk, {}).setdefault(json.dumps(t["config"], sort_keys=True), []).append(
                    t["ms"] / base_ms)
    out = {}
    for tk, (best, total, n) in _fastest(by_key).items():
        names = neutral[tk.split("/")[2]]
        if total <= n * (1 - FEW_PROGRAMS_MIN_GAIN) and any(best[k] != order[tk][k] for k in names):
            out[tk] = {k: best[k] for k in names}
    return out


def write_module(report: dict, path: Path = OUT_MODULE) -> None:
    v = report["verdicts"]
    neutral = {k: tuple(x["neutral"]) for k, x in sorted(v.items()) if x["neutral"]}
    proven = {k: x["proven_keys"] for k, x in sorted(v.items()) if x["neutral"]}
    order = _with_modes(fastest_entries(report["timing_all"], report["arch"])) if report.get("timing_all") else {}
    if report.get("timing_all") and "sms" not in report:
        raise ValueError("report: expected 'sms' (the timing GPU's SM count, which FEW_PROGRAMS needs), got none")
    # the timed (training) keys only: the proof covered those; a no-grad or prefill forward keeps its ORDER entry
    few = (few_program_entries(report["timing_all"], report["arch"], order, neutral, report["sms"])
           if report.get("timing_all") else {})
    meta = {k: report[k] for k in ("date", "gpu", "versions", "generated_by")}
    meta["cases"] = {k: f"{x['cases']} cases" for k, x in sorted(v.items())}
    meta["shapes"] = {n: "d_model,d_state,headdim,chunk_size,ngroups,B,L = " + ",".join(map(str, SHAPES[n]))
                      for n in report["shapes"]}
    meta["timing"] = "best of 3 trials x 10 launches, CUDA events, at each shape's own B and L"
    meta["sms"] = report.get("sms")
    text = ('"""The Mamba-3 SISO kernels\' pinned launch configurations and the proof of their bit-neutral '
            'parameters\n(generated by '
            '``python benchmarks/mamba3_configs.py --write REPORT``; do not edit by hand).\n\n'
            '``ORDER``: per table key, the pinned configuration (every parameter, the order ones included: they decide '
            'bits),\nthe fastest of upstream\'s candidates timed at the shapes of ``META`` (the forward kernels\' '
            'entries repeated\nfor the no-grad and prefill keys, so a forward has the same order parameters in every '
            'mode); a key without an\nentry takes the ``mincost-v1`` rule\'s configuration whole: '
            ':mod:`csrc_bindings._configs` reads ``ORDER`` beside the\nMamba-2 kernels\' table. ``NEUTRAL`` and '
            '``PROVEN`` record the proof (the parameters that left every output bit\nunchanged on the GPU of '
            '``META``, and the key range it covered). ``FEW_PROGRAMS``: per table key, the values of the\n'
            'kernel\'s bit-neutral parameters for a launch of at most as many programs as the GPU has SMs (rule\n'
            '``few-programs-v1``, :func:`csrc_bindings._configs.few_programs_config`, which reads ``NEUTRAL`` and '
            '``PROVEN``\ntoo): the fastest with the entry\'s order parameters at the timed shapes whose launch is '
            f'that small\n(``META["sms"]`` programs or fewer), where it gains at least {FEW_PROGRAMS_MIN_GAIN:.0%}; it '
            'never changes a bit.\nTraining keys only (the ones the proof covered): a no-grad or prefill forward keeps '
            'its ``ORDER`` entry.\n'
            '"""\n\n'
            f"META = {pprint.pformat(meta, width=116)}\n\n#: the GPU architecture the proof and the timing ran on"
            f"\nARCH = {report['arch']!r}\n\nORDER = {pprint.pformat(order, width=116)}\n\n"
            f"FEW_PROGRAMS = {pprint.pformat(few, width=116)}\n\n"
            f"NEUTRAL = {pprint.pformat(neutral, width=116)}\n\n"
            f"PROVEN = {pprint.pformat(proven, width=116)}\n")
    path.write_text(text)


def merge(proof: dict, timing: dict) -> dict:
    """One report of a proof report (``verdicts``, ``cases``) and a timing report (``timing_all``) of the same GPU,
    arch and versions; each timing row gets the dtype its kernel launches with (:func:`launch_keys` at the row's
    shape) where it has none, and must have the key recorded there. Raises ValueError otherwise."""
    for k in ("gpu", "arch", "versions"):
        if proof.get(k) != timing.get(k):
            raise ValueError(f"--merge: expected the same {k} in both reports, got {proof.get(k)!r} and "
                             f"{timing.get(k)!r}")
    launched = {}
    for row in timing["timing_all"]:
        if row["shape"] not in launched:
            launched[row["shape"]] = {k: (key, dt) for k, key, dt in launch_keys(row["shape"])}
        key, dt = launched[row["shape"]][row["kernel"]]
        if key != row["key"] or row.setdefault("dtype", dt) != dt:
            raise ValueError(f"--merge: {row['shape']} {row['kernel']}: the timing ran key {row['key']} "
                             f"{row.get('dtype')}, the launchers launch {key} {dt}")
    out = dict(proof)
    for k in ("sms", "timing_all", "warm_s", "time_all_s"):
        if k in timing:
            out[k] = timing[k]
    out["generated_by"] = f"{proof['generated_by']} --prove; {timing['generated_by']} --time-all; --merge"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prove", action="store_true")
    p.add_argument("--jobs", type=int, default=12)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--report", help="write the report JSON here")
    p.add_argument("--write", metavar="REPORT", help="generate csrc_bindings/pinned/mamba3_params.py from REPORT")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--time-all", action="store_true",
                   help="time every candidate (order parameters too), after compiling them in --jobs workers")
    p.add_argument("--kernels", default=None, help="comma-separated kernels (default: all seven)")
    p.add_argument("--merge", nargs=3, metavar=("PROOF", "TIMING", "OUT"),
                   help="join a proof report and a --time-all report into OUT (no GPU needed)")
    a = p.parse_args(argv)
    if a.worker:
        _worker(*a.worker)
        return 0
    if a.merge:
        proof, timing = (json.loads(Path(f).read_text()) for f in a.merge[:2])
        Path(a.merge[2]).write_text(json.dumps(merge(proof, timing), separators=(",", ":")))
        print(f"wrote {a.merge[2]}")
        return 0
    if a.write:
        write_module(json.loads(Path(a.write).read_text()))
        print(f"wrote {OUT_MODULE}")
        return 0
    import torch

    import mamba_ssm
    import triton

    from csrc_bindings._configs import device_arch
    shapes = [s for s in a.shapes.split(",") if s]
    report = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
              "arch": device_arch(torch.device("cuda")),
              "sms": torch.cuda.get_device_properties(0).multi_processor_count, "shapes": shapes,
              "versions": {"mamba_ssm": mamba_ssm.__version__, "torch": torch.__version__,
                           "triton": triton.__version__},
              "generated_by": "python benchmarks/mamba3_configs.py"}
    t0 = time.time()
    if a.prove:
        report["cases"] = prove(shapes, a.jobs)
        report["verdicts"] = verdicts(report["cases"])
        report["prove_s"] = round(time.time() - t0, 1)
        for k, v in report["verdicts"].items():
            print(f"{k}: neutral {v['neutral']} order {v['order']} ({v['cases']} cases, {v['errors']} errors, "
                  f"violations {list(v['violations'])})", flush=True)
    kernels = None if a.kernels is None else a.kernels.split(",")
    if a.time_all:
        t1 = time.time()
        prove(shapes, a.jobs, mode="warm", kernels=kernels)
        report["warm_s"] = round(time.time() - t1, 1)
        t1 = time.time()
        report["timing_all"] = time_shapes(shapes, kernels=kernels)
        report["time_all_s"] = round(time.time() - t1, 1)
    if a.report:
        Path(a.report).write_text(json.dumps(report, indent=1))
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
