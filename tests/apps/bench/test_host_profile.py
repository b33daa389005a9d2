"""Where a step's host time goes (:mod:`ordered_ssd.apps.bench.host_profile`), on the CPU."""
import json

import pytest
import torch

from ordered_ssd.apps.bench import host_profile

TINY = "2,64,32,16,1,16,32"


def test_host_profile_on_the_cpu(tmp_path, capsys):
    """The host profile runs one shape on the reference path and writes what it measured: host times
    for the mode asked for and a cProfile in which the ordered backward ran once per profiled step (no timing
    assertions)."""
    argv = ["--shape", TINY, "--device", "cpu", "--steps", "2", "--top", "50", "--out", str(tmp_path)]
    assert host_profile.main(argv) == 0
    out = capsys.readouterr().out
    assert f"== {TINY} ordered: host " in out
    res = json.load(open(tmp_path / f"host_profile_{TINY}.json"))
    assert res["dims"] == "B2 L64 d32 N16 G1 P16 cs32 fp32" and list(res["modes"]) == ["ordered"]
    r = res["modes"]["ordered"]
    assert r["host_ms_median"] > 0 and r["gpu_ms_median"] is None
    assert r["idle_host_ms"] > 0 and r["idle_forward_ms"] > 0 and r["idle_backward_ms"] > 0
    assert isinstance(r["calls"], dict) and "   idle GPU: host " in out  # the reference path: no CUDA-path call
    prof = r["profile"]["cumulative"]
    # the ordered backward ran once per profiled step (2), inside autograd
    line = next(ln for ln in prof.splitlines() if "(ordered_reference_mamba2_bwd)" in ln)
    assert line.split()[0] == "2", line


def test_per_call_host_times_count_the_cuda_path_with_the_natives_faked(monkeypatch):
    """On the CPU with the native kernels faked (``tests.csrc_bindings.launch_record``) and the layer on its CUDA
    path: the timed functions of a step are counted where they run (one fused layer op and its two compositions,
    every launcher, the common launch path (``launch_fitting``) once per Triton launch, the two fold launches of
    ``fold_many``), and every wrapped function is put back afterwards."""
    import csrc_bindings
    from ordered_ssd.apps.bench.runner import LayerRunner
    from ordered_ssd.apps.bench.shapes import named_or_parsed_shape
    from ordered_ssd.ops import ssd_combined
    from tests.csrc_bindings.launch_record import fake_cuda_path

    log = []
    fake_cuda_path(monkeypatch, log, layer=True)
    original = csrc_bindings.launch_chunk_scan_fwd
    runner = LayerRunner(named_or_parsed_shape(TINY), ["ordered"], torch.device("cpu"), 0)
    runner.step("ordered")
    log.clear()
    calls = host_profile.per_call_host_times(runner, "ordered", 2)
    assert csrc_bindings.launch_chunk_scan_fwd is original and ssd_combined.fold_many.__name__ == "fold_many"
    per_step = {label: r["calls_per_step"] for label, r in calls.items()}
    assert per_step["op ordered_mamba_split_conv1d_scan_combined"] == 1
    assert per_step["composition ordered_mamba_split_conv1d_scan_combined_fwd"] == 1
    assert per_step["composition ordered_mamba_split_conv1d_scan_combined_bwd"] == 1
    assert per_step["launcher launch_chunk_scan_fwd"] == 1 and per_step["launcher launch_chunk_cumsum_fwd"] == 2
    triton_launches = sum(1 for e in log if e["kernel"] in csrc_bindings.KERNELS) / 2
    # every Triton launch goes through launch_fitting: from _native.launch (a launcher's own Python) or from a
    # launcher's plan (the second chunk_cumsum_fwd of a step at least: its signature was seen in the forward)
    assert per_step["launch path launch_fitting (Triton run)"] == triton_launches > 10
    replays = per_step["launch path _plans.replay (a launcher's plan)"]
    assert per_step.get("launch path _native.launch", 0) + replays == triton_launches and replays >= 1
    assert per_step["fold fold_many"] == 2
    assert all(r["us_per_call"] > 0 for r in calls.values())


def test_upstream_det_is_refused_with_how_to_profile_it(capsys):
    """upstream-det's switches are read at import, so it never runs in the profiling process: a usage error naming
    the argument and the environment to profile it in, before any layer is built."""
    with pytest.raises(SystemExit) as exc:
        host_profile.main(["--shape", TINY, "--device", "cpu", "--modes", "native,upstream-det"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--modes" in err and "'upstream-det'" in err and "MAMBA_DETERMINISTIC=1" in err


def test_the_timed_functions_include_mamba3s_launchers_and_compositions():
    """A Mamba-3 profile (``--shape M1``) counts OrderedMamba3's own launchers, its launch path and its
    compositions, beside the shared ones (projections, norms, folds)."""
    import csrc_bindings.mamba3 as mamba3
    from csrc_bindings.mamba3 import _runtime
    from ordered_ssd.ops import mamba3_siso

    found = host_profile._timed_functions()
    for name in ("launch_angle_dt_fwd", "launch_mamba3_siso_fwd", "launch_dzdo", "launch_dqkv",
                 "launch_rotary_bias_angles", "launch_ddt_dtrap", "launch_angle_dt_bwd"):
        assert found[f"launcher {name}"] is getattr(mamba3, name)
    assert found["composition ordered_mamba3_siso_bwd"] is mamba3_siso.ordered_mamba3_siso_bwd
    assert found["op ordered_dt_softplus"] is mamba3_siso.ordered_dt_softplus
    assert found["launch path mamba3 launch_kernel (config)"] is _runtime.launch_kernel
    assert found["fold fold_dims"].__name__ == "fold_dims" and "op ordered_linear" in found
