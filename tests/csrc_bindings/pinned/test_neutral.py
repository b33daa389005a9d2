"""The bit-neutral split on the CPU (no native import): the proof's verdict from digests, its variants, the speed
choice of neutral parameters (speed table, ``nearest-speed-v1``) and that it never touches an order parameter."""
import pytest
import torch

import csrc_bindings._configs as configs
from csrc_bindings._registry import KERNELS, order_config, pinned_config, table_key
from csrc_bindings.pinned import neutral, tune

SPEC = KERNELS["chunk_state_fwd"]  # blocks M, N, K


def _row(digest, **cfg):
    base = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "num_warps": 4, "num_stages": 3}
    return {"config": {**base, **cfg}, "digest": digest}


def test_verdict_neutral_and_order_parameters():
    rows = [_row("a"), _row("a", BLOCK_SIZE_M=128), _row("a", num_warps=8), _row("a", num_stages=2),
            _row("b", BLOCK_SIZE_K=64), _row("a", BLOCK_SIZE_N=32),
            _row("a", BLOCK_SIZE_M=128, num_warps=8, num_stages=4)]
    v = neutral.neutral_params(SPEC, [rows])
    assert v["neutral"] == ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "num_warps", "num_stages"]
    assert v["order"] == ["BLOCK_SIZE_K"]
    assert v["pairs"]["BLOCK_SIZE_K"] == 1 and "BLOCK_SIZE_K" in v["violations"]


def test_verdict_without_a_pair_is_not_neutral_and_interactions_are_caught():
    rows = [_row("a"), _row("a", num_warps=8)]  # nothing varies M, N, K or the stages alone
    assert neutral.neutral_params(SPEC, [rows])["neutral"] == ["num_warps"]
    # each alone leaves the bits, a candidate that changes both changes them: not both can be neutral
    rows = [_row("a"), _row("a", BLOCK_SIZE_M=32), _row("a", num_warps=8),
            _row("c", BLOCK_SIZE_M=128, num_warps=2)]
    v = neutral.neutral_params(SPEC, [rows])
    assert len([n for n in ("BLOCK_SIZE_M", "num_warps") if n in v["neutral"]]) == 1
    # a second case that disagrees makes the parameter an order parameter for the kernel
    other = [_row("x"), _row("y", num_warps=8)]
    assert "num_warps" not in neutral.neutral_params(SPEC, [[_row("a"), _row("a", num_warps=8)], other])["neutral"]


def test_variants_start_from_the_base_and_stay_in_the_candidates_span():
    base = order_config("chunk_state_fwd", {"hdim": 64, "dstate": 128, "chunk_size": 256}, torch.bfloat16,
                        "sm_90").as_dict()
    vs = neutral.variants(SPEC, base)
    assert vs[0] == base and len({tuple(sorted(v.items())) for v in vs}) == len(vs)
    for b in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        lo, hi = min(c[0][b] for c in SPEC.candidates), max(c[0][b] for c in SPEC.candidates)
        assert all(lo <= v[b] <= hi for v in vs)
    assert {v["num_warps"] for v in vs} >= {2, 4, 8} and {v["num_stages"] for v in vs} >= {1, 2, 3, 4, 5}
    for c in SPEC.candidates:
        assert {**c[0], "num_warps": c[1], "num_stages": c[2]} in vs


def test_cases_cover_the_proof_shapes_and_dtypes():
    cs = neutral.cases()
    kernels = {k for k, _, _ in cs}
    assert {"chunk_scan_fwd", "chunk_state_fwd", "bmm_chunk_bwd", "state_passing_bwd"} <= kernels
    assert {dt for k, _, dt in cs if k == "chunk_scan_fwd"} == {"bfloat16", "float16", "float32"}
    assert {dt for k, _, dt in cs if k == "state_passing_fwd"} == {"float32"}
    assert {key["chunk_size"] for k, key, _ in cs if k == "chunk_scan_fwd"} == {64, 128, 256}


@pytest.fixture
def speed_tables(monkeypatch):
    """NEUTRAL / SPEED (and, if given, the pinned table) replaced for one test (the lookups are memoised: cleared
    before and after)."""
    def install(neutral_map, speed_map, table=None, proven=None):
        if proven is None:  # default: the proof covers every key of these kernels on sm_90
            proven = {k: {n: ([False, True] if n == "IS_CAUSAL" else [1, 1 << 20]) for n in KERNELS[k].autotune_key}
                      for k in neutral_map}
        monkeypatch.setattr(configs, "_neutral", lambda: neutral_map)
        monkeypatch.setattr(configs, "_speed", lambda: speed_map)
        monkeypatch.setattr(configs, "_proof", lambda: ("sm_90", proven))
        if table is not None:
            monkeypatch.setattr(configs, "_table", lambda: table)
            configs._order.cache_clear()
        configs._pinned.cache_clear()
    yield install
    configs._order.cache_clear()
    configs._pinned.cache_clear()


def test_speed_choice_keeps_the_order_parameters(speed_tables):
    key = {"hdim": 64, "dstate": 128, "chunk_size": 256}
    tk = table_key("sm_90", torch.bfloat16, "chunk_state_fwd", key)
    base = order_config("chunk_state_fwd", key, torch.bfloat16, "sm_90")
    speed_tables({"chunk_state_fwd": ("BLOCK_SIZE_M", "num_warps")},
                 {tk: {"BLOCK_SIZE_M": 32, "num_warps": 8, "BLOCK_SIZE_K": 128}})  # K is not neutral: ignored
    got = pinned_config("chunk_state_fwd", key, torch.bfloat16, "sm_90")
    assert got.speed == "speed-table" and got.source == base.source
    assert got["BLOCK_SIZE_M"] == 32 and got.num_warps == 8
    assert got["BLOCK_SIZE_K"] == base["BLOCK_SIZE_K"] and got["BLOCK_SIZE_N"] == base["BLOCK_SIZE_N"]
    assert got.num_stages == base.num_stages
    # another kernel without neutral parameters is untouched
    k2 = {"chunk_size": 256, "hdim": 64, "dstate": 128, "IS_CAUSAL": True}
    assert pinned_config("chunk_scan_fwd", k2, torch.bfloat16, "sm_90") == order_config(
        "chunk_scan_fwd", k2, torch.bfloat16, "sm_90")


def test_nearest_speed_rule(speed_tables):
    near = table_key("sm_90", torch.bfloat16, "chunk_state_fwd", {"hdim": 64, "dstate": 64, "chunk_size": 256})
    far = table_key("sm_90", torch.bfloat16, "chunk_state_fwd", {"hdim": 32, "dstate": 16, "chunk_size": 64})
    fp32 = table_key("sm_90", torch.float32, "chunk_state_fwd", {"hdim": 64, "dstate": 128, "chunk_size": 256})
    pinned = table_key("sm_90", torch.bfloat16, "chunk_state_fwd", {"hdim": 64, "dstate": 128, "chunk_size": 64})
    entry = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "num_warps": 2, "num_stages": 3}
    speed_tables({"chunk_state_fwd": ("num_warps",)},
                 {near: {"num_warps": 8}, far: {"num_warps": 2}, fp32: {"num_warps": 4}}, table={pinned: entry})
    key = {"hdim": 64, "dstate": 256, "chunk_size": 256}  # dstate 64 is 2 octaves away, the other 8
    got = pinned_config("chunk_state_fwd", key, torch.bfloat16, "sm_90")
    assert got.num_warps == 8 and got.speed == f"nearest:{near}"
    # a pinned-table entry is a timed entry too: nearest to chunk 64 (2 octaves) but not to the key above (3)
    got = pinned_config("chunk_state_fwd", {"hdim": 64, "dstate": 128, "chunk_size": 32}, torch.bfloat16, "sm_90")
    assert got.num_warps == 2 and got.speed == f"nearest:{pinned}"
    # at the pinned entry's own key: that entry, no speed choice
    at = pinned_config("chunk_state_fwd", {"hdim": 64, "dstate": 128, "chunk_size": 64}, torch.bfloat16, "sm_90")
    assert at.speed == "" and at.as_dict() == entry and at.source == "table"
    assert configs._distance({"a": 64, "b": True}, {"a": 16, "b": True}) == 2.0
    assert configs._distance({"a": 64, "b": True}, {"a": 64, "b": False}) == float("inf")
    # no entry of this dtype at all (fp16; the table above has none): the order configuration as it is
    got16 = pinned_config("chunk_state_fwd", key, torch.float16, "sm_90")
    assert got16.speed == "" and got16 == order_config("chunk_state_fwd", key, torch.float16, "sm_90")


def test_fingerprint_names_the_speed_choice(speed_tables):
    before, bits = configs.fingerprint(), configs.fingerprint(speed=False)
    assert " speed=" in before and " speed=" not in bits and before.startswith(bits + " ")
    speed_tables({"chunk_state_fwd": ("num_warps",)}, {})
    assert configs.fingerprint() != before  # a new neutral set is a new speed choice
    assert configs.fingerprint(speed=False) == bits  # that decides no bit


def test_speed_candidates_vary_only_neutral_parameters(speed_tables):
    speed_tables({"chunk_state_fwd": ("BLOCK_SIZE_M", "num_warps")}, {})
    key = {"hdim": 64, "dstate": 128, "chunk_size": 256}
    live = {"chunk_state_fwd": SPEC.candidates}
    cands = tune.speed_candidates("chunk_state_fwd", key, "bfloat16", live, "sm_90")
    base = order_config("chunk_state_fwd", key, torch.bfloat16, "sm_90")
    assert cands[0] == (dict(base.meta), base.num_warps, base.num_stages)
    assert len(cands) == len(set((tuple(sorted(b.items())), w, s) for b, w, s in cands)) > 3
    for block, warps, stages in cands:
        assert block["BLOCK_SIZE_N"] == base["BLOCK_SIZE_N"] and block["BLOCK_SIZE_K"] == base["BLOCK_SIZE_K"]
        assert stages == base.num_stages
    assert {w for _, w, _ in cands} == {2, 4, 8} and len(cands) <= len(SPEC.candidates) + 1 + 3
    assert {b["BLOCK_SIZE_M"] for b, _, _ in cands} == {c[0]["BLOCK_SIZE_M"] for c in SPEC.candidates}


def test_no_speed_choice_outside_the_proven_keys_or_on_another_arch(speed_tables):
    key = {"hdim": 64, "dstate": 128, "chunk_size": 256}
    tk = table_key("sm_90", torch.bfloat16, "chunk_state_fwd", key)
    proven = {"chunk_state_fwd": {"hdim": [32, 128], "dstate": [16, 128], "chunk_size": [64, 256]}}
    speed_tables({"chunk_state_fwd": ("num_warps",)}, {tk: {"num_warps": 8}}, proven=proven)
    assert pinned_config("chunk_state_fwd", key, torch.bfloat16, "sm_90").speed == "speed-table"
    for outside in ({"hdim": 64, "dstate": 256, "chunk_size": 256}, {"hdim": 16, "dstate": 128, "chunk_size": 256},
                    {"hdim": 64, "dstate": 128, "chunk_size": 32}):
        got = pinned_config("chunk_state_fwd", outside, torch.bfloat16, "sm_90")
        assert got.speed == "" and got == order_config("chunk_state_fwd", outside, torch.bfloat16, "sm_90"), outside
    # another arch: the proof says nothing there
    tk80 = table_key("sm_80", torch.bfloat16, "chunk_state_fwd", key)
    speed_tables({"chunk_state_fwd": ("num_warps",)}, {tk80: {"num_warps": 8}}, proven=proven)
    assert pinned_config("chunk_state_fwd", key, torch.bfloat16, "sm_80").speed == ""
    # a boolean key value the proof did not run
    assert not configs._proven("chunk_scan_fwd", {"chunk_size": 64, "hdim": 64, "dstate": 64, "IS_CAUSAL": False},
                               "sm_90")


def test_the_committed_proof_covers_its_cases():
    """PROVEN spans exactly the cases of the committed evidence, and the verdict function gives NEUTRAL back from it
    (docs/results/neutral_h200.json stores each configuration with its digest or error)."""
    import json
    import pathlib

    from csrc_bindings.pinned import neutral_params
    data = json.loads((pathlib.Path(neutral.__file__).parents[2] / "docs/results/neutral_h200.json").read_text())
    assert neutral_params.ARCH == "sm_90"
    for kernel, v in data["kernels"].items():
        names = neutral.params_of(KERNELS[kernel])
        cases = [[{**r, "dtype": c["dtype"]} for r in neutral.case_rows(c, names)] for c in v["evidence"]]
        got = neutral.neutral_params(KERNELS[kernel], cases)
        assert tuple(got["neutral"]) == neutral_params.NEUTRAL.get(kernel, ()), kernel
        if got["neutral"]:
            assert neutral_params.PROVEN[kernel] == neutral.proven_keys([c["key"] for c in v["evidence"]]), kernel


def test_verdict_needs_a_pair_in_every_dtype_and_repeatable_configurations():
    bf16 = [{**_row("a"), "dtype": "bfloat16"}, {**_row("a", num_warps=8), "dtype": "bfloat16"}]
    fp32 = [{**_row("b"), "dtype": "float32"}, {**_row("b", BLOCK_SIZE_M=128), "dtype": "float32"}]
    v = neutral.neutral_params(SPEC, [bf16, fp32])
    assert v["neutral"] == []  # num_warps was paired in bf16 only, BLOCK_SIZE_M in fp32 only
    both = [bf16 + [], [*fp32, {**_row("b", num_warps=8), "dtype": "float32"}]]
    assert neutral.neutral_params(SPEC, both)["neutral"] == ["num_warps"]
    flaky = [*bf16, {"config": _row("a", num_stages=2)["config"], "error": "not repeatable: 1 then 2",
                     "dtype": "bfloat16"}]
    v = neutral.neutral_params(SPEC, [flaky])
    assert v["neutral"] == [] and "not repeatable" in v["violations"]


def test_reused_cases_round_trip_and_only_from_the_same_gpu_and_versions():
    names = neutral.params_of(KERNELS["chunk_scan_bwd_dz"])
    config = {n: 1 for n in names}
    done = {"key": {"chunk_size": 64, "hdim": 32}, "dtype": "bfloat16",
            "rows": [{"config": config, "digest": "ab"}, {"config": {**config, "num_warps": 8}, "error": "E: x"}]}
    cut = {"key": {"chunk_size": 256, "hdim": 64}, "dtype": "bfloat16",
           "rows": [{"config": config, "digest": "ab"}, {"config": config, "error": "skipped: budget"}]}
    stored = [neutral.compact_case(c) for c in (done, cut)]
    assert stored[0]["configs"][1] == {**config, "num_warps": 8, "error": "E: x"}
    assert neutral.case_rows(stored[0], names) == done["rows"]
    versions = {"mamba_ssm": "2.3.2.post1", "triton": "3.6.0"}
    odd = {"key": {"chunk_size": 128, "hdim": 32}, "dtype": "bfloat16",
           "configs": [{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_Q": 1, "num_warps": 4, "num_stages": 3, "digest": "ab"}]}
    report = {"gpu": "G", "versions": versions, "problem": neutral.PROBLEM,
              "kernels": {"chunk_scan_bwd_dz": {"evidence": stored + [odd]}, "no_such_kernel": {"evidence": stored}}}
    got = neutral.reusable_cases(report, versions, "G")
    # not the cut one, not the one with other parameters, nothing of an unknown kernel
    assert got == {("chunk_scan_bwd_dz", '{"chunk_size": 64, "hdim": 32}', "bfloat16"): done["rows"]}
    assert neutral.reusable_cases(report, versions, "H") == {}
    assert neutral.reusable_cases(report, {**versions, "triton": "3.7.0"}, "G") == {}
    assert neutral.reusable_cases({**report, "problem": {**neutral.PROBLEM, "batch": 3}}, versions, "G") == {}
    assert neutral.reusable_cases({k: v for k, v in report.items() if k != "problem"}, versions, "G") == {}
