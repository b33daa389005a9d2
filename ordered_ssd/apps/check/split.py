"""``ordered-ssd check --split-invariance``: the same global batch trained with several splits ``(R, m)`` (``R``
ranks, ``m`` accumulation steps of ``b`` examples each) must give the same bits.

Every split is a run of ``R`` processes under torchrun (``R = 1`` included, so every run is launched alike, with
the same intra-op thread count) training with the one loop of :mod:`.train`: rank ``r`` trains blocks
``[r*m, (r+1)*m)`` of every step's global batch, one forward and backward per block, without a DDP wrapper; the
library's :class:`~ordered_ssd.accumulate.TreeGradAccumulator` takes every block's gradients and writes the pairwise
tree sum over all ``R*m`` blocks in global order, divided by ``R*m``. One split is also stopped at step ``k`` and
resumed from its checkpoint in fresh processes (the replay). The records are compared with
:func:`.report.compare_runs` against the first split.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ..files import atomic_write_json
from ..lm import ByteData
from .errors import CheckError, plural, writing
from .launch import Launcher, child_threads
from .memory import n_params as count_params
from .outdir import RUNS
from .report import (_model_summary, _print_table, check_command, compare_runs, describe_comparison,
                     diverged_verdict, first_nonfinite, load_record, val_loss_texts, write_report)
from .run import prepared_run, thread_lines
from .spec import layer_name

#: The splits ``(R, m)`` checked by default, per device type (CUDA: one GPU per rank, so 2 GPUs).
DEFAULT_SPLITS = {"cpu": [(1, 4), (2, 2), (4, 1)], "cuda": [(1, 2), (2, 1)]}
ACCUMULATE = ("tree", "sequential")


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def parse_splits(text: str) -> List[Tuple[int, int]]:
    """argparse type of ``--splits``: ``R1xM1,R2xM2,...`` -> ``[(R1, M1), ...]``; R and M powers of two, the same
    product ``R*M`` for every split, no split twice (a single split is refused later unless ``--fsdp`` adds the
    DDP run to compare with: :func:`run_split_check`)."""
    splits = []
    for part in text.split(","):
        r, sep, m = part.strip().lower().partition("x")
        try:
            split = (int(r), int(m))
        except ValueError:
            split = None
        if not sep or split is None:
            raise argparse.ArgumentTypeError(f"expected splits RxM separated by commas (e.g. 1x4,2x2,4x1), got "
                                             f"{part.strip()!r}")
        if not (_power_of_two(split[0]) and _power_of_two(split[1])):
            raise argparse.ArgumentTypeError(f"split {part.strip()}: the ranks R and the accumulation steps M must "
                                             f"be powers of two (1, 2, 4, ...)")
        splits.append(split)
    if len(set(splits)) != len(splits):
        raise argparse.ArgumentTypeError(f"expected different splits, got {text!r}")
    if len({r * m for r, m in splits}) != 1:
        raise argparse.ArgumentTypeError(f"every split must have the same number of blocks R*M (the block size "
                                         f"is fixed), got {', '.join(label(s) for s in splits)}")
    return splits


def parse_rank_list(text: str) -> List[int]:
    """argparse type of ``--restart-ranks``: ``R1,R2,...`` -> ``[R1, R2, ...]``, powers of two, none twice."""
    ranks = []
    for part in text.split(","):
        try:
            r = int(part.strip())
        except ValueError:
            r = 0
        if not _power_of_two(r):
            raise argparse.ArgumentTypeError(f"expected numbers of ranks that are powers of two separated by commas "
                                             f"(e.g. 2,8), got {part.strip()!r}")
        ranks.append(r)
    if len(set(ranks)) != len(ranks):
        raise argparse.ArgumentTypeError(f"expected every number of ranks once, got {text!r}")
    return ranks


def label(split: Tuple[int, int]) -> str:
    return f"{split[0]}x{split[1]}"


def check_splits(spec: dict, splits: List[Tuple[int, int]]) -> int:
    """The block size ``b = batch / (R*m)``; CheckError (one line) if the batch does not split into ``R*m`` blocks,
    a split has too many ranks for the GPUs, or the device is a numbered GPU."""
    blocks = splits[0][0] * splits[0][1]
    if spec["batch"] % blocks:
        raise CheckError(f"--batch: the global batch {spec['batch']} does not split into R*M = {blocks} blocks of "
                         f"equal size (the splits {', '.join(label(s) for s in splits)})")
    device = torch.device(spec["device"])
    if device.type == "cuda":
        if device.index is not None:
            raise CheckError(f"--device: with --split-invariance give cuda, not {spec['device']} (rank r uses "
                             f"cuda:r)")
        most = max(r for r, _ in splits)
        if most > torch.cuda.device_count():
            raise CheckError(f"--splits: split {label(max(splits))} needs {plural(most, 'GPU')} (one per rank), "
                             f"{torch.cuda.device_count()} visible; choose splits with fewer ranks with --splits")
    return spec["batch"] // blocks


def replay_split(splits: List[Tuple[int, int]]) -> Tuple[int, int]:
    """The split stopped and resumed: the first with several ranks and several accumulation steps, else the one with
    the most ranks."""
    both = [s for s in splits if s[0] > 1 and s[1] > 1]
    return both[0] if both else max(splits)


def _first_difference(comparisons: dict) -> Optional[dict]:
    """The earliest step (then the first split in order) where a run differs from the reference."""
    found = []
    for name, cmp in comparisons.items():
        if cmp["identical"]:
            continue
        cands = []
        if cmp["first_loss_diff"] is not None:
            cands.append((cmp["first_loss_diff"], 0, "loss", []))
        for i, key in ((1, "first_grad_diff"), (2, "first_param_diff")):
            if cmp.get(key):
                cands.append((cmp[key]["step"], i, "gradient" if i == 1 else "parameter", cmp[key]["params"]))
        if not cands:
            cands.append((cmp["steps_compared"], 3, "final parameters or validation loss"
                          if cmp["same_length"] else "number of steps", []))
        step, _, what, tensors = min(cands, key=lambda c: c[:2])
        found.append({"run": name, "step": step, "what": what, "tensors": tensors})
    return min(found, key=lambda f: f["step"]) if found else None


def check_restart_ranks(spec: dict, splits: List[Tuple[int, int]], restart_ranks: Optional[List[int]]) -> List[int]:
    """The numbers of ranks to resume the replayed split on; CheckError (one line) for one that does not divide
    the number of blocks or exceeds the GPUs."""
    ranks = list(restart_ranks or [])
    blocks = splits[0][0] * splits[0][1]
    for r in ranks:
        if not _power_of_two(r) or blocks % r:
            raise CheckError(f"--restart-ranks: expected numbers of ranks dividing the {plural(blocks, 'block')} of "
                             f"the splits {', '.join(label(s) for s in splits)}, got {r}")
        if torch.device(spec["device"]).type == "cuda" and r > torch.cuda.device_count():
            raise CheckError(f"--restart-ranks: {plural(r, 'rank')} {'needs' if r == 1 else 'need'} "
                             f"{plural(r, 'GPU')} (one per rank), {torch.cuda.device_count()} visible")
    return ranks


def run_split_check(spec: dict, out_dir: str, *, splits: Optional[List[Tuple[int, int]]], stop_at: int,
                    accumulate: str = "tree", progress: bool = True, print_fn: Callable = print, fsdp: bool = False,
                    restart_ranks: Optional[List[int]] = None, kill_rank: bool = False) -> int:
    """Train ``spec`` with every split, and replay one split from a checkpoint; print the table and the verdict;
    write ``report.json`` and ``loss.png`` under ``out_dir``. Returns 0 (``SPLIT-INVARIANT``) or 1.

    ``fsdp``: every split shards the model with FSDP2 (the library's ordered reduce-scatter and
    :class:`~ordered_ssd.fsdp.FSDPTreeAccumulator`), and a DDP-free tree run of the first split is added
    (``ddp-RxM``). ``restart_ranks``: the replayed split's checkpoint is also resumed on each of these numbers of
    ranks (``restart-RxM``). ``kill_rank``: the replayed split is also run under torchrun with one restart and a
    checkpoint after every step, its last rank killed with SIGKILL in the middle of step ``stop_at`` (``kill``).
    Every run must equal the first split bit for bit.

    Raises:
        CheckError: bad splits, restart ranks or ``stop_at``, a batch that does not split, too few GPUs,
            unwritable output, or a failed run (one line; nothing written before the arguments are checked).
    """
    device_type = torch.device(spec["device"]).type
    splits = list(splits or DEFAULT_SPLITS[device_type])
    if accumulate not in ACCUMULATE:
        raise CheckError(f"--accumulate: expected one of {', '.join(ACCUMULATE)}, got {accumulate!r}")
    if len(splits) < 2 and not fsdp:
        raise CheckError(f"--splits: expected at least two different splits (one is enough with --fsdp, which adds "
                         f"the DDP run of the same split), got {', '.join(label(s) for s in splits)}")
    block = check_splits(spec, splits)
    ranks = check_restart_ranks(spec, splits, restart_ranks)
    processes = max([r for r, _ in splits] + ranks)  # ranks training at once, each on blocks of `block` rows
    with prepared_run(spec, out_dir, stop_at, rows=block, processes=processes) as run:
        return _run_split_check(spec, run.out_dir, run.data, run.source, splits=splits, block=block,
                                stop_at=stop_at, accumulate=accumulate, progress=progress, print_fn=print_fn,
                                fsdp=fsdp, restart_ranks=ranks, kill_rank=kill_rank, notes=run.notes)


def _run_split_check(spec: dict, out_dir: str, data: ByteData, source: str, *, splits: List[Tuple[int, int]],
                     block: int, stop_at: int, accumulate: str, progress: bool, print_fn: Callable,
                     fsdp: bool = False, restart_ranks: Sequence[int] = (), kill_rank: bool = False,
                     notes: Sequence[str] = ()) -> int:
    """:func:`run_split_check` in its locked output directory, on the data already read; ``notes``: lines printed
    after the data's."""
    spec = dict(spec, data_sha256=data.sha256)
    # every rank of every split with the same count (the CPU's bits depend on it): --threads or its CPU default
    # (spec["threads"]); on CUDA OMP_NUM_THREADS or the usable cores split between the most ranks
    most = max(r for r, _ in splits)
    threads = spec.get("threads") or int(os.environ.get("OMP_NUM_THREADS") or child_threads(most))
    runs_dir = os.path.join(out_dir, RUNS)
    n_params = count_params(spec)
    print_fn(f"ordered-ssd check --split-invariance: {n_params / 1e6:.2f}M-parameter byte-level "
             f"{layer_name(spec['model'])} LM "
             f"({plural(spec['model']['n_layers'], 'layer')}, d_model {spec['model']['d_model']}) on "
             f"{spec['device']}, {plural(spec['steps'], 'step')} of global batch {spec['batch']} x {spec['seq_len']} "
             f"bytes in blocks of {block}; "
             f"splits (ranks x accumulation steps) {', '.join(label(s) for s in splits)}; {accumulate} "
             f"accumulation{'; FSDP2 (fully_shard)' if fsdp else ''}; {plural(threads, 'thread')} per rank")
    print_fn(f"data: {source}: {data.n_bytes} bytes, sha256 {data.sha256[:16]}")
    for line in list(notes) + thread_lines(spec.get("threads"), most)[1:]:  # the count is in the first line
        print_fn(line)
    launch = Launcher(runs_dir, progress, None, threads=threads)
    replay = replay_split(splits)
    ckpt = os.path.join(runs_dir, f"checkpoints-{label(replay)}")
    parallel = "fsdp" if fsdp else "ddp"

    def split_spec(name: str, split: Tuple[int, int], how: str) -> str:
        path = os.path.join(runs_dir, f"spec-{name}.json")
        with writing("spec", path):
            atomic_write_json(path, dict(spec, nproc=split[0], split={
                "ranks": split[0], "accum": split[1], "block": block, "accumulate": accumulate, "parallel": how}))
        return path

    t0 = time.perf_counter()
    runs, spec_paths = {}, {}
    for split in splits:
        name = label(split)
        spec_paths[name] = split_spec(name, split, parallel)
        launch(spec_paths[name], name, name, [], nproc=split[0])
        runs[name] = load_record(launch.record(name))
    if fsdp:  # the same global batch without FSDP: the DDP-free tree accumulation must give the same bits
        name = f"ddp-{label(splits[0])}"
        launch(split_spec(name, splits[0], "ddp"), name, name, [], nproc=splits[0][0])
        runs[name] = load_record(launch.record(name))
    name = label(replay)
    launch(spec_paths[name], f"{name}-replay1", f"{name}:1", ["--stop-at", str(stop_at), "--ckpt", ckpt],
           nproc=replay[0])
    launch(spec_paths[name], f"{name}-replay2", f"{name}:2", ["--resume", ckpt], nproc=replay[0])
    runs["replay"] = load_record(launch.record(f"{name}-replay2"))  # holds the steps before the restart too
    runs["replay"]["label"] = "replay"
    blocks = replay[0] * replay[1]
    for ranks in restart_ranks:
        split = (ranks, blocks // ranks)
        name = f"restart-{label(split)}"
        launch(split_spec(name, split, parallel), name, name, ["--resume", ckpt], nproc=ranks)
        runs[name] = load_record(launch.record(name))
    if kill_rank:
        kill_ckpt = os.path.join(runs_dir, "checkpoints-kill")
        launch(spec_paths[label(replay)], "kill", "kill",
               ["--ckpt", kill_ckpt, "--ckpt-every", "1", "--resume", kill_ckpt, "--resume-if-any",
                "--kill-at", str(stop_at)], nproc=replay[0], max_restarts=1)
        runs["kill"] = load_record(launch.record("kill"))
    wall = time.perf_counter() - t0
    return 0 if split_report(runs, spec, out_dir, splits=splits, replay=replay, block=block, accumulate=accumulate,
                             threads=threads, source=source, n_params=n_params, stop_at=stop_at, wall=wall,
                             print_fn=print_fn, fsdp=fsdp, restart_ranks=list(restart_ranks),
                             kill_rank=kill_rank) else 1


def _describe_run(lab: str, replay: Tuple[int, int], stop_at: int, rec: dict) -> str:
    resumed = ", ".join(str(s) for s in rec.get("restarts") or []) or "none"
    if lab == "replay":
        return f"replay (split {label(replay)} stopped at {stop_at}, resumed)"
    if lab.startswith("restart-"):
        r, m = lab[len("restart-"):].split("x")
        return (f"{lab} (split {label(replay)} stopped at {stop_at}, resumed on {_ranks_x_steps(int(r), int(m))})")
    if lab == "kill":
        return (f"kill (split {label(replay)}, last rank killed in step {stop_at}, torchrun restart resumed from "
                f"step {resumed})")
    if lab.startswith("ddp-"):
        r, m = lab[len("ddp-"):].split("x")
        return f"{lab} ({_ranks_x_steps(int(r), int(m))} without FSDP)"
    r, m = lab.split("x")
    return f"{lab} ({_ranks_x_steps(int(r), int(m))})"


def _ranks_x_steps(ranks: int, accum: int) -> str:
    """``"2 ranks x 1 accumulation step"``."""
    return f"{plural(ranks, 'rank')} x {plural(accum, 'accumulation step')}"


def split_report(runs: dict, spec: dict, out_dir: str, *, splits, replay, block: int, accumulate: str, threads: int,
                 source: str, n_params: int, stop_at: int, wall: float, print_fn: Callable = print,
                 fsdp: bool = False, restart_ranks: Sequence[int] = (), kill_rank: bool = False) -> bool:
    """Compare every run with the first split; print the table, the comparisons and the verdict; write
    ``loss.png`` and ``report.json``. Returns whether every run equals the reference bit for bit."""
    ref = label(splits[0])
    comparisons = {f"{lab}_vs_{ref}": compare_runs(runs[ref], rec) for lab, rec in runs.items() if lab != ref}
    ranks_agree = all(rec.get("ranks_agree", True) for rec in runs.values())
    # the resumed runs must really have resumed: the replay and restarts at stop_at, the killed run from the last
    # complete checkpoint (a step <= stop_at)
    resumed = {lab: rec.get("restarts") for lab, rec in runs.items()
               if lab == "replay" or lab.startswith("restart-") or lab == "kill"}
    not_resumed = sorted(lab for lab, r in resumed.items()
                         if not r or (lab != "kill" and r != [stop_at]) or (lab == "kill" and r[0] > stop_at))
    invariant = all(c["identical"] for c in comparisons.values()) and ranks_agree and not not_resumed
    diverged = first_nonfinite(runs, list(runs))
    ok = invariant and diverged is None
    first = _first_difference(comparisons)
    _print_table(runs, stop_at, print_fn)
    for key, cmp in comparisons.items():
        lab = key.split("_vs_")[0]
        print_fn(f"{_describe_run(lab, replay, stop_at, runs[lab])} vs {ref}: {describe_comparison(cmp)}")
    if not_resumed:
        print_fn(f"resumed: NO: {'run' if len(not_resumed) == 1 else 'runs'} {', '.join(not_resumed)} did not "
                 f"resume from the expected checkpoint "
                 f"(restarts: {', '.join(f'{lab} {resumed[lab]}' for lab in not_resumed)})")
    if not ranks_agree:
        print_fn("ranks agree: NO: " + ", ".join(f"run {lab} ranks {rec['ranks_disagreeing']}"
                                                  for lab, rec in runs.items() if not rec.get("ranks_agree", True)))
    val = val_loss_texts(runs)
    for lab, rec in runs.items():
        per_rank = ", ".join(f"{1000 * t:.1f}" for t in rec.get("rank_s_per_step", []))
        print_fn(f"  run {lab:>8}: {1000 * rec['s_per_step']:.1f} ms/step (per rank: {per_rank}), val loss {val[lab]}")
    n_steps = len(runs[ref]["steps"])
    verdict = "SPLIT-INVARIANT" if invariant else "NOT SPLIT-INVARIANT"
    if diverged is not None:
        verdict = diverged_verdict(diverged)
        print_fn(f"verdict: {verdict}: the loss of run {diverged['run']} is {diverged['loss']} (not finite): the "
                 f"training diverged (--lr {spec.get('lr')}); the runs are "
                 f"{'identical' if invariant else 'different'}")
    elif ok:
        extra = "".join([f", DDP ({label(splits[0])})" if fsdp else "",
                         f", the restarts on {', '.join(map(str, restart_ranks))} "
                         f"{'rank' if list(restart_ranks) == [1] else 'ranks'}" if restart_ranks else "",
                         ", the killed-rank run" if kill_rank else ""])
        print_fn(f"verdict: {verdict}: {plural(n_steps, 'step')}, loss, per-parameter gradient and parameter "
                 f"digests after every step identical across the splits {', '.join(label(s) for s in splits)}"
                 f"{' (FSDP2)' if fsdp else ''}{extra} and the replay of {label(replay)} (restart at step "
                 f"{stop_at}), every rank agreeing")
    elif first is not None:
        shown = ", ".join(first["tensors"][:3]) + (", ..." if len(first["tensors"]) > 3 else "")
        more = f" ({shown})" if shown else ""
        print_fn(f"verdict: {verdict}: first difference at step {first['step']}: {first['what']}{more} of run "
                 f"{first['run'].split('_vs_')[0]} differs from {ref}")
    elif not_resumed:
        print_fn(f"verdict: {verdict}: {'run' if len(not_resumed) == 1 else 'runs'} {', '.join(not_resumed)} did not "
                 f"resume from the expected checkpoint")
    else:
        print_fn(f"verdict: {verdict}: the ranks of a run disagree")
    summary = {
        "verdict": verdict, "ok": ok, "split_invariant": invariant, "diverged": diverged, "mode": "split-invariance",
        "spec": spec, "data_source": source, "model": _model_summary(spec),
        "n_params": n_params, "stop_at": stop_at, "wall_s": wall, "threads": threads, "block": block,
        "accumulate": accumulate, "splits": [{"label": label(s), "ranks": s[0], "accum": s[1]} for s in splits],
        "reference": ref, "replay": {"split": label(replay), "stop_at": stop_at}, "ranks_agree": ranks_agree,
        "fsdp": fsdp, "restart_ranks": list(restart_ranks), "kill_rank": kill_rank, "resumed": resumed,
        "first_difference": first, "comparisons": comparisons,
        "fingerprints": {lab: rec["fingerprint"] for lab, rec in runs.items()},
        "fingerprint_info": runs[ref]["fingerprint_info"],
        "runs": {lab: {"s_per_step": rec["s_per_step"], "val_loss": rec["val_loss"], "final": rec["final"],
                       "losses": [s["loss"] for s in rec["steps"]], "world_size": rec.get("world_size"),
                       "rank_s_per_step": rec.get("rank_s_per_step"), "ranks_agree": rec.get("ranks_agree"),
                       "threads": (rec.get("fingerprint_info") or {}).get("threads"),
                       "restarts": rec.get("restarts"),
                       "ranks_disagreeing": rec.get("ranks_disagreeing")} for lab, rec in runs.items()},
        "per_step": [{k: s[k] for k in ("step", "loss", "grads", "params") if k in s} for s in runs[ref]["steps"]]}
    for rec in runs.values():
        rec.setdefault("mixer", spec["mixer"])
    write_report(out_dir, summary, runs, print_fn, command=check_command(spec, "--split-invariance"))
    return ok
