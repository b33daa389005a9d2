"""Data-parallel `ordered-ssd check --nproc N` on the CPU (gloo), and the ordered gradient hook.

The multi-process parts run under ``python -m torch.distributed.run``: the end-to-end check (2 processes), and
this file itself as a torchrun script (``--worker hook``, 3 processes: with 2 ranks the fold order cannot show,
since ``a + b == b + a`` in IEEE arithmetic) for the hook's unit test.
"""
import gc
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # when torchrun runs this file as a script
    sys.path.insert(0, ROOT)

from ordered_ssd.check import CheckError, _build, run_check  # noqa: E402
from ordered_ssd.cli import main  # noqa: E402
from ordered_ssd.digest import tensor_sha256  # noqa: E402
from ordered_ssd.distributed import (TEST_SKEW_ENV, fingerprint_mismatch_message, shard_rows)  # noqa: E402
from ordered_ssd.fingerprint import determinism_fingerprint  # noqa: E402
from ordered_ssd.lm import ByteData, ModelConfig, load_corpus, lm_loss  # noqa: E402

TINY = ["--device", "cpu", "--d-model", "32", "--n-layers", "1", "--d-state", "8", "--headdim", "16",
        "--chunk-size", "16", "--steps", "6", "--stop-at", "3", "--batch", "4", "--seq-len", "24",
        "--data-bytes", "60000", "--quiet"]


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(TEST_SKEW_ENV, None)
    env.update(extra)
    return env


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ordered_ssd", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=600)


# ----------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def ddp_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-check")
    res = _cli("check", *TINY, "--nproc", "2", "--out", str(out))
    return res, out


def test_ddp_check_is_reproducible_and_reports(ddp_check):
    res, out = ddp_check
    assert res.returncode == 0, res.stderr + res.stdout
    assert "on cpu x 2 processes (gloo, DistributedDataParallel, ordered gradient hook)" in res.stdout
    assert "global batch 4 (2 rows per rank)" in res.stdout
    assert "b (fresh processes) vs a:             identical" in res.stdout
    assert "ranks agree (loss, gradient and parameter bits on every rank): yes, in every run" in res.stdout
    assert "verdict: REPRODUCIBLE: 6 steps, world size 2," in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["world_size"] == 2 and report["backend"] == "gloo"
    assert report["ranks_agree"] is True
    assert report["fingerprint_info"]["world_size"] == 2
    assert report["spec"]["nproc"] == 2 and report["spec"]["ddp"]["bucket_cap_mb"] == 25.0
    runs = report["runs"]
    assert set(runs) == {"a", "b", "c"}
    assert runs["a"]["losses"] == runs["b"]["losses"] == runs["c"]["losses"] and len(runs["a"]["losses"]) == 6
    assert runs["a"]["final"] == runs["b"]["final"] == runs["c"]["final"]
    assert runs["a"]["val_loss"] == runs["b"]["val_loss"] == runs["c"]["val_loss"]
    for lab in ("a", "b", "c"):
        assert runs[lab]["world_size"] == 2 and runs[lab]["ranks_agree"] is True
        assert runs[lab]["ranks_disagreeing"] == []
        assert len(runs[lab]["rank_s_per_step"]) == 2 and all(t > 0 for t in runs[lab]["rank_s_per_step"])
    for key in ("b_vs_a", "c_vs_a"):
        c = report["comparisons"][key]
        assert c["identical"] and c["loss_equal_steps"] == 6 and c["first_grad_diff"] is None
    # per-step gradient digests (after the hook's reduction) for every parameter
    names = json.loads((out / "runs" / "a.json").read_text())["param_names"]
    assert len(report["per_step"]) == 6 and all(sorted(s["grads"]) == sorted(names) for s in report["per_step"])
    assert all(len(h) == 64 for h in report["per_step"][0]["grads"].values())
    # the parameters moved, and the same way in every run
    assert report["per_step"][0]["grads"] != report["per_step"][1]["grads"]
    assert not [p for p in os.listdir(out) if p.startswith(".tmp-")]
    assert not [p for p in os.listdir(out / "runs") if p.startswith(".tmp-")]


def test_ddp_loss_is_the_global_batch_mean(ddp_check):
    """Step 0 (same initial parameters everywhere): the recorded loss, the rank-ordered mean of the ranks' mean
    losses, equals the 1-process mean over the whole global batch up to rounding."""
    res, out = ddp_check
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    spec = report["spec"]
    torch.set_num_threads(report["fingerprint_info"]["threads"])  # the ranks' thread count (restored by conftest)
    model, _ = _build(spec, torch.device("cpu"))
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


def test_ddp_checkpoint_refuses_a_one_process_resume(ddp_check, tmp_path):
    _, out = ddp_check
    spec = json.loads((out / "runs" / "spec.json").read_text())
    del spec["nproc"], spec["ddp"]
    one = tmp_path / "spec-1.json"
    one.write_text(json.dumps(spec))
    res = _cli("_train", "--spec", str(one), "--record", str(tmp_path / "r.json"), "--label", "x",
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
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(OMP_NUM_THREADS="1"), timeout=600)
    assert res.returncode != 0
    assert ("ordered-ssd _train: error: checkpoint " + str(out / "runs" / "checkpoint-step3.pt") +
            " was written by 2 processes, this run has 1") in res.stderr
    assert not (tmp_path / "r.json").exists()


def test_ddp_train_outside_torchrun_is_a_clear_error(ddp_check, tmp_path):
    _, out = ddp_check
    env = _env()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    res = _cli("_train", "--spec", str(out / "runs" / "spec.json"), "--record", str(tmp_path / "r.json"),
               "--label", "x", "--quiet", env=env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "not launched by torchrun" in res.stderr and "torch.distributed.run --nproc-per-node" in res.stderr
    assert not (tmp_path / "r.json").exists()


# ----------------------------------------------------------------------------------------------- errors
def test_rank_fingerprint_mismatch_stops_every_rank(tmp_path):
    out = tmp_path / "o"
    res = _cli("check", *TINY, "--nproc", "2", "--out", str(out), env=_env(**{TEST_SKEW_ENV: "1:threads=99"}))
    assert res.returncode == 2, res.stdout + res.stderr
    err = res.stderr
    assert err.count("\n") == 1, err
    assert err.startswith("ordered-ssd check: error: run a (2 processes under torchrun) failed with exit code")
    assert "the 2 ranks do not share one determinism fingerprint: rank 1 (" in err
    assert ") differs from rank 0 (" in err and "'threads': (" in err and "'99')" in err
    assert "they would not compute the same bits, stopping" in err
    assert not (out / "report.json").exists() and not (out / "runs" / "a.json").exists()


def test_fingerprint_mismatch_message_groups_ranks():
    a = determinism_fingerprint("cpu", world_size=4)
    b = dict(a, threads=99)
    c = dict(a, torch="0.0.0")
    assert fingerprint_mismatch_message([a, a, a, a]) is None
    msg = fingerprint_mismatch_message([a, b, c, b])
    assert msg.startswith("the 4 ranks do not share one determinism fingerprint: ranks 1, 3 (")
    assert "differ from rank 0 (" in msg and f"'threads': ({a['threads']}, 99)" in msg
    assert "; rank 2 (" in msg and f"'torch': ('{a['torch']}', '0.0.0')" in msg and "\n" not in msg


def test_uneven_global_batch_is_a_one_line_error(tmp_path, capsys):
    code = main(["check", *TINY, "--nproc", "2", "--batch", "3", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert ("ordered-ssd check: error: --batch: the global batch 3 is not divisible by --nproc 2 (rank r takes "
            "rows [r*B/N, (r+1)*B/N) of every step's batch)") in err
    assert not (tmp_path / "o").exists()


def test_nproc_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", *TINY, "--nproc", "0", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "argument --nproc: expected a positive integer, got 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_run_check_rejects_uneven_batch_before_writing(tmp_path):
    from ordered_ssd.cli import _build_parser, _spec_from_args

    spec = _spec_from_args(_build_parser().parse_args(["check", *TINY]))
    with pytest.raises(CheckError, match=r"--batch: the global batch 4 is not divisible by --nproc 3"):
        run_check(spec, str(tmp_path / "o"), stop_at=3, native=False, progress=False, nproc=3)
    assert not (tmp_path / "o").exists()


def test_shard_rows():
    assert [shard_rows(8, 4, r) for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert shard_rows(5, 1, 0) == (0, 5)
    with pytest.raises(ValueError, match=r"the global batch 6 is not divisible by the number of processes 4"):
        shard_rows(6, 4, 0)
    with pytest.raises(ValueError, match=r"rank: expected 0 <= rank < 2, got 2"):
        shard_rows(4, 2, 2)
    with pytest.raises(TypeError, match="global_batch: expected an int"):
        shard_rows(4.0, 2, 0)


def test_ddp_batch_rows_are_the_documented_slice():
    data = ByteData(bytes(range(256)) * 40, 16)
    x, y = data.batch(3, 7, 6)
    for r in range(3):
        off, cnt = shard_rows(6, 3, r)
        xr, yr = data.batch(3, 7, 6, offset=off, count=cnt)
        assert torch.equal(xr, x[2 * r:2 * r + 2]) and torch.equal(yr, y[2 * r:2 * r + 2])


# ----------------------------------------------------------------------------------------------- the hook
@pytest.fixture(scope="module")
def hook_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("hook")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
           "--max-restarts", "0", os.path.abspath(__file__), "--worker", "hook", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(OMP_NUM_THREADS="1"), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[:6000]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]


def test_ordered_all_reduce_is_the_rank_ordered_lexical_fold(hook_results):
    for dtype in ("float32", "float64", "bfloat16"):
        first = hook_results[0]["reduce"][dtype]
        # every rank holds the same bits, and they are lexical_fold(rank 0, rank 1, rank 2) / 3, cast once
        assert all(r["reduce"][dtype]["hook"] == first["hook"] for r in hook_results)
        assert first["hook"] == first["expected"]
        if dtype != "bfloat16":
            # the test data is order-sensitive: folding the ranks the other way round gives other bits
            assert first["reversed"] != first["expected"]
        else:
            # (after the cast to bf16 the order rarely shows; but accumulating in bf16 would give other bits)
            assert first["bf16_accumulation"] != first["expected"]
        # a -0.0 in every rank gives +0.0 (the fold starts from +0.0)
        assert first["hook_elem0_hex"] == "0x0.0p+0"
    # N * numel gathered elements in the tensor's dtype; the reduction itself in fp32
    assert hook_results[0]["reduce"]["bfloat16"]["expected_from_fp32_fold"] is True


def test_ddp_hook_gradients_equal_the_fold_of_rank_gradients(hook_results):
    first = hook_results[0]["ddp"]
    for cap in ("bucket_cap_mb=25", "bucket_cap_mb=0.001"):
        for step in ("0", "1", "2"):  # steps 1 and 2 run with the buckets DDP rebuilt at step 1
            got = first[cap][step]
            assert got == first["expected"][step], (cap, step)
            assert all(r["ddp"][cap][step] == got for r in hook_results)
    assert first["n_buckets"]["bucket_cap_mb=25"] == 1 and first["n_buckets"]["bucket_cap_mb=0.001"] >= 2
    # DDP's default all-reduce gives the same mean up to rounding (same scaling: gradient of the global mean)
    assert first["max_rel_diff_vs_default_allreduce"] < 1e-5


# ----------------------------------------------------------------------------------------------- worker side
def _rank_tensor(k: int, dtype: torch.dtype, n: int = 4099) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + k)
    mags = 10.0 ** torch.randint(-6, 7, (n,), generator=g).double()
    t = (torch.randn(n, generator=g, dtype=torch.float64) * mags).to(dtype)
    t[0] = -0.0
    return t


def _worker_hook(out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ordered_ssd.check import _build
    from ordered_ssd.distributed import ordered_all_reduce, register_ordered_hook
    from ordered_ssd.fold import accumulation_dtype, lexical_fold

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    result = {"reduce": {}, "ddp": {}}
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        parts = [_rank_tensor(k, dtype) for k in range(n)]
        mine = parts[rank].clone()
        ordered_all_reduce(mine).wait()
        acc = accumulation_dtype(dtype)
        expected = (lexical_fold(parts, dtype=acc) / n).to(dtype)
        rev = (lexical_fold(parts[::-1], dtype=acc) / n).to(dtype)
        manual = ((((torch.zeros(parts[0].shape, dtype=acc) + parts[0].to(acc)) + parts[1].to(acc))
                   + parts[2].to(acc)) / 3).to(dtype)
        result["reduce"][str(dtype).split(".")[1]] = {
            "hook": tensor_sha256(mine), "expected": tensor_sha256(expected), "reversed": tensor_sha256(rev),
            "hook_elem0_hex": float(mine[0]).hex(), "expected_from_fp32_fold": bool(torch.equal(manual, expected)),
            "bf16_accumulation": tensor_sha256((((parts[0] + parts[1]) + parts[2]) / 3).to(dtype))}

    spec = {"seed": 0, "mixer": "ordered", "weight_decay": 0.1, "lr": 1e-3,
            "model": dict(ModelConfig(d_model=16, n_layers=1, d_state=8, headdim=8, chunk_size=8).__dict__)}
    data = ByteData(bytes(range(256)) * 40, 16)
    B = 2 * n

    def local_grads(model, step, k, wrapper=None):
        off, cnt = shard_rows(B, n, k)
        x, y = data.batch(0, step, B, offset=off, count=cnt)
        model.zero_grad(set_to_none=True)
        lm_loss((wrapper or model)(x), y).backward()
        return [p.grad.detach().clone() for p in model.parameters()]

    ref, _ = _build(spec, torch.device("cpu"))
    result["ddp"]["expected"] = {}
    for step in (0, 1, 2):
        per_rank = [local_grads(ref, step, k) for k in range(n)]
        folded = [(lexical_fold([g[i] for g in per_rank], dtype=torch.float32) / n).to(per_rank[0][i].dtype)
                  for i in range(len(per_rank[0]))]
        result["ddp"]["expected"][str(step)] = [tensor_sha256(t) for t in folded]
        if step == 0:
            expected0 = folded
    result["ddp"]["n_buckets"] = {}
    for cap in (25, 0.001):
        model, _ = _build(spec, torch.device("cpu"))
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
        register_ordered_hook(ddp)
        key = f"bucket_cap_mb={cap}"
        result["ddp"][key] = {str(s): [tensor_sha256(g) for g in local_grads(model, s, rank, ddp)] for s in (0, 1, 2)}
        # the buckets DDP rebuilt at the second iteration (steps 1 and 2 ran with them)
        rebuilt = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
        result["ddp"]["n_buckets"][key] = len([b for b in str(rebuilt).split(",") if b.strip()])
    model, _ = _build(spec, torch.device("cpu"))
    plain = DistributedDataParallel(model)  # DDP's default all-reduce
    got = local_grads(model, 0, rank, plain)
    result["ddp"]["max_rel_diff_vs_default_allreduce"] = max(
        float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(got, expected0))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    del ddp, plain
    gc.collect()  # DDP reducers hold the process group: release them before destroying it
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["hook"], required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    _worker_hook(a.out)
