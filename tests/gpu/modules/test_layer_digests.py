"""The CUDA path gives the bits recorded on the H200 before the renovation (tests/data/layer_digests.json), also
when every fresh buffer starts full of NaN (the launchers write every entry they return and zero what they sum into).

The digests are of one GPU model (the H200 of the gate, sm_90) and the versions in docs/native.md; on another GPU
model the pinned configurations and cuBLAS choices may differ, so the test runs only where they were recorded.
"""
import pytest

from tests.layer_digests import CONFIGS, environment, load_fixture, recorded_on, step_digests

CUDA = [name for name, cfg in CONFIGS.items() if cfg[0] == "cuda"]


def _check(name):
    if environment("cuda") != recorded_on("cuda"):
        pytest.skip(f"digests recorded on {recorded_on('cuda')}, this is {environment('cuda')}")
    recorded = load_fixture()[name]
    got = step_digests(name)
    assert sorted(got) == sorted(recorded)
    assert {k: v for k, v in got.items() if recorded[k] != v} == {}


@pytest.mark.parametrize("name", CUDA)
def test_cuda_step_matches_recorded_digests(name):
    _check(name)


@pytest.mark.parametrize("name", CUDA)
def test_cuda_step_matches_recorded_digests_with_nan_filled_fresh_buffers(name, nan_fresh_buffers):
    _check(name)
