"""SHA-256 digests of one OrderedMamba2 training step on fixed inputs: the bits a change must not alter by accident.

Each configuration builds a layer from a seed (on the CPU, then moved), moves every parameter away from its
constant initialisation, runs one forward and one backward with a fixed upstream gradient, and hashes the bytes of
the output, the input gradient and every parameter gradient. Only the public API is used (``OrderedMamba2``,
``ordered_ssd.digest.tensor_sha256``), so the digests survive a change of the package's layout.

The committed fixture ``tests/data/layer_digests.json``: the CPU entries were recorded before the first move of the
renovation (this machine kind, one thread); the CUDA entries (the H200 of the GPU gate) were re-recorded for
reduction version 3 (the conv1d backward, 2026-11-30), where only ``conv1d.*.grad``, ``in_proj.*.grad`` and
``u.grad`` changed, after the same digests of the tree before that change matched the previous entries; and again for
the key-space pinned table (table hash 6202d5f865936130, 2026-12-01), whose ``state_passing_bwd`` entry at ``dim``
512 is this layer's key: only the three fp32-parameter configurations changed (``cuda-fp32``: ``A_log``, ``dt_bias``,
``in_proj.weight`` and ``u`` gradients; ``cuda-fp32-autocast-bf16-bias``: ``A_log``, ``dt_bias``;
``cuda-fp32-gated-mlp-bias-no-mem-eff``: ``A_log``, ``in_proj.bias``, ``in_proj.weight``, ``u``; in bf16/fp16 the
fp32 difference rounds away), after the same
digests with the previous table matched the previous entries (the same call, 12 passed). Re-record with
``python -m tests.layer_digests --device cpu|cuda --out FILE`` only when a change is meant to alter bits (and then
bump the reduction version, see docs/native.md).
Reduction version 4 (2026-12-01) changes bits only at ``L == 1``; these configurations have ``L`` = 100.

``tests/data/layer_digests_cpu_models.json`` holds the CPU configurations' digests per CPU model: CI's machines
include CPU models whose MKL gives other matmul bits at the same ISA level (AVX512). The entry of ``GenuineIntel
family 6 model 207`` was recorded on 2026-12-02 by the code of commit e9bf14b and of this one alike (the same
digests from both, in two fresh processes each), after the main fixture's CPU entries failed there at e9bf14b too:
the machine, not the code, had changed. Add a model with ``python -m tests.layer_digests --device cpu
--cpu-model-entry --out tests/data/layer_digests_cpu_models.json``, from a commit whose digests match on a machine
already covered.

Reduction version 6 (2026-12-07) changed every CPU digest (the reference path computes each sequence alone, chunk
by chunk, and folds over sequences); the main fixture's CPU entries were re-recorded on its machine kind
(``AuthenticAMD family 26 model 2``, AVX512, one thread), and the entry of ``GenuineIntel family 6 model 207``,
which no machine of that model could re-record, holds ``"digests": null`` and says why: its tests skip there.
"""
from __future__ import annotations

import argparse
import json
import os
import platform

import torch

from ordered_ssd import OrderedMamba2
from ordered_ssd.digest import tensor_sha256

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "layer_digests.json")

_BASE = dict(d_model=64, d_state=32, d_conv=4, headdim=16, chunk_size=32)
_B, _L = 3, 100  # L not a multiple of chunk_size: a partial last chunk

# name -> (device, dtype, constructor options, with seq_idx, literal mode[, autocast dtype])
CONFIGS = {
    "cpu-fp64": ("cpu", torch.float64, {}, False, False),
    "cpu-fp32": ("cpu", torch.float32, {}, False, False),
    "cpu-fp32-ngroups2-seq_idx": ("cpu", torch.float32, dict(ngroups=2), True, False),
    "cpu-fp64-D_has_hdim-no-rmsnorm-bias": ("cpu", torch.float64, dict(D_has_hdim=True, rmsnorm=False, bias=True),
                                            False, False),
    "cuda-bf16": ("cuda", torch.bfloat16, {}, False, False),
    "cuda-fp16": ("cuda", torch.float16, {}, False, False),
    "cuda-fp32": ("cuda", torch.float32, {}, False, False),
    "cuda-bf16-ngroups2": ("cuda", torch.bfloat16, dict(ngroups=2), False, False),
    "cuda-bf16-D_has_hdim": ("cuda", torch.bfloat16, dict(D_has_hdim=True), False, False),
    "cuda-bf16-no-rmsnorm": ("cuda", torch.bfloat16, dict(rmsnorm=False), False, False),
    "cuda-bf16-seq_idx": ("cuda", torch.bfloat16, {}, True, False),
    "cuda-bf16-no-mem-eff-path": ("cuda", torch.bfloat16, dict(use_mem_eff_path=False), False, False),
    "cuda-fp32-gated-mlp-bias-no-mem-eff": ("cuda", torch.float32, dict(d_ssm=96, bias=True, rmsnorm=False,
                                                                       use_mem_eff_path=False), False, False),
    "cuda-fp16-ngroups2-seq_idx-literal": ("cuda", torch.float16, dict(ngroups=2), True, True),
    # added after the first review (recorded with the pre-renovation code 17f6e85 on the H200 too):
    "cuda-bf16-gated-mlp-mem-eff": ("cuda", torch.bfloat16, dict(d_ssm=96), False, False),
    "cuda-fp32-autocast-bf16-bias": ("cuda", torch.float32, dict(bias=True), False, False, torch.bfloat16),
}

#: Where the digests were recorded; a test on another torch build or CPU capability (or another GPU model) skips:
#: the bits of the reference path's matmuls and of the kernels are fixed per build and device, not across them.
RECORDED_ON = "_recorded_on"
#: CPU digests per CPU model (:func:`cpu_fixture`): ``{model: {"_recorded_on": environment, "digests": {...}}}``
CPU_MODEL_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "layer_digests_cpu_models.json")


def step_digests(name: str) -> dict:
    """``{tensor name: sha256}`` of one training step of configuration ``name`` (see :data:`CONFIGS`)."""
    device, dtype, options, with_seq_idx, literal, *autocast = CONFIGS[name]
    threads = torch.get_num_threads()
    rng = torch.random.get_rng_state()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        layer = OrderedMamba2(**_BASE, **options)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        layer = layer.to(device=device, dtype=dtype)
        layer.literal = literal
        u = torch.randn(_B, _L, _BASE["d_model"], generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
        dout = torch.randn(_B, _L, _BASE["d_model"], generator=gen).to(device=device, dtype=dtype)
        seq_idx = None
        if with_seq_idx:  # example 0: one sequence; 1: two; 2: three (a boundary inside a chunk)
            seq_idx = torch.zeros(_B, _L, dtype=torch.int32)
            seq_idx[1, 40:] = 1
            seq_idx[2, 17:] = 1
            seq_idx[2, 70:] = 2
            seq_idx = seq_idx.to(device)
        with torch.autocast(device, dtype=autocast[0] if autocast else None, enabled=bool(autocast)):
            out = layer(u, seq_idx=seq_idx)
        out.backward(dout.to(out.dtype))
        result = {"out": tensor_sha256(out), "u.grad": tensor_sha256(u.grad)}
        result.update({f"{n}.grad": tensor_sha256(p.grad) for n, p in layer.named_parameters()})
        return result
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)


def cpu_model() -> str:
    """``"GenuineIntel family 6 model 207"``: the CPU model (Linux's ``/proc/cpuinfo``; ``platform.processor()``
    elsewhere). MKL picks its matmul kernels by CPU model, not only by the ISA level torch reports: two machines of
    capability AVX512 gave other bits for the same fp64 step (2026-12-02)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
    except OSError:
        pass
    if {"vendor_id", "cpu family", "model"} <= set(fields):
        return f"{fields['vendor_id']} family {fields['cpu family']} model {fields['model']}"
    return platform.processor() or platform.machine()


def environment(device: str) -> dict:
    """What the recorded bits of ``device`` depend on besides the code: the torch build and the CPU capability,
    or the GPU model. (The CPU model, :func:`cpu_model`, selects among the CPU digests: :func:`cpu_fixture`.)"""
    if device == "cpu":
        return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
            "capability": "sm_%d%d" % torch.cuda.get_device_capability()}


def load_fixture() -> dict:
    """``{config: {tensor: sha256}}`` of the committed fixture (without its :data:`RECORDED_ON` entry)."""
    with open(FIXTURE) as f:
        return {k: v for k, v in json.load(f).items() if k != RECORDED_ON}


def recorded_on(device: str) -> dict:
    """The :func:`environment` the fixture's ``device`` configurations were recorded in."""
    with open(FIXTURE) as f:
        return json.load(f)[RECORDED_ON][device]


def cpu_fixture():
    """``(digests, where)``: the CPU configurations' recorded digests for this machine, or ``(None, why)``.

    :data:`CPU_MODEL_FIXTURES` holds digests per CPU model (:func:`cpu_model`), each with the environment it was
    recorded in; a machine whose model has an entry is compared with it. Any other machine of the main fixture's
    environment (torch build and capability; its CPU model was not recorded) is compared with the main fixture."""
    model = cpu_model()
    if os.path.exists(CPU_MODEL_FIXTURES):
        with open(CPU_MODEL_FIXTURES) as f:
            entry = json.load(f).get(model)
        if entry is not None:
            if entry["digests"] is None:  # a model whose digests of the current bits were not recorded yet
                return None, f"{model}: {entry['why_none']}"
            if entry[RECORDED_ON] != environment("cpu"):
                return None, f"digests of {model} recorded on {entry[RECORDED_ON]}, this is {environment('cpu')}"
            return entry["digests"], f"{model}, {entry[RECORDED_ON]}"
    if environment("cpu") != recorded_on("cpu"):
        return None, f"digests recorded on {recorded_on('cpu')}, this is {environment('cpu')} ({model})"
    return load_fixture(), f"the main fixture, {recorded_on('cpu')}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.layer_digests", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), required=True)
    ap.add_argument("--out", required=True, help="JSON file to write ({config: {tensor: sha256}})")
    ap.add_argument("--cpu-model-entry", action="store_true",
                    help="add (or replace) this CPU model's entry in --out, a file of the form of "
                         "tests/data/layer_digests_cpu_models.json")
    ap.add_argument("--only", default=None, help="comma-separated configuration names (default: all of the device)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else [n for n, cfg in CONFIGS.items() if cfg[0] == args.device]
    res = {name: step_digests(name) for name in names}
    if args.cpu_model_entry:
        if args.device != "cpu":
            ap.error("--cpu-model-entry: expected --device cpu")
        fixtures = {}
        if os.path.exists(args.out):
            with open(args.out) as f:
                fixtures = json.load(f)
        fixtures[cpu_model()] = {RECORDED_ON: environment("cpu"), "digests": res}
        res = fixtures
    else:
        res[RECORDED_ON] = {args.device: environment(args.device)}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print(f"{len(names)} configurations written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
