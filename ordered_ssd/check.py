"""``ordered-ssd check``: train a byte-level Mamba-2 LM on real text and prove the run is reproducible.

Runs (each a full training of the same spec):

* ``a``  in this process;
* ``b``  in a fresh process;
* ``c``  in a fresh process stopped after step ``k`` (checkpoint written atomically), then resumed from the
  checkpoint in another fresh process;
* with ``--native``: ``native-1`` and ``native-2``, the same model with mamba-ssm's ``Mamba2`` in two fresh
  processes (a control showing whether the native layer diverges).

Compared, bit for bit: the loss of every step, the SHA-256 of every parameter's gradient at every step, and
the SHA-256 of every final parameter. The verdict is ``REPRODUCIBLE`` only if ``a``, ``b`` and ``c`` agree on
all of them.
"""
from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import torch
import torch.distributed as dist

from ._files import atomic_savefig, atomic_torch_save, atomic_write_json
from .digest import tensor_sha256
from .fingerprint import determinism_fingerprint, fingerprint_diff, fingerprint_string
from .lm import ByteData, ByteLM, ModelConfig, load_corpus, lm_loss

CKPT_FORMAT = 1
DDP_CKPT_FORMAT = 2  # one file for a data-parallel run: every rank's RNG state, the world size


class CheckError(RuntimeError):
    """A user-facing failure of the check (one-line message, nonzero exit)."""


# ----------------------------------------------------------------------------------------------- files
def prepare_out_dir(path: str) -> str:
    """Create ``path`` if needed and check it is writable; raise CheckError otherwise."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CheckError(f"--out: output directory {path} is not writable: {e.strerror or e}") from None
    return os.path.abspath(path)


# ----------------------------------------------------------------------------------------------- progress
class Progress:
    """A one-line progress display on stderr (redrawn in place on a terminal, every 10% otherwise)."""

    def __init__(self, label: str, total: int, start: int = 0, enabled: bool = True):
        self.label, self.total, self.enabled = label, total, enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.start = start
        self.last_pct = -1

    def update(self, step: int, loss: float) -> None:
        if not self.enabled:
            return
        done = step + 1
        pct = int(100 * done / max(self.total, 1))
        rate = (done - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        width = 24
        bar = "#" * int(width * done / max(self.total, 1))
        line = f"[{self.label:>8}] |{bar:<{width}}| {done}/{self.total} loss {loss:.4f} {rate:.1f} step/s"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if done == self.total else ""))
            sys.stderr.flush()
        elif pct // 10 != self.last_pct // 10 or done == self.total:
            sys.stderr.write(line + "\n")
        self.last_pct = pct


# ----------------------------------------------------------------------------------------------- training
def _mixer_class(kind: str):
    if kind == "ordered":
        from .mamba2 import OrderedMamba2

        return OrderedMamba2
    if kind == "native":
        try:
            from mamba_ssm.modules.mamba2 import Mamba2
        except ImportError as e:
            raise CheckError(f"--native needs mamba-ssm ({e}); install it with: pip install ordered-ssd[cuda]") from None
        return Mamba2
    raise ValueError(f"mixer: expected 'ordered' or 'native', got {kind!r}")


def _build(spec: dict, device: torch.device):
    torch.manual_seed(spec["seed"])
    model = ByteLM(ModelConfig(**spec["model"]), _mixer_class(spec["mixer"]), device=device)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if getattr(p, "_no_weight_decay", False) or p.dim() < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec["lr"], betas=(0.9, 0.95), eps=1e-8, foreach=False)
    return model, opt


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.random.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.random.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _check_resume_fingerprint(ckpt: dict, resume: str, fp: str, fp_info: dict, allow: bool, holder: str) -> None:
    """Stop (CheckError naming the differing fields) if the checkpoint's fingerprint is not ``fp``, unless
    ``allow``."""
    if ckpt["fingerprint"] != fp and not allow:
        diff = fingerprint_diff(json.loads(ckpt["fingerprint_info"]), fp_info)
        raise CheckError(f"checkpoint {resume} was written with determinism fingerprint {ckpt['fingerprint']}, "
                         f"{holder} {fp} (differs in: {diff}); resuming would not replay the run bit for bit. "
                         f"Pass --allow-fingerprint-mismatch to resume anyway.")


def _val_loss(model, data: ByteData, batch: int, device: torch.device) -> str:
    """Mean validation loss per byte over every validation window, in order, as ``float.hex``."""
    with torch.no_grad():
        total, count = 0.0, 0
        for xv, yv in data.val_batches(batch):
            total += float(lm_loss(model(xv.to(device)), yv.to(device))) * xv.numel()
            count += xv.numel()
    return (total / max(count, 1)).hex()


def train_run(spec: dict, record_path: str, *, label: str, stop_at: Optional[int] = None,
              ckpt_path: Optional[str] = None, resume: Optional[str] = None, allow_fingerprint_mismatch: bool = False,
              progress: bool = True) -> dict:
    """Train according to ``spec``; write (atomically) and return the run record.

    The record has ``steps`` (per step: the loss as ``float.hex`` and the SHA-256 of every parameter's
    gradient), ``final`` (SHA-256 of every parameter at the end, if the run reached the last step),
    ``val_loss``, timings and the fingerprint.
    """
    device = torch.device(spec["device"])
    corpus, _ = load_corpus(spec["data"], spec["data_bytes"])
    data = ByteData(corpus, spec["seq_len"])
    if data.sha256 != spec["data_sha256"]:
        raise CheckError(f"the data read by run {label} differs from the data of the parent run")
    native = spec["mixer"] == "native"
    fp_info = determinism_fingerprint(device)
    fp = fingerprint_string(fp_info)
    model, opt = _build(spec, device)
    start = 0
    if resume is not None:
        ckpt = torch.load(resume, map_location="cpu", weights_only=True)  # RNG states must stay on the CPU
        if ckpt.get("format") == DDP_CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume} was written by a {ckpt.get('world_size')}-process run "
                             f"(--nproc {ckpt.get('world_size')}); resume it under torchrun with that many processes")
        if ckpt.get("format") != CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume}: unsupported format {ckpt.get('format')!r} (expected {CKPT_FORMAT})")
        _check_resume_fingerprint(ckpt, resume, fp, fp_info, allow_fingerprint_mismatch, "this machine has")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        _set_rng_state(ckpt["rng"], device)
        start = int(ckpt["data_position"])
    names = [n for n, _ in model.named_parameters()]
    steps: List[dict] = []
    bar = Progress(label, spec["steps"], start, enabled=progress)
    end = spec["steps"] if stop_at is None else min(stop_at, spec["steps"])
    t0 = time.perf_counter()
    for step in range(start, end):
        x, y = data.batch(spec["seed"], step, spec["batch"])
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        grads = {n: tensor_sha256(p.grad) for n, p in model.named_parameters()}
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"], foreach=False)
        opt.step()
        value = float(loss.item())
        steps.append({"step": step, "loss": value.hex(), "grads": grads})
        bar.update(step, value)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_s = time.perf_counter() - t0
    record = {"label": label, "spec": spec, "fingerprint": fp, "fingerprint_info": fp_info, "start": start,
              "steps": steps, "train_s": train_s, "s_per_step": train_s / max(len(steps), 1),
              "param_names": names, "final": None, "val_loss": None, "mixer": spec["mixer"], "native": native}
    if end < spec["steps"]:
        if ckpt_path is None:
            raise ValueError("ckpt_path is required with stop_at")
        atomic_torch_save(ckpt_path, {
            "format": CKPT_FORMAT, "step": end, "data_position": end, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "rng": _rng_state(device), "fingerprint": fp,
            "fingerprint_info": json.dumps(fp_info, sort_keys=True), "spec": json.dumps(spec, sort_keys=True)})
    else:
        record["final"] = {n: tensor_sha256(p) for n, p in model.named_parameters()}
        record["val_loss"] = _val_loss(model, data, spec["batch"], device)
    atomic_write_json(record_path, record)
    return record


# ----------------------------------------------------------------------------------------------- data parallel
def _digest_of(obj) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def train_run_ddp(spec: dict, record_path: str, *, label: str, stop_at: Optional[int] = None,
                  ckpt_path: Optional[str] = None, resume: Optional[str] = None,
                  allow_fingerprint_mismatch: bool = False, progress: bool = True) -> Optional[dict]:
    """One rank of a data-parallel training run (launched by torchrun with ``spec["nproc"]`` processes).

    Rank ``r`` of ``N`` trains on rows ``[r*B/N, (r+1)*B/N)`` of the global batch of every step
    (:func:`ordered_ssd.distributed.shard_rows`); its loss is the mean over its rows; the model is wrapped in
    ``DistributedDataParallel`` with :func:`ordered_ssd.distributed.ordered_allreduce_hook`, so every
    parameter's gradient is the rank-ordered fold of the ranks' gradients divided by ``N`` (the gradient of the
    mean over the global batch), the same bits on every rank. The recorded loss of a step is the rank-ordered
    mean of the ranks' losses (identical on every rank).

    Start-up: every rank all-gathers its determinism fingerprint (world size included) and all stop with a
    :class:`CheckError` naming the differing ranks if they differ. Stopping at ``stop_at`` writes one
    checkpoint (rank 0, atomically) holding the model and optimizer (identical on every rank) and every
    rank's RNG state. Only rank 0 writes the record (the 1-process record plus ``world_size``, ``backend``,
    ``rank_s_per_step`` and ``ranks_agree``: whether every rank saw the same loss, gradient and final parameter
    bits); returns it on rank 0, None elsewhere.

    Raises:
        CheckError: not under torchrun or a world size other than ``spec["nproc"]``, uneven batch, ranks'
            fingerprints differ, or the checkpoint does not match (format, world size, fingerprint).
    """
    from . import distributed as D

    device_type = torch.device(spec["device"]).type
    try:
        ctx = D.init_distributed(device_type)
    except RuntimeError as e:
        raise CheckError(str(e)) from None
    try:
        return _ddp_rank_run(ctx, spec, record_path, label=label, stop_at=stop_at, ckpt_path=ckpt_path,
                             resume=resume, allow_fingerprint_mismatch=allow_fingerprint_mismatch, progress=progress)
    finally:
        # The DDP model (and its reducer, which holds the process group) is gone with _ddp_rank_run's frame on
        # success; collect it before destroying the group (gloo can abort at exit otherwise).
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()


def _ddp_rank_run(ctx, spec: dict, record_path: str, *, label: str, stop_at: Optional[int], ckpt_path: Optional[str],
                  resume: Optional[str], allow_fingerprint_mismatch: bool, progress: bool) -> Optional[dict]:
    from torch.nn.parallel import DistributedDataParallel

    from . import distributed as D

    n = int(spec["nproc"])
    if ctx.world_size != n:
        raise CheckError(f"the spec asks for {n} processes but torchrun started {ctx.world_size}")
    rank, device = ctx.rank, ctx.device
    fp_info = D.rank_fingerprint(device, n)
    try:
        D.check_rank_fingerprints(fp_info)
    except D.RankMismatchError as e:
        raise CheckError(str(e)) from None
    fp = fingerprint_string(fp_info)
    try:
        offset, count = D.shard_rows(spec["batch"], n, rank)
    except ValueError as e:
        raise CheckError(f"--batch: {e}") from None
    corpus, _ = load_corpus(spec["data"], spec["data_bytes"])
    data = ByteData(corpus, spec["seq_len"])
    if data.sha256 != spec["data_sha256"]:
        raise CheckError(f"the data read by run {label} (rank {rank}) differs from the data of the parent run")
    model, opt = _build(spec, device)
    start = 0
    if resume is not None:
        ckpt = torch.load(resume, map_location="cpu", weights_only=True)
        if ckpt.get("format") == CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume} was written by a 1-process run; resume it without --nproc")
        if ckpt.get("format") != DDP_CKPT_FORMAT:
            raise CheckError(f"checkpoint {resume}: unsupported format {ckpt.get('format')!r} "
                             f"(expected {DDP_CKPT_FORMAT})")
        if int(ckpt["world_size"]) != n:
            raise CheckError(f"checkpoint {resume} was written by {ckpt['world_size']} processes, this run has "
                             f"{n}: every rank's RNG state and data shard belong to one world size")
        _check_resume_fingerprint(ckpt, resume, fp, fp_info, allow_fingerprint_mismatch, "these ranks have")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        _set_rng_state(ckpt["rng"][rank], device)
        start = int(ckpt["data_position"])
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                  bucket_cap_mb=spec["ddp"]["bucket_cap_mb"])
    D.register_ordered_hook(ddp)
    names = [nm for nm, _ in model.named_parameters()]
    steps: List[dict] = []
    bar = Progress(label, spec["steps"], start, enabled=progress and rank == 0)
    end = spec["steps"] if stop_at is None else min(stop_at, spec["steps"])
    t0 = time.perf_counter()
    for step in range(start, end):
        x, y = data.batch(spec["seed"], step, spec["batch"], offset=offset, count=count)
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(ddp(x), y)  # mean over this rank's rows
        loss.backward()  # the hook leaves mean-over-ranks gradients in p.grad
        grads = {nm: tensor_sha256(p.grad) for nm, p in model.named_parameters()}
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"], foreach=False)
        opt.step()
        value = float(D.ordered_mean(loss.detach()).item())  # mean over the global batch, same on every rank
        steps.append({"step": step, "loss": value.hex(), "grads": grads})
        bar.update(step, value)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_s = time.perf_counter() - t0
    final = {nm: tensor_sha256(p) for nm, p in model.named_parameters()} if end >= spec["steps"] else None
    mine = {"train_s": train_s, "steps": _digest_of(steps), "final": _digest_of(final),
            "state": _digest_of({nm: tensor_sha256(p) for nm, p in model.named_parameters()}),
            "rng": _rng_state(device)}
    every: List[Optional[dict]] = [None] * n
    dist.all_gather_object(every, mine)
    disagree = sorted({r for r, o in enumerate(every)
                       if any(o[k] != every[0][k] for k in ("steps", "final", "state"))})
    if end < spec["steps"]:
        if ckpt_path is None:
            raise ValueError("ckpt_path is required with stop_at")
        if rank == 0:
            atomic_torch_save(ckpt_path, {
                "format": DDP_CKPT_FORMAT, "world_size": n, "step": end, "data_position": end,
                "model": model.state_dict(), "optimizer": opt.state_dict(),
                "rng": [o["rng"] for o in every], "fingerprint": fp,
                "fingerprint_info": json.dumps(fp_info, sort_keys=True), "spec": json.dumps(spec, sort_keys=True)})
    record = None
    if rank == 0:
        rank_s = [o["train_s"] / max(len(steps), 1) for o in every]
        record = {"label": label, "spec": spec, "fingerprint": fp, "fingerprint_info": fp_info, "start": start,
                  "steps": steps, "train_s": train_s, "s_per_step": max(rank_s),
                  "rank_train_s": [o["train_s"] for o in every], "rank_s_per_step": rank_s,
                  "world_size": n, "backend": ctx.backend, "ranks_agree": not disagree,
                  "ranks_disagreeing": disagree, "param_names": names, "final": final, "val_loss": None,
                  "mixer": spec["mixer"], "native": spec["mixer"] == "native"}
        if final is not None:
            record["val_loss"] = _val_loss(model, data, spec["batch"], device)
        atomic_write_json(record_path, record)
    dist.barrier()
    return record


# ----------------------------------------------------------------------------------------------- check
def _worker(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool) -> None:
    cmd = [sys.executable, "-m", "ordered_ssd", "_train", "--spec", spec_path, "--record", record_path,
           "--label", label] + extra + ([] if progress else ["--quiet"])
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True)
    if res.returncode != 0:
        raise CheckError(f"run {label} (a fresh process) failed with exit code {res.returncode}: "
                         f"{res.stdout.strip()[-500:]}")


def _child_threads(nproc: int) -> int:
    """Intra-op threads per rank when OMP_NUM_THREADS is unset: the usable cores split between the ranks."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // nproc)


def _is_progress_line(line: str) -> bool:
    return line.lstrip().startswith("[") and "step/s" in line and "|" in line


ERROR_PREFIX = "ordered-ssd _train: error: "
_RANK_EXCEPTION = re.compile(r"^\[rank\d+\]: [A-Za-z_.]*(Error|Exception|Interrupt)\b.*")


def _torchrun_worker(spec_path: str, record_path: str, label: str, extra: List[str], progress: bool, nproc: int,
                     log_path: str) -> None:
    """Run ``ordered-ssd _train`` under ``python -m torch.distributed.run`` with ``nproc`` processes.

    torchrun's and the ranks' output goes to ``log_path``; rank 0's progress lines are forwarded to stderr.
    On failure, raises CheckError with the ranks' one-line errors (deduplicated), or the log's path.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", "-m", "ordered_ssd", "_train", "--spec", spec_path, "--record", record_path,
           "--label", label] + extra + ([] if progress else ["--quiet"])
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(_child_threads(nproc)))
    errors: List[str] = []
    crash: List[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, env=env, bufsize=1)
        try:
            for line in proc.stdout:
                log.write(line)
                if ERROR_PREFIX in line:
                    # ranks write concurrently: one line may hold several ranks' messages
                    for msg in line.split(ERROR_PREFIX)[1:]:
                        msg = msg.strip()
                        if msg and msg not in errors:
                            errors.append(msg)
                elif _RANK_EXCEPTION.match(line):  # an uncaught exception's last line, "[rankN]: XError: ..."
                    crash.append(line.strip())
                elif progress and _is_progress_line(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            rc = proc.wait()
        except BaseException:
            proc.terminate()  # torchrun forwards SIGTERM to the ranks
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    if rc != 0:
        detail = " | ".join(errors) if errors else (
            (crash[0] + f" (full output: {log_path})") if crash else f"see {log_path}")
        raise CheckError(f"run {label} ({nproc} processes under torchrun) failed with exit code {rc}: {detail}")


def _load(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def _merge(first: dict, second: dict) -> dict:
    merged = dict(second)
    merged["steps"] = first["steps"] + second["steps"]
    merged["train_s"] = first["train_s"] + second["train_s"]
    merged["s_per_step"] = merged["train_s"] / max(len(merged["steps"]), 1)
    merged["label"] = "c"
    if "rank_train_s" in first and "rank_train_s" in second:  # data-parallel runs
        merged["rank_train_s"] = [a + b for a, b in zip(first["rank_train_s"], second["rank_train_s"])]
        merged["rank_s_per_step"] = [t / max(len(merged["steps"]), 1) for t in merged["rank_train_s"]]
        merged["s_per_step"] = max(merged["rank_s_per_step"])
        merged["ranks_agree"] = first["ranks_agree"] and second["ranks_agree"]
        merged["ranks_disagreeing"] = sorted(set(first["ranks_disagreeing"]) | set(second["ranks_disagreeing"]))
    return merged


def compare_runs(ref: dict, other: dict) -> dict:
    """Where ``other`` first differs from ``ref``: loss, gradient digests, final parameters."""
    out = {"loss_equal_steps": 0, "first_loss_diff": None, "first_grad_diff": None, "final_equal": None,
           "steps_compared": min(len(ref["steps"]), len(other["steps"])),
           "same_length": len(ref["steps"]) == len(other["steps"])}
    for r, o in zip(ref["steps"], other["steps"]):
        if r["loss"] == o["loss"]:
            out["loss_equal_steps"] += 1
        elif out["first_loss_diff"] is None:
            out["first_loss_diff"] = r["step"]
        if out["first_grad_diff"] is None:
            bad = sorted(n for n in r["grads"] if r["grads"][n] != o["grads"].get(n))
            if bad:
                out["first_grad_diff"] = {"step": r["step"], "params": bad[:8], "count": len(bad)}
    if ref["final"] is not None and other["final"] is not None:
        out["final_equal"] = ref["final"] == other["final"]
    out["identical"] = (out["same_length"] and out["first_loss_diff"] is None and out["first_grad_diff"] is None
                        and out["final_equal"] is True and ref.get("val_loss") == other.get("val_loss"))
    return out


def _plot(path: str, runs: dict) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install ordered-ssd[plot]); loss plot skipped"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = {"a": "-", "b": "--", "c": ":", "native-1": "-", "native-2": "--"}
    for label, rec in runs.items():
        steps = [s["step"] for s in rec["steps"]]
        losses = [float.fromhex(s["loss"]) for s in rec["steps"]]
        ax.plot(steps, losses, styles.get(label, "-"), label=f"{label} ({rec['mixer']})", linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/byte)")
    ax.set_title("ordered-ssd check: loss of every run")
    ax.legend()
    atomic_savefig(path, fig, dpi=110)
    return None


DDP_BUCKET_CAP_MB = 25.0  # set explicitly; it changes DDP's bucket layout (speed), never the bits (elementwise fold)


def run_check(spec: dict, out_dir: str, *, stop_at: int, native: bool, progress: bool = True,
              print_fn=print, nproc: Optional[int] = None) -> int:
    """Run a, b, c (and the native control); print the table and the verdict; write report.json and loss.png.

    With ``nproc`` (an int >= 1), every run (a included) is a data-parallel run of ``nproc`` processes launched
    through ``python -m torch.distributed.run`` (see :func:`train_run_ddp`; gloo on the CPU, nccl on CUDA with
    one GPU per rank), and the verdict also requires every rank of every run to agree bit for bit.

    Returns the exit code: 0 if a, b and c agree bit for bit, 1 otherwise.

    Raises:
        CheckError: bad ``stop_at``, a global batch not divisible by ``nproc``, too few GPUs, unwritable output,
            or a failed run (one-line message).
    """
    ddp = nproc is not None
    if ddp:
        if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
            raise CheckError(f"--nproc: expected a positive integer, got {nproc!r}")
        if spec["batch"] % nproc:
            raise CheckError(f"--batch: the global batch {spec['batch']} is not divisible by --nproc {nproc} "
                             f"(rank r takes rows [r*B/N, (r+1)*B/N) of every step's batch)")
        dev = torch.device(spec["device"])
        if dev.type == "cuda":
            if dev.index is not None:
                raise CheckError(f"--device: with --nproc give cuda, not {spec['device']} (rank r uses cuda:r)")
            if nproc > torch.cuda.device_count():
                raise CheckError(f"--nproc: {nproc} processes need {nproc} GPUs (one per rank), "
                                 f"{torch.cuda.device_count()} visible")
    out_dir = prepare_out_dir(out_dir)
    corpus, source = load_corpus(spec["data"], spec["data_bytes"])
    data = ByteData(corpus, spec["seq_len"])
    spec = dict(spec, data_sha256=data.sha256)
    if ddp:
        spec = dict(spec, nproc=nproc, ddp={"bucket_cap_mb": DDP_BUCKET_CAP_MB, "hook": "ordered_allreduce_hook",
                                            "backend": "nccl" if torch.device(spec["device"]).type == "cuda"
                                            else "gloo"})
    if not 0 < stop_at < spec["steps"]:
        raise CheckError(f"--stop-at: expected 0 < k < --steps={spec['steps']}, got {stop_at}")
    runs_dir = os.path.join(out_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    spec_path = os.path.join(runs_dir, "spec.json")
    atomic_write_json(spec_path, spec)
    n_params = sum(p.numel() for p in _build(spec, torch.device("cpu"))[0].parameters())
    where = (f"{spec['device']} x {nproc} processes ({spec['ddp']['backend']}, DistributedDataParallel, ordered "
             f"gradient hook)" if ddp else spec["device"])
    batch_desc = (f"global batch {spec['batch']} ({spec['batch'] // nproc} rows per rank)" if ddp
                  else f"batch {spec['batch']}")
    print_fn(f"ordered-ssd check: {n_params / 1e6:.2f}M-parameter byte-level Mamba-2 LM "
             f"({spec['model']['n_layers']} layers, d_model {spec['model']['d_model']}) on {where}, "
             f"{spec['steps']} steps of {batch_desc} x {spec['seq_len']} bytes")
    print_fn(f"data: {source}: {data.n_bytes} bytes, sha256 {data.sha256[:16]}")
    rec = lambda name: os.path.join(runs_dir, f"{name}.json")  # noqa: E731
    ckpt = os.path.join(runs_dir, f"checkpoint-step{stop_at}.pt")

    def launch(sp, name, label, extra):
        if ddp:
            _torchrun_worker(sp, rec(name), label, extra, progress, nproc, os.path.join(runs_dir, f"{name}.log"))
        else:
            _worker(sp, rec(name), label, extra, progress)

    t0 = time.perf_counter()
    if ddp:
        launch(spec_path, "a", "a", [])
        runs = {"a": _load(rec("a"))}
    else:
        runs = {"a": train_run(spec, rec("a"), label="a", progress=progress)}
    launch(spec_path, "b", "b", [])
    runs["b"] = _load(rec("b"))
    launch(spec_path, "c1", "c:1", ["--stop-at", str(stop_at), "--ckpt", ckpt])
    launch(spec_path, "c2", "c:2", ["--resume", ckpt])
    runs["c"] = _merge(_load(rec("c1")), _load(rec("c2")))
    if native:
        nspec = dict(spec, mixer="native")
        nspec_path = os.path.join(runs_dir, "spec-native.json")
        atomic_write_json(nspec_path, nspec)
        for name in ("native-1", "native-2"):
            launch(nspec_path, name, name, [])
            runs[name] = _load(rec(name))
    wall = time.perf_counter() - t0

    cmp_b, cmp_c = compare_runs(runs["a"], runs["b"]), compare_runs(runs["a"], runs["c"])
    cmp_native = compare_runs(runs["native-1"], runs["native-2"]) if native else None
    ranks_agree = all(runs[lab].get("ranks_agree", True) for lab in ("a", "b", "c"))
    ok = cmp_b["identical"] and cmp_c["identical"] and ranks_agree

    # table
    labels = list(runs)
    print_fn("")
    print_fn(f"{'step':>5} {'loss (a)':>10}  " + "  ".join(f"{lab:>8}" for lab in labels[1:]))
    n = len(runs["a"]["steps"])
    show = sorted(set(list(range(min(n, 5))) + list(range(0, n, max(1, n // 10))) + [n - 1, stop_at - 1, stop_at]))
    for i in show:
        if not 0 <= i < n:
            continue
        ra = runs["a"]["steps"][i]
        cells = []
        for lab in labels[1:]:
            ro = runs[lab]["steps"][i] if i < len(runs[lab]["steps"]) else None
            if ro is None:
                cells.append("missing")
            elif lab.startswith("native"):
                nref = runs["native-1"]["steps"][i]
                same = ro["loss"] == nref["loss"] and ro["grads"] == nref["grads"]
                cells.append(f"{float.fromhex(ro['loss']):.4f}" + ("" if same or lab == "native-1" else "*"))
            else:
                cells.append("= bits" if ro["loss"] == ra["loss"] and ro["grads"] == ra["grads"] else "DIFF")
        print_fn(f"{i:>5} {float.fromhex(ra['loss']):>10.6f}  " + "  ".join(f"{c:>8}" for c in cells))
    print_fn("")
    desc = lambda c: ("identical" if c["identical"] else  # noqa: E731
                      f"DIFFERENT (loss from step {c['first_loss_diff']}, grads {c['first_grad_diff']}, "
                      f"final params equal: {c['final_equal']})")
    if ddp:
        print_fn(f"b (fresh processes) vs a:             {desc(cmp_b)}")
        print_fn(f"c (stopped at {stop_at}, resumed) vs a:    {desc(cmp_c)}")
        print_fn("ranks agree (loss, gradient and parameter bits on every rank): " + (
            "yes, in every run" if ranks_agree else "NO: " + ", ".join(
                f"run {lab} ranks {runs[lab]['ranks_disagreeing']}" for lab in ("a", "b", "c")
                if not runs[lab]["ranks_agree"])))
    else:
        print_fn(f"b (fresh process) vs a:               {desc(cmp_b)}")
        print_fn(f"c (stopped at {stop_at}, resumed) vs a:    {desc(cmp_c)}")
    if native:
        nd = cmp_native
        print_fn("(native columns: the loss; '*' marks a step whose loss or gradient bits differ from native-1)")
        print_fn("native Mamba2 run 1 vs run 2 (control): " + (
            "identical" if nd["identical"] else
            f"diverged: first gradient difference at step "
            f"{nd['first_grad_diff']['step'] if nd['first_grad_diff'] else '-'}, first loss difference at step "
            f"{nd['first_loss_diff']}"))
    for lab, r in runs.items():
        per_rank = ("" if "rank_s_per_step" not in r else
                    " (per rank: " + ", ".join(f"{1000 * t:.1f}" for t in r["rank_s_per_step"]) + ")")
        print_fn(f"  run {lab:>8}: {1000 * r['s_per_step']:.1f} ms/step{per_rank}, "
                 f"val loss {float.fromhex(r['val_loss']):.4f}")
    verdict = "REPRODUCIBLE" if ok else "NOT REPRODUCIBLE"
    if ddp:
        print_fn(f"verdict: {verdict}: {n} steps, world size {nproc}, loss, per-parameter gradient and final "
                 f"parameter digests {'identical' if ok else 'differ'} across 3 runs and every rank "
                 f"(fresh processes; restart at step {stop_at})")
    else:
        print_fn(f"verdict: {verdict}: {n} steps, loss, per-parameter gradient and final parameter digests "
                 f"{'identical' if ok else 'differ'} across 3 runs (fresh process; restart at step {stop_at})")

    report = {"verdict": verdict, "ok": ok, "spec": spec, "data_source": source, "n_params": n_params,
              "stop_at": stop_at, "wall_s": wall, "fingerprint": runs["a"]["fingerprint"],
              "fingerprint_info": runs["a"]["fingerprint_info"],
              "comparisons": {"b_vs_a": cmp_b, "c_vs_a": cmp_c, "native_2_vs_native_1": cmp_native},
              "runs": {lab: {"mixer": r["mixer"], "s_per_step": r["s_per_step"], "val_loss": r["val_loss"],
                             "losses": [s["loss"] for s in r["steps"]], "final": r["final"]}
                       for lab, r in runs.items()},
              "per_step": [{"step": s["step"], "loss": s["loss"], "grads": s["grads"]} for s in runs["a"]["steps"]]}
    if ddp:
        report["world_size"] = nproc
        report["backend"] = spec["ddp"]["backend"]
        report["ranks_agree"] = ranks_agree
        for lab, r in runs.items():
            report["runs"][lab].update({k: r[k] for k in ("rank_s_per_step", "ranks_agree", "ranks_disagreeing",
                                                          "world_size")})
    note = _plot(os.path.join(out_dir, "loss.png"), runs)
    report["plot"] = None if note else "loss.png"
    atomic_write_json(os.path.join(out_dir, "report.json"), report)
    if note:
        print_fn(f"note: {note}")
    print_fn(f"report: {os.path.join(out_dir, 'report.json')}" + ("" if note else f", plot: {os.path.join(out_dir, 'loss.png')}"))
    return 0 if ok else 1
