"""``benchmarks/check_first_step.py``: on the CPU with a tiny model, the first steps are timed one by one into the
JSON, ``--static`` turns native-autotune-v1 off for the process, and Triton's cache folder is counted by kernel."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import check_first_step  # noqa: E402

TINY = ["--device", "cpu", "--d-model", "32", "--n-layers", "1", "--d-state", "8", "--headdim", "16",
        "--chunk-size", "16", "--seq-len", "24", "--batch", "2", "--data-bytes", "60000"]


def test_first_steps_are_timed_one_by_one(tmp_path, monkeypatch, capsys):
    import csrc_bindings._configs as configs
    monkeypatch.setattr(configs, "NATIVE_TIMING", True)  # put back after the test
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")  # removed by the tool (put back after the test)
    path = tmp_path / "r.json"
    assert check_first_step.main([*TINY, "--steps", "2", "--first-steps", "3", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert len(r["first_step_s"]) == 3 and all(t > 0 for t in r["first_step_s"])
    assert r["static"] is False and r["steps"] == 2 and r["ms_per_step_after"] > 0
    assert r["kernels_compiled"] == 0 and r["by_kernel"] == {}  # no Triton cache folder named
    assert configs.NATIVE_TIMING is True and "TRITON_CACHE_AUTOTUNING" not in os.environ
    assert "timed configurations" in capsys.readouterr().out
    assert check_first_step.main([*TINY, "--steps", "1", "--first-steps", "1", "--static", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["static"] is True and configs.NATIVE_TIMING is False


def test_compiled_kernels_are_counted_by_name(tmp_path):
    for sub, files in {"a1": ["foo.json", "__grp__foo.json", "foo.cubin"],
                       "b2": ["foo.json", "bar.json", "foo.autotune.json"]}.items():
        (tmp_path / sub).mkdir()
        for f in files:
            (tmp_path / sub / f).write_text("{}")
    (tmp_path / "stray.json").write_text("{}")  # not in a kernel's folder
    assert check_first_step.compiled_kernels(str(tmp_path)) == {"foo": 2, "bar": 1}
    assert check_first_step.compiled_kernels(str(tmp_path / "missing")) == {}
    assert check_first_step.compiled_kernels(None) == {}
