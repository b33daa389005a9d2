"""Where a step's host time goes (:mod:`ordered_ssd.apps.bench.host_profile`), on the CPU."""
import json

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
    prof = r["profile"]["cumulative"]
    # the ordered backward ran once per profiled step (2), inside autograd
    line = next(ln for ln in prof.splitlines() if "(ordered_reference_mamba2_bwd)" in ln)
    assert line.split()[0] == "2", line
