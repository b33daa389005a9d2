"""The scripts of ``examples/`` run, each in a fresh process on the CPU, and print what they claim.

* ``train_lm.py --check``: two trainings in one process give the same bits, and a third in another process too
  (with ``OrderedMamba2`` layers, and with ``--layer mamba3``, ``OrderedMamba3`` layers);
* ``generate.py``: the cached greedy generation gives the tokens of the full forward on the growing sequence;
* ``tree_accumulator_ddp.py`` under torchrun with 1 and 2 processes (splits 1 x 4 and 2 x 2 of one global batch):
  the same gradient and parameter digests (split invariance);
* ``fsdp_restart.py`` under torchrun: FSDP2 on 2 ranks, stopped at step 2 and resumed on 1 rank from its sharded
  checkpoint, gives the uninterrupted run's digests, which are the DDP example's (the same tree);
* ``grpo_parity.py``: the importance ratio of every sampled token is exactly 1 (the sampler's log-probabilities
  are the training forward's bits) at each of two updates (the example itself asserts it at the first);
* ``convert_hf.py --check`` (skipped without ``transformers``): a converted ``Mamba2ForCausalLM`` and a Bamba hybrid
  train to the same bits twice.
"""
import ast
import os
import re
import subprocess
import sys

import pytest

from tests.apps.helpers import ROOT, cli_env

EXAMPLES = os.path.join(ROOT, "examples")
TESTED = {"train_lm.py", "generate.py", "tree_accumulator_ddp.py", "convert_hf.py", "fsdp_restart.py",
          "grpo_parity.py"}
HEX = r"[0-9a-f]{64}"


def run(*args, torchrun_nproc=None) -> str:
    """``python examples/ARGS`` (or under ``torch.distributed.run`` with ``torchrun_nproc`` processes) on the CPU
    with one thread per process; asserts exit status 0 and returns stdout."""
    launcher = [sys.executable]
    if torchrun_nproc is not None:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun_nproc),
                     "--max-restarts", "0"]
    res = subprocess.run([*launcher, os.path.join(EXAMPLES, args[0]), *args[1:]], capture_output=True, text=True,
                         env=cli_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""), cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return res.stdout


@pytest.mark.parametrize("name", ["tree_accumulator_ddp.py", "fsdp_restart.py"])
def test_a_distributed_example_started_without_torchrun_says_how_in_one_line(name):
    res = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True,
                         env=cli_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""), cwd=ROOT, timeout=120)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == (f"{name}: run it under torchrun: python -m torch.distributed.run --standalone "
                          f"--nproc-per-node 2 examples/{name}\n")


def test_every_example_is_tested_and_documented():
    found = {f for f in os.listdir(EXAMPLES) if f.endswith(".py")}
    assert found == TESTED
    for name in found:
        text = open(os.path.join(EXAMPLES, name)).read()
        assert text.startswith('"""') and f"examples/{name}" in text.split('"""')[1], name  # how to run it
        assert max(map(len, text.splitlines())) <= 120, name


def test_train_lm_repeats_bit_for_bit_in_and_across_processes():
    first = run("train_lm.py", "--check")
    steps = re.findall(r"^step (\d+): loss ([0-9.]+) grad sha256 ([0-9a-f]{16})$", first, re.M)
    assert [int(s) for s, _, _ in steps] == [0, 1, 2, 3]
    assert len({d for _, _, d in steps}) == 4  # a new gradient every step
    assert float(steps[-1][1]) < float(steps[0][1])  # it trains
    assert re.search(r"^same bits: True$", first, re.M)
    second = run("train_lm.py")  # a fresh process: the same steps and final parameters
    final = re.findall(rf"^final params sha256 ({HEX})$", first + second, re.M)
    assert len(final) == 2 and final[0] == final[1]
    assert re.findall(r"^step .*$", second, re.M) == re.findall(r"^step .*$", first, re.M)


def test_train_lm_with_mamba3_layers_repeats_bit_for_bit_in_and_across_processes():
    first = run("train_lm.py", "--check", "--layer", "mamba3")
    steps = re.findall(r"^step (\d+): loss ([0-9.]+) grad sha256 ([0-9a-f]{16})$", first, re.M)
    assert [int(s) for s, _, _ in steps] == [0, 1, 2, 3] and float(steps[-1][1]) < float(steps[0][1])
    assert re.search(r"^same bits: True$", first, re.M)
    second = run("train_lm.py", "--layer", "mamba3")
    assert re.findall(r"^step .*$", second, re.M) == re.findall(r"^step .*$", first, re.M)
    finals = re.findall(rf"^final params sha256 ({HEX})$", first + second, re.M)
    assert len(finals) == 2 and finals[0] == finals[1]
    mamba2 = run("train_lm.py")  # another layer: other bits
    assert re.findall(rf"^final params sha256 ({HEX})$", mamba2, re.M)[0] != finals[0]


def test_generate_cached_equals_full_forward():
    out = run("generate.py", "--tokens", "24")
    assert re.search(r"^same tokens: True$", out, re.M)
    rows = [[ast.literal_eval(side) for side in line.split(" -> ")] for line in out.splitlines() if " -> " in line]
    assert [len(new) for _, new in rows] == [24, 24] and all(len(prompt) == len(rows[0][0]) > 8 for prompt, _ in rows)
    assert len(set(rows[0][1] + rows[1][1])) >= 4  # not one repeated byte: the comparison has something to compare
    diff = float(re.search(r"^max \|logits difference\|: (\S+)$", out, re.M).group(1))
    assert 0 <= diff < 1e-4  # the step and the chunked scan round differently, but only just


def test_tree_accumulator_ddp_same_bits_for_1x4_and_2x2():
    outs = {n: run("tree_accumulator_ddp.py", torchrun_nproc=n) for n in (1, 2)}
    for n, m in ((1, 4), (2, 2)):
        assert re.search(rf"^split {n} x {m}: final params sha256 {HEX}$", outs[n], re.M), outs[n]
    digests = {n: re.findall(rf"^(?:step \d+: grad|split \d+ x \d+: final params) sha256 ({HEX})$", out, re.M)
               for n, out in outs.items()}
    assert len(digests[1]) == 4 and len(set(digests[1])) == 4  # 3 steps' gradients, the final parameters
    assert digests[1] == digests[2]


@pytest.mark.parametrize("arch", ["mamba2", "bamba"])
def test_convert_hf_trains_to_the_same_bits_twice(arch):
    pytest.importorskip("transformers")
    out = run("convert_hf.py", "--arch", arch, "--check")
    assert re.search(r"ForCausalLM: audit_model: nothing uncovered$", out, re.M)
    steps = re.findall(r"^step (\d+): loss ([0-9.]+) grad sha256 ([0-9a-f]{16})$", out, re.M)
    assert len(steps) == 3 and len({d for _, _, d in steps}) == 3
    assert re.search(rf"^final params sha256 {HEX}$", out, re.M)
    assert re.search(r"^same bits: True$", out, re.M)


def test_fsdp_restart_on_another_world_size_continues_with_the_same_bits(tmp_path):
    steps = lambda out: re.findall(rf"^step (\d+): grad sha256 ({HEX})$", out, re.M)  # noqa: E731
    final = lambda out: re.findall(rf"final params sha256 ({HEX})$", out, re.M)  # noqa: E731
    whole = run("fsdp_restart.py", torchrun_nproc=2)
    ckpt = str(tmp_path / "ckpt")
    stopped = run("fsdp_restart.py", "--ckpt", ckpt, "--stop-at", "2", torchrun_nproc=2)
    resumed = run("fsdp_restart.py", "--ckpt", ckpt, torchrun_nproc=1)
    assert [s for s, _ in steps(whole)] == ["0", "1", "2", "3"] and len({d for _, d in steps(whole)}) == 4
    assert steps(stopped) == steps(whole)[:2] and steps(resumed) == steps(whole)[2:]
    assert "1 rank, steps 2..3" in resumed and final(resumed) == final(whole)
    assert final(stopped) != final(whole)
    assert sorted(os.listdir(ckpt)) == ["step-00000002"]  # written atomically: no temporary directory left
    ddp = run("tree_accumulator_ddp.py", torchrun_nproc=1)  # the same global batches, the same tree
    assert steps(ddp) == steps(whole)[:3]


def test_grpo_parity_has_an_importance_ratio_of_exactly_one_on_every_token():
    out = run("grpo_parity.py", "--updates", "2")
    lines = re.findall(r"^update (\d): mean reward ([0-9.]+), importance ratio exactly 1 on (\d+) of (\d+) tokens$",
                       out, re.M)
    assert [int(u) for u, *_ in lines] == [0, 1]
    assert all(int(exact) == int(total) == 384 for _, _, exact, total in lines)
