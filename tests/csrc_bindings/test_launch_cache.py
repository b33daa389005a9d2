"""The compiled-kernel cache of csrc_bindings._launch_cache, on the CPU with a stand-in JIT function (the GPU test
tests/gpu/csrc_bindings/test_launch_cache.py compares the cached launches with Triton's own bit for bit)."""
from types import SimpleNamespace

import pytest
import torch

from csrc_bindings import _launch_cache, _resources


class FakeJIT:
    """Records ``jit[grid](*args, **kwargs)`` calls; each returns a new stand-in compiled kernel."""

    arg_names = ["x_ptr", "n", "flag", "BLOCK"]
    pre_run_hooks = []

    def __init__(self, stages=None):
        self.calls = []
        self.stages = stages

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            stages = kwargs.get("num_stages") if self.stages is None else self.stages
            return SimpleNamespace(metadata=SimpleNamespace(num_stages=stages), tag=len(self.calls))
        return call


class OutOfResources(Exception):
    """Stands for triton's ``OutOfResources`` for shared memory (launch_fitting matches the class name)."""
    name = "shared memory"


def _refusing_three_stages(monkeypatch) -> FakeJIT:
    """A FakeJIT whose launches at 3 stages raise ``OutOfResources`` for shared memory (as Triton does before
    launching a kernel that does not fit), at fewer stages run."""
    real_getitem = FakeJIT.__getitem__

    def refuse_three(self, grid):
        call = real_getitem(self, grid)

        def run(*args, **kwargs):
            if kwargs["num_stages"] == 3:
                raise OutOfResources()
            return call(*args, **kwargs)
        return run
    monkeypatch.setattr(FakeJIT, "__getitem__", refuse_three)
    return FakeJIT()


@pytest.fixture
def fake(monkeypatch):
    """FakeJIT counts as a JIT function, a CUDA ``ref`` stands in, and ``run_compiled`` records instead of launching."""
    runs = []
    monkeypatch.setattr(_launch_cache, "_jit_class", lambda: FakeJIT)
    # the current device (the ref's, under its device guard); CPU builds of torch lack the function
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 3, raising=False)
    monkeypatch.setattr(_launch_cache, "run_compiled", lambda compiled, grid, args, device:
                        runs.append((compiled.tag, grid, args, device)))
    _launch_cache.clear()
    yield SimpleNamespace(runs=runs, ref=SimpleNamespace(is_cuda=True, get_device=lambda: 3))
    _launch_cache.clear()


def test_argument_key_tensor_dtype_and_alignment():
    base = torch.zeros(64, dtype=torch.float16)
    assert base.data_ptr() % 16 == 0
    aligned, misaligned, shifted8 = base[8:], base[1:], base[4:]  # 16, 2 and 8 bytes past the base
    key = _launch_cache.argument_key
    assert key((base,)) == ((torch.Tensor,), (), ((torch.float16, True),))
    assert key((aligned,)) == key((base,))
    assert key((misaligned,)) == ((torch.Tensor,), (), ((torch.float16, False),)) == key((shifted8,))
    assert key((base.float(),)) == ((torch.Tensor,), (), ((torch.float32, True),))
    # a tensor's place among the other arguments is part of the key
    assert key((base, 3)) != key((3, base))
    assert key((base, 3, base[1:])) == ((torch.Tensor, int, torch.Tensor), (3,), ((torch.float16, True),
                                                                                   (torch.float16, False)))


def test_argument_key_values_with_their_types():
    key = _launch_cache.argument_key
    assert key((1, True, 1.0, None)) == ((int, bool, float, type(None)), (1, True, 1.0, None), ())
    # 1, True and 1.0 compare equal in Python: their keys must not
    assert len({key((1,)), key((True,)), key((1.0,))}) == 3
    assert key((16,)) != key((32,))
    assert key((16, 8)) != key((16, 9)) and key((16, 8)) == key((16, 8))


def test_argument_key_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(_launch_cache, "MAX_ENTRIES", 3)
    _launch_cache._plans.clear()
    for args in ((1,), (1.0,), (True,), (None,), ("s",)):
        _launch_cache.argument_key(args)
    assert 1 <= len(_launch_cache._plans) <= 3
    assert _launch_cache.argument_key((2,)) == ((int,), (2,), ())


def test_positional_covers_the_signature_exactly():
    jit = FakeJIT()
    assert _launch_cache.positional(jit, ("x", 4), {"flag": True, "BLOCK": 128}) == ("x", 4, True, 128)
    assert _launch_cache.positional(jit, ("x", 4, False, 64), {}) == ("x", 4, False, 64)
    assert _launch_cache.positional(jit, ("x", 4), {"flag": True}) is None  # BLOCK missing (a default)
    assert _launch_cache.positional(jit, ("x", 4), {"flag": True, "BLOK": 1}) is None  # another name
    assert _launch_cache.positional(jit, ("x", 4, False), {}) is None  # BLOCK left to its default


def test_no_key_off_cuda_or_for_other_functions(fake):
    cpu = torch.zeros(1)
    assert _launch_cache.cache_key(FakeJIT(), cpu, (cpu, 1, True, 8), 4, 3) is None
    assert _launch_cache.cache_key(object(), fake.ref, (cpu, 1, True, 8), 4, 3) is None
    assert _launch_cache.cache_key(FakeJIT(), fake.ref, (cpu, [1], True, 8), 4, 3) is None  # unhashable
    assert _launch_cache.cache_key(FakeJIT(), fake.ref, (cpu, 1, True, 8), 4, 3) == (
        3, 4, 3, ((torch.Tensor, int, bool, int), (1, True, 8), ((torch.float32, True),)))


def test_second_launch_of_a_key_runs_the_kept_kernel(fake):
    jit, x = FakeJIT(), torch.zeros(32)
    _launch_cache.launch(jit, (5,), (x, 7), {"flag": True, "BLOCK": 64}, fake.ref, num_warps=4)
    assert len(jit.calls) == 1 and jit.calls[0][2] == {"flag": True, "BLOCK": 64, "num_warps": 4}
    assert fake.runs == []
    y = torch.ones(32)  # another tensor of the same dtype and alignment: the same key
    _launch_cache.launch(jit, (6, 2), (y, 7), {"flag": True, "BLOCK": 64}, fake.ref, num_warps=4)
    assert len(jit.calls) == 1
    assert fake.runs == [(1, (6, 2), (y, 7, True, 64), 3)]


@pytest.mark.parametrize("change", ["value", "flag", "dtype", "alignment", "warps", "stages"])
def test_any_change_of_the_key_takes_triton_path(fake, change):
    jit, x = FakeJIT(), torch.zeros(32)
    base = dict(args=(x, 7), kwargs={"flag": True, "BLOCK": 64}, num_warps=4, num_stages=None)
    other = {"value": dict(base, args=(x, 8)),
             "flag": dict(base, kwargs={"flag": False, "BLOCK": 64}),
             "dtype": dict(base, args=(x.double(), 7)),
             "alignment": dict(base, args=(x[1:], 7)),
             "warps": dict(base, num_warps=8),
             "stages": dict(base, num_stages=2)}[change]
    for launch in (base, other, other):
        _launch_cache.launch(jit, (1,), launch["args"], launch["kwargs"], fake.ref, num_warps=launch["num_warps"],
                             num_stages=launch["num_stages"])
    assert len(jit.calls) == 2  # base and other compiled (Triton's path) once each, other's second launch kept
    assert [r[0] for r in fake.runs] == [2]
    assert ("num_stages" in jit.calls[1][2]) == (change == "stages")


def test_cpu_launches_always_take_triton_path(fake):
    jit, x = FakeJIT(), torch.zeros(4)
    for _ in range(3):
        _launch_cache.launch(jit, (1,), (x, 1, True, 8), {}, x, num_warps=4)
    assert len(jit.calls) == 3 and fake.runs == []


def test_keep_skips_futures_and_none_and_empties_when_full(fake, monkeypatch):
    jit = FakeJIT()
    _launch_cache.keep(jit, ("k",), None)
    _launch_cache.keep(jit, ("k",), SimpleNamespace(result=lambda: None))
    assert _launch_cache.lookup(jit, ("k",)) is None
    monkeypatch.setattr(_launch_cache, "MAX_ENTRIES", 2)
    for i in range(2):
        _launch_cache.keep(jit, (i,), f"kernel{i}")
    assert [_launch_cache.lookup(jit, (i,)) for i in range(2)] == ["kernel0", "kernel1"]
    _launch_cache.keep(jit, (2,), "kernel2")  # full: emptied, then the new key kept
    assert [_launch_cache.lookup(jit, (i,)) for i in range(3)] == [None, None, "kernel2"]
    assert _launch_cache.lookup(FakeJIT(), (2,)) is None  # one cache per JIT function


def test_launch_fitting_keeps_the_fitted_stage_count(fake, monkeypatch):
    """A key that needed fewer stages once launches its kept kernel (at those stages) without refitting."""
    jit = _refusing_three_stages(monkeypatch)
    fits = []
    monkeypatch.setattr(_resources, "fit_launch", lambda *a, **k: fits.append(1) or 2)
    x, config = torch.zeros(8), {"num_warps": 4, "num_stages": 3}
    for _ in range(3):
        got = _resources.launch_fitting("k", jit, (1,), (x, 1, True, 8), {}, config, fake.ref)
        assert got == 2
    assert fits == [1] and len(jit.calls) == 1
    assert [r[0] for r in fake.runs] == [1, 1]


def test_kernel_with_pre_run_hooks_is_not_cached(fake):
    jit, x = FakeJIT(), torch.zeros(4)
    jit.pre_run_hooks = [lambda *a, **k: None]
    for _ in range(2):
        _launch_cache.launch(jit, (1,), (x, 1, True, 8), {}, fake.ref, num_warps=4)
    assert len(jit.calls) == 2 and fake.runs == []


def test_explicit_config_never_runs_a_kernel_fitted_for_a_pinned_launch(fake, monkeypatch):
    """A pinned launch that ran at fewer stages keeps that kernel; an explicit launch of the same configuration must
    not run it (an explicit configuration is never changed): it takes Triton's path, which refuses it."""
    jit = _refusing_three_stages(monkeypatch)

    def fit(*a, explicit=False, **k):
        if explicit:
            raise ValueError("k: configuration ... does not fit")
        return 2
    monkeypatch.setattr(_resources, "fit_launch", fit)
    x, config = torch.zeros(8), {"num_warps": 4, "num_stages": 3}
    assert _resources.launch_fitting("k", jit, (1,), (x, 1, True, 8), {}, config, fake.ref) == 2
    with pytest.raises(ValueError, match="does not fit"):
        _resources.launch_fitting("k", jit, (1,), (x, 1, True, 8), {}, config, fake.ref, explicit=True)
    assert fake.runs == []
    assert _resources.launch_fitting("k", jit, (1,), (x, 1, True, 8), {}, config, fake.ref) == 2
    assert [r[0] for r in fake.runs] == [1]  # the pinned launch still gets its kept kernel
