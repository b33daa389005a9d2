"""FSDP2 with the ordered reduce-scatter (:mod:`ordered_ssd.fsdp`) and the sharded checkpoints
(:mod:`ordered_ssd.checkpoint`) on the CPU (gloo).

The workers run this module under ``python -m torch.distributed.run`` (``-m tests.test_fsdp --worker NAME``) with
1, 2, 4 and 8 processes. A byte-level LM with ``OrderedMamba2`` layers is ``fully_shard``-ed (each mixer, then the
whole model) and trained 3 steps on a global batch of 8 blocks: ``R`` ranks x ``8 / R`` micro-batches, clipped with
:func:`ordered_clip_grad_norm_`, AdamW. The reference is the same model without FSDP in one process, its 8 block
gradients added by :func:`ordered_ssd.tree_sum`, clipped with ``clip_grad_norm_(..., foreach=False)``.
"""
import argparse
import gc
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from ordered_ssd.apps.check.train import build_model, make_optimizer, no_decay_names
from ordered_ssd.apps.lm import ByteData, ModelConfig, lm_loss
from ordered_ssd.digest import tensor_sha256
from tests.apps.helpers import ROOT, cli_env

N_BLOCKS, STEPS, CLIP = 8, 3, 0.05
SPEC = {"seed": 0, "mixer": "ordered", "weight_decay": 0.1, "lr": 1e-2,
        "model": dict(ModelConfig(d_model=16, n_layers=2, d_state=8, headdim=8, chunk_size=8).__dict__)}


def _data() -> ByteData:
    return ByteData(bytes(range(256)) * 40, 16)


def _block(data, step, k):
    return data.batch(3, step, N_BLOCKS, offset=k, count=1)


def _digests(named) -> dict:
    return {n: tensor_sha256(t.full_tensor() if hasattr(t, "full_tensor") else t) for n, t in named}


def reference_steps() -> list:
    """Per step: the digests of the gradients (tree over the 8 blocks / 8) and of the parameters after the step,
    without FSDP, in this process."""
    from ordered_ssd import TreeGradAccumulator

    model, opt = build_model(SPEC, torch.device("cpu"))
    acc, data, out = TreeGradAccumulator(model.parameters()), _data(), []
    for step in range(STEPS):
        for k in range(N_BLOCKS):
            x, y = _block(data, step, k)
            lm_loss(model(x), y).backward()
            acc.add_block()
        acc.write_grads()
        grads = _digests((n, p.grad) for n, p in model.named_parameters())
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=False)
        opt.step()
        opt.zero_grad()
        out.append({"grads": grads, "params": _digests(model.named_parameters())})
    return out


# ----------------------------------------------------------------------------------------------- workers
def _sharded(ordered: bool = True, **fsdp_kw):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ordered_ssd.fsdp import set_ordered_reduce_scatter

    model, _ = build_model(SPEC, torch.device("cpu"))
    no_decay = no_decay_names(model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for mixer in model.mixers:
        fully_shard(mixer, mesh=mesh, **fsdp_kw)
    fully_shard(model, mesh=mesh, **fsdp_kw)
    comms = set_ordered_reduce_scatter(model) if ordered else []
    return model, make_optimizer(model, SPEC, no_decay), comms


def _train(model, opt, acc, start: int, stop: int, ordered: bool = True) -> list:
    import torch.distributed as dist

    from ordered_ssd.fsdp import fsdp_blocks, ordered_clip_grad_norm_

    rank, world = dist.get_rank(), dist.get_world_size()
    data, out = _data(), []
    for step in range(start, stop):
        for k in fsdp_blocks(rank, world, N_BLOCKS // world):
            x, y = _block(data, step, k)
            lm_loss(model(x), y).backward()
            acc.add_block()
        acc.write_grads()
        grads = _digests((n, p.grad) for n, p in model.named_parameters())
        if ordered:
            ordered_clip_grad_norm_(model.parameters(), CLIP)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=False)
        opt.step()
        opt.zero_grad()
        out.append({"grads": grads, "params": _digests(model.named_parameters())})
    return out


def _worker_train(out: str) -> None:
    """The ordered run, the default-FSDP control, and the refusals."""
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from ordered_ssd.apps.check.sequential import FSDPDefaultAccumulation
    from ordered_ssd.fsdp import (FSDPTreeAccumulator, OrderedReduceScatter, _param_groups, ordered_clip_grad_norm_,
                                  set_ordered_reduce_scatter)

    rank, world = dist.get_rank(), dist.get_world_size()
    result = {}
    model, opt, comms = _sharded()
    acc = FSDPTreeAccumulator(model)
    result["ordered"] = _train(model, opt, acc, 0, STEPS)
    result["calls"] = [c.calls for c in comms]
    result["max_buffers_held"] = acc.max_buffers_held
    # the clipped gradient and the norm equal clip_grad_norm_ on the full gradients
    x, y = _block(_data(), 0, rank)
    lm_loss(model(x), y).backward()
    acc.add_block()
    acc.write_grads()
    full = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    norm = ordered_clip_grad_norm_(model.parameters(), CLIP)
    ref = {n: torch.nn.Parameter(torch.zeros_like(g)) for n, g in full.items()}
    for n, p in ref.items():
        p.grad = full[n]
    ref_norm = torch.nn.utils.clip_grad_norm_(list(ref.values()), CLIP, foreach=False)
    clipped = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    result["clip_equal"] = bool(torch.equal(norm, ref_norm)) and all(torch.equal(clipped[n], ref[n].grad)
                                                                      for n in full)
    result["clipped"] = bool(float(ref_norm) > CLIP)
    opt.zero_grad()
    # the one-collective gather of the clip: the bytes of full_tensor(), uneven and empty shards included
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from ordered_ssd.fsdp import _full_tensors

    g = torch.Generator().manual_seed(1)
    plain = [torch.randn(5, 3, generator=g), torch.randn(1, generator=g), torch.randn(7, 2, 2, generator=g),
             torch.randn(3, generator=g, dtype=torch.float64)]
    mesh = init_device_mesh("cpu", (world,))
    sharded = [distribute_tensor(t, mesh, [Shard(0)]) for t in plain]
    got = _full_tensors(sharded + plain[:1])
    result["full_tensors_equal"] = all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, plain + plain[:1]))
    result["full_tensors_sharded"] = [list(t.to_local().shape) for t in sharded]
    # reshard_after_forward=False (the parameters stay unsharded between forward and backward): the same bits
    model, opt, _ = _sharded(reshard_after_forward=False)
    result["no_reshard"] = _train(model, opt, FSDPTreeAccumulator(model), 0, STEPS)
    # the control: FSDP's own reduce-scatter and accumulation
    model, opt, _ = _sharded(ordered=False)
    result["default"] = _train(model, opt, FSDPDefaultAccumulation(model), 0, STEPS, ordered=False)
    # refusals (every rank raises before changing anything)
    errors = {}
    try:
        _sharded(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    except ValueError as e:
        errors["bf16"] = str(e)
    # CPU offload needs pinned memory (an accelerator) to be built: its policy is put on a CPU model's group
    model, _, _ = _sharded(ordered=False)
    _param_groups(model.mixers[1])[0].offload_policy = CPUOffloadPolicy()
    try:
        set_ordered_reduce_scatter(model)
    except ValueError as e:
        errors["offload"] = str(e)
    result["unchanged_after_refusal"] = not any(isinstance(g._reduce_scatter_comm, OrderedReduceScatter)
                                                for m in (model, *model.mixers) for g in _param_groups(m))
    plain, _ = build_model(SPEC, torch.device("cpu"))
    for name, call in (("no_fsdp", lambda: set_ordered_reduce_scatter(plain)),
                       ("acc_without_ordered", lambda: FSDPTreeAccumulator(_sharded(ordered=False)[0]))):
        try:
            call()
        except ValueError as e:
            errors[name] = str(e)
    model, _, _ = _sharded()
    acc = FSDPTreeAccumulator(model)
    model.set_requires_gradient_sync(False)
    x, y = _block(_data(), 0, rank)
    lm_loss(model(x), y).backward()
    try:
        acc.add_block()
    except ValueError as e:
        errors["no_sync"] = str(e)
    result["errors"] = errors
    with open(os.path.join(out, f"train-{world}-rank{rank}.json"), "w") as fh:
        json.dump(result, fh)


def _worker_ckpt(out: str, mode: str) -> None:
    """``stop``: train to step 1, checkpoint; ``resume``: load the latest checkpoint, train to the end;
    ``refuse``: the loads that must fail."""
    import torch.distributed as dist

    from ordered_ssd.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
    from ordered_ssd.fsdp import FSDPTreeAccumulator

    rank, world = dist.get_rank(), dist.get_world_size()
    root = os.path.join(out, "ckpts")
    model, opt, _ = _sharded()
    acc = FSDPTreeAccumulator(model)
    result = {}
    if mode == "stop":
        result["steps"] = _train(model, opt, acc, 0, 1)
        path = save_checkpoint(root, 1, model, opt, app_state={"data_position": 1}, fingerprint={"world_size": world,
                                                                                                   "torch": "x"})
        result["path"] = path
    elif mode == "resume":
        manifest = load_checkpoint(latest_checkpoint(root), model, opt, fingerprint={"world_size": world, "torch": "x"})
        result["start"] = manifest["app_state"]["data_position"]
        result["saved_world"] = manifest["world_size"]
        result["steps"] = _train(model, opt, acc, result["start"], STEPS)
    else:
        errors = {}
        for case in sorted(os.listdir(os.path.join(out, "bad"))):
            try:
                load_checkpoint(os.path.join(out, "bad", case), model, opt, fingerprint={"world_size": world,
                                                                                          "torch": "x"})
            except CheckpointError as e:
                errors[case] = str(e)
        other = build_model(dict(SPEC, model=dict(SPEC["model"], d_model=32)), torch.device("cpu"))[0]
        try:
            load_checkpoint(latest_checkpoint(root), other)
        except CheckpointError as e:
            errors["other_model"] = str(e)
        result["errors"] = errors
    with open(os.path.join(out, f"ckpt-{mode}-{world}-rank{rank}.json"), "w") as fh:
        json.dump(result, fh)


# ----------------------------------------------------------------------------------------------- tests
def _run(out, nproc: int, *args) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", "-m", "tests.test_fsdp", "--out", str(out)] + list(args)
    res = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(OMP_NUM_THREADS="1"), cwd=ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]


def _read(out, name: str) -> dict:
    with open(os.path.join(out, name)) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    for world in (1, 2, 4):
        _run(out, world, "--worker", "train")
    return out, reference_steps()


def test_fsdp_gives_the_unsharded_tree_bits_on_every_world_size(trained):
    out, ref = trained
    for world in (1, 2, 4):
        ranks = [_read(out, f"train-{world}-rank{r}.json") for r in range(world)]
        for r in ranks:  # every rank sees the same (full) gradients and parameters
            assert r["ordered"] == ranks[0]["ordered"]
        assert ranks[0]["ordered"] == ref, world
        assert ranks[0]["no_reshard"] == ref, world
        # the ordered reduce-scatter ran once per module and micro-batch (FSDP skips it on one rank)
        m = N_BLOCKS // world
        assert ranks[0]["calls"] == ([STEPS * m] * 3 if world > 1 else [0, 0, 0])
        assert ranks[0]["max_buffers_held"] <= m.bit_length()
        assert ranks[0]["clip_equal"] is True and ranks[0]["clipped"] is True
        for r in ranks:
            assert r["full_tensors_equal"] is True
        if world == 4:  # 5 rows as 2, 2, 1, 0; 1 row as 1, 0, 0, 0
            assert [r["full_tensors_sharded"][0][0] for r in ranks] == [2, 2, 1, 0]
            assert [r["full_tensors_sharded"][1][0] for r in ranks] == [1, 0, 0, 0]
    assert ref[0]["grads"] != ref[1]["grads"] and ref[0]["params"] != ref[1]["params"]


def test_default_fsdp_depends_on_the_world_size(trained):
    """The control: FSDP's own reduce-scatter and left-to-right accumulation give other bits per world size."""
    out, ref = trained
    default = {w: _read(out, f"train-{w}-rank0.json")["default"] for w in (1, 2, 4)}
    assert default[1][0]["grads"] != default[4][0]["grads"]
    assert default[2][0]["grads"] != default[4][0]["grads"]
    assert default[1][0]["grads"] != ref[0]["grads"]


def test_unsupported_fsdp_options_are_refused(trained):
    out, _ = trained
    res = _read(out, "train-2-rank1.json")
    errors = res["errors"]
    assert "fully_shard module mixers.1: expected no CPU offload, got offload_policy=CPUOffloadPolicy()" in \
        errors["offload"]
    assert res["unchanged_after_refusal"] is True
    assert "expected gradients reduced in fp32 or fp64, got torch.bfloat16" in errors["bf16"]
    assert "reduce_dtype=torch.float32" in errors["bf16"]
    assert "expected a model with fully_shard-ed modules" in errors["no_fsdp"]
    assert "with the ordered reduce-scatter" in errors["acc_without_ordered"]
    assert "set_requires_gradient_sync(False)" in errors["no_sync"]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-ckpt")
    _run(out, 4, "--worker", "ckpt", "--mode", "stop")
    for world in (2, 8):
        _run(out, world, "--worker", "ckpt", "--mode", "resume")
    return out


def test_restart_on_another_world_size_continues_with_the_same_bits(restarted, trained):
    _, ref = trained
    out = restarted
    assert _read(out, "ckpt-stop-4-rank0.json")["steps"] == ref[:1]
    for world in (2, 8):
        res = _read(out, f"ckpt-resume-{world}-rank0.json")
        assert res["start"] == 1 and res["saved_world"] == 4
        assert res["steps"] == ref[1:], world


def _bad_checkpoints(out) -> None:
    """Broken copies of the step-1 checkpoint: truncated shard, changed manifest fingerprint, no manifest."""
    src = os.path.join(out, "ckpts", "step-00000001")
    bad = os.path.join(out, "bad")
    os.makedirs(bad)
    for case in ("truncated", "fingerprint", "interrupted"):
        shutil.copytree(src, os.path.join(bad, case))
    shard = sorted(n for n in os.listdir(src) if n.endswith(".distcp"))[0]
    path = os.path.join(bad, "truncated", shard)
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 7)
    mpath = os.path.join(bad, "fingerprint", "manifest.json")
    manifest = json.loads(open(mpath).read())
    manifest["fingerprint"]["torch"] = "0.0"
    with open(mpath, "w") as fh:
        json.dump(manifest, fh)
    os.unlink(os.path.join(bad, "interrupted", "manifest.json"))


def test_unusable_checkpoints_are_refused(restarted):
    from ordered_ssd.checkpoint import latest_checkpoint

    out = restarted
    _bad_checkpoints(out)
    _run(out, 2, "--worker", "ckpt", "--mode", "refuse")
    errors = [_read(out, f"ckpt-refuse-2-rank{r}.json")["errors"] for r in range(2)]
    assert errors[0] == errors[1]  # every rank raises the same error
    e = errors[0]
    assert "bytes, got" in e["truncated"] and "(truncated or changed)" in e["truncated"]
    assert "differs in {'torch': ('0.0', 'x')}" in e["fingerprint"]
    assert "without manifest.json (an interrupted write?)" in e["interrupted"]
    assert "parameter" in e["other_model"] and "(another model?)" in e["other_model"]
    # an interrupted write (a temporary directory, a step directory without manifest) is never the latest
    root = os.path.join(out, "ckpts")
    os.makedirs(os.path.join(root, ".step-00000009.tmp-abc"))
    shutil.copytree(os.path.join(out, "bad", "interrupted"), os.path.join(root, "step-00000005"))
    assert latest_checkpoint(root) == os.path.join(root, "step-00000001")
    assert latest_checkpoint(os.path.join(out, "missing")) is None


def test_save_checkpoint_checks_its_arguments(tmp_path):
    from ordered_ssd.checkpoint import save_checkpoint

    model, _ = build_model(SPEC, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"step: expected an int >= 0, got -1"):
        save_checkpoint(str(tmp_path), -1, model)
    with pytest.raises(TypeError, match="app_state / fingerprint: expected JSON-serialisable"):
        save_checkpoint(str(tmp_path), 1, model, app_state={"x": object()})
    assert os.listdir(tmp_path) == []


def test_one_process_checkpoint_round_trip(tmp_path):
    """Without a process group: save, change the model, load: the parameters and RNG state come back."""
    from ordered_ssd.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    model, opt = build_model(SPEC, torch.device("cpu"))
    x, y = _block(_data(), 0, 0)
    lm_loss(model(x), y).backward()
    opt.step()
    before = _digests(model.named_parameters())
    torch.manual_seed(123)
    save_checkpoint(str(tmp_path), 1, model, opt, app_state={"k": 1})
    expected = torch.rand(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    manifest = load_checkpoint(latest_checkpoint(str(tmp_path)), model, opt)
    assert manifest["app_state"] == {"k": 1} and manifest["world_size"] == 1 and manifest["step"] == 1
    assert _digests(model.named_parameters()) == before
    assert torch.equal(torch.rand(3), expected)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True, choices=("train", "ckpt"))
    parser.add_argument("--mode", default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if args.worker == "train":
        _worker_train(args.out)
    else:
        _worker_ckpt(args.out, args.mode)
    # The worker's FSDP modules (reference cycles through their hooks) hold the process group: collect them while
    # it is alive, so that nothing of gloo is torn down at interpreter exit (an abort seen once in CI's run)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
