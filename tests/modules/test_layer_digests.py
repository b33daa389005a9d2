"""The CPU reference path gives the bits recorded before the renovation (tests/data/layer_digests.json).

The bits of the reference's matmuls are fixed per torch build and CPU capability (the scope of the guarantee), so the
comparison runs where the fixture was recorded (CI's machine kind and torch pin) and says why it skips elsewhere.
"""
import pytest

from tests.layer_digests import CONFIGS, environment, load_fixture, recorded_on, step_digests

CPU = [name for name, cfg in CONFIGS.items() if cfg[0] == "cpu"]


@pytest.mark.parametrize("name", CPU)
def test_cpu_step_matches_recorded_digests(name):
    if environment("cpu") != recorded_on("cpu"):
        pytest.skip(f"digests recorded on {recorded_on('cpu')}, this is {environment('cpu')}")
    recorded = load_fixture()[name]
    got = step_digests(name)
    assert sorted(got) == sorted(recorded)  # every gradient is there, and no other
    assert {k: v for k, v in got.items() if recorded[k] != v} == {}


def test_fixture_covers_every_configuration():
    assert sorted(load_fixture()) == sorted(CONFIGS)
    assert sorted(recorded_on("cpu")) == ["cpu_capability", "torch"]
