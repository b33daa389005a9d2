"""The CUDA path of ``OrderedMamba2`` launches what it launched before (CPU, natives faked).

``tests/csrc_bindings/data/layer_launches.json`` is :func:`~tests.csrc_bindings.launch_record.record_layer_steps`:
every native launch of one training step for six layer constructions, without and with ``seq_idx``, each argument's
shape, strides, offset, dtype and storage. It was written at commit 1afc974 and gave the same file at 4a750d3 (the
compositions without ``einops.rearrange``). A change to the compositions that must not change a launch (host-time
work, refactoring) keeps this file; one that is meant to regenerates it (``python -m
tests.csrc_bindings.launch_record``) and says why.
"""
import json
import pathlib

from tests.csrc_bindings.launch_record import LAYER_STEPS, record_layer_steps

DATA = pathlib.Path(__file__).parents[1] / "csrc_bindings" / "data" / "layer_launches.json"


def test_layer_steps_launch_what_they_launched_before(monkeypatch):
    want = json.loads(DATA.read_text())
    got = record_layer_steps(monkeypatch)
    assert sorted(got) == sorted(want) and len(want) == 2 * len(LAYER_STEPS)
    for name in want:
        assert len(got[name]) == len(want[name]), name
        for i, (g, w) in enumerate(zip(got[name], want[name])):
            assert g == w, (name, i, w["kernel"])


def test_the_record_describes_real_launches(monkeypatch):
    """Every step launches the SSD forward and backward kernels, the conv1d forward and the gated RMSNorm where
    the layer has it, with tensor arguments (not an empty or constant log)."""
    got = record_layer_steps(monkeypatch)
    for name, launches in got.items():
        kernels = [e["kernel"] for e in launches]
        assert {"chunk_scan_fwd", "chunk_state_fwd", "chunk_scan_chunk_state_bwd_dx", "causal_conv1d_fwd"} <= set(
            kernels), name
        has_norm = "no-rmsnorm" not in name
        assert has_norm == any("rmsnorm" in k for k in kernels), (name, kernels)
        assert all(any(isinstance(a, list) and a[:1] == ["T"] for a in e["args"]) for e in launches), name
