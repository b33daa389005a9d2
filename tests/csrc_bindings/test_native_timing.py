"""Rule ``native-autotune-v1`` (csrc_bindings._configs): kernels whose every parameter is bit-neutral take upstream's
autotuned configuration, timed at the first launch of a key, then launch it through the JIT function.

On the CPU with the natives faked (tests/csrc_bindings/launch_record.fake_native) and a stand-in for upstream's
``triton.autotune`` object; the device arch and "is this a CUDA launch" are patched, so the launchers' own code runs.
The GPU side (the same bits with and without the timing, on a layer) is tests/gpu/csrc_bindings/test_native_timing.py.
"""
from types import SimpleNamespace

import pytest
import torch

from csrc_bindings import _configs, _native
from csrc_bindings._examples import make_problem
from csrc_bindings._registry import KERNELS, describe_launch, pinned_config, run_kernel, timed_config
from tests.csrc_bindings.launch_record import fake_native

TIMED = {"bmm_chunk_fwd", "bmm_chunk_bwd", "chunk_state_fwd", "chunk_state_varlen", "chunk_scan_fwd",
         "chunk_scan_bwd_dstates", "state_passing_fwd"}
# a key within the neutrality proof's range (chunk 64-256, headdim 32-128, d_state 16-256)
PROVEN_SIZES = dict(chunk_size=64, headdim=32, dstate=16, nheads=4, ngroups=2, batch=2, seqlen=150)


class FakeTuner:
    """Stands for a ``triton.autotune`` object: ``configs`` are the kernel's candidates; ``tuner[grid](**args)``
    records the grid it gives for each candidate, "times" them (``configs_timings``, a ``cache`` entry) and picks
    ``choice`` (an index into the candidates), as Triton's ``Autotuner.run`` does."""

    def __init__(self, spec, log, choice):
        self.spec, self.log, self.choice = spec, log, choice
        self.configs = [SimpleNamespace(kwargs=dict(kw), num_warps=w, num_stages=st, pre_hook=None)
                        for kw, w, st in spec.candidates]
        self.cache = {("native's own key",): "native's own choice"}
        self.best_config = "native's last choice"

    def __getitem__(self, grid):
        def run(**args):
            grids = [grid({**args, **c.kwargs}) for c in self.configs]
            self.best_config = self.configs[self.choice]
            self.configs_timings = {id(c): 1.0 for c in self.configs}
            self.cache[tuple(args[n] for n in self.spec.autotune_key)] = self.best_config
            self.log.append({"kernel": self.spec.name, "tuned": True, "grids": grids, "args": args})
        return run


@pytest.fixture
def faked(monkeypatch):
    """Natives faked, every launch "on CUDA" of an sm_90 device, no capture, no timed choice kept."""
    log = []
    tri, conv = fake_native(log)
    monkeypatch.setitem(_native._state, "triton", tri)
    monkeypatch.setitem(_native._state, "conv", conv)
    monkeypatch.setattr(_configs, "_on_cuda", lambda ref: True)
    monkeypatch.setattr(_configs, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    _configs.forget_timed()
    yield tri, log
    _configs.forget_timed()


def _tuners(tri, log, choice):
    for name in TIMED:
        tri.kernels[name] = FakeTuner(KERNELS[name], log, choice)


def test_the_timed_kernels_are_the_all_neutral_plain_store_ones():
    got = {name for name, spec in KERNELS.items() if spec.timing_outputs}
    assert got == TIMED
    for name in got:
        spec = KERNELS[name]
        assert _configs._all_neutral(spec), name
        assert not spec.pre_hook_zero, name
        assert set(spec.timing_outputs) <= set(spec.arg_names), name
    # a kernel with an order parameter is never timed at run time
    assert not _configs._all_neutral(KERNELS["chunk_scan_chunk_state_bwd_dx"])
    assert not KERNELS["chunk_scan_chunk_state_bwd_dx"].timing_outputs


def test_first_launch_times_later_launches_use_the_choice(faked):
    tri, log = faked
    spec = KERNELS["chunk_scan_fwd"]
    choice = len(spec.candidates) - 1
    _tuners(tri, log, choice)
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    out1 = run_kernel("chunk_scan_fwd", p)
    assert [e.get("tuned") for e in log] == [True]
    # the tuner got every argument but the configuration's, and a grid that follows each candidate's block sizes
    args = log[0]["args"]
    assert set(args) == set(spec.arg_names) - set(spec.candidates[0][0])
    B, L, H, P, cs = 2, 150, 4, 32, 64
    for (kw, _, _), grid in zip(spec.candidates, log[0]["grids"]):
        assert grid == (-(-cs // kw["BLOCK_SIZE_M"]) * -(-P // kw["BLOCK_SIZE_N"]), B * -(-L // cs), H)
    key = {"chunk_size": cs, "hdim": P, "dstate": 16, "IS_CAUSAL": True}
    kept = timed_config("chunk_scan_fwd", key, torch.bfloat16, "sm_90")
    kw, warps, stages = spec.candidates[choice]
    assert kept.as_dict() == {**kw, "num_warps": warps, "num_stages": stages}
    assert kept.speed == "native-autotune-v1" and kept.source == pinned_config("chunk_scan_fwd", key, torch.bfloat16,
                                                                                "sm_90").source
    log.clear()
    out2 = run_kernel("chunk_scan_fwd", p)
    assert len(log) == 1 and "tuned" not in log[0]
    assert (log[0]["num_warps"], log[0]["num_stages"]) == (warps, stages)
    assert log[0]["grid"] == [-(-cs // kw["BLOCK_SIZE_M"]) * -(-P // kw["BLOCK_SIZE_N"]), B * -(-L // cs), H]
    names = spec.arg_names
    assert [log[0]["args"][names.index(n)] for n in kw] == list(kw.values())
    assert [t.shape for t in out1] == [t.shape for t in out2]
    # another dtype is another key
    assert timed_config("chunk_scan_fwd", key, torch.float16, "sm_90") is None
    name = "sm_90/bfloat16/chunk_scan_fwd/chunk_size=64,hdim=32,dstate=16,IS_CAUSAL=True"
    assert name in _configs.timed_configs() and _configs.timing_counts()[name] == len(spec.candidates)
    # upstream's autotuner object is left as it was: its cache and its record of the last run
    tuner = tri.kernels["chunk_scan_fwd"]
    assert tuner.cache == {("native's own key",): "native's own choice"}
    assert tuner.best_config == "native's last choice" and not hasattr(tuner, "configs_timings")


def test_describe_launch_reports_a_timed_choice(faked):
    tri, log = faked
    _tuners(tri, log, 0)
    sizes = dict(chunk_size=64, headdim=32, dstate=16, nheads=4)
    before = describe_launch(**sizes, dtype=torch.bfloat16, arch="sm_90")["kernels"]["chunk_scan_fwd"]
    assert before.get("speed") != "native-autotune-v1"
    run_kernel("chunk_scan_fwd", make_problem(dtype=torch.bfloat16, **PROVEN_SIZES))
    after = describe_launch(**sizes, dtype=torch.bfloat16, arch="sm_90")["kernels"]["chunk_scan_fwd"]
    kw, warps, stages = KERNELS["chunk_scan_fwd"].candidates[0]
    assert after["speed"] == "native-autotune-v1"
    assert after["config"] == {**kw, "num_warps": warps, "num_stages": stages}


@pytest.mark.parametrize("kernel", sorted(TIMED))
def test_every_timed_kernel_goes_through_its_tuner_once(faked, kernel):
    tri, log = faked
    _tuners(tri, log, 1)
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    if kernel == "state_passing_fwd":  # key ``dim`` = headdim * dstate = 512 (within the proof's range)
        p["states"] = torch.randn(2, 3, 4, 512)
    run_kernel(kernel, p)
    run_kernel(kernel, p)
    tuned = [e for e in log if e.get("tuned")]
    plain = [e for e in log if not e.get("tuned")]
    assert len(tuned) == 1 and len(plain) == 1, kernel
    kw, warps, stages = KERNELS[kernel].candidates[1]
    assert (plain[0]["num_warps"], plain[0]["num_stages"]) == (warps, stages)


def test_not_timed_outside_the_proof_during_capture_off_or_explicit(faked, monkeypatch):
    tri, log = faked
    _tuners(tri, log, 1)
    outside = make_problem(dtype=torch.bfloat16, **{**PROVEN_SIZES, "chunk_size": 32})  # chunk 32: not proven
    run_kernel("chunk_scan_fwd", outside)
    assert [e.get("tuned") for e in log] == [None]
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    key = {"chunk_size": 64, "hdim": 32, "dstate": 16, "IS_CAUSAL": True}
    static = pinned_config("chunk_scan_fwd", key, torch.bfloat16, "sm_90")
    log.clear()
    run_kernel("chunk_scan_fwd", p, config=static.as_dict())  # explicit: launched as given
    assert [e.get("tuned") for e in log] == [None]
    monkeypatch.setattr(_configs, "NATIVE_TIMING", False)
    log.clear()
    run_kernel("chunk_scan_fwd", p)
    assert [e.get("tuned") for e in log] == [None]
    assert (log[0]["num_warps"], log[0]["num_stages"]) == (static.num_warps, static.num_stages)
    monkeypatch.setattr(_configs, "NATIVE_TIMING", True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    log.clear()
    run_kernel("chunk_scan_fwd", p)  # under capture: the static choice, nothing kept
    assert [e.get("tuned") for e in log] == [None]
    assert timed_config("chunk_scan_fwd", key, torch.bfloat16, "sm_90") is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    log.clear()
    run_kernel("chunk_scan_fwd", p)  # the next launch outside a capture times
    assert [e.get("tuned") for e in log] == [True]


def test_an_output_sharing_storage_with_an_input_is_not_timed(faked):
    import csrc_bindings as cb
    tri, log = faked
    _tuners(tri, log, 1)
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    a = p["Cm"]
    out = a.clone()
    cb.launch_bmm_chunk_bwd(a, p["dCB"], residual=out, out=out)  # out is the residual: repeated launches would add
    assert [e.get("tuned") for e in log] == [None]
    assert timed_config("bmm_chunk_bwd", {"chunk_size": 64, "K": 16}, torch.bfloat16, "sm_90") is None
    log.clear()
    cb.launch_bmm_chunk_bwd(a, p["dCB"], residual=p["dB_res"])
    assert [e.get("tuned") for e in log] == [True]


def test_a_choice_outside_the_candidates_raises(faked):
    tri, log = faked
    spec = KERNELS["chunk_scan_fwd"]

    class Odd(FakeTuner):
        def __getitem__(self, grid):
            def run(**args):
                self.best_config = SimpleNamespace(kwargs={"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16,
                                                           "BLOCK_SIZE_K": 16}, num_warps=1, num_stages=1)
            return run
    tri.kernels["chunk_scan_fwd"] = Odd(spec, log, 0)
    with pytest.raises(RuntimeError, match="not one of the candidates"):
        run_kernel("chunk_scan_fwd", make_problem(dtype=torch.bfloat16, **PROVEN_SIZES))


def test_an_autotuner_cut_by_the_deterministic_mode_is_timed_by_an_own_tuner(faked, monkeypatch):
    """mamba-ssm's deterministic mode (read at its import) cuts the live list to one of the candidates: the key is
    timed by this package's own tuner over all the candidates (made once per kernel), the live tuner is not asked
    and keeps its list and cache, and later launches take the choice."""
    tri, log = faked
    _tuners(tri, log, 0)
    live = tri.kernels["chunk_scan_fwd"]
    live.configs = live.configs[-1:]  # the one config mamba-ssm keeps (the cheapest)
    made = []
    monkeypatch.setattr(_native, "_own_tuners", {})
    monkeypatch.setattr(_native, "_make_own_tuner",
                        lambda spec, tuner: made.append((spec.name, tuner)) or FakeTuner(spec, log, 2))
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    key = {"chunk_size": 64, "hdim": 32, "dstate": 16, "IS_CAUSAL": True}
    for _ in range(3):
        run_kernel("chunk_scan_fwd", p)
    assert made == [("chunk_scan_fwd", live)]
    assert [e.get("tuned") for e in log] == [True, None, None]
    cand = KERNELS["chunk_scan_fwd"].candidates[2]
    got = timed_config("chunk_scan_fwd", key, torch.bfloat16, "sm_90")
    assert got is not None and dict(got.meta) == cand[0] and (got.num_warps, got.num_stages) == cand[1:]
    assert all((e["num_warps"], e["num_stages"]) == cand[1:] for e in log[1:])
    assert len(live.configs) == 1 and live.cache == {("native's own key",): "native's own choice"}


@pytest.mark.parametrize("change", ["foreign", "superset", "hook"])
def test_an_autotuner_with_another_list_is_not_timed(faked, monkeypatch, change):
    """A live list that is not the candidates nor a part of them (another configuration, more of them) or a hook:
    nothing is timed, the key keeps its static choice for the process and the tuner is not asked again."""
    tri, log = faked
    _tuners(tri, log, 0)
    tuner = tri.kernels["chunk_scan_fwd"]
    monkeypatch.setattr(_native, "_own_tuners", {})
    monkeypatch.setattr(_native, "_make_own_tuner", lambda spec, t: pytest.fail("no own tuner expected"))
    if change == "foreign":
        tuner.configs = [SimpleNamespace(kwargs={"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 8, "BLOCK_SIZE_K": 8},
                                         num_warps=1, num_stages=1, pre_hook=None)]
    elif change == "superset":
        tuner.configs = tuner.configs + [SimpleNamespace(kwargs={"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 8,
                                                                 "BLOCK_SIZE_K": 8}, num_warps=1, num_stages=1,
                                                         pre_hook=None)]
    else:
        tuner.configs = tuner.configs[:1]
        tuner.configs[0].pre_hook = lambda nargs: None
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    key = {"chunk_size": 64, "hdim": 32, "dstate": 16, "IS_CAUSAL": True}
    static = pinned_config("chunk_scan_fwd", key, torch.bfloat16, "sm_90")
    for _ in range(2):
        run_kernel("chunk_scan_fwd", p)
    assert [e.get("tuned") for e in log] == [None, None]
    assert all((e["num_warps"], e["num_stages"]) == (static.num_warps, static.num_stages) for e in log)
    assert timed_config("chunk_scan_fwd", key, torch.bfloat16, "sm_90") is None
    assert _configs.timed_configs() == {}


def test_disjoint_views_of_one_buffer_are_timed(faked):
    """The alias check compares the bytes each tensor may touch: an output beside an input in one buffer is fine."""
    import csrc_bindings as cb
    tri, log = faked
    _tuners(tri, log, 1)
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    a = p["Cm"]
    both = torch.empty((2,) + tuple(a.shape), dtype=a.dtype)
    both[0].copy_(p["dB_res"])
    cb.launch_bmm_chunk_bwd(a, p["dCB"], residual=both[0], out=both[1])
    assert [e.get("tuned") for e in log] == [True]


def test_out_of_memory_while_timing_keeps_the_static_choice(faked):
    tri, log = faked
    spec = KERNELS["chunk_scan_fwd"]

    class Oom(FakeTuner):
        def __getitem__(self, grid):
            def run(**args):
                self.cache["half-written"] = 1
                raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")
            return run
    tri.kernels["chunk_scan_fwd"] = Oom(spec, log, 0)
    p = make_problem(dtype=torch.bfloat16, **PROVEN_SIZES)
    with pytest.warns(RuntimeWarning, match="out of memory"):
        run_kernel("chunk_scan_fwd", p)
    assert [e.get("tuned") for e in log] == [None]  # the static choice launched
    assert tri.kernels["chunk_scan_fwd"].cache == {("native's own key",): "native's own choice"}
    run_kernel("chunk_scan_fwd", p)  # not asked again
    assert [e.get("tuned") for e in log] == [None, None]
