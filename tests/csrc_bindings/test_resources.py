"""The shared-memory check before every launch (rule ``fit-stages-v1``), with the compiled kernels and the device
limit faked: the exact stage count chosen, the exact error, the cache, and that nothing is launched on an error."""
import contextlib
import re
from types import SimpleNamespace

import pytest
import torch

from csrc_bindings import _native, _resources
from csrc_bindings._configs import KernelConfig
from csrc_bindings._spec import KernelSpec

H200 = 232448  # shared_memory_per_block_optin of the H200


def _asked(table):
    calls = []

    def asked(stages):
        calls.append(stages)
        return table[stages]
    return asked, calls


CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3}


def test_a_fitting_configuration_is_kept_and_only_its_own_stage_count_is_compiled():
    asked, calls = _asked({3: H200, 2: 1, 1: 1})
    assert _resources.fit_stages("k", CONFIG, asked, H200) == 3
    assert calls == [3]


def test_fewer_stages_are_tried_one_at_a_time_and_the_first_that_fits_runs():
    asked, calls = _asked({3: 262400, 2: 232449, 1: 131328})
    assert _resources.fit_stages("k", CONFIG, asked, H200) == 1
    assert calls == [3, 2, 1]
    asked, calls = _asked({3: 262400, 2: H200, 1: 0})
    assert _resources.fit_stages("k", CONFIG, asked, H200) == 2 and calls == [3, 2]


def test_nothing_fits_raises_naming_kernel_config_bytes_limit_and_layer_sizes():
    asked, _ = _asked({3: 393600, 2: 262400, 1: 262400})
    sizes = "headdim=512, dstate=128, chunk_size=256; BLOCK_SIZE_K=512"
    with pytest.raises(ValueError) as err:
        _resources.fit_stages("chunk_state_bwd_db", CONFIG, asked, H200, sizes=lambda: sizes,
                              device_name="NVIDIA H200")
    assert str(err.value) == (
        "chunk_state_bwd_db: configuration BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, num_warps=4, num_stages=3 asks 393600 "
        "bytes of shared memory per program, more than the 232448 bytes NVIDIA H200 allows "
        "(shared_memory_per_block_optin) (layer sizes: headdim=512, dstate=128, chunk_size=256; BLOCK_SIZE_K=512); "
        "fewer stages do not fit either (262400 at num_stages=2, 262400 at num_stages=1). No configuration of this "
        "kernel fits this shape on this device: use smaller layer sizes.")


def test_an_explicit_configuration_is_never_changed():
    asked, calls = _asked({3: 262400, 2: 1, 1: 1})
    with pytest.raises(ValueError, match=re.escape("asks 262400 bytes of shared memory per program, more than the "
                                                   "232448 bytes the device allows (shared_memory_per_block_optin); "
                                                   "an explicit configuration is never changed.")):
        _resources.fit_stages("k", CONFIG, asked, H200, explicit=True)
    assert calls == [3]


def test_layer_sizes_names_the_layer_arguments_and_the_block_sizes_derived_from_them():
    args = {"x_ptr": torch.empty(1), "hdim": 512, "dstate": 128, "chunk_size": 256, "nheads_per_program": 2,
            "BLOCK_SIZE_M": 64, "BLOCK_SIZE_K": 512, "DETERMINISTIC_REDUCTION": True, "IS_TRITON_22": True}
    assert _resources.layer_sizes(args, ("BLOCK_SIZE_M",)) == (
        "headdim=512, dstate=128, chunk_size=256; BLOCK_SIZE_K=512")


class OutOfResources(Exception):
    """Stands for ``triton.runtime.errors.OutOfResources`` (matched by name, so triton is not imported)."""

    def __init__(self, required, limit, name):
        super().__init__(f"out of resource: {name}, Required: {required}, Hardware limit: {limit}")
        self.required, self.limit, self.name = required, limit, name


class FakeJit:
    """A JIT function whose compiled kernels ask ``table[num_stages]`` bytes; a launch asking more than the H200
    allows raises :class:`OutOfResources` before launching, as Triton does. Records warmups and launches."""

    def __init__(self, table):
        self.table, self.warmups, self.launches = table, [], []

    def warmup(self, *args, grid, num_warps, num_stages, **kwargs):
        self.warmups.append(num_stages)
        return SimpleNamespace(metadata=SimpleNamespace(shared=self.table[num_stages]))

    def __getitem__(self, grid):
        def run(*args, num_warps, num_stages):
            if self.table[num_stages] > H200:
                raise OutOfResources(self.table[num_stages], H200, "shared memory")
            self.launches.append((grid, args, num_warps, num_stages))
        return run


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA-like reference tensor on a CPU-only machine: the H200's limit, no device guard."""
    monkeypatch.setattr(_resources, "shared_memory_limit", lambda device: H200)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(_native, "device_guard", lambda t: contextlib.nullcontext())
    monkeypatch.setattr(_resources, "_verdicts", {})
    return SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))


SPEC = KernelSpec(name="fake_kernel", module="fake", attr="fake", arg_names="x hdim BLOCK_SIZE_M BLOCK_SIZE_K")
ARGS = {"x": 7, "hdim": 512, "BLOCK_SIZE_K": 512}


def test_a_fitting_launch_compiles_nothing_extra(monkeypatch, fake_cuda):
    jit = FakeJit({3: H200})
    monkeypatch.setattr(_native, "kernel_jit", lambda spec: jit)
    cfg = KernelConfig("fake_kernel", (("BLOCK_SIZE_M", 64),), 4, 3, "table")
    _native.launch(SPEC, (1,), ARGS, cfg, fake_cuda)
    assert jit.warmups == [] and jit.launches == [((1,), (7, 512, 64, 512), 4, 3)]


def test_launch_lowers_the_stages_of_a_pinned_config_and_caches_the_verdict(monkeypatch, fake_cuda):
    jit = FakeJit({4: 262400, 3: 262400, 2: 200000, 1: 100000})
    monkeypatch.setattr(_native, "kernel_jit", lambda spec: jit)
    cfg = KernelConfig("fake_kernel", (("BLOCK_SIZE_M", 64),), 4, 4, "rule")
    for _ in range(3):
        _native.launch(SPEC, (1,), ARGS, cfg, fake_cuda)
    assert jit.warmups == [4, 3, 2]  # compiled once per stage count, the verdict cached afterwards
    assert [launch[3] for launch in jit.launches] == [2, 2, 2]
    assert jit.launches[0][1] == (7, 512, 64, 512) and jit.launches[0][2] == 4


def test_launch_raises_before_launching_when_nothing_fits(monkeypatch, fake_cuda):
    jit = FakeJit({2: 262400, 1: 262400})
    monkeypatch.setattr(_native, "kernel_jit", lambda spec: jit)
    cfg = KernelConfig("fake_kernel", (("BLOCK_SIZE_M", 64),), 4, 2, "table")
    with pytest.raises(ValueError) as err:
        _native.launch(SPEC, (1,), ARGS, cfg, fake_cuda)
    assert str(err.value) == (
        "fake_kernel: configuration BLOCK_SIZE_M=64, num_warps=4, num_stages=2 asks 262400 bytes of shared memory "
        "per program, more than the 232448 bytes Fake GPU allows (shared_memory_per_block_optin) (layer sizes: "
        "headdim=512; BLOCK_SIZE_K=512); fewer stages do not fit either (262400 at num_stages=1). No configuration "
        "of this kernel fits this shape on this device: use smaller layer sizes.")
    assert jit.launches == []


def test_launch_keeps_an_explicit_config_and_raises_if_it_does_not_fit(monkeypatch, fake_cuda):
    jit = FakeJit({3: 262400, 2: 1, 1: 1})
    monkeypatch.setattr(_native, "kernel_jit", lambda spec: jit)
    cfg = KernelConfig("fake_kernel", (("BLOCK_SIZE_M", 64),), 4, 3, "explicit")
    with pytest.raises(ValueError, match="an explicit configuration is never changed"):
        _native.launch(SPEC, (1,), ARGS, cfg, fake_cuda)
    assert jit.warmups == [3] and jit.launches == []


def test_off_cuda_nothing_is_compiled():
    jit = FakeJit({})
    got = _resources.fit_launch("k", jit, (1,), (1,), {}, CONFIG, torch.empty(1))
    assert got == 3 and jit.warmups == []


def test_other_out_of_resources_becomes_the_clear_error(monkeypatch, fake_cuda):
    jit = FakeJit({2: 1000})

    def refuse(self, grid):
        def run(*args, num_warps, num_stages):
            raise OutOfResources(512, 256, "threads")
        return run
    monkeypatch.setattr(FakeJit, "__getitem__", refuse)
    monkeypatch.setattr(_native, "kernel_jit", lambda spec: jit)
    cfg = KernelConfig("fake_kernel", (("BLOCK_SIZE_M", 64),), 16, 2, "table")
    with pytest.raises(ValueError) as err:
        _native.launch(SPEC, (1,), ARGS, cfg, fake_cuda)
    assert str(err.value) == (
        "fake_kernel: configuration BLOCK_SIZE_M=64, num_warps=16, num_stages=2 does not fit Fake GPU (layer sizes: "
        "headdim=512; BLOCK_SIZE_K=512): out of resource: threads, Required: 512, Hardware limit: 256")
    assert isinstance(err.value.__cause__, OutOfResources) and jit.warmups == []
