"""GPU: launch plans (csrc_bindings._plans) give the launchers' bits: one training step per layer configuration
with every launcher running its own Python, then steps whose launchers replay their plans, all with the same
digests (and the committed ones where they were recorded), also with every fresh buffer full of NaN."""
import pytest

from csrc_bindings import _plans
from tests.layer_digests import CONFIGS, environment, load_fixture, recorded_on, step_digests

CUDA = [name for name, cfg in CONFIGS.items() if cfg[0] == "cuda"]


def _planned_steps(name):
    with _plans.disabled():
        launchers = step_digests(name)
    assert sum(n for n, _ in _plans.stats().values()) == 0
    _plans.clear()
    steps = [step_digests(name) for _ in range(3)]  # the first records (and replays within the step), then replays
    kept = _plans.stats()
    assert sum(n for n, _ in kept.values()) >= 12, kept  # the step's SSD, state-passing, bmm, norm launchers
    # from the second replay on, a plan's launch runs the compiled kernel it kept (the third step did)
    direct = [step[-1][0] is not None for table in _plans._plans.values() for plan in table.values()
              if plan is not _plans._UNPLANNABLE for step in plan.steps if step[0] == "launch"]
    assert sum(direct) >= 12, (sum(direct), len(direct))
    return launchers, steps


@pytest.mark.parametrize("name", CUDA)
def test_planned_steps_give_the_launchers_bits(name):
    launchers, steps = _planned_steps(name)
    for got in steps:
        assert got == launchers
    if environment("cuda") == recorded_on("cuda"):
        assert launchers == load_fixture()[name]


@pytest.mark.parametrize("name", ["cuda-bf16", "cuda-fp32", "cuda-fp16-ngroups2-seq_idx-literal",
                                  "cuda-fp32-gated-mlp-bias-no-mem-eff"])
def test_replayed_buffers_are_written_in_full(name, nan_fresh_buffers):
    """With every fresh buffer NaN, a buffer a replay allocates but that its launches do not write in full (or
    that the launcher zeroed and the replay did not) shows in the digests."""
    launchers, steps = _planned_steps(name)
    for got in steps:
        assert got == launchers
