"""What the bench needs (:mod:`ordered_ssd.apps.bench.requirements`)."""

from ordered_ssd.apps import bench


def test_missing_requirements_names_what_is_missing():
    def spec(missing):
        return lambda name: None if name in missing else object()

    msg = bench.missing_requirements("cuda", bench.MODES, cuda_available=True, find_spec=spec({"mamba_ssm"}))
    assert "mamba-ssm not installed" in msg and "causal-conv1d not installed" not in msg and "pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0" in msg
    msg = bench.missing_requirements("cuda", ["native"], cuda_available=False, find_spec=spec(set()))
    assert msg.startswith("no CUDA device") and "pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0" in msg
    msg = bench.missing_requirements("cuda", ["ordered"], cuda_available=True, find_spec=spec(set()),
                                     cuda_path=lambda: (False, "mamba-ssm 2.2 is not supported"))
    assert "CUDA path is unavailable" in msg and "mamba-ssm 2.2" in msg
    assert bench.missing_requirements("cuda", ["native"], cuda_available=True, find_spec=spec(set())) is None
    assert bench.missing_requirements("cpu", ["ordered", "literal"]) is None
    assert "upstream-det" in bench.missing_requirements("cpu", ["upstream-det", "ordered"])
    assert "--device" in bench.missing_requirements("tpu", ["ordered"])
