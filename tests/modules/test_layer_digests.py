"""The CPU reference path gives the bits recorded before the renovation (tests/data/layer_digests.json).

The bits of the reference's matmuls are fixed per torch build and CPU model (the scope of the guarantee: MKL picks
its kernels by CPU model), so the comparison runs where digests were recorded (CI's machine kinds and torch pin:
``tests.layer_digests.cpu_fixture``) and says why it skips elsewhere.
"""
import pytest

from tests.layer_digests import CONFIGS, cpu_fixture, load_fixture, recorded_on, step_digests

CPU = [name for name, cfg in CONFIGS.items() if cfg[0] == "cpu"]


@pytest.mark.parametrize("name", CPU)
def test_cpu_step_matches_recorded_digests(name):
    fixture, where = cpu_fixture()
    if fixture is None:
        pytest.skip(where)
    recorded = fixture[name]
    got = step_digests(name)
    assert sorted(got) == sorted(recorded)  # every gradient is there, and no other
    assert {k: v for k, v in got.items() if recorded[k] != v} == {}


def test_fixture_covers_every_configuration():
    assert sorted(load_fixture()) == sorted(CONFIGS)
    assert sorted(recorded_on("cpu")) == ["cpu_capability", "torch"]


def test_cpu_model_fixtures_cover_the_cpu_configurations():
    """Every CPU model's entry has every CPU configuration, recorded in an environment of the torch pin."""
    import json

    from tests.layer_digests import CPU_MODEL_FIXTURES, RECORDED_ON
    with open(CPU_MODEL_FIXTURES) as f:
        entries = json.load(f)
    assert entries, "no CPU model entry"
    for model, entry in entries.items():
        if entry["digests"] is None:  # not recorded for the current bits: skipped there, saying why
            assert "python -m tests.layer_digests" in entry["why_none"], model
            continue
        assert sorted(entry["digests"]) == sorted(CPU), model
        assert sorted(entry[RECORDED_ON]) == ["cpu_capability", "torch"], model
        assert entry[RECORDED_ON]["torch"] == recorded_on("cpu")["torch"], model
