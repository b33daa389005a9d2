"""One training run (:mod:`ordered_ssd.apps.check.train`): the loop that serves both worlds, checkpoints and
resuming, the data-parallel loss."""
import json
import os
import socket

import pytest
import torch

from ordered_ssd.apps.check import train as train_module
from ordered_ssd.apps.check.train import build_model
from ordered_ssd.apps.check.world import DataParallel, SingleProcess
from ordered_ssd.apps.lm import ByteData, load_corpus, lm_loss
from tests.apps.helpers import run_cli


def test_checkpoint_loads_with_weights_only(check_run):
    _, out = check_run
    ckpt = torch.load(out / "runs" / "checkpoint-step3.pt", weights_only=True)
    assert ckpt["step"] == 3 and ckpt["data_position"] == 3
    assert {"model", "optimizer", "rng", "fingerprint", "fingerprint_info"} <= set(ckpt)
    assert isinstance(ckpt["rng"]["torch"], torch.Tensor)


def test_resume_with_a_different_fingerprint_stops(check_run, tmp_path):
    _, out = check_run
    ckpt = torch.load(out / "runs" / "checkpoint-step3.pt", weights_only=True)
    ckpt["fingerprint"] = "0" * 16
    info = json.loads(ckpt["fingerprint_info"])
    info["torch"] = "0.0.0"
    ckpt["fingerprint_info"] = json.dumps(info)
    bad = tmp_path / "bad.pt"
    torch.save(ckpt, bad)
    spec = str(out / "runs" / "spec.json")
    res = run_cli("_train", "--spec", spec, "--record", str(tmp_path / "r.json"), "--label", "x", "--resume", str(bad),
               "--quiet")
    assert res.returncode == 2
    assert "determinism fingerprint 0000000000000000" in res.stderr and "'torch': ('0.0.0'" in res.stderr
    assert "--allow-fingerprint-mismatch" in res.stderr
    assert not (tmp_path / "r.json").exists()
    res = run_cli("_train", "--spec", spec, "--record", str(tmp_path / "r.json"), "--label", "x", "--resume", str(bad),
               "--quiet", "--allow-fingerprint-mismatch")
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    original = json.loads((out / "report.json").read_text())["runs"]["a"]
    assert [s["loss"] for s in record["steps"]] == original["losses"][3:]


def test_ddp_loss_is_the_global_batch_mean(ddp_check):
    """Step 0 (same initial parameters everywhere): the recorded loss, the rank-ordered mean of the ranks' mean
    losses, equals the 1-process mean over the whole global batch up to rounding."""
    res, out = ddp_check
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    spec = report["spec"]
    torch.set_num_threads(report["fingerprint_info"]["threads"])  # the ranks' thread count (restored by conftest)
    model, _ = build_model(spec, torch.device("cpu"))
    data = ByteData(load_corpus(spec["data"], spec["data_bytes"])[0], spec["seq_len"])
    x, y = data.batch(spec["seed"], 0, spec["batch"])
    with torch.no_grad():
        full = float(lm_loss(model(x), y))
        halves = [float(lm_loss(model(x[r * 2:(r + 1) * 2]), y[r * 2:(r + 1) * 2])) for r in range(2)]
    recorded = float.fromhex(report["runs"]["a"]["losses"][0])
    assert abs(recorded - full) <= 1e-6 * abs(full)
    # the shards are rows [0, 2) and [2, 4) of the global batch: their mean loss, averaged in fp32
    expected = (torch.tensor(halves[0], dtype=torch.float32) + torch.tensor(halves[1], dtype=torch.float32)) / 2
    assert recorded == float(expected)


def test_ddp_checkpoint_is_one_file_with_every_rank_rng(ddp_check):
    _, out = ddp_check
    files = [p for p in os.listdir(out / "runs") if p.endswith(".pt")]
    assert files == ["checkpoint-step3.pt"]
    ckpt = torch.load(out / "runs" / "checkpoint-step3.pt", weights_only=True)
    assert ckpt["format"] == 2 and ckpt["world_size"] == 2 and ckpt["step"] == 3 and ckpt["data_position"] == 3
    assert isinstance(ckpt["rng"], list) and len(ckpt["rng"]) == 2
    assert all(isinstance(s["torch"], torch.Tensor) and s["torch"].dtype == torch.uint8 for s in ckpt["rng"])
    assert json.loads(ckpt["fingerprint_info"])["world_size"] == 2
    # run c:1 stopped after 3 steps with every rank in the same state
    c1 = json.loads((out / "runs" / "c1.json").read_text())
    assert c1["ranks_agree"] is True and c1["final"] is None and len(c1["steps"]) == 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_one_loop_serves_one_process_and_every_rank(ddp_check, tmp_path, monkeypatch):
    """``train_run`` goes through the same ``train_loop`` for a 1-process spec and for a data-parallel rank (here a
    1-rank gloo group in this process); over one rank the ordered hook and the rank-ordered loss mean change no
    value, so both runs record the same losses, final parameters and validation loss."""
    res, out = ddp_check
    assert res.returncode == 0, res.stderr
    spec = json.loads((out / "runs" / "spec.json").read_text())
    single = {k: v for k, v in spec.items() if k not in ("nproc", "ddp")}
    seen = []
    loop = train_module.train_loop

    def spy(world, *args, **kwargs):
        seen.append(type(world))
        return loop(world, *args, **kwargs)

    monkeypatch.setattr(train_module, "train_loop", spy)
    one = train_module.train_run(single, str(tmp_path / "one.json"), label="one", progress=False)
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)
    ranked = train_module.train_run(dict(spec, nproc=1), str(tmp_path / "ranked.json"), label="ranked",
                                    progress=False)
    assert seen == [SingleProcess, DataParallel]
    assert not torch.distributed.is_initialized()  # the world's exit destroyed the group
    assert "world_size" not in one and ranked["world_size"] == 1 and ranked["ranks_agree"] is True
    assert len(one["steps"]) == 6
    assert [s["loss"] for s in one["steps"]] == [s["loss"] for s in ranked["steps"]]
    assert one["final"] is not None and one["final"] == ranked["final"]
    assert one["val_loss"] == ranked["val_loss"]
    assert json.loads((tmp_path / "ranked.json").read_text())["steps"] == ranked["steps"]


class _Loss:
    """A loss that counts how often it is read on the host."""

    def __init__(self, value):
        self.value, self.reads = value, 0

    def __float__(self):
        self.reads += 1
        return self.value


@pytest.mark.parametrize("tty", [False, True])
def test_progress_reads_the_loss_only_when_it_draws(monkeypatch, capsys, tty):
    """Off a terminal the line is drawn every 10% of the steps; on one at most every REDRAW_S seconds and at the last
    step. Each draw reads the loss (a wait for the device); steps not drawn never read it."""
    import sys

    from ordered_ssd.apps.check import train

    clock = iter(range(1000))
    monkeypatch.setattr(train.time, "perf_counter", lambda: next(clock) * 0.1)  # every step 0.1 s later
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    bar = train.Progress("a", 20)
    losses = [_Loss(1.0 + i) for i in range(20)]
    for step, loss in enumerate(losses):
        bar.update(step, loss)
    err = capsys.readouterr().err
    drawn = [i for i, loss in enumerate(losses) if loss.reads]
    assert all(loss.reads <= 1 for loss in losses)
    if tty:  # the first step, then every third (0.3 s >= 0.25 s), and the last
        assert drawn == [0, 3, 6, 9, 12, 15, 18, 19]
        assert err.count("\r") == len(drawn) and err.endswith("step/s\n")
        assert "| 20/20 loss 20.0000 " in err.split("\r")[-1]
    else:
        assert drawn == [0, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19]  # the first step, then each 10%
        assert [line.split(" loss ")[1].split()[0] for line in err.splitlines()] == \
            [f"{1.0 + i:.4f}" for i in drawn]
    # a run that stops early (a restart's first part) draws its last step too
    bar = train.Progress("a", 20, stop=8)
    losses = [_Loss(1.0 + i) for i in range(8)]
    for step, loss in enumerate(losses):
        bar.update(step, loss)
    assert losses[-1].reads == 1 and "8/20 loss 8.0000" in capsys.readouterr().err


def test_an_error_in_a_step_ends_the_hashing_process(check_run, tmp_path, monkeypatch):
    """A failing step (here the loss of step 0 raises) closes the run's StepDigests before the error goes on: its
    hashing process has exited and its buffers are released, not left until this process ends."""
    from ordered_ssd.apps.check import digests as digests_module

    _, out = check_run
    spec = json.loads((out / "runs" / "spec.json").read_text())
    made = []

    class Recording(digests_module.StepDigests):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    def failing(logits, targets):
        raise RuntimeError("a step that fails")

    monkeypatch.setattr(train_module, "StepDigests", Recording)
    monkeypatch.setattr(train_module, "lm_loss", failing)
    with pytest.raises(RuntimeError, match="a step that fails"):
        train_module.train_run(spec, str(tmp_path / "r.json"), label="x", progress=False)
    (digests,) = made
    assert digests._closed and digests._worker is None and digests._capacity == -1
    assert all(slot.host is None and slot.device_buf is None for slot in digests._slots)


def test_every_batch_goes_to_the_device_through_batch_to(check_run, tmp_path, monkeypatch):
    """The loop copies each step's inputs and targets with ``batch_to`` (pinned, non-blocking on CUDA: no wait for
    the device a step), in order, and so does the validation; the values are the step's batch."""
    from ordered_ssd.apps import lm

    _, out = check_run
    spec = json.loads((out / "runs" / "spec.json").read_text())
    seen = []

    def recording(tensor, device):
        seen.append(tensor.clone())
        return lm.batch_to(tensor, device)

    monkeypatch.setattr(train_module, "batch_to", recording)
    train_module.train_run(spec, str(tmp_path / "r.json"), label="x", progress=False)
    data = ByteData(load_corpus(spec["data"], spec["data_bytes"])[0], spec["seq_len"])
    expected = [t for step in range(spec["steps"]) for t in data.batch(spec["seed"], step, spec["batch"])]
    assert len(seen) > len(expected) and len(expected) == 2 * spec["steps"]
    assert all(torch.equal(a, b) for a, b in zip(seen, expected))
    x_val, y_val = next(data.val_batches(spec["batch"], spec.get("val_windows")))
    assert torch.equal(seen[len(expected)], x_val) and torch.equal(seen[len(expected) + 1], y_val)
