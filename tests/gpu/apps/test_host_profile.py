"""The host profile on the GPU (:mod:`ordered_ssd.apps.bench.host_profile`): idle-GPU host times and the per-function
counts of an ordered step on the CUDA path, with the launchers' plans (the default) and without
(``csrc_bindings._plans.disabled``); no timing assertions."""
import json

from csrc_bindings import _plans
from ordered_ssd.apps.bench import host_profile

SMALL = "4,256,256,64,1,64,128"
REPLAY = "launch path _plans.replay (a launcher's plan)"
NATIVE = "launch path _native.launch"
FITTING = "launch path launch_fitting (Triton run)"
KEPT = "launch path run_compiled (a kept kernel)"


def _profile(out):
    assert host_profile.main(["--shape", SMALL, "--modes", "ordered", "--steps", "3", "--top", "5",
                              "--out", str(out)]) == 0
    r = json.loads((out / f"host_profile_{SMALL}.json").read_text())["modes"]["ordered"]
    assert r["gpu_ms_median"] > 0 and r["idle_host_ms"] > 0
    assert 0 < r["idle_forward_ms"] < r["idle_host_ms"] and 0 < r["idle_backward_ms"] < r["idle_host_ms"]
    per_step = {label: row["calls_per_step"] for label, row in r["calls"].items()}
    assert per_step["op ordered_mamba_split_conv1d_scan_combined"] == 1
    assert per_step["fold fold_many"] == 2  # the SSD pass's tile folds, the layer's parameter folds
    assert "fold fold_dims" not in per_step  # every fold of the step in those two launches
    assert per_step["fold fold_example_gemms"] == 2  # in_proj and out_proj weight gradients (L < 8192)
    return per_step


def test_host_profile_counts_the_launches_of_an_ordered_step(tmp_path):
    planned = _profile(tmp_path / "plans")
    with _plans.disabled():
        own = _profile(tmp_path / "no-plans")
    # without plans every native Triton launch goes through _native.launch, and it and the two weight-gradient
    # folds through launch_fitting
    assert REPLAY not in own
    assert own[NATIVE] > 10
    assert own[FITTING] == own[NATIVE] + 2
    # with plans the native launchers replay them (one replay per launcher call)
    assert planned[REPLAY] > 10
    assert planned.get(NATIVE, 0) < own[NATIVE]
    # once warm, the same kept kernels launch either way (a plan's launch runs the kernel launch_fitting kept for
    # its key, or calls launch_fitting where none is kept)
    assert own[KEPT] > 10
    assert planned[KEPT] == own[KEPT]
