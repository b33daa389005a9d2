"""The ordered gradient hook and its helpers (:mod:`ordered_ssd.distributed`) on the CPU (gloo).

The hook's unit test runs this module under ``python -m torch.distributed.run`` (``-m tests.test_distributed
--worker hook``, 3 processes: with 2 ranks the fold order cannot show, since ``a + b == b + a`` in IEEE
arithmetic). The split-invariance tests (``--worker split``) run in one spawn of 4 processes: the world (R = 4), two
subgroups of 2 (R = 2) and four of 1 (R = 1). ``ordered-ssd check --nproc N`` end to end is tested in ``tests/apps/check/``.
"""
import gc
import json
import os
import subprocess
import sys

import pytest
import torch

from ordered_ssd.apps.check.train import build_model
from ordered_ssd.apps.lm import ByteData, ModelConfig, lm_loss
from ordered_ssd.digest import tensor_sha256
from ordered_ssd.distributed import fingerprint_mismatch_message, shard_rows
from ordered_ssd.fingerprint import determinism_fingerprint
from tests.apps.helpers import ROOT, cli_env


# ----------------------------------------------------------------------------------------------- helpers
def test_fingerprint_mismatch_message_groups_ranks():
    a = determinism_fingerprint("cpu", world_size=4)
    b = dict(a, threads=99)
    c = dict(a, torch="0.0.0")
    assert fingerprint_mismatch_message([a, a, a, a]) is None
    msg = fingerprint_mismatch_message([a, b, c, b])
    assert msg.startswith("the 4 ranks do not share one determinism fingerprint: ranks 1, 3 (")
    assert "differ from rank 0 (" in msg and f"'threads': ({a['threads']}, 99)" in msg
    assert "; rank 2 (" in msg and f"'torch': ('{a['torch']}', '0.0.0')" in msg and "\n" not in msg


def test_shard_rows():
    assert [shard_rows(8, 4, r) for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert shard_rows(5, 1, 0) == (0, 5)
    with pytest.raises(ValueError, match=r"the global batch 6 is not divisible by the number of processes 4"):
        shard_rows(6, 4, 0)
    with pytest.raises(ValueError, match=r"rank: expected 0 <= rank < 2, got 2"):
        shard_rows(4, 2, 2)
    with pytest.raises(TypeError, match="global_batch: expected an int"):
        shard_rows(4.0, 2, 0)


# ----------------------------------------------------------------------------------------------- the hook
def _run_workers(out, worker: str, nproc: int) -> list:
    """This file's ``worker`` on ``nproc`` gloo processes under torchrun; every rank's JSON result."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", "-m", "tests.test_distributed", "--worker", worker, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(OMP_NUM_THREADS="1"), cwd=ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[:6000]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def hook_results(tmp_path_factory):
    return _run_workers(tmp_path_factory.mktemp("hook"), "hook", 3)


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


# ----------------------------------------------------------------------------------------------- split invariance
@pytest.fixture(scope="module")
def split_results(tmp_path_factory):
    return _run_workers(tmp_path_factory.mktemp("split"), "split", 4)


def test_reduce_gives_the_same_bits_for_every_split(split_results):
    """(R, m) in {(1, 4), (2, 2), (4, 1)} and {(1, 8), (2, 4), (4, 2)}: ``reduce`` and the gradients after
    ``write_grads`` have the bits of one process's ``tree_sum`` over all blocks, on every rank."""
    first = split_results[0]["split"]
    for blocks in ("4", "8"):
        expected = first["expected"][blocks]
        assert first["left_to_right"][blocks] != expected["reduce"]  # the test data is order-sensitive
        for R in ("1", "2", "4"):
            for res in split_results:
                got = res["split"]["got"][blocks][R]
                assert got["reduce"] == expected["reduce"], (blocks, R)
                assert got["grads"] == expected["grads"], (blocks, R)
        # the old two-level scheme (local left-to-right sums, then the rank-ordered DDP hook) is not split-invariant
        assert first["two_level_4_ranks"][blocks] != expected["grads"]


def test_ddp_no_sync_and_bf16_autocast_give_the_same_bits_for_every_split(split_results):
    """The documented use with DistributedDataParallel (every block under no_sync) under CPU bf16 autocast over
    fp32 parameters: the gradients after write_grads have the bits of one process's tree for R = 1, 2, 4."""
    expected = split_results[0]["ddp_autocast"]["expected"]
    assert split_results[0]["ddp_autocast"]["left_to_right"] != expected  # the data is order-sensitive
    for res in split_results:
        for R in ("1", "2", "4"):
            assert res["ddp_autocast"]["got"][R] == expected, R


def test_ranks_that_disagree_all_raise_the_same_error(split_results):
    messages = [res["mismatch"] for res in split_results]
    assert messages[0] is not None and "the ranks differ in (blocks, gradient elements" in messages[0]
    assert "rank 0: (2," in messages[0] and "rank 1: (4," in messages[0]
    assert messages[0] == messages[1] and messages[2] == messages[3]


def test_ordered_all_reduce_bits_unchanged_vs_the_all_gather_algorithm(split_results):
    for res in split_results:
        for world in ("2", "4"):
            for dtype, cases in res["ordered"][world].items():
                for numel, (got, old) in cases.items():
                    assert got == old, (world, dtype, numel)
                    assert got == split_results[0]["ordered"][world][dtype][numel][0]


def test_reductions_move_o_size_elements(split_results):
    """Each collective of both reductions moves O(numel) elements per rank, not O(ranks * numel)."""
    for name in ("tree_all_reduce", "ordered_all_reduce"):
        calls = split_results[0]["traffic"][name]
        numel, world, s = calls["numel"], 4, -(-calls["numel"] // 4)
        assert calls["all_to_all"] == [[world * s, world * s]]       # (received, sent): one shard to each rank
        assert calls["all_gather"] == [[world * s, s]]               # (gathered, contributed)
        assert world * s < numel + world                             # padding below one element per rank


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

    ref, _ = build_model(spec, torch.device("cpu"))
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
        model, _ = build_model(spec, torch.device("cpu"))
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
        register_ordered_hook(ddp)
        key = f"bucket_cap_mb={cap}"
        result["ddp"][key] = {str(s): [tensor_sha256(g) for g in local_grads(model, s, rank, ddp)] for s in (0, 1, 2)}
        # the buckets DDP rebuilt at the second iteration (steps 1 and 2 ran with them)
        rebuilt = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
        result["ddp"]["n_buckets"][key] = len([b for b in str(rebuilt).split(",") if b.strip()])
    model, _ = build_model(spec, torch.device("cpu"))
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


def _split_model():
    spec = {"seed": 0, "mixer": "ordered", "weight_decay": 0.1, "lr": 1e-3,
            "model": dict(ModelConfig(d_model=16, n_layers=1, d_state=8, headdim=8, chunk_size=8).__dict__)}
    model, _ = build_model(spec, torch.device("cpu"))
    return model


def _block_loss(model, data, block, b=2, n_blocks=8):
    x, y = data.batch(3, 0, n_blocks * b, offset=block * b, count=b)
    return lm_loss(model(x), y)


def _worker_split(out: str) -> None:
    import torch.distributed as dist

    import ordered_ssd.distributed as D
    from ordered_ssd import TreeGradAccumulator, tree_sum
    from ordered_ssd.fold import lexical_fold

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    singles = [dist.new_group([r]) for r in range(4)]
    groups = {1: singles[rank], 2: pairs[rank // 2], 4: None}
    data = ByteData(bytes(range(256)) * 40, 16)
    result = {"split": {"expected": {}, "got": {}, "left_to_right": {}, "two_level_4_ranks": {}},
              "ordered": {}, "traffic": {}}

    model = _split_model()
    params = list(model.parameters())
    sizes = [p.numel() for p in params]

    def grads_digest(flat):
        return [tensor_sha256(t.view(p.shape).to(p.dtype)) for t, p in zip(flat.split(sizes), params)]

    block_grads = []
    for k in range(8):
        model.zero_grad(set_to_none=True)
        _block_loss(model, data, k).backward()
        block_grads.append(torch.cat([p.grad.reshape(-1).float() for p in params]))
    for n_blocks in (4, 8):
        gs = block_grads[:n_blocks]
        ref = tree_sum(gs)
        key = str(n_blocks)
        result["split"]["expected"][key] = {"reduce": tensor_sha256(ref), "grads": grads_digest(ref / n_blocks)}
        l2r = torch.zeros_like(ref)
        for g in gs:
            l2r += g
        result["split"]["left_to_right"][key] = tensor_sha256(l2r)
        m4 = n_blocks // 4  # the old scheme on 4 ranks: left-to-right per rank, then the rank-ordered fold / 4
        local = [lexical_fold(gs[r * m4:(r + 1) * m4], dtype=torch.float32) / m4 for r in range(4)]
        result["split"]["two_level_4_ranks"][key] = grads_digest(lexical_fold(local, dtype=torch.float32) / 4)
        result["split"]["got"][key] = {}
        for R in (1, 2, 4):
            m = n_blocks // R
            r = rank % R  # this rank's place in its group of R
            model.zero_grad(set_to_none=True)
            acc = TreeGradAccumulator(model.parameters())
            for k in range(r * m, (r + 1) * m):
                _block_loss(model, data, k).backward()
                acc.add_block()
            assert acc.max_buffers_held <= m.bit_length()
            red = acc.reduce(groups[R])
            acc.write_grads(group=groups[R])
            result["split"]["got"][key][str(R)] = {
                "reduce": tensor_sha256(red), "grads": [tensor_sha256(p.grad) for p in params]}

    # ordered_all_reduce: the shard algorithm against the all-gather algorithm it replaced, on 2 and 4 ranks
    for R in (2, 4):
        g, r = groups[R], rank % R
        result["ordered"][str(R)] = {}
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            cases = {}
            for numel in (1, 5, 4099, 4100):
                parts = [_rank_tensor(k, dtype, numel) for k in range(R)]
                mine = parts[r].clone()
                D.ordered_all_reduce(mine, g).wait()
                gathered = torch.empty(R * numel, dtype=dtype)
                D._all_gather_flat(gathered, parts[r].clone(), g).wait()
                old = lexical_fold(gathered.view(R, numel), dtype=D.accumulation_dtype(dtype)).div_(R).to(dtype)
                cases[str(numel)] = [tensor_sha256(mine), tensor_sha256(old)]
            result["ordered"][str(R)][str(dtype).split(".")[1]] = cases

    # with DistributedDataParallel (every block under no_sync) and bf16 autocast over fp32 parameters: the same
    # bits as one process's tree over the autocast block gradients, for every split of 4 blocks. (A small MLP:
    # OrderedMamba2's CPU path refuses bf16 inputs, so CPU autocast cannot run the LM.)
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(5)
    mlp = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 24))
    mlp_params = list(mlp.parameters())
    mlp_sizes = [p.numel() for p in mlp_params]
    inputs = torch.randn(4, 3, 24, generator=torch.Generator().manual_seed(6)) * torch.logspace(-2, 2, 24)

    def autocast_block_loss(module, k):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return module(inputs[k]).float().square().mean()

    def mlp_digest(flat):
        return [tensor_sha256(t.view(p.shape).to(p.dtype)) for t, p in zip(flat.split(mlp_sizes), mlp_params)]

    autocast_grads = []
    for k in range(4):
        mlp.zero_grad(set_to_none=True)
        autocast_block_loss(mlp, k).backward()
        autocast_grads.append(torch.cat([p.grad.reshape(-1).float() for p in mlp_params]))
    l2r = autocast_grads[0].clone()
    for g in autocast_grads[1:]:
        l2r += g
    result["ddp_autocast"] = {"expected": mlp_digest(tree_sum(autocast_grads) / 4), "got": {},
                              "left_to_right": mlp_digest(l2r / 4)}
    for R in (1, 2, 4):
        m, r = 4 // R, rank % R
        mlp.zero_grad(set_to_none=True)
        ddp = DistributedDataParallel(mlp, process_group=groups[R])
        acc = TreeGradAccumulator(mlp.parameters())
        for k in range(r * m, (r + 1) * m):
            with ddp.no_sync():
                autocast_block_loss(ddp, k).backward()
            acc.add_block()
        acc.write_grads(group=groups[R])
        result["ddp_autocast"]["got"][str(R)] = [tensor_sha256(p.grad) for p in mlp_params]
        ddp = None

    # ranks that disagree on the block count: every rank raises the same one-line error, none hangs
    model.zero_grad(set_to_none=True)
    acc = TreeGradAccumulator(model.parameters())
    for k in range(2 if rank % 2 == 0 else 4):
        _block_loss(model, data, k).backward()
        acc.add_block()
    try:
        acc.write_grads(group=groups[2])
        result["mismatch"] = None
    except ValueError as e:
        result["mismatch"] = str(e)
    model.zero_grad(set_to_none=True)

    # traffic: the shapes each collective is handed
    real_a2a, real_ag = D._all_to_all_flat, D._all_gather_flat
    for name in ("tree_all_reduce", "ordered_all_reduce"):
        calls = {"numel": 4099, "all_to_all": [], "all_gather": []}

        def a2a(o, i, grp, calls=calls):
            calls["all_to_all"].append([o.numel(), i.numel()])
            return real_a2a(o, i, grp)

        def ag(o, i, grp, calls=calls):
            calls["all_gather"].append([o.numel(), i.numel()])
            return real_ag(o, i, grp)

        D._all_to_all_flat, D._all_gather_flat = a2a, ag
        try:
            t = _rank_tensor(rank, torch.float32, 4099)
            if name == "tree_all_reduce":
                D.tree_all_reduce(t)
            else:
                D.ordered_all_reduce(t).wait()
        finally:
            D._all_to_all_flat, D._all_gather_flat = real_a2a, real_ag
        result["traffic"][name] = calls

    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["hook", "split"], required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    (_worker_hook if a.worker == "hook" else _worker_split)(a.out)
