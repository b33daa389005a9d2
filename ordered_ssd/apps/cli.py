"""Command line: ``ordered-ssd {check, bench, env}`` (also ``python -m ordered_ssd``); ``_train`` is one training
run, started by ``check`` in fresh processes."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import torch

from .._version import __version__
from .errors import EXIT_OK, AppError, OneLineParser, run_reporting
from .files import positive_float, positive_int
from .lm import DataError


#: the commands a user runs, as the usage and the unknown-command error name them (``_train``, one training run of
#: ``check`` in a fresh process, is internal)
COMMANDS = ("check", "env", "bench")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``ordered-ssd`` (``bench`` takes its own arguments: see :func:`main`)."""
    parser = OneLineParser(prog="ordered-ssd", description="Bitwise-reproducible Mamba-2 training.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")

    check = sub.add_parser("check",
                           help="train a byte-level Mamba-2 LM on real text and prove the run is reproducible",
                           description="Train the same model three times (this process; a fresh process; a fresh "
                                       "process stopped at step k and resumed from its checkpoint) and compare the "
                                       "loss, gradient and parameter bits. Exit 0 only if all three agree.")
    check.add_argument("--device", default="auto",
                       help="cpu, cuda, cuda:N or auto (default: auto, cuda if torch sees a GPU, which then needs "
                            "the native extras, else cpu)")
    check.add_argument("--data", default=None,
                       help="text file or directory to train on (default: the Python standard library's sources)")
    check.add_argument("--data-bytes", type=positive_int, default=None,
                       help="read at most this many bytes" + _per_device("data_bytes"))
    check.add_argument("--out", default="ordered-ssd-check", help="output directory (default: ./ordered-ssd-check)")
    check.add_argument("--steps", type=positive_int, default=None, help="training steps" + _per_device("steps"))
    check.add_argument("--stop-at", type=positive_int, default=None,
                       help="step k of the restart run (default: steps/2)")
    check.add_argument("--batch", type=positive_int, default=None,
                       help="sequences per step, the global batch" + _per_device("batch"))
    check.add_argument("--seq-len", type=positive_int, default=None, help="bytes per sequence" + _per_device("seq_len"))
    check.add_argument("--val-windows", type=positive_int, default=None,
                       help="validate each run on at most this many windows of the held-out split, spread evenly "
                            "over it (default: 256)")
    check.add_argument("--d-model", type=positive_int, default=None, help="model width" + _per_device("d_model"))
    check.add_argument("--n-layers", type=positive_int, default=None, help="Mamba blocks" + _per_device("n_layers"))
    check.add_argument("--d-state", type=positive_int, default=None, help="SSM state size" + _per_device("d_state"))
    check.add_argument("--headdim", type=positive_int, default=None,
                       help="head dimension, a divisor of 2 * d_model" + _per_device("headdim"))
    check.add_argument("--ngroups", type=positive_int, default=1,
                       help="B/C groups, a divisor of the heads (default: 1)")
    check.add_argument("--chunk-size", type=positive_int, default=None,
                       help="SSD chunk length" + _per_device("chunk_size"))
    check.add_argument("--layer", choices=("mamba2", "mamba3"), default="mamba2",
                       help="the mixer of every block: mamba2 (OrderedMamba2) or mamba3 (OrderedMamba3, Mamba-3 "
                            "single-input single-output; --d-state at least 4, and on CUDA --d-state, --headdim and "
                            "--chunk-size powers of two >= 16) (default: mamba2)")
    check.add_argument("--lr", type=positive_float, default=None, help="AdamW learning rate" + _per_device("lr"))
    check.add_argument("--seed", type=int, default=0, help="seed of the initialisation and the batches (default: 0)")
    check.add_argument("--hf-config", default=None, metavar="PATH",
                       help="check a Hugging Face transformers causal LM instead of the byte-level LM: a config.json "
                            "(built with random weights seeded by --seed) or a model folder (loaded from its weights "
                            "if it has any); its Mamba-2 mixers are converted with convert_to_ordered; the vocabulary "
                            "must hold the 256 bytes (needs ordered-ssd[hf]; see docs/check.md; default: off)")
    check.add_argument("--native", action="store_true",
                       help="also train twice with mamba-ssm's Mamba2 (Mamba3 with --layer mamba3; GPU only) as a "
                            "control (default: off)")
    check.add_argument("--nproc", type=positive_int, default=None,
                       help="data-parallel: launch every run through torchrun with N processes (gloo on the CPU, nccl "
                            "with one GPU per rank), DistributedDataParallel with the ordered gradient hook; rank r "
                            "trains on rows [r*B/N, (r+1)*B/N) of the global batch (see docs/distributed.md; "
                            "default: one process, no torchrun)")
    check.add_argument("--split-invariance", action="store_true",
                       help="instead of a, b, c: train the same global batch (--batch) with every split (R ranks x M "
                            "accumulation steps of --batch/(R*M) examples; default off) under torchrun, replay one "
                            "split from a checkpoint, and require the same loss, gradient and parameter bits after "
                            "every step (see docs/check.md); exit 0 SPLIT-INVARIANT, 1 NOT SPLIT-INVARIANT")
    check.add_argument("--splits", type=_splits, default=None, metavar="R1xM1,R2xM2,...",
                       help="the splits of --split-invariance, powers of two with the same R*M (default: 1x4,2x2,4x1 "
                            "on the CPU, 1x2,2x1 on CUDA with one GPU per rank)")
    check.add_argument("--accumulate", choices=("tree", "sequential"), default=None,
                       help="--split-invariance's gradient accumulation: tree (default), the library's pairwise tree "
                            "over the blocks in global order; sequential, a control: left to right per rank, then "
                            "the rank-ordered mean (expected NOT SPLIT-INVARIANT)")
    check.add_argument("--fsdp", action="store_true",
                       help="--split-invariance with FSDP2 (fully_shard, the library's ordered reduce-scatter and "
                            "FSDPTreeAccumulator); adds a DDP run of the first split, which must give the same bits "
                            "(see docs/distributed.md; default: DDP-free tree accumulation)")
    check.add_argument("--restart-ranks", type=_rank_list, default=None, metavar="R1,R2,...",
                       help="--split-invariance: also resume the replayed split's checkpoint on each of these numbers "
                            "of ranks (powers of two dividing the number of blocks), which must continue with the "
                            "uninterrupted bits (default: none)")
    check.add_argument("--kill-rank", action="store_true",
                       help="--split-invariance: also run the replayed split under torchrun with one restart, "
                            "checkpointing every step, with its last rank killed (SIGKILL) in the middle of step "
                            "--stop-at; the restarted job resumes from the last complete checkpoint and must end with "
                            "the uninterrupted bits (default: off)")
    check.add_argument("--threads", type=positive_int, default=None,
                       help="intra-op CPU threads of every training process (torch.set_num_threads); the CPU's bits "
                            "depend on it, so every run of the check, fresh processes and ranks included, uses the "
                            "same (default on the CPU: OMP_NUM_THREADS if set, else 1, which does not slow down "
                            "when other processes take the cores; on CUDA: torch's own)")
    check.add_argument("--quiet", action="store_true", help="no progress bars (default: progress bars on stderr)")

    sub.add_parser("env", help="print versions, the GPU and the determinism fingerprint")
    # `ordered-ssd bench ARGS` is dispatched to ordered_ssd.apps.bench before this parser runs (see main); the
    # subparser is here for the command list and `ordered-ssd --help`.
    bench = sub.add_parser("bench", add_help=False,
                           help="time and measure one layer: native Mamba2, upstream deterministic mode, "
                                "OrderedMamba2 and its literal mode; with --layer mamba3 native Mamba3, "
                                "OrderedMamba3 and its literal mode (GPU; `ordered-ssd bench --help`)")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")

    train = sub.add_parser("_train")  # one training run, used by `check` in fresh processes; no help: not listed
    train.add_argument("--spec", required=True)
    train.add_argument("--record", required=True)
    train.add_argument("--label", required=True)
    train.add_argument("--stop-at", type=int, default=None)
    train.add_argument("--ckpt", default=None)
    train.add_argument("--resume", default=None)
    train.add_argument("--allow-fingerprint-mismatch", action="store_true")
    train.add_argument("--ckpt-every", type=int, default=None)
    train.add_argument("--resume-if-any", action="store_true")
    train.add_argument("--kill-at", type=int, default=None)
    train.add_argument("--quiet", action="store_true")
    train.add_argument("--precompile", default=None)  # I/K: a precompile worker's one step (check/precompile.py)
    return parser


def _per_device(key: str) -> str:
    """`` (default: <cpu> on the CPU, <cuda> on CUDA)``: the per-device default of a ``check`` option."""
    from .check.spec import DEFAULTS

    return f" (default: {DEFAULTS['cpu'][key]} on the CPU, {DEFAULTS['cuda'][key]} on CUDA)"


def _rank_list(text: str):
    from .check.split import parse_rank_list

    return parse_rank_list(text)


def _splits(text: str):
    from .check.split import parse_splits

    return parse_splits(text)


def _out_of_memory(command):
    """``command()``, with running out of memory (``MemoryError``, ``torch.OutOfMemoryError``, the CPU allocator's
    ``RuntimeError``) as one :class:`AppError` line: the estimate that let the run start (docs/check.md, Memory) was
    too low for this machine at this moment."""
    try:
        return command()
    except (MemoryError, torch.OutOfMemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not isinstance(e, torch.OutOfMemoryError) and \
                "can't allocate memory" not in str(e):
            raise
        from .check.errors import first_line

        raise AppError(f"memory: expected the training to fit (it was estimated to, see the memory line and "
                       f"docs/check.md, Memory), got {type(e).__name__}: {first_line(e)[:300]}") from None


def _cmd_check(args) -> int:
    return _out_of_memory(lambda: _check(args))


def _check(args) -> int:
    from .check import run_check
    from .check.spec import spec_from_args

    if not args.split_invariance:
        for flag, value in (("--splits", args.splits), ("--accumulate", args.accumulate),
                            ("--restart-ranks", args.restart_ranks), ("--fsdp", args.fsdp or None),
                            ("--kill-rank", args.kill_rank or None)):
            if value is not None:
                raise DataError(f"{flag}: only with --split-invariance")
    elif args.hf_config is not None:
        raise DataError("--split-invariance: not with --hf-config (the split-invariance check trains the byte-level "
                        "LM)")
    elif args.nproc is not None or args.native:
        raise DataError(f"--split-invariance: not with {'--nproc' if args.nproc is not None else '--native'} (the "
                        f"splits choose the number of processes; the control is --accumulate sequential)")
    spec = spec_from_args(args)
    stop_at = args.stop_at if args.stop_at is not None else max(1, spec["steps"] // 2)
    if args.split_invariance:
        from .check.split import run_split_check

        return run_split_check(spec, args.out, splits=args.splits, stop_at=stop_at,
                               accumulate=args.accumulate or "tree", progress=not args.quiet, fsdp=args.fsdp,
                               restart_ranks=args.restart_ranks, kill_rank=args.kill_rank)
    return run_check(spec, args.out, stop_at=stop_at, native=args.native, progress=not args.quiet,
                     nproc=args.nproc)


def _cmd_train(args) -> int:
    """One run of a spec: in this process, or as one rank of a data-parallel run (the spec has ``nproc``)."""
    return _out_of_memory(lambda: _train(args))


def _train(args) -> int:
    from .check import train_run
    from .check.errors import first_line

    try:
        with open(args.spec) as fh:
            spec = json.load(fh)
    except OSError as e:
        raise AppError(f"--spec: expected a readable spec file, got {args.spec}: {e.strerror or e}") from None
    except ValueError as e:
        raise AppError(f"--spec: expected the JSON spec of a check, got {args.spec}, which does not parse: "
                       f"{first_line(e)}") from None
    if not isinstance(spec, dict):
        raise AppError(f"--spec: expected the JSON object of a check's spec, got a {type(spec).__name__} in "
                       f"{args.spec}")
    if args.precompile is not None:
        from .check.precompile import parse_slice, warm_step

        try:
            index, count = parse_slice(args.precompile)
        except ValueError as e:
            raise AppError(str(e)) from None
        warm_step(spec, index, count)
        return EXIT_OK
    train_run(spec, args.record, label=args.label, stop_at=args.stop_at, ckpt_path=args.ckpt, resume=args.resume,
              allow_fingerprint_mismatch=args.allow_fingerprint_mismatch, progress=not args.quiet,
              ckpt_every=args.ckpt_every, resume_if_any=args.resume_if_any, kill_at=args.kill_at)
    return EXIT_OK


def _cmd_env(args) -> int:
    from ..fingerprint import determinism_fingerprint, fingerprint_string, package_versions

    for package, version in package_versions().items():
        print(f"{package:>14}: {version if version is not None else 'not installed'}")
    if torch.cuda.is_available():
        device = torch.device("cuda")
        print(f"{'gpu':>14}: {torch.cuda.get_device_name(0)} (sm_%d%d)" % torch.cuda.get_device_capability(0))
    else:
        device = torch.device("cpu")
        print(f"{'gpu':>14}: none")
    if device.type == "cuda":
        from ..modules import cuda_path_available

        ok, why = cuda_path_available()
        print(f"{'cuda path':>14}: {'available' if ok else 'unavailable: ' + why}")
    info = determinism_fingerprint(device)
    print(f"{'fingerprint':>14}: {fingerprint_string(info)}")
    for field, value in info.items():
        print(f"{'':>16}{field} = {value}")
    return EXIT_OK


def _cmd_bench(rest: List[str]) -> int:
    """``ordered-ssd bench [args]``: the benchmark suite (:mod:`ordered_ssd.apps.bench`); prints its table. Without a
    CUDA device or the native extras it exits 2 with one line naming what is missing and the install command."""
    from .bench import main as bench_main

    return bench_main(rest, prog="ordered-ssd bench")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``ordered-ssd``: the exit status (0 success, 1 ``check`` found a difference or stdout was
    closed early, e.g. ``ordered-ssd env | head -1``, 2 usage or data error with one line on stderr, 130
    interrupted)."""
    try:
        try:
            return _main(argv)
        finally:  # also after argparse's SystemExit (--help, --version): a closed pipe shows up at the flush
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader of stdout has gone (``| head -1``): no traceback. As the ``signal`` module's documentation
        # recommends ("Note on SIGPIPE"), point stdout at devnull so that the interpreter's final flush does not
        # raise again, and exit 1.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: Optional[List[str]]) -> int:
    """:func:`main` without the closed-pipe handling."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":  # its own parser: REMAINDER would not take options such as --shapes
        return _cmd_bench(argv[1:])
    parser = build_parser()
    commands = {"check": _cmd_check, "_train": _cmd_train, "env": _cmd_env,
                "bench": lambda parsed: _cmd_bench(list(parsed.rest))}
    if argv and not argv[0].startswith("-") and argv[0] not in commands:  # argparse's message would list _train
        parser.error(f"command: expected {', '.join(COMMANDS[:-1])} or {COMMANDS[-1]}, got {argv[0]!r}")
    args = parser.parse_args(argv)
    return run_reporting(f"ordered-ssd {args.command}", lambda: commands[args.command](args),
                         errors=(DataError, AppError))
