"""The host profile on the GPU (:mod:`ordered_ssd.apps.bench.host_profile`): idle-GPU host times and the per-function
counts of an ordered step on the CUDA path (no timing assertions)."""
import json

from ordered_ssd.apps.bench import host_profile


def test_host_profile_counts_the_launches_of_an_ordered_step(tmp_path):
    small = "4,256,256,64,1,64,128"
    assert host_profile.main(["--shape", small, "--modes", "ordered", "--steps", "3", "--top", "5",
                              "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / f"host_profile_{small}.json").read_text())["modes"]["ordered"]
    assert r["gpu_ms_median"] > 0 and r["idle_host_ms"] > 0
    assert 0 < r["idle_forward_ms"] < r["idle_host_ms"] and 0 < r["idle_backward_ms"] < r["idle_host_ms"]
    per_step = {label: row["calls_per_step"] for label, row in r["calls"].items()}
    assert per_step["op ordered_mamba_split_conv1d_scan_combined"] == 1
    assert per_step["fold fold_many"] == 2  # the SSD pass's tile folds, the layer's parameter folds
    assert "fold fold_dims" not in per_step  # every fold of the step in those two launches
    assert per_step["fold fold_example_gemms"] == 2  # in_proj and out_proj weight gradients (L < 8192)
    # every native Triton launch, and the two weight-gradient folds, go through launch_fitting
    assert per_step["launch path launch_fitting (Triton run)"] == per_step["launch path _native.launch"] + 2
    assert per_step["launch path _native.launch"] > 10
