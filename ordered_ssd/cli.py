"""Command line: ``ordered-ssd {check, bench, env}`` (also ``python -m ordered_ssd``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import torch

from ._files import positive_int
from .lm import DataError

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2

# Defaults per device: CPU finishes in about a minute; CUDA trains a larger model for longer.
DEFAULTS = {
    "cpu": dict(d_model=64, n_layers=2, d_state=16, headdim=16, chunk_size=32, steps=40, batch=4, seq_len=128,
                lr=3e-3, data_bytes=2_000_000),
    "cuda": dict(d_model=512, n_layers=8, d_state=64, headdim=64, chunk_size=128, steps=200, batch=8, seq_len=512,
                 lr=1e-3, data_bytes=16_000_000),
}


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ordered-ssd", description="Bitwise-reproducible Mamba-2 training.")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="train a byte-level Mamba-2 LM on real text and prove the run is reproducible",
                       description="Train the same model three times (this process; a fresh process; a fresh "
                                   "process stopped at step k and resumed from its checkpoint) and compare the "
                                   "loss, gradient and parameter bits. Exit 0 only if all three agree.")
    c.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: cuda if available)")
    c.add_argument("--data", default=None,
                   help="text file or directory to train on (default: the Python standard library's sources)")
    c.add_argument("--data-bytes", type=positive_int, default=None, help="read at most this many bytes")
    c.add_argument("--out", default="ordered-ssd-check", help="output directory (default: ./ordered-ssd-check)")
    c.add_argument("--steps", type=positive_int, default=None)
    c.add_argument("--stop-at", type=positive_int, default=None, help="step k of the restart run (default steps/2)")
    c.add_argument("--batch", type=positive_int, default=None)
    c.add_argument("--seq-len", type=positive_int, default=None)
    c.add_argument("--d-model", type=positive_int, default=None)
    c.add_argument("--n-layers", type=positive_int, default=None)
    c.add_argument("--d-state", type=positive_int, default=None)
    c.add_argument("--headdim", type=positive_int, default=None)
    c.add_argument("--ngroups", type=positive_int, default=1)
    c.add_argument("--chunk-size", type=positive_int, default=None)
    c.add_argument("--lr", type=float, default=None)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--native", action="store_true",
                   help="also train twice with mamba-ssm's Mamba2 (GPU only) as a control")
    c.add_argument("--nproc", type=positive_int, default=None,
                   help="data-parallel: launch every run through torchrun with N processes (gloo on the CPU, nccl "
                        "with one GPU per rank), DistributedDataParallel with the ordered gradient hook; rank r "
                        "trains on rows [r*B/N, (r+1)*B/N) of the global batch (see docs/distributed.md)")
    c.add_argument("--quiet", action="store_true", help="no progress bars")

    sub.add_parser("env", help="print versions, the GPU and the determinism fingerprint")
    # `ordered-ssd bench ARGS` is dispatched to ordered_ssd.bench before this parser runs (see main); the
    # subparser is here for the command list and `ordered-ssd --help`.
    b = sub.add_parser("bench", add_help=False,
                       help="time and measure one layer: native Mamba2, upstream deterministic mode, OrderedMamba2 "
                            "and its literal mode (GPU; `ordered-ssd bench --help`)")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")

    t = sub.add_parser("_train", help=argparse.SUPPRESS)  # one training run, used by `check` in fresh processes
    t.add_argument("--spec", required=True)
    t.add_argument("--record", required=True)
    t.add_argument("--label", required=True)
    t.add_argument("--stop-at", type=int, default=None)
    t.add_argument("--ckpt", default=None)
    t.add_argument("--resume", default=None)
    t.add_argument("--allow-fingerprint-mismatch", action="store_true")
    t.add_argument("--quiet", action="store_true")
    return p


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DataError(f"--device: expected cpu, cuda, cuda:N or auto, got {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DataError(f"--device: {name} requested but no CUDA device is available")
    if dev.type not in ("cpu", "cuda"):
        raise DataError(f"--device: expected cpu or cuda, got {name!r}")
    return dev


def _spec_from_args(args) -> dict:
    device = _resolve_device(args.device)
    d = DEFAULTS[device.type]
    pick = lambda v, k: d[k] if v is None else v  # noqa: E731
    model = dict(d_model=pick(args.d_model, "d_model"), n_layers=pick(args.n_layers, "n_layers"),
                 d_state=pick(args.d_state, "d_state"), headdim=pick(args.headdim, "headdim"),
                 ngroups=args.ngroups, chunk_size=pick(args.chunk_size, "chunk_size"), expand=2)
    if (2 * model["d_model"]) % model["headdim"]:
        raise DataError(f"--headdim: expected a divisor of 2 * d_model = {2 * model['d_model']}, got {model['headdim']}")
    if ((2 * model["d_model"]) // model["headdim"]) % model["ngroups"]:
        raise DataError(f"--ngroups: expected a divisor of the number of heads "
                        f"{(2 * model['d_model']) // model['headdim']}, got {model['ngroups']}")
    if args.data is not None and not os.path.exists(args.data):
        raise DataError(f"--data: no such file or directory: {args.data}")
    if args.native and device.type != "cuda":
        raise DataError("--native: the native Mamba2 control needs a CUDA device (and mamba-ssm)")
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        batch = pick(args.batch, "batch")
        if batch % nproc:
            raise DataError(f"--batch: the global batch {batch} is not divisible by --nproc {nproc} "
                            f"(rank r takes rows [r*B/N, (r+1)*B/N) of every step's batch)")
        if device.type == "cuda" and args.device not in ("auto", "cuda"):
            raise DataError(f"--device: with --nproc give cuda (rank r uses cuda:r), not {args.device}")
        if device.type == "cuda" and nproc > torch.cuda.device_count():
            raise DataError(f"--nproc: {nproc} processes need {nproc} GPUs (one per rank), "
                            f"{torch.cuda.device_count()} visible")
    return {"device": str(device), "mixer": "ordered", "model": model, "seed": args.seed,
            "steps": pick(args.steps, "steps"), "batch": pick(args.batch, "batch"),
            "seq_len": pick(args.seq_len, "seq_len"), "lr": pick(args.lr, "lr"), "weight_decay": 0.1, "clip": 1.0,
            "data": None if args.data is None else os.path.abspath(args.data),
            "data_bytes": pick(args.data_bytes, "data_bytes")}


def _cmd_check(args) -> int:
    from .check import run_check

    spec = _spec_from_args(args)
    stop_at = args.stop_at if args.stop_at is not None else max(1, spec["steps"] // 2)
    return run_check(spec, args.out, stop_at=stop_at, native=args.native, progress=not args.quiet,
                     nproc=args.nproc)


def _cmd_train(args) -> int:
    from .check import train_run

    with open(args.spec) as fh:
        spec = json.load(fh)
    if spec.get("nproc") is not None:  # one rank of a data-parallel run, started by torchrun
        from .check import train_run_ddp

        train_run_ddp(spec, args.record, label=args.label, stop_at=args.stop_at, ckpt_path=args.ckpt,
                      resume=args.resume, allow_fingerprint_mismatch=args.allow_fingerprint_mismatch,
                      progress=not args.quiet)
        return EXIT_OK
    train_run(spec, args.record, label=args.label, stop_at=args.stop_at, ckpt_path=args.ckpt, resume=args.resume,
              allow_fingerprint_mismatch=args.allow_fingerprint_mismatch, progress=not args.quiet)
    return EXIT_OK


def _cmd_env(args) -> int:
    from .fingerprint import determinism_fingerprint, fingerprint_string, package_versions

    for k, v in package_versions().items():
        print(f"{k:>14}: {v if v is not None else 'not installed'}")
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        print(f"{'gpu':>14}: {torch.cuda.get_device_name(0)} (sm_%d%d)" % torch.cuda.get_device_capability(0))
    else:
        dev = torch.device("cpu")
        print(f"{'gpu':>14}: none")
    if dev.type == "cuda":
        from .mamba2 import native_path_available

        ok, why = native_path_available()
        print(f"{'native path':>14}: {'available' if ok else 'unavailable: ' + why}")
    info = determinism_fingerprint(dev)
    print(f"{'fingerprint':>14}: {fingerprint_string(info)}")
    for k, v in info.items():
        print(f"{'':>16}{k} = {v}")
    return EXIT_OK


def _cmd_bench(rest: List[str]) -> int:
    """``ordered-ssd bench [args]``: the benchmark suite (:mod:`ordered_ssd.bench`); prints its table. Without a
    CUDA device or the native extras it exits 2 with one line naming what is missing and the install command."""
    from .bench import main as bench_main

    return bench_main(rest, prog="ordered-ssd bench")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":  # its own parser: REMAINDER would not take options such as --shapes
        return _cmd_bench(argv[1:])
    parser = _build_parser()
    args = parser.parse_args(argv)
    from .check import CheckError

    try:
        if args.command == "check":
            return _cmd_check(args)
        if args.command == "_train":
            return _cmd_train(args)
        if args.command == "env":
            return _cmd_env(args)
        if args.command == "bench":
            return _cmd_bench(list(args.rest))
    except (DataError, CheckError) as e:
        # one write, so that the lines of concurrent ranks (under torchrun) do not interleave
        sys.stderr.write(f"ordered-ssd {args.command}: error: {e}\n")
        sys.stderr.flush()
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"ordered-ssd {args.command}: interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE
