"""``ordered-ssd check --split-invariance`` (:mod:`ordered_ssd.apps.check.split`): the CPU splits 1x4, 2x2, 4x1 of
one global batch give the same bits; the left-to-right control does not; the arguments are checked first."""
import json
import os

import pytest
import torch

from ordered_ssd.accumulate import TreeGradAccumulator
from ordered_ssd.apps.check import CheckError
from ordered_ssd.apps.check.sequential import SequentialGradAccumulator
from ordered_ssd.apps.check.split import check_splits, replay_split, run_split_check
from ordered_ssd.apps.check.spec import spec_from_args
from ordered_ssd.apps.check.train import build_model
from ordered_ssd.apps.cli import build_parser, main
from ordered_ssd.apps.lm import ByteData, lm_loss, load_corpus
from tests.apps.helpers import TINY_CHECK, run_cli

TINY = TINY_CHECK + ["--batch", "4"]
TINY_B2 = TINY_CHECK + ["--batch", "8"]  # blocks of 2 examples: the folds inside a block are exercised too


@pytest.fixture(scope="module")
def split_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("split-check")
    return run_cli("check", *TINY_B2, "--split-invariance", "--out", str(out)), out


def test_split_check_is_split_invariant_and_reports(split_check):
    res, out = split_check
    assert res.returncode == 0, res.stderr + res.stdout
    assert "splits (ranks x accumulation steps) 1x4, 2x2, 4x1; tree accumulation" in res.stdout
    assert "in blocks of 2" in res.stdout
    assert "byte-level Mamba-2 LM (1 layer, d_model 32) on cpu, 6 steps of global batch 8 x 24 bytes" in res.stdout
    assert "replay (split 2x2 stopped at 3, resumed) vs 1x4: identical" in res.stdout
    assert "verdict: SPLIT-INVARIANT: 6 steps" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["verdict"] == "SPLIT-INVARIANT" and report["first_difference"] is None
    assert report["block"] == 2 and report["reference"] == "1x4" and report["accumulate"] == "tree"
    assert [s["label"] for s in report["splits"]] == ["1x4", "2x2", "4x1"]
    assert report["replay"] == {"split": "2x2", "stop_at": 3}
    assert set(report["runs"]) == {"1x4", "2x2", "4x1", "replay"}
    assert all(c["identical"] for c in report["comparisons"].values()) and len(report["comparisons"]) == 3
    assert [report["runs"][lab]["world_size"] for lab in ("1x4", "2x2", "4x1", "replay")] == [1, 2, 4, 2]
    # every rank of every run with one intra-op thread count (the CPU default), recorded and in the header
    default = int(os.environ.get("OMP_NUM_THREADS") or 1)
    assert report["threads"] == report["spec"]["threads"] == default
    assert {run["threads"] for run in report["runs"].values()} == {default}
    assert f"; {default} thread{'' if default == 1 else 's'} per rank\n" in res.stdout
    assert report["plot"] == "loss.png" and (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(report["differences"]["pairs"]) == ["2x2 vs 1x4", "4x1 vs 1x4", "replay vs 1x4"]
    assert all(pair[key] == ["identical bits"] * 6 for pair in report["differences"]["pairs"].values()
               for key in ("loss", "grads", "params"))
    # every step's loss, gradient and parameter digests, per parameter, are equal in every record
    records = {name: json.loads((out / "runs" / f"{name}.json").read_text())
               for name in ("1x4", "2x2", "4x1", "2x2-replay1", "2x2-replay2")}
    ref = records["1x4"]["steps"]
    assert len(ref) == 6 and all(len(s["grads"]) == len(s["params"]) == len(records["1x4"]["param_names"])
                                 for s in ref)
    for name in ("2x2", "4x1"):
        assert records[name]["steps"] == ref and records[name]["ranks_agree"] is True
    # the resumed run's record carries the steps before the restart (from the checkpoint) and its own after it
    assert records["2x2-replay1"]["steps"] == ref[:3] and records["2x2-replay2"]["steps"] == ref
    assert records["2x2-replay2"]["restarts"] == [3] and records["2x2-replay2"]["start"] == 3
    assert ref[0]["grads"] != ref[1]["grads"] and ref[0]["params"] != ref[1]["params"]
    ckpt = out / "runs" / "checkpoints-2x2"
    assert sorted(os.listdir(ckpt)) == ["step-00000003"] and (ckpt / "step-00000003" / "manifest.json").exists()
    assert not [p for p in os.listdir(out) if p.startswith(".tmp-")]


def test_split_loss_is_the_tree_of_the_block_losses(split_check):
    """Step 0: the recorded loss is ((l0 + l1) + (l2 + l3)) / 4 of the four blocks' mean losses (2 examples each)."""
    res, out = split_check
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    spec = report["spec"]
    torch.set_num_threads(report["threads"])  # restored by conftest
    model, _ = build_model(spec, torch.device("cpu"))
    data = ByteData(load_corpus(spec["data"], spec["data_bytes"])[0], spec["seq_len"])
    with torch.no_grad():
        ls = [lm_loss(model(x), y)
              for x, y in (data.batch(spec["seed"], 0, 8, offset=2 * j, count=2) for j in range(4))]
    assert float.fromhex(report["runs"]["4x1"]["losses"][0]) == float(((ls[0] + ls[1]) + (ls[2] + ls[3])) / 4)


def test_sequential_control_is_not_split_invariant(tmp_path):
    out = tmp_path / "o"
    res = run_cli("check", *TINY_CHECK, "--batch", "4", "--steps", "2", "--stop-at", "1", "--split-invariance",
                  "--splits", "1x4,2x2", "--accumulate", "sequential", "--out", str(out))
    assert res.returncode == 1, res.stderr + res.stdout
    assert "verdict: NOT SPLIT-INVARIANT: first difference at step 0: gradient (" in res.stdout
    assert "of run 2x2 differs from 1x4" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is False and report["verdict"] == "NOT SPLIT-INVARIANT"
    first = report["first_difference"]
    assert first["run"] == "2x2_vs_1x4" and first["step"] == 0 and first["what"] == "gradient" and first["tensors"]
    assert report["runs"]["2x2"]["ranks_agree"] is True  # reproducible, only not split-invariant
    # loss.png: 2x2 (and its replay) against 1x4: the forward of step 0 agrees, its gradients and the parameters
    # after it do not (the largest relative difference of a differing tensor's L2 norm, or digests differing with
    # equal norms)
    diffs = report["differences"]
    assert diffs["grads_measure"] == diffs["params_measure"] == "norm"
    assert list(diffs["pairs"]) == ["2x2 vs 1x4", "replay vs 1x4"]
    for pair in diffs["pairs"].values():
        assert pair["loss"][0] == "identical bits"
        values = pair["grads"] + pair["params"]
        assert all(v == "bits differ, norms equal" or (isinstance(v, float) and 0 < v < 1e-3) for v in values)
        assert any(isinstance(v, float) for v in pair["grads"])


def _block_grads(n_blocks=4):
    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    model, _ = build_model(spec, torch.device("cpu"))
    data = ByteData(load_corpus(spec["data"], spec["data_bytes"])[0], spec["seq_len"])
    grads = []
    for j in range(n_blocks):
        x, y = data.batch(spec["seed"], 0, n_blocks, offset=j, count=1)
        model.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return model, grads


def _accumulate(model, grads, acc):
    for block in grads:
        for p, g in zip(model.parameters(), block):
            p.grad = g.clone()
        acc.add_block()
    acc.write_grads()
    return [p.grad.clone() for p in model.parameters()]


def test_left_to_right_accumulation_depends_on_the_split():
    """In one process: the control's (1, 4) sum ((g0+g1)+g2)+g3 and its (2, 2) sum ((g0+g1)/2 + (g2+g3)/2)/2 (the
    rank-ordered mean of the two ranks' sums, emulated) differ in bits; the tree accumulator's (1, 4) result is the
    (2, 2) one."""
    model, grads = _block_grads()
    seq_14 = _accumulate(model, grads, SequentialGradAccumulator(model.parameters()))
    halves = [_accumulate(model, grads[r * 2:(r + 1) * 2], SequentialGradAccumulator(model.parameters()))
              for r in range(2)]
    seq_22 = [(torch.zeros_like(a) + a + b) / 2 for a, b in zip(*halves)]
    tree_14 = _accumulate(model, grads, TreeGradAccumulator(model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(seq_14, seq_22))
    assert all(torch.equal(a, b) for a, b in zip(tree_14, seq_22))


@pytest.mark.parametrize("args,message", [
    (["--batch", "6"], "--batch: the global batch 6 does not split into R*M = 4 blocks of equal size"),
    (["--splits", "3x1,1x3"], "split 3x1: the ranks R and the accumulation steps M must be powers of two"),
    (["--splits", "1x4,2x1"], "every split must have the same number of blocks R*M"),
    (["--splits", "2x2"], "--splits: expected at least two different splits (one is enough with --fsdp"),
    (["--splits", "2x2,2x2"], "expected different splits"),
    (["--splits", "2by2,1x4"], "expected splits RxM separated by commas"),
    (["--nproc", "2"], "--split-invariance: not with --nproc"),
])
def test_split_usage_errors_are_one_line(args, message, tmp_path, capsys):
    with_flag = ["--split-invariance"] + args
    try:
        code = main(["check", *TINY_CHECK, "--batch", "4", "--out", str(tmp_path / "o"), *with_flag])
    except SystemExit as e:  # argparse's type errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "o").exists()


def test_split_options_need_the_flag(tmp_path, capsys):
    assert main(["check", *TINY, "--splits", "1x2,2x1", "--out", str(tmp_path / "o")]) == 2
    assert "--splits: only with --split-invariance" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    spec = {"device": "cuda", "batch": 8}
    with pytest.raises(CheckError, match=r"--splits: split 2x1 needs 2 GPUs \(one per rank\), 1 visible"):
        check_splits(spec, [(1, 2), (2, 1)])
    assert check_splits(spec, [(1, 2), (1, 2)]) == 4
    with pytest.raises(CheckError, match="with --split-invariance give cuda, not cuda:1"):
        check_splits(dict(spec, device="cuda:1"), [(1, 2), (2, 1)])


def test_run_split_check_checks_before_writing(tmp_path):
    spec = spec_from_args(build_parser().parse_args(["check", *TINY]))
    with pytest.raises(CheckError, match="--stop-at: expected 0 < k < --steps=6, got 6"):
        run_split_check(spec, str(tmp_path / "o"), splits=None, stop_at=6, progress=False)
    with pytest.raises(CheckError, match="--accumulate: expected one of tree, sequential"):
        run_split_check(spec, str(tmp_path / "o"), splits=None, stop_at=3, accumulate="ltr", progress=False)
    assert not (tmp_path / "o").exists()
    assert replay_split([(1, 4), (2, 2), (4, 1)]) == (2, 2) and replay_split([(1, 2), (2, 1)]) == (2, 1)
