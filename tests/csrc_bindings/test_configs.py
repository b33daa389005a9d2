"""The pinned-configuration lookup on the CPU (no native import): table entries, the mincost-v1 rule, memoisation
(csrc_bindings/_configs.py, asked by kernel name through csrc_bindings/_registry.py)."""
import pytest
import torch

from csrc_bindings._configs import (_cost, _neutral, _parse_key, _speed, _table, config_from_dict, device_arch,
                                    resolve_config, table_key_of)
from csrc_bindings._registry import KERNELS, order_config, pinned_config, rule_config, table_key
from csrc_bindings._spec import KernelSpec

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _parse(k):
    arch, dt, kernel, keystr = k.split("/")
    return arch, DT[dt], kernel, _parse_key(keystr)


def test_every_table_entry_is_returned_and_memoised():
    entries = list(_table().items())
    assert len(entries) > 10
    for k, entry in entries:
        arch, dtype, kernel, key = _parse(k)
        assert table_key(arch, dtype, kernel, key) == k
        want = config_from_dict(KERNELS[kernel], entry, "table")
        assert order_config(kernel, key, dtype, arch) == want
        first = pinned_config(kernel, key, dtype, arch)
        assert first.source == "table"
        # the entry itself, unless the speed table has this key (then only its bit-neutral parameters differ)
        assert first == want or (first.speed == "speed-table" and table_key(arch, dtype, kernel, key) in _speed())
        assert pinned_config(kernel, dict(reversed(list(key.items()))), dtype, arch) is first  # cached, any order


def test_keys_outside_the_table_get_the_mincost_rule():
    """A key with no entry and (for a kernel with ``order_nearest`` sizes) no entry to be near to in bf16 on sm_90:
    chunk size 7 has no chunk-cumsum entry, and ``state_passing_bwd`` has fp32 entries only."""
    for kernel, spec in KERNELS.items():
        if spec.candidates is None or spec.autotune_key is None:
            continue
        key = {n: 7 for n in spec.autotune_key}  # 7 is in no table key
        got = pinned_config(kernel, key, torch.bfloat16, "sm_90")
        cands = spec.candidates
        costs = [_cost(c[0], c[2]) for c in cands]
        best = costs.index(min(costs))  # the earliest of the cheapest
        rule = order_config(kernel, key, torch.bfloat16, "sm_90")
        assert rule.source == "rule" and rule == rule_config(kernel)
        assert dict(rule.meta) == dict(cands[best][0]) and (rule.num_warps, rule.num_stages) == cands[best][1:]
        # launched: the rule's order parameters; the bit-neutral ones from the nearest timed entry, if any
        got = pinned_config(kernel, key, torch.bfloat16, "sm_90")
        neutral = _neutral().get(kernel, ())
        assert got.source == "rule"
        assert {n: v for n, v in got.as_dict().items() if n not in neutral} == {
            n: v for n, v in rule.as_dict().items() if n not in neutral}
        assert got == rule or got.speed.startswith("nearest:sm_90/bfloat16/" + kernel + "/")


def test_bool_and_int_key_values_are_not_confused():
    entries = [(k, _parse(k)) for k in _table() if "=True" in k or "=False" in k]
    assert entries, "the table has no boolean key to test with"
    k, (arch, dtype, kernel, key) = entries[0]
    assert pinned_config(kernel, key, dtype, arch).source == "table"
    as_int = {n: (int(v) if isinstance(v, bool) else v) for n, v in key.items()}
    assert table_key(arch, dtype, kernel, as_int) != k
    assert order_config(kernel, as_int, dtype, arch).source == "rule"  # not the cached table entry


def test_device_arch_off_cuda():
    assert device_arch("cpu") == "cpu" and device_arch(torch.device("meta")) == "meta"


def test_explicit_configs():
    spec = KERNELS["chunk_state_fwd"]
    key = {"hdim": 64, "dstate": 128, "chunk_size": 256}
    d = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "num_warps": 2, "num_stages": 5}
    got = resolve_config(spec, key, torch.bfloat16, "cpu", d)
    assert got.source == "explicit" and got.as_dict() == d
    assert resolve_config(spec, key, torch.bfloat16, "cpu", got) is got
    with pytest.raises(ValueError, match="config: expected a config for chunk_scan_fwd, got one for chunk_state_fwd"):
        resolve_config(KERNELS["chunk_scan_fwd"], key, torch.bfloat16, "cpu", got)
    with pytest.raises(ValueError, match=r"config: expected exactly .* for chunk_state_fwd, got"):
        resolve_config(spec, key, torch.bfloat16, "cpu", {"BLOCK_SIZE_M": 64})
    with pytest.raises(KeyError, match="key: expected the names"):
        table_key("sm_90", torch.bfloat16, "chunk_state_fwd", {"hdim": 64})


def test_errors_name_the_argument_expected_and_got():
    from csrc_bindings.layernorm_gated import rmsnorm_heuristic
    with pytest.raises(KeyError, match=r"kernel: expected one of \[.*\], got 'rmsnorm_gated_fwd'"):
        pinned_config("rmsnorm_gated_fwd", {}, torch.bfloat16, "sm_90")
    with pytest.raises(KeyError, match="kernel: expected one of"):
        rule_config("no_such_kernel")
    with pytest.raises(KeyError, match="kernel: expected a kernel with an autotuner"):
        table_key_of(KERNELS["rmsnorm_gated_fwd"], "sm_90", torch.bfloat16, {})
    with pytest.raises(ValueError, match=r"group_size: expected at most 32768 elements .*, got 40000"):
        rmsnorm_heuristic(40000, 2)


@pytest.mark.parametrize("block_m, block_n", [(32, 64), (64, 128), (32, 128)])
def test_ddAcs_refuses_block_n_not_dividing_block_m_before_launching(monkeypatch, block_m, block_n):
    """``_chunk_scan_bwd_ddAcs_stable_kernel`` races when BLOCK_SIZE_M is not a multiple of BLOCK_SIZE_N (its zeroing
    loop writes into the next row tile; seen as other bits from run to run on the H200): refused, nothing launched."""
    from csrc_bindings._examples import make_problem
    from csrc_bindings.ssd_chunk_scan import launch_chunk_scan_bwd_ddAcs_stable
    from tests.csrc_bindings.launch_record import fake_cuda_path

    log = []
    fake_cuda_path(monkeypatch, log)
    p = make_problem(chunk_size=128, headdim=32, dstate=16, seqlen=300)
    cfg = {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": block_n, "num_warps": 4, "num_stages": 3}
    with pytest.raises(ValueError, match=f"config: chunk_scan_bwd_ddAcs_stable needs BLOCK_SIZE_M to be a multiple of "
                                         f"BLOCK_SIZE_N, got BLOCK_SIZE_M={block_m}, BLOCK_SIZE_N={block_n}"):
        launch_chunk_scan_bwd_ddAcs_stable(p["x"], p["dt"], p["dA_cumsum"], p["dout"], p["CB"], config=cfg)
    assert log == []
    ok = dict(cfg, BLOCK_SIZE_N=block_m)  # a multiple: launched
    launch_chunk_scan_bwd_ddAcs_stable(p["x"], p["dt"], p["dA_cumsum"], p["dout"], p["CB"], config=ok)
    assert [e["kernel"] for e in log] == ["chunk_scan_bwd_ddAcs_stable"]


def test_every_ddAcs_candidate_and_table_entry_has_block_m_a_multiple_of_block_n():
    from csrc_bindings.pinned.table import TABLE
    spec = KERNELS["chunk_scan_bwd_ddAcs_stable"]
    blocks = [c[0] for c in spec.candidates] + [v for k, v in TABLE.items() if "/chunk_scan_bwd_ddAcs_stable/" in k]
    assert len(blocks) > len(spec.candidates)
    assert all(b["BLOCK_SIZE_M"] % b["BLOCK_SIZE_N"] == 0 for b in blocks)


ORDER_KERNELS = ("chunk_scan_chunk_state_bwd_dx", "chunk_state_bwd_db", "chunk_scan_bwd_dC",
                 "chunk_scan_bwd_ddAcs_stable", "chunk_scan_bwd_dz", "state_passing_bwd")


def test_the_pinned_table_covers_the_key_space_of_the_order_kernels():
    """On sm_90, every (kernel, key, dtype) of the six kernels with order parameters over the key space (chunk
    64/128/256, headdim 32/64/128, d_state 16-256; bf16, fp16, fp32) has a pinned entry (none is left to the
    mincost-v1 rule); every entry's configuration is one of the kernel's native candidates."""
    from types import SimpleNamespace

    from csrc_bindings.pinned import tune
    args = SimpleNamespace(shapes="key-space", kernels=",".join(ORDER_KERNELS), nheads="24,32,48,64",
                           dtypes="bfloat16,float16,float32", swiglu_cols=0)
    jobs = tune.build_jobs(args)
    assert len(jobs) == 466
    table = _table()
    missing = [(k, key, dt) for k, key, dt in jobs if table_key("sm_90", DT[dt], k, key) not in table]
    assert missing == []
    for k, key, dt in jobs:
        assert order_config(k, key, DT[dt], "sm_90").source == "table", (k, key, dt)
    for k, key, dt in jobs:
        tk = table_key("sm_90", DT[dt], k, key)
        if tk in table:
            entry = table[tk]
            cand = ({n: v for n, v in entry.items() if n not in ("num_warps", "num_stages")}, entry["num_warps"],
                    entry["num_stages"])
            assert cand in [(dict(c[0]), c[1], c[2]) for c in KERNELS[k].candidates], tk


def test_nearest_order_rule_on_a_synthetic_table():
    """Rule nearest-order-v1 (csrc_bindings._configs.nearest_order_key): along the spec's ``order_nearest`` names
    only, the smallest sum of |log2| ratios, the other key values equal, ties to the first key in sorted order."""
    from csrc_bindings._configs import nearest_order_key
    spec = KERNELS["chunk_cumsum_fwd"]
    assert spec.order_nearest == ("nheads",)
    pre = "sm_90/bfloat16/chunk_cumsum_fwd/"
    e = {"BLOCK_SIZE_H": 8, "num_warps": 4, "num_stages": 3}
    table = {pre + "chunk_size=64,nheads=8": e, pre + "chunk_size=64,nheads=32": e,
             pre + "chunk_size=256,nheads=16": e, "sm_90/float16/chunk_cumsum_fwd/chunk_size=64,nheads=16": e,
             "sm_90/bfloat16/chunk_cumsum_bwd/chunk_size=64,nheads=16": e}

    def near(chunk_size, nheads):
        key = {"chunk_size": chunk_size, "nheads": nheads}
        return nearest_order_key(spec, key, table_key_of(spec, "sm_90", "bfloat16", key), table)

    assert near(64, 9) == pre + "chunk_size=64,nheads=8"
    assert near(64, 1) == pre + "chunk_size=64,nheads=8"  # below the smallest entry
    assert near(64, 24) == pre + "chunk_size=64,nheads=32"  # |log2(24/32)| = 0.415 < |log2(24/8)| = 1.585
    assert near(64, 16) == pre + "chunk_size=64,nheads=32"  # a tie (1 and 1): "nheads=32" sorts before "nheads=8"
    assert near(64, 1000) == pre + "chunk_size=64,nheads=32"
    assert near(256, 8) == pre + "chunk_size=256,nheads=16"  # never another chunk_size, dtype or kernel
    assert near(128, 16) is None  # no entry at this chunk_size: the mincost-v1 rule
    # a boolean value is never near another value (the distance is infinite), under an order_nearest name too
    bool_spec = KernelSpec(name="k", module="m", attr="a", autotune_key=("IS_CAUSAL", "n"),
                           order_nearest=("IS_CAUSAL",))
    bpre = "sm_90/bfloat16/k/"
    btable = {bpre + "IS_CAUSAL=False,n=4": e}
    for v in (True, 1):
        bkey = {"IS_CAUSAL": v, "n": 4}
        assert nearest_order_key(bool_spec, bkey, table_key_of(bool_spec, "sm_90", "bfloat16", bkey), btable) is None
    bkey = {"IS_CAUSAL": False, "n": 4}
    assert nearest_order_key(bool_spec, bkey, "sm_90/bfloat16/k/IS_CAUSAL=False,n=5", btable) == bpre + (
        "IS_CAUSAL=False,n=4")
    with pytest.raises(ValueError, match="order_nearest: expected names of the autotune key"):
        KernelSpec(name="k", module="m", attr="a", autotune_key=("chunk_size", "nheads"), order_nearest=("nhead",))
    dc = KERNELS["chunk_scan_bwd_dC"]
    assert dc.order_nearest == ()
    key = {"chunk_size": 64, "dstate": 48, "hdim": 64}
    assert nearest_order_key(dc, key, table_key_of(dc, "sm_90", "bfloat16", key), _table()) is None


@pytest.mark.parametrize("kernel,key,dtype,near", [
    # log2(48/40) = 0.26 < log2(40/32) = 0.32
    ("chunk_cumsum_fwd", {"chunk_size": 256, "nheads": 40}, torch.bfloat16, "chunk_size=256,nheads=48"),
    # log2(24/20) = 0.26 < log2(20/16) = 0.32
    ("chunk_cumsum_bwd", {"chunk_size": 64, "nheads": 20}, torch.bfloat16, "chunk_size=64,nheads=24"),
    ("chunk_cumsum_fwd", {"chunk_size": 128, "nheads": 1000}, torch.float32, "chunk_size=128,nheads=256"),
    ("chunk_cumsum_bwd", {"chunk_size": 256, "nheads": 256}, torch.float16, "chunk_size=256,nheads=128"),
    ("chunk_cumsum_fwd", {"chunk_size": 64, "nheads": 2}, torch.float32, "chunk_size=64,nheads=8"),
    # log2(4096/3072) = 0.42 < log2(3072/2048) = 0.58
    ("state_passing_bwd", {"dim": 3072}, torch.float32, "dim=4096"),
    ("state_passing_bwd", {"dim": 65536}, torch.float32, "dim=32768"),
    ("state_passing_bwd", {"dim": 7}, torch.float32, "dim=512"),
])
def test_keys_between_table_entries_take_the_nearest_entrys_order_parameters(kernel, key, dtype, near):
    """Real table: a key missing from it takes the order parameters of the nearest entry (worked out by hand
    above), the source says which, the same in every call (memoised)."""
    spec = KERNELS[kernel]
    tk = table_key("sm_90", dtype, kernel, key)
    table = _table()
    assert tk not in table
    best = tk.rsplit("/", 1)[0] + "/" + near
    assert best in table
    got = order_config(kernel, key, dtype, "sm_90")
    assert got.source == f"nearest:{best}"
    assert got == config_from_dict(spec, table[best], f"nearest:{best}")
    launched = pinned_config(kernel, key, dtype, "sm_90")
    neutral = _neutral().get(kernel, ())
    assert {n: v for n, v in launched.as_dict().items() if n not in neutral} == {
        n: v for n, v in got.as_dict().items() if n not in neutral}
    assert pinned_config(kernel, key, dtype, "sm_90") is launched


def test_the_chunk_cumsum_kernels_take_a_timed_configuration_at_every_nheads_of_the_key_space():
    """On sm_90, the two chunk-cumsum kernels (order parameters BLOCK_SIZE_H, num_warps; key chunk_size, nheads)
    have a pinned entry in bf16, fp16 and fp32 at chunk 64/128/256 and nheads 8-256 (tuned 2026-12-03; the search
    of nheads 256 at chunk 256 ran out of its time budget), and every other nheads of those chunk sizes takes the
    nearest entry's order parameters (nearest-order-v1), never the untimed mincost-v1 rule. The fp16 entries at
    chunk 64/128, held back in the table's META until G10-G13 were benched on them, are in the table."""
    table = _table()
    assert "held_back" not in _table_meta()
    tuned = (8, 16, 24, 32, 48, 64, 96, 128, 256)
    missing = []
    for kernel in ("chunk_cumsum_fwd", "chunk_cumsum_bwd"):
        for dt, dtype in DT.items():
            for chunk_size in (64, 128, 256):
                for nheads in tuned:
                    if table_key("sm_90", dtype, kernel, {"chunk_size": chunk_size, "nheads": nheads}) not in table:
                        missing.append((kernel, dt, chunk_size, nheads))
                for nheads in range(1, 513):
                    got = order_config(kernel, {"chunk_size": chunk_size, "nheads": nheads}, dtype, "sm_90")
                    assert got.source == "table" or got.source.startswith(
                        f"nearest:sm_90/{dt}/{kernel}/chunk_size={chunk_size},"), (kernel, dt, chunk_size, nheads)
                    name = got.source[len("nearest:"):] if got.source != "table" else table_key(
                        "sm_90", dtype, kernel, {"chunk_size": chunk_size, "nheads": nheads})
                    assert got.as_dict() == table[name], (kernel, dt, chunk_size, nheads)
    kernels = ("chunk_cumsum_fwd", "chunk_cumsum_bwd")
    assert sorted(missing) == sorted((k, dt, 256, 256) for k in kernels for dt in DT)
    for kernel, dt, chunk_size, nheads in missing:
        got = order_config(kernel, {"chunk_size": chunk_size, "nheads": nheads}, DT[dt], "sm_90")
        assert got.source == f"nearest:sm_90/{dt}/{kernel}/chunk_size=256,nheads=128"
    # one of the formerly held-back fp16 entries, value as tuned (BLOCK_SIZE_H 64 at chunk 128 with 128 heads)
    got = order_config("chunk_cumsum_bwd", {"chunk_size": 128, "nheads": 128}, DT["float16"], "sm_90")
    assert (got.source, got.as_dict()["BLOCK_SIZE_H"]) == ("table", 64)


def _table_meta() -> dict:
    from csrc_bindings.pinned.table import META
    return META


def test_the_fingerprint_names_which_kernels_take_the_nearest_entry(monkeypatch):
    """Giving another kernel order_nearest sizes changes configurations as a table change does: the fingerprint's
    rule part changes with it."""
    import dataclasses

    import csrc_bindings
    from csrc_bindings import _registry
    before = csrc_bindings.fingerprint(speed=False)
    spec = KERNELS["chunk_scan_bwd_dC"]
    monkeypatch.setitem(_registry.KERNELS, spec.name, dataclasses.replace(spec, order_nearest=("dstate",)))
    after = csrc_bindings.fingerprint(speed=False)
    assert after != before
    assert before.split(" rule=")[0] == after.split(" rule=")[0]  # the same versions and table


def test_the_speed_table_overrides_no_pinned_entry_written_after_it():
    """A speed-table entry holds bit-neutral values timed with the order parameters pinned when it was tuned
    (2026-11-30), and wins over the pinned table's own values at its key. Every pinned-table write since then pruned
    the speed entries at the keys it wrote (``write.prune_speed``, recorded in the speed table's META "pruned"); the
    keys both tables still share are the two first-table chunk-cumsum entries (chunk 256, 24 heads) the speed run
    was timed on top of, which no later run rewrote. A table write that forgets to prune adds a key here."""
    from csrc_bindings.pinned.speed_table import META as SPEED_META

    shared = sorted(set(_table()) & set(_speed()))
    assert shared == ["sm_90/bfloat16/chunk_cumsum_bwd/chunk_size=256,nheads=24",
                      "sm_90/float32/chunk_cumsum_fwd/chunk_size=256,nheads=24"]
    pruned = {k for p in SPEED_META["pruned"] for k in p["entries"]}
    fp16_128 = {f"sm_90/float16/chunk_cumsum_{d}/chunk_size=128,nheads={h}" for d in ("fwd", "bwd") for h in (16, 64)}
    assert fp16_128 <= pruned
    assert not pruned & set(_speed())
