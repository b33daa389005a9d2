"""``ordered-ssd check --layer mamba3``: the byte LM with ``OrderedMamba3`` mixers, end to end on the CPU (a, b and
the restart replay c; FSDP2 split invariance), its spec and report, and a checkpoint of the other layer kind refused
on resume. The refusals are rows of test_misuse.py (section 7), the parameter count its
``test_the_parameter_count_of_the_estimate_is_the_model_s``."""
import json

import pytest
import torch

from ordered_ssd.apps.check.train import build_model
from ordered_ssd.modules.mamba3 import OrderedMamba3
from tests.apps.helpers import run_cli

#: a small Mamba-3 check (the CPU defaults reduced; 4 steps, restart at step 2)
MAMBA3 = ["--device", "cpu", "--layer", "mamba3", "--d-model", "32", "--n-layers", "1", "--d-state", "8",
          "--headdim", "16", "--chunk-size", "16", "--seq-len", "32", "--steps", "4", "--data-bytes", "60000",
          "--quiet"]


@pytest.fixture(scope="module")
def mamba3_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("mamba3-check")
    return run_cli("check", *MAMBA3, "--batch", "2", "--out", str(out)), out


def test_a_mamba3_check_is_reproducible_with_its_restart(mamba3_check):
    res, out = mamba3_check
    assert res.returncode == 0, res.stderr + res.stdout
    assert res.stdout.startswith("ordered-ssd check: 0.02M-parameter byte-level Mamba-3 LM (1 layer, d_model 32) on "
                                 "cpu, 4 steps of batch 2 x 32 bytes\n"), res.stdout
    assert "b (fresh process) vs a:               identical" in res.stdout
    assert "c (stopped at 2, resumed) vs a:    identical" in res.stdout
    assert ("verdict: REPRODUCIBLE: byte-level Mamba-3 LM, 4 steps, loss, per-parameter gradient and final parameter "
            "digests identical across 3 runs (fresh process; restart at step 2)") in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["verdict"] == "REPRODUCIBLE" and report["stop_at"] == 2
    assert report["spec"]["model"]["layer"] == "mamba3" and report["model"]["layer"] == "mamba3"
    runs = report["runs"]
    assert runs["a"]["losses"] == runs["b"]["losses"] == runs["c"]["losses"] and len(runs["a"]["losses"]) == 4
    assert runs["a"]["final"] == runs["b"]["final"] == runs["c"]["final"]
    for key in ("b_vs_a", "c_vs_a"):
        assert report["comparisons"][key]["identical"]
    # the Mamba-3 layer's own parameters were trained and compared (no conv1d, no A_log)
    names = sorted(report["per_step"][0]["grads"])
    assert {"mixers.0.B_bias", "mixers.0.C_bias", "mixers.0.B_norm.weight", "mixers.0.in_proj.weight"} <= set(names)
    assert not [n for n in names if "conv1d" in n or "A_log" in n]
    assert report["n_params"] == sum(p.numel() for p in build_model(report["spec"], torch.device("meta"))[0]
                                     .parameters())
    ckpt = torch.load(out / "runs" / "checkpoint-step2.pt", weights_only=True)
    assert json.loads(ckpt["spec"])["model"]["layer"] == "mamba3"


def test_build_model_makes_ordered_mamba3_mixers_and_mamba2_specs_name_no_layer(check_run):
    spec = {"seed": 0, "mixer": "ordered", "lr": 1e-3, "weight_decay": 0.1,
            "model": dict(d_model=32, n_layers=2, d_state=8, headdim=16, ngroups=1, chunk_size=16, expand=2,
                          layer="mamba3")}
    model, _ = build_model(spec, torch.device("cpu"))
    assert all(isinstance(m, OrderedMamba3) for m in model.mixers) and len(model.mixers) == 2
    assert [m.layer_idx for m in model.mixers] == [0, 1] and model.mixers[0].num_rope_angles == 2
    _, out = check_run  # a mamba2 check: its spec as before --layer (no "layer" key), its report names the kind
    report = json.loads((out / "report.json").read_text())
    assert "layer" not in report["spec"]["model"] and report["model"]["layer"] == "mamba2"
    assert "layer" not in json.loads((out / "runs" / "spec.json").read_text())["model"]


def test_a_checkpoint_of_the_other_layer_kind_is_refused_on_resume(check_run, tmp_path):
    _, out = check_run  # its checkpoint was written for Mamba-2 layers
    spec = json.loads((out / "runs" / "spec.json").read_text())
    spec["model"]["layer"] = "mamba3"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    res = run_cli("_train", "--spec", str(path), "--record", str(tmp_path / "r.json"), "--label", "x", "--quiet",
                  "--resume", str(out / "runs" / "checkpoint-step3.pt"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "expected one written for this run's model (chunk_size=16, d_model=32, d_state=8, expand=2, headdim=16, " \
           "layer=mamba3, n_layers=1, ngroups=1), got one written for another model (chunk_size=16, d_model=32, " \
           "d_state=8, expand=2, headdim=16, n_layers=1, ngroups=1)" in res.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_mamba3_check_is_split_invariant_under_fsdp(tmp_path):
    """--nproc, --split-invariance and --fsdp work unchanged with Mamba-3 layers: here FSDP2 (fully_shard on every
    mixer) on split 2x2, with the DDP-free run of the same split and the replay from a sharded checkpoint."""
    out = tmp_path / "out"
    res = run_cli("check", *MAMBA3, "--batch", "4", "--split-invariance", "--fsdp", "--splits", "2x2",
                  "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout
    assert "byte-level Mamba-3 LM (1 layer, d_model 32) on cpu" in res.stdout
    assert "verdict: SPLIT-INVARIANT: 4 steps" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["layer"] == "mamba3" and set(report["runs"]) == {"2x2", "ddp-2x2", "replay"}
