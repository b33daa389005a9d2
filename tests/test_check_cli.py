"""The main job end to end on the CPU: `ordered-ssd check` with a tiny model, and its errors."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ordered_ssd.check import compare_runs
from ordered_ssd.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--device", "cpu", "--d-model", "32", "--n-layers", "1", "--d-state", "8", "--headdim", "16",
        "--chunk-size", "16", "--steps", "6", "--stop-at", "3", "--batch", "2", "--seq-len", "24",
        "--data-bytes", "60000", "--quiet"]


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "ordered_ssd", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def check_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("check")
    res = _cli("check", *TINY, "--out", str(out))
    return res, out


def test_check_is_reproducible_and_reports(check_run):
    res, out = check_run
    assert res.returncode == 0, res.stderr + res.stdout
    assert "verdict: REPRODUCIBLE: 6 steps" in res.stdout
    assert "b (fresh process) vs a:               identical" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["verdict"] == "REPRODUCIBLE"
    assert report["stop_at"] == 3 and report["spec"]["steps"] == 6
    assert "standard library" in report["data_source"]
    runs = report["runs"]
    assert set(runs) == {"a", "b", "c"}
    assert runs["a"]["losses"] == runs["b"]["losses"] == runs["c"]["losses"]
    assert len(runs["a"]["losses"]) == 6
    losses = [float.fromhex(h) for h in runs["a"]["losses"]]
    assert 4.0 < losses[0] < 6.5  # about log(256) = 5.55 nats for an untrained byte model
    assert runs["a"]["final"] == runs["c"]["final"] and len(runs["a"]["final"]) == len(report["per_step"][0]["grads"])
    assert all(len(h) == 64 for h in report["per_step"][0]["grads"].values())
    for key in ("b_vs_a", "c_vs_a"):
        c = report["comparisons"][key]
        assert c["identical"] and c["loss_equal_steps"] == 6 and c["first_grad_diff"] is None
    assert report["plot"] == "loss.png" and (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "runs" / "checkpoint-step3.pt").exists()
    assert not [p for p in os.listdir(out) if p.startswith(".tmp-")]


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
    res = _cli("_train", "--spec", spec, "--record", str(tmp_path / "r.json"), "--label", "x", "--resume", str(bad),
               "--quiet")
    assert res.returncode == 2
    assert "determinism fingerprint 0000000000000000" in res.stderr and "'torch': ('0.0.0'" in res.stderr
    assert "--allow-fingerprint-mismatch" in res.stderr
    assert not (tmp_path / "r.json").exists()
    res = _cli("_train", "--spec", spec, "--record", str(tmp_path / "r.json"), "--label", "x", "--resume", str(bad),
               "--quiet", "--allow-fingerprint-mismatch")
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    original = json.loads((out / "report.json").read_text())["runs"]["a"]
    assert [s["loss"] for s in record["steps"]] == original["losses"][3:]


def test_compare_runs_finds_the_first_difference():
    def rec(losses, grads, final):
        return {"steps": [{"step": i, "loss": l, "grads": g} for i, (l, g) in enumerate(zip(losses, grads))],
                "final": final, "val_loss": "0x1p+0"}
    a = rec(["0x1p+0", "0x1p+1", "0x1p+2"], [{"w": "x"}, {"w": "y"}, {"w": "z"}], {"w": "f"})
    b = rec(["0x1p+0", "0x1p+1", "0x1.8p+2"], [{"w": "x"}, {"w": "Y"}, {"w": "z"}], {"w": "g"})
    c = compare_runs(a, b)
    assert c["identical"] is False and c["first_loss_diff"] == 2 and c["loss_equal_steps"] == 2
    assert c["first_grad_diff"] == {"step": 1, "params": ["w"], "count": 1} and c["final_equal"] is False
    assert compare_runs(a, a)["identical"] is True


@pytest.mark.parametrize("args,message", [
    (["--data", "/nonexistent/corpus"], "--data: no such file or directory: /nonexistent/corpus"),
    (["--stop-at", "9"], "--stop-at: expected 0 < k < --steps=6, got 9"),
    (["--headdim", "24"], "--headdim: expected a divisor of 2 * d_model = 64, got 24"),
    (["--native"], "--native: the native Mamba2 control needs a CUDA device"),
    (["--device", "tpu"], "--device"),
])
def test_check_usage_errors_are_one_line(args, message, tmp_path, capsys):
    code = main(["check", *TINY, "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o" / "report.json").exists()


def test_empty_data_and_unwritable_output(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert main(["check", *TINY, "--data", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "--data: no bytes to train on in file" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["check", *TINY, "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert "--out: output directory" in err and "is not writable" in err


def test_check_on_a_user_directory(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"part{i}.txt").write_text(("The quick brown fox jumps over the lazy dog. %d\n" % i) * 300)
    out = tmp_path / "out"
    res = _cli("check", *TINY, "--data", str(corpus), "--out", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] and report["data_source"].startswith(f"directory {corpus} (3 files")


def test_env_prints_versions_and_fingerprint():
    res = _cli("env")
    assert res.returncode == 0, res.stderr
    assert "ordered-ssd: 0.1.0.dev0" in res.stdout and "fingerprint:" in res.stdout
    assert "device_type = cpu" in res.stdout or "device_type = cuda" in res.stdout
