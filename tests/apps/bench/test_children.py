"""The child processes (:mod:`ordered_ssd.apps.bench.children`)."""
import os

import pytest

from ordered_ssd.apps import bench

TINY = "2,64,32,16,1,16,32"


def test_child_process_gets_the_switches_and_reports_json():
    """The upstream-det plumbing, run on the CPU with the ordered mode: the deterministic switches are set in the
    child's environment only, and its results come back as JSON lines."""
    shape = bench.parse_shape(TINY, name="T")
    settings = {"repeats": 2, "warmup": 1, "bit_repeats": 2, "seed": 0}
    before = {k: os.environ.get(k) for k in bench.DET_ENV}
    ch = bench.run_child("upstream-det", [shape], settings, "cpu", mode="ordered", extra_modes=("literal",))
    assert {k: os.environ.get(k) for k in bench.DET_ENV} == before
    assert ch["returncode"] == 0 and ch["error"] is None, ch
    assert ch["meta"]["env"]["MAMBA_DETERMINISTIC"] == "1" and ch["meta"]["env"]["CAUSAL_CONV1D_DETERMINISTIC"] == "1"
    row = ch["shapes"]["T"]["rows"]["ordered"]
    assert row.get("error") is None and row["n"] == 2 and row["bitwise"] is True
    extra = ch["shapes"]["T"]["rows"]["literal"]  # an extra mode, run in the same child beside the first
    assert extra.get("error") is None and extra["n"] == 2 and extra["same_bits_as_ordered"] is True
    with pytest.raises(ValueError, match="kind"):
        bench.run_child("other", [shape], settings, "cpu")


def test_child_keeps_the_parents_deadline():
    """A child started with a deadline already past (on the shared monotonic clock) starts no shape: it uses the
    parent's deadline, not one measured from its own start after its imports."""
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("the shared monotonic clock is used on Linux only")
    shape = bench.parse_shape(TINY, name="T")
    settings = {"repeats": 2, "warmup": 1, "bit_repeats": 2, "seed": 0}
    ch = bench.run_child("native", [shape], settings, "cpu", mode="ordered", extra_modes=("literal",),
                         deadline=time.monotonic() - 0.001)
    rows = ch["shapes"]["T"]["rows"]
    assert rows["ordered"].get("error") == "skipped: time budget", ch
    assert rows["literal"].get("error") == "skipped: time budget", ch
