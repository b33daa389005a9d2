"""The CPU reference path gives the bits recorded before the renovation (tests/data/layer_digests.json)."""
import pytest

from tests.layer_digests import CONFIGS, load_fixture, step_digests

CPU = [name for name, cfg in CONFIGS.items() if cfg[0] == "cpu"]


@pytest.mark.parametrize("name", CPU)
def test_cpu_step_matches_recorded_digests(name):
    recorded = load_fixture()[name]
    got = step_digests(name)
    assert sorted(got) == sorted(recorded)  # every gradient is there, and no other
    assert {k: v for k, v in got.items() if recorded[k] != v} == {}


def test_fixture_covers_every_configuration():
    assert sorted(load_fixture()) == sorted(CONFIGS)
