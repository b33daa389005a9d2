"""Launch plans (csrc_bindings._plans), on the CPU with the natives faked: a replayed call launches exactly what the
launcher launches, with this call's tensors and fresh buffers; calls that cannot be accounted for are never
planned. (The GPU test tests/gpu/csrc_bindings/test_plans.py compares the bits of both paths.)"""
import contextlib
import json
import pathlib

import pytest
import torch

from csrc_bindings import _plans
from tests.csrc_bindings.launch_record import fake_cuda_path, record_layer_steps

LAYER_LAUNCHES = pathlib.Path(__file__).with_name("data") / "layer_launches.json"


def test_replayed_layer_steps_launch_what_the_launchers_launch(monkeypatch):
    """Six layer constructions with and without ``seq_idx``: the first round records the plans, the second replays
    every planned launcher (each of its signatures was seen); both give the committed launch record, argument by
    argument (storages numbered in first-seen order, so fresh buffers are new storages in both)."""
    want = json.loads(LAYER_LAUNCHES.read_text())
    first = record_layer_steps(monkeypatch)
    kept = _plans.stats()
    assert sum(n for n, _ in kept.values()) >= 18, kept  # the SSD, state-passing, bmm and RMSNorm launchers
    assert all(bad == 0 for _, bad in kept.values()), kept  # every signature of these steps was planned
    recordings = []
    real_init = _plans._Recording.__init__
    monkeypatch.setattr(_plans._Recording, "__init__", lambda self: recordings.append(1) or real_init(self))
    second = record_layer_steps(monkeypatch)
    assert recordings == [] and _plans.stats() == kept  # no launcher recorded again: every call replayed
    for got in (first, second):
        assert sorted(got) == sorted(want)
        for name in want:
            assert got[name] == want[name], name


def _bmm(a, b, chunk, **kw):
    from csrc_bindings import launch_bmm_chunk_fwd
    return launch_bmm_chunk_fwd(a, b, chunk, **kw)


@pytest.fixture
def fake_log(monkeypatch):
    log = []
    fake_cuda_path(monkeypatch, log)
    return log


def _tensor_args(entry):
    return [a for a in entry["args"] if isinstance(a, torch.Tensor)]


def test_a_replay_uses_this_calls_tensors_and_fresh_buffers(fake_log):
    torch.manual_seed(0)
    a1, b1 = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    a2, b2 = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    out1 = _bmm(a1, b1, 16)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (1, 0)
    out2 = _bmm(a2, b2, 16)
    first, second = fake_log
    assert second["kernel"] == first["kernel"] == "bmm_chunk_fwd"
    assert second["grid"] == first["grid"] and second["num_warps"] == first["num_warps"]
    assert second["num_stages"] == first["num_stages"]
    t1, t2 = _tensor_args(first), _tensor_args(second)
    assert t1[0] is a1 and t1[1] is b1 and t1[2] is out1
    assert t2[0] is a2 and t2[1] is b2 and t2[2] is out2
    assert out2 is not out1 and out2.data_ptr() != out1.data_ptr()
    assert (out2.shape, out2.stride(), out2.dtype) == (out1.shape, out1.stride(), out1.dtype)
    same = [x for x in first["args"] if not isinstance(x, torch.Tensor)]
    assert same == [x for x in second["args"] if not isinstance(x, torch.Tensor)]


def test_the_signature_tells_shapes_strides_dtypes_aliasing_and_values_apart(fake_log):
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    _bmm(a, b, 16)
    _bmm(a, b, 32)  # another chunk size
    _bmm(a, a, 16)  # the same tensor twice
    _bmm(a.double(), b.double(), 16)  # another dtype
    _bmm(torch.randn(2, 48, 1, 8), torch.randn(2, 48, 1, 8), 16)  # another shape
    _bmm(a, b, 16, causal=True)  # a keyword
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (6, 0)
    n = len(fake_log)
    _bmm(b, a, 16)  # the first signature again: replayed
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (6, 0) and len(fake_log) == n + 1
    t = _tensor_args(fake_log[-1])
    assert t[0] is b and t[1] is a


def test_a_copy_made_by_the_launcher_is_never_planned(fake_log):
    """``bmm_chunk_fwd`` copies an input strided in both its last and its seqlen dim: a tensor the plan cannot
    name, so that signature is launched by the launcher every time (and the copy is made every time)."""
    torch.manual_seed(0)
    a = torch.randn(2, 40, 1, 16)[..., ::2]  # [2, 40, 1, 8], strided in dims -1 and 1
    b = torch.randn(2, 40, 1, 8)
    _bmm(a, b, 16)
    _bmm(a, b, 16)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 1)
    first, second = fake_log
    assert _tensor_args(first)[0] is not a and _tensor_args(second)[0] is not a  # a contiguous copy each time
    assert _tensor_args(first)[0] is not _tensor_args(second)[0]
    assert torch.equal(_tensor_args(second)[0], a)


def test_unhashable_or_unknown_arguments_are_launched_every_time(fake_log):
    from csrc_bindings import launch_chunk_cumsum_fwd
    torch.manual_seed(0)
    dt, A = torch.randn(2, 40, 4), torch.randn(4)
    cfg = {"BLOCK_SIZE_H": 2, "num_warps": 4, "num_stages": 1}
    launch_chunk_cumsum_fwd(dt, A, 16, config=cfg)  # a dict configuration: no signature
    launch_chunk_cumsum_fwd(dt, A, 16, config=cfg)
    assert _plans.stats()["launch_chunk_cumsum_fwd"] == (0, 0)
    assert [e["num_warps"] for e in fake_log] == [4, 4]


def test_a_launch_taking_upstreams_autotuner_is_not_planned(fake_log, monkeypatch):
    """A configuration still to be timed (``native-autotune-v1``) keeps no plan for its call (the recording sees
    the pending mark before the launch); once the key's configuration is settled, the next call is planned."""
    from csrc_bindings import _configs
    from csrc_bindings._spec import TIMING_PENDING
    real = _configs.launch_config

    def pending(spec, args, ref, config=None):
        import dataclasses
        return dataclasses.replace(real(spec, args, ref, config), speed=TIMING_PENDING)
    from csrc_bindings import ssd_chunk_state
    monkeypatch.setattr(ssd_chunk_state, "launch_config", pending)
    torch.manual_seed(0)
    dt, A = torch.randn(2, 40, 4), torch.randn(4)
    ssd_chunk_state.launch_chunk_cumsum_fwd(dt, A, 16)
    ssd_chunk_state.launch_chunk_cumsum_fwd(dt, A, 16)
    assert _plans.stats()["launch_chunk_cumsum_fwd"] == (0, 0)
    assert len(fake_log) == 2
    monkeypatch.setattr(ssd_chunk_state, "launch_config", real)  # the key's configuration settled
    ssd_chunk_state.launch_chunk_cumsum_fwd(dt, A, 16)
    assert _plans.stats()["launch_chunk_cumsum_fwd"] == (1, 0)
    ssd_chunk_state.launch_chunk_cumsum_fwd(dt, A, 16)
    assert _plans.stats()["launch_chunk_cumsum_fwd"] == (1, 0) and len(fake_log) == 4


def test_disabled_runs_the_launchers_and_keeps_nothing(fake_log):
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    with _plans.disabled():
        _bmm(a, b, 16)
        _bmm(a, b, 16)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 0)
    assert len(fake_log) == 2


def test_bad_input_is_still_refused_on_a_planned_signature(fake_log):
    """A plan is keyed by the shapes: an argument of another shape is another signature, whose first call runs
    the launcher's checks."""
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    _bmm(a, b, 16)
    with pytest.raises(ValueError, match="b: expected shape"):
        _bmm(a, torch.randn(2, 40, 1, 9), 16)
    assert len(fake_log) == 1


def test_zeroed_buffers_are_zeroed_again(monkeypatch):
    """A buffer the launcher asked zeroed (``out_buffer(zero=True)`` / ``alloc(zero=True)``) is zeroed on every
    replay; an empty one is only allocated."""
    log = []
    fake_cuda_path(monkeypatch, log)

    @_plans.planned
    def launch_probe(x):
        z = _plans.alloc((3,), torch.float32, x.device, zero=True)
        e = _plans.alloc_like(x)
        return z, e
    z1, e1 = launch_probe(torch.ones(2))
    z1.fill_(7.0)
    z2, e2 = launch_probe(torch.ones(2))
    assert _plans.stats()["launch_probe"] == (1, 0)
    assert torch.equal(z2, torch.zeros(3)) and z2.data_ptr() != z1.data_ptr()
    assert e2.shape == (2,) and e2.dtype == torch.float32


def test_a_given_buffer_the_launcher_zeroes_is_zeroed_by_the_replay(fake_log):
    """``chunk_cumsum_bwd`` zeroes the ``dA_partial`` and ``ddt_bias_partial`` it is given (the autotuner pre-hook's
    work) before its launch; a replay zeroes this call's buffers, in the same place (the fake launch writes
    nothing, so what the buffers hold afterwards is the zeroing alone)."""
    from csrc_bindings import launch_chunk_cumsum_bwd
    torch.manual_seed(0)
    B, L, H, cs = 2, 40, 4, 16
    C = -(-L // cs)

    def call():
        ddA, ddt_out = torch.randn(B, H, C, cs), torch.randn(B, H, C, cs)
        dt, A, bias = torch.randn(B, L, H), torch.randn(H), torch.randn(H)
        dA_partial = torch.full((B, C, H), 7.0)
        ddt_bias_partial = torch.full((B, C, H), 7.0)
        launch_chunk_cumsum_bwd(ddA, ddt_out, dt, A, dt_bias=bias, dt_softplus=True, dA_partial=dA_partial,
                                ddt_bias_partial=ddt_bias_partial)
        return dA_partial, ddt_bias_partial
    first = call()
    assert _plans.stats()["launch_chunk_cumsum_bwd"] == (1, 0)
    second = call()
    assert len(fake_log) == 2
    for t in first + second:
        assert torch.equal(t, torch.zeros_like(t))


def test_a_kernel_kept_in_a_plan_is_run_directly_until_the_launch_cache_is_cleared(fake_log, monkeypatch):
    """From the second replay on CUDA a plan's launch runs the compiled kernel that ``launch_fitting`` keeps for it
    (``_keep_kernel``), with this call's arguments, without ``launch_fitting``; ``_launch_cache.clear()`` makes
    the plan go through ``launch_fitting`` again. (On the CPU nothing is kept: the kept kernel is put in by hand
    here; the GPU tests run the real one.)"""
    from csrc_bindings import _launch_cache, _resources
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    _bmm(a, b, 16)
    (plan,) = [p for t, table in _plans._plans.items() if ".launch_bmm_chunk_fwd#" in t for p in table.values()]
    (step,) = plan.steps
    runs, fitted = [], []
    monkeypatch.setattr(_launch_cache, "run_compiled", lambda c, grid, args, device: runs.append((c, grid, args,
                                                                                                   device)))
    real_fitting = _resources.launch_fitting
    monkeypatch.setattr(_resources, "launch_fitting", lambda *a, **k: fitted.append(1) or real_fitting(*a, **k))
    from csrc_bindings._native import kernel_jit
    step[-1][:] = ["compiled", _launch_cache.generation[0], 5, kernel_jit(step[1])]
    a2, b2 = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    out2 = _bmm(a2, b2, 16)
    assert fitted == [] and len(fake_log) == 1  # not through launch_fitting / the (faked) Triton path
    (c, grid, args, device), = runs
    assert (c, device) == ("compiled", 5) and list(grid) == fake_log[0]["grid"]
    t = [x for x in args if isinstance(x, torch.Tensor)]
    assert t[0] is a2 and t[1] is b2 and t[2] is out2
    assert [x for x in args if not isinstance(x, torch.Tensor)] == [
        x for x in fake_log[0]["args"] if not isinstance(x, torch.Tensor)]
    _launch_cache.clear()
    _bmm(a2, b2, 16)
    assert len(runs) == 1 and fitted == [1] and len(fake_log) == 2  # through launch_fitting again


def test_a_triton_dtype_argument_is_kept_as_it_is(fake_log, monkeypatch):
    """``bmm_chunk_fwd`` passes ``dot_dtype`` (on a GPU ``tl.bfloat16``, an object, not a plain value): with its
    type registered (``_native`` registers ``tl.dtype`` when it loads triton) the call is planned and
    the replay passes the same object; an object of a type not registered makes the call unplannable."""
    from csrc_bindings import _native

    class Dtype:  # stands for triton.language.dtype
        def __init__(self, name):
            self.name = name
    tl = _native._state["triton"].tl
    monkeypatch.setattr(tl, "bfloat16", Dtype("bf16"))
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8).bfloat16(), torch.randn(2, 40, 1, 8).bfloat16()
    _bmm(a, b, 16)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 1)  # not registered: unplannable
    _plans.clear()
    monkeypatch.setitem(_plans._bound, "value_types", _plans._bound["value_types"] | {Dtype})
    _bmm(a, b, 16)
    _bmm(a, b, 16)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (1, 0)
    dts = [[x for x in e["args"] if isinstance(x, Dtype)] for e in fake_log]
    assert dts[1] == dts[2] == [tl.bfloat16]


def test_floats_are_told_apart_by_their_bits(fake_log):
    """``-0.0`` and ``0.0`` are other signatures (the launcher passes the one it got), and a NaN argument replays."""
    import math

    from csrc_bindings import launch_chunk_cumsum_fwd
    torch.manual_seed(0)
    dt, A = torch.randn(2, 40, 4), torch.randn(4)
    launch_chunk_cumsum_fwd(dt, A, 16, dt_limit=(0.0, math.inf))
    launch_chunk_cumsum_fwd(dt, A, 16, dt_limit=(-0.0, math.inf))
    assert _plans.stats()["launch_chunk_cumsum_fwd"] == (2, 0)
    launch_chunk_cumsum_fwd(dt, A, 16, dt_limit=(-0.0, math.inf))  # replayed
    signs = [[math.copysign(1.0, x) for x in e["args"] if isinstance(x, float) and x == 0.0] for e in fake_log]
    assert signs == [[1.0], [-1.0], [-1.0]]
    launch_chunk_cumsum_fwd(dt, A, 16, dt_limit=(math.nan, math.inf))
    launch_chunk_cumsum_fwd(dt, A, 16, dt_limit=(float("nan"), math.inf))  # another NaN object, the same bits
    assert _plans.stats()["launch_chunk_cumsum_fwd"] == (3, 0)


def test_a_misaligned_input_is_another_signature(fake_log):
    """Triton specialises on 16-byte alignment: an input 4 bytes off is another signature than an aligned one of
    the same shape and strides."""
    from csrc_bindings import launch_chunk_cumsum_fwd
    torch.manual_seed(0)
    base = torch.randn(2 * 40 * 4 + 1)
    aligned, off = base[:-1].view(2, 40, 4), base[1:].view(2, 40, 4)
    assert aligned.data_ptr() % 16 == 0 and off.data_ptr() % 16 == 4
    A = torch.randn(4)
    launch_chunk_cumsum_fwd(aligned, A, 16)
    launch_chunk_cumsum_fwd(off, A, 16)
    assert _plans.stats()["launch_chunk_cumsum_fwd"] == (2, 0)


def test_a_timed_choice_forgets_the_plans(fake_log):
    """A key's configuration changes where ``native-autotune-v1`` keeps or forgets a timed choice: every plan is
    dropped there (the next call of each signature records again, with the configuration then in force)."""
    from csrc_bindings import _configs
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    _bmm(a, b, 16)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (1, 0)
    _configs.forget_timed()
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 0)
    _bmm(a, b, 16)
    from csrc_bindings.ssd_bmm import BMM_CHUNK_FWD
    _configs.record_timed(BMM_CHUNK_FWD, {"chunk_size": 16, "K": 8, "IS_CAUSAL": False}, a, None)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 0)
    _configs.forget_timed()


def test_disabled_holds_in_every_thread(fake_log):
    """Autograd runs a CUDA backward on a thread of its own: disabled() must reach it (a per-thread switch let the
    backward's launchers plan, on the GPU, inside the block)."""
    import threading
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    with _plans.disabled():
        for _ in range(2):
            t = threading.Thread(target=_bmm, args=(a, b, 16))
            t.start()
            t.join()
        assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 0)  # nothing kept by the other threads
    assert len(fake_log) == 2  # both ran the launcher
    _bmm(a, b, 16)  # after the block: recorded again
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (1, 0)


def test_disabled_blocks_nest_and_overlap_between_threads(fake_log):
    """Plans stay off until every open block has ended: after an inner block, and while another thread's block is
    still open after this thread's has ended."""
    import threading
    torch.manual_seed(0)
    a, b = torch.randn(2, 40, 1, 8), torch.randn(2, 40, 1, 8)
    with _plans.disabled():
        with _plans.disabled():
            _bmm(a, b, 16)
        _bmm(a, b, 16)  # the outer block is still open
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 0)
    opened, release = threading.Event(), threading.Event()

    def hold():
        with _plans.disabled():
            opened.set()
            release.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    opened.wait(10)
    with _plans.disabled():
        _bmm(a, b, 16)
    _bmm(a, b, 16)  # this thread's block has ended, the other's has not
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (0, 0)
    release.set()
    t.join()
    _bmm(a, b, 16)
    assert _plans.stats()["launch_bmm_chunk_fwd"] == (1, 0)
    assert len(fake_log) == 5  # every call ran the launcher (the last one recorded its plan)


def test_a_block_opened_during_a_call_keeps_its_plan_out():
    """A disabled() block that opens while a call is being recorded (in another thread; here inside the call)
    leaves that call without a plan; the next call after the block records one."""
    blocks = []

    @_plans.planned
    def launch_identity(x, open_block=False):
        if open_block:
            blocks.append(_plans.disabled())
            blocks[-1].__enter__()
        return x

    x = torch.zeros(3)
    try:
        assert launch_identity(x, open_block=True) is x
        assert _plans.stats()["launch_identity"] == (0, 0)
    finally:
        blocks.pop().__exit__(None, None, None)  # never leave the process with plans off
    assert launch_identity(x) is x
    assert _plans.stats()["launch_identity"] == (1, 0)


@pytest.fixture
def fake_mamba3(fake_log, monkeypatch):
    """The Mamba-3 launchers on the faked natives: their specs get fake JIT functions, upstream's modules count as
    imported, and Triton's allocator is a stand-in whose block each launch records (``log[i]["allocator"]``)."""
    from csrc_bindings import _native
    from csrc_bindings.mamba3 import MAMBA3_SPECS, _runtime
    from tests.csrc_bindings.launch_record import _Jit
    inside = []

    class _Recorded(_Jit):
        def __getitem__(self, grid):
            run = super().__getitem__(grid)

            def launch(*args, **kw):
                run(*args, **kw)
                self.log[-1]["allocator"] = bool(inside)
            return launch

    tri = _native._state["triton"]
    for spec in MAMBA3_SPECS:
        monkeypatch.setitem(tri.jit, spec.name, _Recorded(spec.name, fake_log))

    @contextlib.contextmanager
    def allocator():
        inside.append(1)
        try:
            yield
        finally:
            inside.pop()
    monkeypatch.setattr(_runtime, "allocator", allocator)
    monkeypatch.setattr(_runtime, "_imported", True)
    return fake_log


def _dqkv_inputs(batch=2, seqlen=40, nheads=2, n=8, p=4, chunk=16):
    nchunks = -(-seqlen // chunk)
    bf, f32 = torch.bfloat16, torch.float32
    return (torch.randn(batch, seqlen, nheads, n).to(bf), torch.randn(batch, seqlen, nheads, n).to(bf),
            torch.randn(batch, seqlen, nheads, p).to(bf), torch.randn(batch, nheads, seqlen),
            torch.randn(batch, nheads, nchunks), torch.randn(batch, nheads, seqlen),
            torch.randn(batch, nheads, p, nchunks * n).to(bf), torch.randn(batch, seqlen, nheads, p).to(bf),
            torch.randn(nheads, dtype=f32))


def test_a_mamba3_launcher_replays_its_launch_with_a_dict_result_under_the_allocator(fake_mamba3):
    """``launch_dqkv`` (a dict result, one launch): the second call of a signature replays the plan, launching the
    same kernel with this call's tensors and fresh buffers, inside Triton's allocator block as the launcher's own
    launch; the dict comes back with the same keys, None kept."""
    from csrc_bindings.mamba3 import launch_dqkv
    torch.manual_seed(0)
    first_in, second_in = _dqkv_inputs(), _dqkv_inputs()
    r1 = launch_dqkv(*first_in, chunk_size=16)
    assert _plans.stats()["launch_dqkv"] == (1, 0)
    recordings = []
    real_init = _plans._Recording.__init__
    _plans._Recording.__init__ = lambda self: recordings.append(1) or real_init(self)
    try:
        r2 = launch_dqkv(*second_in, chunk_size=16)
    finally:
        _plans._Recording.__init__ = real_init
    assert recordings == []  # replayed, not recorded again
    first, second = fake_mamba3
    assert first["kernel"] == second["kernel"] == "mamba3_siso_bwd_dqkv"
    assert first["allocator"] is True and second["allocator"] is True
    assert (first["grid"], first["num_warps"], first["num_stages"]) == (
        second["grid"], second["num_warps"], second["num_stages"])
    assert [x for x in first["args"] if not isinstance(x, torch.Tensor)] == [
        x for x in second["args"] if not isinstance(x, torch.Tensor)]
    assert list(r1) == list(r2) == ["dq", "dk", "dv", "dadt", "dqk", "dD"]
    t1, t2 = _tensor_args(first), _tensor_args(second)
    q, k, v, da_cs, da_cs_sum, qk, ssm, dout, D = second_in
    assert all(a is b for a, b in zip(t2[:9], (q, k, v, da_cs, da_cs_sum, qk, D, ssm, dout)))  # this call's
    def where(ts, r):  # the positions of the results among the launch's tensors
        return [[i for i, t in enumerate(ts) if t is r[k]] for k in r]
    assert where(t2, r2) == where(t1, r1) and all(len(w) == 1 for w in where(t1, r1))
    for k in r1:
        assert r2[k] is not r1[k] and r2[k].data_ptr() != r1[k].data_ptr()
        assert (r2[k].shape, r2[k].stride(), r2[k].dtype) == (r1[k].shape, r1[k].stride(), r1[k].dtype)
    r3 = launch_dqkv(*_dqkv_inputs()[:8], chunk_size=16)  # no D: another signature, None in the result
    assert r3["dD"] is None and _plans.stats()["launch_dqkv"] == (2, 0)


def test_the_mamba3_forward_with_final_states_is_never_planned(fake_mamba3):
    """With ``return_final_states`` the forward returns views (the last chunk's K, the last position's V): such a
    call keeps no plan and is launched by the launcher every time; training calls are planned."""
    from csrc_bindings.mamba3 import launch_mamba3_siso_fwd
    torch.manual_seed(0)
    B, L, H, G, N, P, S, bf = 2, 40, 2, 1, 8, 4, 2, torch.bfloat16
    args = (torch.randn(B, L, G, N).to(bf), torch.randn(B, L, G, N).to(bf), torch.randn(B, L, H, P).to(bf),
            torch.randn(B, H, L), torch.randn(B, H, L), torch.randn(B, H, L).to(bf), torch.randn(H, N),
            torch.randn(H, N), torch.randn(B, L, H, S).to(bf), torch.randn(H), torch.randn(B, L, H, P).to(bf))
    for _ in range(2):
        res = launch_mamba3_siso_fwd(*args, chunk_size=16, return_final_states=True)
        assert res["final_v"].data_ptr() == args[2][:, -1].data_ptr()
    assert _plans.stats()["launch_mamba3_siso_fwd"] == (0, 1)
    for _ in range(2):
        res = launch_mamba3_siso_fwd(*args, chunk_size=16)
    assert _plans.stats()["launch_mamba3_siso_fwd"] == (1, 1)
    assert [e["allocator"] for e in fake_mamba3] == [True] * 4
    zeroed = [t for t in _tensor_args(fake_mamba3[-1]) if t is res["ssm_states"] or t is res["da_cs_sum"]]
    assert len(zeroed) == 2 and all(torch.equal(t, torch.zeros_like(t)) for t in zeroed)


def test_a_mamba3_launcher_refuses_bad_input_before_importing_upstream(monkeypatch):
    """Before upstream's Mamba-3 modules are imported (here they cannot be), a launcher's own checks run first: bad
    shapes raise the ValueError its docstring lists, not the ImportError of a missing mamba-ssm."""
    from csrc_bindings.mamba3 import _runtime, launch_dqkv
    monkeypatch.setattr(_runtime, "_imported", False)
    q, k, v, da_cs, da_cs_sum, qk, ssm, dout, D = _dqkv_inputs()
    with pytest.raises(ValueError, match="k_scaled"):
        launch_dqkv(q, k[:, :-1], v, da_cs, da_cs_sum, qk, ssm, dout, D, chunk_size=16)
