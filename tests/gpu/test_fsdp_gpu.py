"""FSDP2 with the ordered reduce-scatter and the sharded checkpoints on one GPU (nccl, world size 1): the
``OrderedMamba2`` CUDA path under ``fully_shard`` gives the bits of the unsharded model, a checkpoint resumes them,
and ``ordered-ssd check --split-invariance --fsdp`` with the killed-rank restart is SPLIT-INVARIANT. (Two and more
GPUs: the two-GPU runs of ``docs/distributed.md``; the CPU tests cover 1 to 16 ranks with gloo.)"""
import argparse
import gc
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.apps.helpers import ROOT, cli_env, run_cli

pytestmark = pytest.mark.gpu

STEPS, M = 3, 4
SPEC = {"seed": 0, "mixer": "ordered", "weight_decay": 0.1, "lr": 1e-3,
        "model": dict(d_model=128, n_layers=2, d_state=32, headdim=32, ngroups=1, chunk_size=64, expand=2)}


def _worker(out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ordered_ssd import TreeGradAccumulator
    from ordered_ssd.apps.check.train import build_model, make_optimizer, no_decay_names
    from ordered_ssd.apps.lm import lm_loss
    from ordered_ssd.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from ordered_ssd.digest import tensor_sha256
    from ordered_ssd.distributed import init_distributed
    from ordered_ssd.fsdp import FSDPTreeAccumulator, ordered_clip_grad_norm_, set_ordered_reduce_scatter

    ctx = init_distributed("cuda")
    device = ctx.device
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (STEPS, M, 2, 256), generator=g).to(device)
    y = torch.randint(0, 256, (STEPS, M, 2, 256), generator=g).to(device)
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731

    def sharded():
        model, _ = build_model(SPEC, device)
        no_decay = no_decay_names(model)
        mesh = init_device_mesh("cuda", (1,))
        for mixer in model.mixers:
            fully_shard(mixer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        set_ordered_reduce_scatter(model)
        return model, make_optimizer(model, SPEC, no_decay), FSDPTreeAccumulator(model)

    def train(model, opt, acc, start, stop, clip):
        rows = []
        for s in range(start, stop):
            for k in range(M):
                lm_loss(model(x[s, k]), y[s, k]).backward()
                acc.add_block()
            acc.write_grads()
            grads = {n: tensor_sha256(full(p.grad)) for n, p in model.named_parameters()}
            clip(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            rows.append({"grads": grads, "params": {n: tensor_sha256(full(p)) for n, p in model.named_parameters()}})
        return rows

    model, opt = build_model(SPEC, device)
    plain = train(model, opt, TreeGradAccumulator(model.parameters()), 0, STEPS,
                  lambda ps, c: torch.nn.utils.clip_grad_norm_(ps, c, foreach=False))
    model, opt, acc = sharded()
    fsdp = train(model, opt, acc, 0, 1, ordered_clip_grad_norm_)
    root = os.path.join(out, "ckpts")
    save_checkpoint(root, 1, model, opt, device=device)
    model, opt, acc = sharded()
    manifest = load_checkpoint(latest_checkpoint(root), model, opt, device=device)
    fsdp += train(model, opt, acc, manifest["step"], STEPS, ordered_clip_grad_norm_)
    with open(os.path.join(out, "result.json"), "w") as fh:
        json.dump({"plain": plain, "fsdp": fsdp}, fh)
    del model, opt, acc
    gc.collect()  # FSDP modules (cycles through their hooks) hold the process group: free them before destroying it
    dist.destroy_process_group()


def test_fsdp_on_the_cuda_path_gives_the_unsharded_bits_and_resumes(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--max-restarts",
           "0", "-m", "tests.gpu.test_fsdp_gpu", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert len(result["fsdp"]) == STEPS and result["fsdp"] == result["plain"]
    assert result["plain"][0]["params"] != result["plain"][1]["params"]


def test_check_fsdp_with_a_killed_rank_on_cuda(tmp_path):
    out = tmp_path / "o"
    res = run_cli("check", "--device", "cuda", "--d-model", "128", "--n-layers", "2", "--d-state", "32",
                  "--headdim", "32", "--chunk-size", "64", "--seq-len", "256", "--batch", "4", "--steps", "4",
                  "--stop-at", "2", "--data-bytes", "200000", "--split-invariance", "--splits", "1x2", "--fsdp",
                  "--kill-rank", "--quiet", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout
    assert "ddp-1x2 (1 rank x 2 accumulation steps without FSDP) vs 1x2: identical" in res.stdout
    assert "kill (split 1x2, last rank killed in step 2, torchrun restart resumed from step 2) vs 1x2: identical" \
        in res.stdout
    assert "verdict: SPLIT-INVARIANT: 4 steps" in res.stdout
    print(res.stdout.strip().splitlines()[-2])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    _worker(parser.parse_args().out)
