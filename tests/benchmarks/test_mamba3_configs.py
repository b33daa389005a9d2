"""``benchmarks/mamba3_configs.py`` and what it generated: ``csrc_bindings/pinned/mamba3_params.py`` is exactly what
``--write`` makes of the committed report (``docs/results/mamba3_configs.json``); its neutral parameters are the
proof's verdict recomputed from the report's digests; every pinned entry is one of upstream's candidates, the
fastest timed at its key; every launch of the timed shapes (keys and dtypes recorded on the CPU) has an entry in
every mode; the launchers take those entries, and a key outside them the ``mincost-v1`` rule's configuration whole.
CPU only: the report holds the GPU's evidence."""
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, "docs", "results", "mamba3_configs.json")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import mamba3_configs as m3  # noqa: E402


def _report():
    with open(REPORT) as f:
        return json.load(f)


def test_the_generated_module_is_what_the_report_gives(tmp_path):
    out = tmp_path / "mamba3_params.py"
    m3.write_module(_report(), out)
    with open(m3.OUT_MODULE) as f:
        assert out.read_text() == f.read()


def test_the_neutral_parameters_are_the_verdict_of_the_digests():
    from csrc_bindings.pinned import mamba3_params

    report = _report()
    verdicts = m3.verdicts(report["cases"])
    assert set(verdicts) == set(m3._specs()) and all(v["cases"] == len(m3.SHAPES) for v in verdicts.values())
    assert {k: tuple(v["neutral"]) for k, v in verdicts.items() if v["neutral"]} == mamba3_params.NEUTRAL
    # num_warps decides bits in the scan kernels (a one-parameter pair with other digests), so they have an ORDER
    assert "num_warps" in verdicts["mamba3_siso_fwd"]["violations"]
    assert verdicts["mamba3_siso_bwd_dqkv"]["neutral"] == []


def test_every_pinned_entry_is_a_candidate_and_the_fastest_timed():
    from csrc_bindings.pinned import mamba3_params

    specs = m3._specs()
    report = _report()
    from csrc_bindings._configs import table_key_of

    timed = {}
    for row in report["timing_all"]:
        tk = table_key_of(specs[row["kernel"]], report["arch"], getattr(torch, row["dtype"]), row["key"])
        base = next(t["ms"] for t in row["times"] if t["config"] == row["pinned"])
        for t in row["times"]:
            if "ms" in t:
                timed.setdefault(tk, {}).setdefault(json.dumps(t["config"], sort_keys=True), []).append(t["ms"] / base)
    assert timed and set(timed) <= set(mamba3_params.ORDER)
    for tk, cfg in mamba3_params.ORDER.items():
        spec = specs[tk.split("/")[2]]
        assert (tuple(sorted(k for k in cfg if not k.startswith("num_"))) ==
                tuple(sorted(spec.candidates[0][0]))), tk
        assert ({k: v for k, v in cfg.items() if not k.startswith("num_")}, cfg["num_warps"],
                cfg["num_stages"]) in spec.candidates, tk
        if tk in timed:  # the forward kernels' other modes repeat the training key's entry (SAME_ENTRY)
            n = max(len(v) for v in timed[tk].values())
            full = {c: sum(v) for c, v in timed[tk].items() if len(v) == n}
            assert json.dumps(cfg, sort_keys=True) == min(full, key=lambda c: (full[c], c)), tk


def test_every_launch_of_the_timed_shapes_has_an_entry_in_every_mode():
    """The keys and dtypes the launchers use (recorded on the CPU: :func:`mamba3_configs.launch_keys`) at every
    shape of the table, in training, no-grad and prefill, each have an ``ORDER`` entry, the forward kernels the same
    one in every mode; and the timing rows ran exactly those keys."""
    from csrc_bindings._configs import table_key_of
    from csrc_bindings.pinned import mamba3_params

    specs = m3._specs()
    report = _report()
    for shape in m3.SHAPES:
        by_mode = {mode: m3.launch_keys(shape, mode) for mode in ("train", "no_grad", "prefill")}
        assert [k for k, _, _ in by_mode["train"]] == list(specs)  # each kernel once, in the order of MAMBA3_SPECS
        assert [k for k, _, _ in by_mode["no_grad"]] == [k for k, _, _ in by_mode["prefill"]] == list(specs)[:2]
        entries = {}
        for mode, launches in by_mode.items():
            for kernel, key, dt in launches:
                tk = table_key_of(specs[kernel], "sm_90", getattr(torch, dt), key)
                assert tk in mamba3_params.ORDER, (shape, mode, tk)
                entries.setdefault(kernel, set()).add(str(mamba3_params.ORDER[tk]))
        assert all(len(v) == 1 for v in entries.values()), entries
        rows = {r["kernel"]: (r["key"], r["dtype"]) for r in report["timing_all"] if r["shape"] == shape}
        assert rows == {k: (key, dt) for k, key, dt in by_mode["train"]}, shape


def test_the_launchers_take_the_pinned_entries_and_the_rule_elsewhere():
    from csrc_bindings import _configs
    from csrc_bindings.pinned import mamba3_params

    specs = m3._specs()
    for tk, cfg in mamba3_params.ORDER.items():
        arch, dtype, kernel, key = tk.split("/")
        got = _configs.pinned_of(specs[kernel], _configs._parse_key(key), getattr(torch, dtype), arch)
        assert (got.source, got.speed, got.as_dict()) == ("table", "", cfg), tk
    dqkv = specs["mamba3_siso_bwd_dqkv"]
    other = {"CHUNK_SIZE": 256, "HEADDIM_QK": 128, "HEADDIM_V": 128, "IS_VARLEN": False}  # no entry there
    got = _configs.pinned_of(dqkv, other, torch.bfloat16, "sm_90")
    assert got.source == "rule" and (got.num_warps, got.num_stages) == (2, 1)
    assert _configs.pinned_of(dqkv, other, torch.bfloat16, "sm_80") == got  # no speed choice either
    fwd = specs["mamba3_siso_fwd"]  # outside the table, every mode launches the rule's configuration whole
    base = dict(CHUNK_SIZE=32, HEADDIM_QK=64, HEADDIM_V=32, HAS_D=True, HAS_Z=True, HAS_INITIAL_STATES=False,
                IS_VARLEN=False)
    modes = [_configs.pinned_of(fwd, dict(base, STORE_SSM_STATES_ADT_OUTV=store, RETURN_FINAL_STATES=final),
                                torch.bfloat16, "sm_90") for store in (True, False) for final in (True, False)]
    assert {(c.source, c.speed, c.num_warps, c.num_stages) for c in modes} == {("rule", "", 2, 1)}
