"""The rule ``few-programs-v1`` (:func:`csrc_bindings._configs.few_programs_config`): a Mamba-3 launch of at most one
program per SM takes the bit-neutral values of ``FEW_PROGRAMS`` at its key, and nothing else changes: not the order
parameters, not a launch of more programs, not an explicit configuration, not a key or arch outside the proof.
CPU only: the launches of the composition are recorded on CPU tensors, with the device's arch and SM count given."""
import dataclasses
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import mamba3_configs as m3  # noqa: E402
from csrc_bindings import _configs  # noqa: E402
from csrc_bindings._spec import TIMING_PENDING  # noqa: E402
from csrc_bindings.pinned import mamba3_params  # noqa: E402

#: M5 and M6 share the forward's key (chunk 64, d_state 128, headdim 64); M6 (B1) launches 64 programs, M5 (B8) 256
FWD_KEY = ("sm_90/bfloat16/mamba3_siso_fwd/CHUNK_SIZE=64,HEADDIM_QK=128,HEADDIM_V=64,STORE_SSM_STATES_ADT_OUTV=True,"
           "HAS_D=True,HAS_Z=True,HAS_INITIAL_STATES=False,RETURN_FINAL_STATES=False,IS_VARLEN=False")


def _fwd():
    return m3._specs()["mamba3_siso_fwd"]


def _pinned(tk):
    arch, dtype, kernel, key = tk.split("/")
    return _configs.pinned_of(m3._specs()[kernel], _configs._parse_key(key), getattr(torch, dtype), arch)


def _few(tk, programs, sms=132, arch=None, cfg=None):
    a, dtype, kernel, key = tk.split("/")
    return _configs.few_programs_config(m3._specs()[kernel], cfg or _pinned(tk), _configs._parse_key(key), programs,
                                        sms, getattr(torch, dtype), arch or a)


def test_the_table_holds_the_entry_the_timing_gives_and_only_bit_neutral_values():
    report = json.load(open(os.path.join(ROOT, "docs", "results", "mamba3_configs.json")))
    neutral = {k: tuple(v["neutral"]) for k, v in report["verdicts"].items() if v["neutral"]}
    few = m3.few_program_entries(report["timing_all"], report["arch"], mamba3_params.ORDER, neutral, report["sms"])
    assert few == {FWD_KEY: {"num_stages": 3}}  # M6's forward: 0.684 ms at 3 stages, 0.767 at the entry's 2
    assert mamba3_params.FEW_PROGRAMS == few and set(few) <= set(mamba3_params.ORDER)
    for tk, values in mamba3_params.FEW_PROGRAMS.items():
        assert set(values) <= set(mamba3_params.NEUTRAL[tk.split("/")[2]]), tk
    assert mamba3_params.ORDER[FWD_KEY] == {"num_warps": 4, "num_stages": 2}


def test_the_generator_counts_programs_at_the_candidate_too():
    """A ``dzdo`` row at the check's shape (8 x 512, 16 heads: 1024 programs at the entry's 64-position chunks): with
    2048 SMs, 32-position chunks (2048 programs) qualify and 16-position ones (4096) do not, though faster."""
    key = "sm_90/bfloat16/mamba3_siso_bwd_dzdo/HEADDIM_V=64"
    entry = mamba3_params.ORDER[key]
    assert entry == {"CHUNK_SIZE": 64, "num_warps": 8, "num_stages": 1}
    row = {"shape": "check", "kernel": "mamba3_siso_bwd_dzdo", "key": {"HEADDIM_V": 64}, "dtype": "bfloat16",
           "times": [{"config": entry, "ms": 1.0}, {"config": dict(entry, CHUNK_SIZE=32), "ms": 0.8},
                     {"config": dict(entry, CHUNK_SIZE=16), "ms": 0.5}]}
    neutral = {"mamba3_siso_bwd_dzdo": mamba3_params.NEUTRAL["mamba3_siso_bwd_dzdo"]}
    got = m3.few_program_entries([row], "sm_90", mamba3_params.ORDER, neutral, 2048)
    assert got == {key: {"CHUNK_SIZE": 32, "num_warps": 8, "num_stages": 1}}
    assert m3.few_program_entries([row], "sm_90", mamba3_params.ORDER, neutral, 4096)[key]["CHUNK_SIZE"] == 16
    assert m3.few_program_entries([row], "sm_90", mamba3_params.ORDER, neutral, 1023) == {}  # the entry: 1024


def test_a_launch_of_at_most_one_program_per_sm_takes_the_entry():
    base = _pinned(FWD_KEY)
    for programs in (1, 64, 132):
        got = _few(FWD_KEY, programs)
        assert (got.num_warps, got.num_stages, got.speed, got.source) == (4, 3, "few-programs-v1", base.source)
    for programs in (133, 256):
        assert _few(FWD_KEY, programs) == base
    assert _few(FWD_KEY, 200, sms=264).num_stages == 3  # the device's SM count decides


def test_nothing_changes_outside_the_rule(monkeypatch):
    base = _pinned(FWD_KEY)
    explicit = _configs.config_from_dict(_fwd(), {"num_warps": 4, "num_stages": 1}, "explicit")
    assert _few(FWD_KEY, 64, cfg=explicit) is explicit
    pending = dataclasses.replace(base, speed=TIMING_PENDING)  # still to be timed: left to that rule
    assert _few(FWD_KEY, 64, cfg=pending) is pending
    # entries where the proof does not reach: another arch, a key outside its range (the no-grad forward)
    sm80 = FWD_KEY.replace("sm_90/", "sm_80/")
    no_grad = FWD_KEY.replace("STORE_SSM_STATES_ADT_OUTV=True", "STORE_SSM_STATES_ADT_OUTV=False")
    monkeypatch.setattr(mamba3_params, "FEW_PROGRAMS", dict(mamba3_params.FEW_PROGRAMS, **{
        sm80: {"num_stages": 3}, no_grad: {"num_stages": 3}}))
    assert _few(FWD_KEY, 64).num_stages == 3  # the entry itself still applies
    assert _few(sm80, 64) == _pinned(sm80)
    assert _few(no_grad, 64) == _pinned(no_grad) and _pinned(no_grad).num_stages == 2
    # a key without an entry
    other = next(tk for tk in mamba3_params.ORDER if tk not in mamba3_params.FEW_PROGRAMS and "siso_fwd" in tk)
    assert _few(other, 1) == _pinned(other)


def test_a_grid_of_the_block_sizes_is_counted_at_both_configurations(monkeypatch):
    """``dzdo``'s grid depends on its ``CHUNK_SIZE`` (bit-neutral there): an entry that would launch more programs
    than the device has SMs is not taken."""
    from csrc_bindings import _resources

    dzdo = m3._specs()["mamba3_siso_bwd_dzdo"]
    key = "sm_90/bfloat16/mamba3_siso_bwd_dzdo/HEADDIM_V=64"
    assert mamba3_params.ORDER[key]["CHUNK_SIZE"] == 64
    monkeypatch.setattr(mamba3_params, "FEW_PROGRAMS", {key: {"CHUNK_SIZE": 16, "num_warps": 4, "num_stages": 1}})
    monkeypatch.setattr(_configs, "_on_cuda", lambda ref: True)
    monkeypatch.setattr(_configs, "device_arch", lambda device: "sm_90")
    seen = []

    def record(spec, grid, args, ref, config=None):
        if spec is dzdo:
            seen.append((grid, args, ref))
    m3._recorded_with("M6", "train", 1, 64, record)  # one chunk of 64 positions: 64 heads x 1 chunk x 1 example
    (grid, args, ref), = seen
    for sms, want in ((64, 64), (256, 16)):  # 16-position chunks: 4 x 64 = 256 programs
        monkeypatch.setattr(_resources, "multiprocessor_count", lambda device, n=sms: n)
        assert _configs.launch_config_for_grid(dzdo, grid, args, ref)["CHUNK_SIZE"] == want, sms


@pytest.mark.parametrize("shape,stages", [("M6", 3), ("M5", 2)])
def test_the_forward_launches_of_a_layer_take_the_rule(monkeypatch, shape, stages):
    """The composition's launches, recorded on CPU tensors at the shape's own batch, through the launchers'
    :func:`~csrc_bindings._configs.launch_config_for_grid` on an sm_90 device of 132 SMs."""
    from csrc_bindings import _resources

    monkeypatch.setattr(_configs, "_on_cuda", lambda ref: True)
    monkeypatch.setattr(_configs, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(_resources, "multiprocessor_count", lambda device: 132)
    seen = {}

    def record(spec, grid, args, ref, config=None):
        seen.setdefault(spec.name, _configs.launch_config_for_grid(spec, grid, args, ref, config))
    m3._recorded_with(shape, "train", m3.SHAPES[shape][5], None, record)
    fwd = seen["mamba3_siso_fwd"]
    assert (fwd.num_warps, fwd.num_stages) == (4, stages)
    assert fwd.speed == ("few-programs-v1" if stages == 3 else "")
    # every other kernel launches its pinned entry as before
    for name, cfg in seen.items():
        if name != "mamba3_siso_fwd":
            assert cfg.speed == "", name


def test_the_speed_hash_covers_the_entries_and_the_bits_do_not(monkeypatch):
    before, bits = _configs.speed_hash(), _configs.fingerprint(speed=False)
    from ordered_ssd.ops.mamba3_siso import mamba3_fingerprint
    m3_bits = mamba3_fingerprint()
    monkeypatch.setattr(mamba3_params, "FEW_PROGRAMS", {})
    assert _configs.speed_hash() != before
    assert _configs.fingerprint(speed=False) == bits and mamba3_fingerprint() == m3_bits
