"""The bindings launch what they launched before the per-upstream-file layout (CPU, natives faked).

``data/launch_record.json`` and ``data/layer_configs.json`` were written by :mod:`.launch_record` before the
launchers, the kernel specs and the key derivation moved; moving code must not change one launch argument, one
configuration or the table hash.
"""
import json
import pathlib

import csrc_bindings as cb
from tests.csrc_bindings.launch_record import record_all, record_layers

DATA = pathlib.Path(__file__).with_name("data")
TABLE_HASH = "83ed2244b67d0fbd"  # the pinned table as tuned on the H200 (see docs/bindings.md)


def test_table_hash_is_pinned():
    assert cb.table_hash() == TABLE_HASH
    assert f" table={TABLE_HASH} rule=mincost-v1" in cb.fingerprint()


def test_layer_keys_and_describe_launch_match_the_record():
    want = json.loads((DATA / "layer_configs.json").read_text())
    got = record_layers()
    assert got["table_hash"] == want["table_hash"] == TABLE_HASH
    for g, w in zip(got["layer_keys"], want["layer_keys"], strict=True):
        assert g == w, w["shape"]
    for g, w in zip(got["describe_launch"], want["describe_launch"], strict=True):
        assert g == w, (w["shape"], w["dtype"], w["arch"], w["ngroups"])


def test_every_launch_matches_the_record(monkeypatch):
    want = json.loads((DATA / "launch_record.json").read_text())
    got = record_all(monkeypatch)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
