"""What differs between one process and one rank (:mod:`ordered_ssd.apps.check.world`): checkpoint formats and
world sizes, the torchrun environment."""
import json
import subprocess
import sys

from tests.apps.helpers import cli_env, run_cli


def test_ddp_checkpoint_refuses_a_one_process_resume(ddp_check, tmp_path):
    _, out = ddp_check
    spec = json.loads((out / "runs" / "spec.json").read_text())
    del spec["nproc"], spec["ddp"]
    one = tmp_path / "spec-1.json"
    one.write_text(json.dumps(spec))
    res = run_cli("_train", "--spec", str(one), "--record", str(tmp_path / "r.json"), "--label", "x",
               "--resume", str(out / "runs" / "checkpoint-step3.pt"), "--quiet")
    assert res.returncode == 2
    assert "was written by a 2-process run (--nproc 2)" in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "r.json").exists()


def test_ddp_checkpoint_refuses_another_world_size(ddp_check, tmp_path):
    _, out = ddp_check
    spec = json.loads((out / "runs" / "spec.json").read_text())
    spec["nproc"] = 1
    one = tmp_path / "spec-1.json"
    one.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--max-restarts",
           "0", "-m", "ordered_ssd", "_train", "--spec", str(one), "--record", str(tmp_path / "r.json"), "--label",
           "x", "--resume", str(out / "runs" / "checkpoint-step3.pt"), "--quiet", "--allow-fingerprint-mismatch"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(OMP_NUM_THREADS="1"), timeout=600)
    assert res.returncode != 0
    assert ("ordered-ssd _train: error: checkpoint " + str(out / "runs" / "checkpoint-step3.pt") +
            " was written by 2 processes, this run has 1") in res.stderr
    assert not (tmp_path / "r.json").exists()


def test_ddp_train_outside_torchrun_is_a_clear_error(ddp_check, tmp_path):
    _, out = ddp_check
    env = cli_env()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    res = run_cli("_train", "--spec", str(out / "runs" / "spec.json"), "--record", str(tmp_path / "r.json"),
               "--label", "x", "--quiet", env=env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "not launched by torchrun" in res.stderr and "torch.distributed.run --nproc-per-node" in res.stderr
    assert not (tmp_path / "r.json").exists()
