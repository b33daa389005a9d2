"""One training run of ``ordered-ssd check``: the model and optimizer of a spec, the progress line, and the one
training loop that serves the 1-process run and every rank of a data-parallel run."""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import time
from typing import Callable, List, Optional

import torch

from ...digest import tensor_sha256
from ...fingerprint import fingerprint_diff, fingerprint_string
from ..files import atomic_torch_save, atomic_write_json
from ..lm import ByteData, ByteLM, ModelConfig, batch_to, lm_loss, load_corpus
from .checkpoint import check_model_state, load_optimizer_state, read_checkpoint
from .errors import CheckError, describe_path, writing
from .digests import StepDigests
from .modules import OutputDigests, add_test_grad_noise, module_digests, module_names
from .world import world_of


# ----------------------------------------------------------------------------------------------- progress
#: the least seconds between two redraws of the progress line on a terminal (each reads the loss: a wait for the device)
REDRAW_S = 0.25


class Progress:
    """A one-line progress display on stderr (redrawn in place on a terminal, every 10% otherwise)."""

    def __init__(self, label: str, total: int, start: int = 0, enabled: bool = True, stop: Optional[int] = None):
        """``total`` steps in the run, of which this process trains ``[start, stop)`` (``stop`` default
        ``total``): the line is drawn at ``stop`` whatever the redraw interval."""
        self.label, self.total, self.enabled = label, total, enabled
        self.stop = total if stop is None else stop
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.start = start
        self.last_pct = -1
        self.drawn = float("-inf")  # when the line was last drawn

    def update(self, step: int, loss) -> None:
        """Step ``step`` done with ``loss`` (a float, or a 0-dim tensor read only when the line is drawn: on a
        terminal at most every :data:`REDRAW_S` seconds and at the last step this process trains, else every 10%
        and at that step)."""
        if not self.enabled:
            return
        done = step + 1
        pct = int(100 * done / max(self.total, 1))
        now = time.perf_counter()
        last = done >= self.stop
        if self.tty:
            draw = last or now - self.drawn >= REDRAW_S
        else:
            draw = pct // 10 != self.last_pct // 10 or last
        self.last_pct = pct
        if not draw:
            return
        self.drawn = now
        loss = float(loss)
        rate = (done - self.start) / max(now - self.t0, 1e-9)
        width = 24
        bar = "#" * int(width * done / max(self.total, 1))
        line = f"[{self.label:>8}] |{bar:<{width}}| {done}/{self.total} loss {loss:.4f} {rate:.1f} step/s"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if last else ""))
            sys.stderr.flush()
        else:
            sys.stderr.write(line + "\n")


# ----------------------------------------------------------------------------------------------- model
def _mixer_class(kind: str, layer: str = "mamba2"):
    """The mixer class of the byte LM: ``kind`` ``"ordered"`` (:class:`ordered_ssd.OrderedMamba2`,
    :class:`ordered_ssd.modules.mamba3.OrderedMamba3`) or ``"native"`` (mamba-ssm's ``Mamba2`` / ``Mamba3``), of
    ``layer`` ``"mamba2"`` or ``"mamba3"``."""
    from ...modules import NATIVE_LAYERS

    if layer not in NATIVE_LAYERS:
        raise ValueError(f"layer: expected one of {', '.join(NATIVE_LAYERS)}, got {layer!r}")
    if kind == "ordered":
        if layer == "mamba3":
            from ...modules.mamba3 import OrderedMamba3

            return OrderedMamba3
        from ... import OrderedMamba2

        return OrderedMamba2
    if kind == "native":
        module, name = NATIVE_LAYERS[layer]
        try:
            native = getattr(importlib.import_module(module), name)
        except ImportError as e:
            from csrc_bindings import INSTALL_HINT

            raise CheckError(f"--native needs mamba-ssm ({e}); install it with: {INSTALL_HINT}") from None
        return native
    raise ValueError(f"mixer: expected 'ordered' or 'native', got {kind!r}")


def build_model(spec: dict, device: torch.device):
    """The model of ``spec`` (seeded with ``spec["seed"]``): the byte-level LM (mixers of the kind ``spec["model"]``
    names in ``layer``, mamba2 where it names none), or with ``spec["hf"]`` the Hugging Face model
    (:func:`.hf.build_hf_model`); and its AdamW optimizer (weight decay off for 1-d and ``_no_weight_decay``
    parameters)."""
    if spec.get("hf") is not None:
        from .hf import build_hf_model

        model = build_hf_model(spec, device)
    else:
        torch.manual_seed(spec["seed"])
        cfg = ModelConfig(**spec["model"])
        model = ByteLM(cfg, _mixer_class(spec["mixer"], cfg.layer), device=device)
    return model, make_optimizer(model, spec, no_decay_names(model))


def no_decay_names(model: torch.nn.Module) -> set:
    """The parameters AdamW does not decay: 1-d ones and those marked ``_no_weight_decay`` (read before FSDP2
    replaces the parameters, which drops the mark)."""
    return {name for name, p in model.named_parameters() if getattr(p, "_no_weight_decay", False) or p.dim() < 2}


def make_optimizer(model: torch.nn.Module, spec: dict, no_decay: set) -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters (made after FSDP2 sharding, over the sharded ones), weight decay off for
    the names in ``no_decay``; ``foreach=False`` (the per-tensor loop, the same arithmetic on every shard)."""
    decay, skip = [], []
    for name, p in model.named_parameters():
        (skip if name in no_decay else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": spec["weight_decay"]},
                              {"params": skip, "weight_decay": 0.0}],
                             lr=spec["lr"], betas=(0.9, 0.95), eps=1e-8, foreach=False)


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded (FSDP2 DTensor) one: an all-gather, collective; a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def logits_fn(spec: dict):
    """``(net, tokens) -> logits`` for the model of ``spec`` (``net`` may be its DDP wrapper)."""
    if spec.get("hf") is not None:
        from .hf import hf_logits

        return hf_logits
    return lambda net, tokens: net(tokens)


def _resolve(digests: StepDigests, steps: List[dict], names: List[str]) -> None:
    """Put the finished digests into the steps still holding :class:`StepDigests` keys (waits for them), and the
    losses and output fingerprints still on the device into them as read on the host."""
    for entry in steps:
        if isinstance(entry.get("loss"), torch.Tensor):
            entry["loss"] = float(entry["loss"].item()).hex()
        if callable(entry.get("outputs")):
            entry["outputs"] = entry["outputs"]()
        if isinstance(entry.get("grads"), int):
            entry["grads"], entry["grad_norms"] = digests.result(entry["grads"])
            entry["modules"] = module_digests(entry["grads"], names)
        if isinstance(entry.get("params"), int):
            entry["params"], entry["param_norms"] = digests.result(entry["params"])


def _check_same_model(ckpt: dict, resume: str, spec: dict) -> None:
    """Stop (CheckError) if the checkpoint was written for another model than ``spec``'s: another byte-LM shape,
    or another Hugging Face config, model type, weights or transformers version."""
    try:
        saved = json.loads(ckpt["spec"])
    except (TypeError, ValueError):
        raise CheckError(f"checkpoint {resume}: expected the spec of its run as JSON, got "
                         f"{type(ckpt['spec']).__name__}")
    for key in ("model", "hf"):
        if isinstance(saved, dict) and saved.get(key) != spec.get(key):
            def show(s):
                if not isinstance(s, dict) or not isinstance(s.get(key), dict):
                    return repr(None if not isinstance(s, dict) else s.get(key))
                v = s[key]
                if key == "hf":
                    return f"{v.get('model_type')} config sha256 {str(v.get('config_sha256'))[:16]}"
                return ", ".join(f"{k}={v[k]}" for k in sorted(v))
            raise CheckError(f"checkpoint {resume}: expected one written for this run's model ({show(spec)}), got one "
                             f"written for another model ({show(saved)}); resume it with the spec it was written with")


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.random.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _check_resume_fingerprint(ckpt: dict, resume: str, fingerprint: str, fingerprint_info: dict, allow: bool,
                              holder: str) -> None:
    """Stop (CheckError naming the differing fields) if the checkpoint's fingerprint is not ``fingerprint``, unless
    ``allow``."""
    if ckpt["fingerprint"] != fingerprint and not allow:
        diff = fingerprint_diff(json.loads(ckpt["fingerprint_info"]), fingerprint_info)
        raise CheckError(f"checkpoint {resume} was written with determinism fingerprint {ckpt['fingerprint']}, "
                         f"{holder} {fingerprint} (differs in: {diff}); resuming would not replay the run bit for "
                         f"bit. "
                         f"Pass --allow-fingerprint-mismatch to resume anyway.")


def _val_loss(model, data: ByteData, batch: int, device: torch.device, logits=lambda net, x: net(x),
              max_windows: Optional[int] = None, label: str = "", progress: bool = False) -> str:
    """Mean validation loss per byte over the validation windows (at most ``max_windows``, spread evenly over the
    held-out split; :meth:`ByteData.val_batches`), in order, as ``float.hex``; with ``progress`` one line on
    stderr saying how many windows."""
    n = data.val_windows() if max_windows is None else min(max_windows, data.val_windows())
    if progress:
        of = data.val_windows()
        sys.stderr.write(f"[{label:>8}] validation: " + (f"{n} of the {of} windows" if of != 1 else "the one window")
                         + " of the held-out split\n")
    with torch.no_grad():
        total, count = 0.0, 0
        for x_val, y_val in data.val_batches(batch, max_windows):
            x_val, y_val = batch_to(x_val, device), batch_to(y_val, device)
            total += float(lm_loss(logits(model, x_val), y_val)) * x_val.numel()
            count += x_val.numel()
    return (total / max(count, 1)).hex()


# ----------------------------------------------------------------------------------------------- the loop
def train_loop(world, spec: dict, record_path: str, *, label: str, stop_at: Optional[int] = None,
               ckpt_path: Optional[str] = None, resume: Optional[str] = None,
               allow_fingerprint_mismatch: bool = False, progress: bool = True, ckpt_every: Optional[int] = None,
               resume_if_any: bool = False, kill_at: Optional[int] = None,
               after_first_step: Optional[Callable[[], None]] = None) -> Optional[dict]:
    """Train according to ``spec`` in ``world`` (:mod:`ordered_ssd.apps.check.world`); write (atomically, rank 0
    only) and return the run record (None on the other ranks).

    Every step trains the world's blocks of the step's batch in order (forward, backward of the block's mean
    loss); with an accumulator (a split-invariance run) each block's gradients go to ``add_block`` and
    ``write_grads`` leaves the step's gradients; without one (the plain check: one block) ``backward`` does.

    The record has ``steps`` (per step: the loss as ``float.hex``, the SHA-256 of every parameter's gradient
    before clipping and ``params``, the SHA-256 of every parameter after the step; ``grad_norms`` and
    ``param_norms``, their float64 L2 norms as ``float.hex``, for the picture's magnitudes),
    ``final`` (SHA-256 of every parameter at the end, if the run reached the last step),
    ``val_loss``, timings (``train_s``; ``timings``: ``setup_s`` from the call to the first step (data, model,
    checkpoint, the digests' buffers and hashing process), ``first_step_s`` (the first step, synchronised:
    compiles and first-launch timings), ``train_s``, ``val_s``) and the fingerprint; a data-parallel run adds
    ``world_size``, ``backend``, ``rank_s_per_step`` and ``ranks_agree`` (whether every rank saw the same loss,
    gradient and final parameter bits).

    Checkpoints. The plain check (1 process or DDP): stopping at ``stop_at`` writes one file (rank 0,
    atomically): model and optimizer (identical on every rank), every rank's RNG state, data position, step and
    fingerprint; ``resume`` is that file. A split-invariance run (``spec["split"]``, DDP or FSDP2) writes sharded
    checkpoints with :func:`ordered_ssd.checkpoint.save_checkpoint` under the directory ``ckpt_path`` (at
    ``stop_at``, and after every ``ckpt_every`` steps), holding the steps recorded so far; ``resume`` is such a
    directory, resumed from its latest complete checkpoint on any number of ranks (``resume_if_any``: start from
    step 0 when it holds none), and the record then holds the steps before the restart too (``restarts`` lists
    the steps resumed from). ``kill_at`` (testing the crash restart): on the first attempt under torchrun, the
    last rank kills itself with SIGKILL after the first block's backward of that step. ``after_first_step`` is
    called once, when the first step (its compiles included) has finished.

    Raises:
        CheckError: the ranks' fingerprints differ, uneven batch, the data differs from the parent run's, or the
            checkpoint is unusable (missing, corrupt, truncated, not a checkpoint: :mod:`.checkpoint`,
            :mod:`ordered_ssd.checkpoint`) or does not match (format, world size, fingerprint, the model's
            parameters); the record or checkpoint path is a directory (found before training) or cannot be written.
    """
    t_enter = time.perf_counter()
    sharded_ckpt = spec.get("split") is not None  # split-invariance runs: ordered_ssd.checkpoint, any world size
    for what, path in (("run record", record_path), ("checkpoint", None if sharded_ckpt else ckpt_path)):
        if path is not None and os.path.isdir(path):  # found before training, not after
            raise CheckError(f"{what} {path}: expected a path where a file can be written, got a directory")
    if ckpt_path is not None and sharded_ckpt and os.path.lexists(ckpt_path) and not os.path.isdir(ckpt_path):
        raise CheckError(f"checkpoint {ckpt_path}: expected a directory of checkpoints (or nothing), got "
                         f"{describe_path(ckpt_path)}")
    device = world.device
    fingerprint_info = world.fingerprint()
    fingerprint = fingerprint_string(fingerprint_info)
    blocks = world.blocks(spec["batch"])
    corpus, _, cut = load_corpus(spec["data"], spec["data_bytes"])
    data = ByteData(corpus, spec["seq_len"], cut=cut)
    if data.sha256 != spec["data_sha256"]:
        raise CheckError(f"the data read by run {world.run_name(label)} differs from the data of the parent run")
    model, optimizer = build_model(spec, device)
    if world.sharded:
        no_decay = no_decay_names(model)
        world.shard(model)
        optimizer = make_optimizer(model, spec, no_decay)
    start, steps, restarts = 0, [], []
    if resume is not None and sharded_ckpt:
        start, steps, restarts = _resume_sharded(resume, model, optimizer, fingerprint_info, device,
                                                 allow_fingerprint_mismatch, resume_if_any)
    elif resume is not None:
        ckpt = read_checkpoint(resume)  # weights_only=True, on the CPU; one-line CheckError for a bad file
        world.check_checkpoint(ckpt, resume)
        _check_same_model(ckpt, resume, spec)
        _check_resume_fingerprint(ckpt, resume, fingerprint, fingerprint_info, allow_fingerprint_mismatch, world.holder)
        check_model_state(resume, ckpt["model"], model)
        model.load_state_dict(ckpt["model"])
        load_optimizer_state(resume, optimizer, ckpt["optimizer"])
        _set_rng_state(world.rng_of(ckpt), device)
        start = int(ckpt["data_position"])
    net = world.wrap(model, spec)
    acc = world.accumulator(model)  # None: one block, the gradients backward leaves (the plain check)
    add_test_grad_noise(model)  # testing only: nothing unless ORDERED_SSD_TEST_GRAD_NOISE names a module
    named = list(model.named_parameters())  # walked once: the loop reads each step's gradients through it
    names = [name for name, _ in named]
    modules = module_names(names)
    # forward outputs depend on how a step's rows are split into blocks and ranks: recorded in one process without
    # the accumulator only (in a data-parallel run rank 0's outputs alone could not tell where a difference arose)
    outputs = OutputDigests(model, modules) if acc is None and world.world_size == 1 else None
    logits = logits_fn(spec)
    recorded_before = len(steps)
    end = spec["steps"] if stop_at is None else min(stop_at, spec["steps"])
    bar = Progress(label, spec["steps"], start, enabled=progress and world.rank == 0, stop=end)
    kill = kill_at is not None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and \
        world.rank == world.world_size - 1
    digests = StepDigests(device)
    try:  # on an error the hashing process and the buffers go at once (not when this process ends)
        # the snapshot buffers and the hashing process before the timed loop (a gradient has its parameter's shape)
        digests.reserve({name: torch.empty(p.shape, dtype=p.dtype, device="meta") for name, p in named})
        t0 = time.perf_counter()
        setup_s, first_step_s = t0 - t_enter, None
        for step in range(start, end):
            optimizer.zero_grad(set_to_none=True)
            losses = []
            for offset, count in blocks:
                x, y = data.batch(spec["seed"], step, spec["batch"], offset=offset, count=count)
                x, y = batch_to(x, device), batch_to(y, device)  # the host queues on; no wait
                loss = lm_loss(logits(net, x), y)  # mean over the block's rows
                loss.backward()  # in a data-parallel run the hook leaves mean-over-ranks gradients in p.grad
                losses.append(loss.detach())
                if kill and step == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # the crash test: this rank dies in the middle of the step
                if acc is not None:
                    acc.add_block()
            if acc is not None:
                acc.write_grads()  # the tree sum over every rank's blocks / (R*m), the same on every rank
            # the digests are taken off the training path: a snapshot in stream order now, SHA-256 while later steps
            # train (StepDigests); the record's entry gets them when resolved
            grads = digests.submit({name: None if p.grad is None else _full(p.grad)
                                    for name, p in named}, norms=True)
            world.clip(model, spec["clip"])
            optimizer.step()
            # the loss and the outputs' fingerprints stay on the device until resolved: no wait for the device a step
            loss = world.global_loss(losses)
            steps.append({"step": step, "loss": loss, "grads": grads})
            if outputs is not None:
                steps[-1]["outputs"] = outputs.take_deferred()
            steps[-1]["params"] = digests.submit({name: _full(p) for name, p in named}, norms=True)
            bar.update(step, loss)
            if first_step_s is None:  # compiles and first-launch timings happen here: one synchronisation, once
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                first_step_s = time.perf_counter() - t0
                if after_first_step is not None:
                    after_first_step()
            done = step + 1
            if sharded_ckpt and ckpt_every and done % ckpt_every == 0 and done < end and ckpt_path is not None:
                _resolve(digests, steps, names)
                _save_sharded(ckpt_path, done, model, optimizer, steps, fingerprint_info, device)
        if outputs is not None:
            outputs.remove()
        _resolve(digests, steps, names)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_s = time.perf_counter() - t0
    except BaseException:
        try:
            digests.close()
        except Exception:  # noqa: BLE001 - the error being raised is the one to report
            pass
        raise
    digests.close()  # the buffers and the hashing process go (every digest is in the steps already)
    final = None
    if end >= spec["steps"]:  # the last step's parameter digests are the final ones (hashed once)
        final = (dict(steps[-1]["params"]) if steps and steps[-1]["step"] == end - 1
                 else {name: tensor_sha256(_full(p)) for name, p in model.named_parameters()})
    every = world.gather(model, steps[recorded_before:], final, train_s)
    if end < spec["steps"]:
        if ckpt_path is None:
            raise ValueError("ckpt_path is required with stop_at")
        if sharded_ckpt:
            _save_sharded(ckpt_path, end, model, optimizer, steps, fingerprint_info, device)
        elif world.rank == 0:
            with writing("checkpoint", ckpt_path):
                atomic_torch_save(ckpt_path, {
                    "step": end, "data_position": end, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "fingerprint": fingerprint,
                    "fingerprint_info": json.dumps(fingerprint_info, sort_keys=True),
                    "spec": json.dumps(spec, sort_keys=True), **world.checkpoint_fields(every)})
    # validation: on rank 0, and with FSDP2 on every rank (its forward all-gathers the parameters: a collective)
    t_val = time.perf_counter()
    val_loss = (_val_loss(model, data, spec["batch"], device, logits, spec.get("val_windows"), label,
                          progress and world.rank == 0)
                if final is not None and (world.rank == 0 or world.sharded) else None)
    timings = {"setup_s": setup_s, "first_step_s": first_step_s, "train_s": train_s,
               "val_s": time.perf_counter() - t_val if val_loss is not None else None}
    record = None
    if world.rank == 0:
        record = {"label": label, "spec": spec, "fingerprint": fingerprint, "fingerprint_info": fingerprint_info,
                  "start": start, "restarts": restarts,
                  "steps": steps, "train_s": train_s, "timings": timings, "param_names": names,
                  "module_names": modules, "final": final,
                  "val_loss": val_loss,
                  "mixer": spec["mixer"], "native": spec["mixer"] == "native",
                  **world.record_fields(every, len(steps) - recorded_before)}
        with writing("run record", record_path):
            atomic_write_json(record_path, record)
    world.barrier()
    return record


def _save_sharded(root: str, step: int, model, optimizer, steps: List[dict], fingerprint_info: dict,
                  device: torch.device) -> None:
    """The split-invariance run's checkpoint after ``step`` steps (:func:`ordered_ssd.checkpoint.save_checkpoint`):
    the data position and the records of the steps so far travel in its ``app_state``."""
    from ...checkpoint import save_checkpoint

    with writing("checkpoint folder", root):
        save_checkpoint(root, step, model, optimizer, app_state={"data_position": step, "steps": steps},
                        fingerprint=fingerprint_info, device=device)


def _resume_sharded(root: str, model, optimizer, fingerprint_info: dict, device: torch.device, allow: bool,
                    if_any: bool):
    """``(start step, steps recorded before it, [start])`` from the latest complete checkpoint under ``root``,
    loaded into ``model`` and ``optimizer`` on this world size; ``(0, [], [])`` with ``if_any`` and none there.
    CheckError (one line) for an unusable one."""
    from ...checkpoint import CheckpointError, latest_checkpoint, load_checkpoint

    path = latest_checkpoint(root)
    if path is None:
        if if_any:
            return 0, [], []
        raise CheckError(f"checkpoint {root}: expected a directory holding a complete checkpoint (step-*/"
                         f"manifest.json), got none")
    try:
        manifest = load_checkpoint(path, model, optimizer, fingerprint=None if allow else fingerprint_info,
                                   device=device)
    except CheckpointError as e:
        hint = ". Pass --allow-fingerprint-mismatch to resume anyway" if "fingerprint" in str(e) else ""
        raise CheckError(f"{e}{hint}") from None
    app = manifest["app_state"]
    return int(app["data_position"]), list(app["steps"]), [int(app["data_position"])]


def train_run(spec: dict, record_path: str, *, label: str, stop_at: Optional[int] = None,
              ckpt_path: Optional[str] = None, resume: Optional[str] = None, allow_fingerprint_mismatch: bool = False,
              progress: bool = True, ckpt_every: Optional[int] = None, resume_if_any: bool = False,
              kill_at: Optional[int] = None, after_first_step: Optional[Callable[[], None]] = None) -> Optional[dict]:
    """One run of ``spec``: in this process, or (``spec["nproc"]`` set) as one rank of a data-parallel run
    launched by torchrun. See :func:`train_loop` for the record and the errors; a data-parallel rank outside
    torchrun, or with another world size than ``spec["nproc"]``, raises :class:`CheckError`. With
    ``spec["threads"]`` (an int) the run trains with that many intra-op threads (:func:`spec_threads`)."""
    with spec_threads(spec), world_of(spec) as world:
        return train_loop(world, spec, record_path, label=label, stop_at=stop_at, ckpt_path=ckpt_path,
                          resume=resume, allow_fingerprint_mismatch=allow_fingerprint_mismatch, progress=progress,
                          ckpt_every=ckpt_every, resume_if_any=resume_if_any, kill_at=kill_at,
                          after_first_step=after_first_step)


@contextlib.contextmanager
def spec_threads(spec: dict):
    """Within the block, torch's intra-op thread count is ``spec["threads"]`` (``torch.set_num_threads``; the CPU's
    bits depend on it, and the determinism fingerprint records it); as it was after it. Nothing where the spec has
    none (on CUDA by default, and specs of earlier versions)."""
    threads = spec.get("threads")
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
