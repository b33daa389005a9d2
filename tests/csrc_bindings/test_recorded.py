"""The bindings launch what they launched before the per-upstream-file layout (CPU, natives faked).

``data/launch_record.json`` and ``data/layer_configs.json`` were written by :mod:`.launch_record` before the
launchers, the kernel specs and the key derivation moved; moving code must not change one launch argument, one
configuration or the table hash. Since the speed choice (bit-neutral parameters,
``csrc_bindings.pinned.neutral_params``), the configurations are compared on their order parameters, and a neutral
parameter may differ only where ``describe_launch`` names a speed choice.
"""
import json
import pathlib

import csrc_bindings as cb
from tests.csrc_bindings.launch_record import record_all, record_layers

DATA = pathlib.Path(__file__).with_name("data")
TABLE_HASH = "7258b66b39eca5ed"  # the pinned table as tuned on the H200 (see docs/bindings.md)
#: which kernels take nearest-order-v1 along which key sizes (chunk-cumsum: nheads; state_passing_bwd: dim)
NEAREST_ORDER_HASH = "72cc9c94"


def test_table_hash_is_pinned():
    assert cb.table_hash() == TABLE_HASH
    assert f" table={TABLE_HASH} rule=mincost-v1+nearest-order-v1:{NEAREST_ORDER_HASH} " in cb.fingerprint()


def test_layer_keys_and_describe_launch_match_the_record():
    want = json.loads((DATA / "layer_configs.json").read_text())
    got = record_layers()
    assert got["table_hash"] == want["table_hash"] == TABLE_HASH
    for g, w in zip(got["layer_keys"], want["layer_keys"], strict=True):
        assert g == w, w["shape"]
    from csrc_bindings._configs import _neutral
    for g, w in zip(got["describe_launch"], want["describe_launch"], strict=True):
        where = (w["shape"], w["dtype"], w["arch"], w["ngroups"])
        gk, wk = g["out"].pop("kernels"), w["out"].pop("kernels")
        assert g == w, where
        assert sorted(gk) == sorted(wk), where
        for kernel, want_row in wk.items():
            row, want_row = dict(gk[kernel]), dict(want_row)
            speed = row.pop("speed", None)
            want_row.pop("speed", None)  # a speed choice of the record's time: bit-neutral, may differ
            neutral = _neutral().get(kernel, ())
            order = {n: v for n, v in row.get("config", {}).items() if n not in neutral}
            assert order == {n: v for n, v in want_row.get("config", {}).items() if n not in neutral}, (where, kernel)
            assert {k: v for k, v in row.items() if k != "config"} == {
                k: v for k, v in want_row.items() if k != "config"}, (where, kernel)
            # a bit-neutral parameter changes only by a recorded speed choice
            assert speed is not None or row.get("config") == want_row.get("config"), (where, kernel)


def test_every_launch_matches_the_record(monkeypatch):
    want = json.loads((DATA / "launch_record.json").read_text())
    got = record_all(monkeypatch)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name


def test_every_launcher_asks_for_the_key_of_its_layer(monkeypatch):
    """The key each launcher builds from its launch arguments (``key_of``) is the kernel's row of ``layer_keys``
    (pinned above to the values from before the move), at the dtype of its role (natives faked, CPU)."""
    import torch

    from csrc_bindings import _configs, _native
    from csrc_bindings._examples import make_problem
    from csrc_bindings._registry import TUNED_KERNELS, run_kernel
    from tests.csrc_bindings.launch_record import fake_native

    tri, conv = fake_native([])
    monkeypatch.setitem(_native._state, "triton", tri)
    monkeypatch.setitem(_native._state, "conv", conv)
    asked, real = [], _configs.pinned_of
    monkeypatch.setattr(_configs, "pinned_of",
                        lambda spec, key, dtype, arch: asked.append((spec.name, dict(key), dtype)) or
                        real(spec, key, dtype, arch))
    p = make_problem(chunk_size=64, headdim=32, dstate=16, nheads=4, ngroups=2, dtype=torch.bfloat16,
                     swiglu_cols=48)
    want = {k: (key, torch.bfloat16 if role == "model" else torch.float32)
            for k, key, role in cb.layer_keys(chunk_size=64, headdim=32, dstate=16, nheads=4, d_nonssm=48)}
    for kernel in TUNED_KERNELS:
        asked.clear()
        run_kernel(kernel, p)
        assert asked == [(kernel, *want[kernel])], kernel
