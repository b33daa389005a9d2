"""The registry (csrc_bindings/_registry.py): every spec of every mirror file is assembled once, in layer order;
``run_kernel`` is a lookup; a layer's autotune keys come from the specs; importing loads nothing native."""
import subprocess
import sys

import pytest
import torch

import csrc_bindings as cb
from csrc_bindings import _registry
from csrc_bindings._spec import KernelSpec


def test_every_mirror_spec_is_registered_once():
    seen = []
    for mod in _registry.MIRRORS:
        specs = [v for v in vars(mod).values() if isinstance(v, KernelSpec)]
        assert specs, mod.__name__
        for spec in specs:
            assert spec.module == mod.UPSTREAM, spec.name
            if spec.arity is None:  # a Triton kernel: the file is named after the upstream module
                assert mod.UPSTREAM == "mamba_ssm.ops.triton." + mod.__name__.rsplit(".", 1)[1], spec.name
            assert callable(spec.example), spec.name
        seen += specs
    assert sorted(s.name for s in seen) == sorted(s.name for s in _registry.SPECS)
    assert len({id(s) for s in _registry.SPECS}) == len(_registry.SPECS) == len(seen)
    assert cb.KERNELS is _registry.KERNELS and set(cb.KERNELS) | set(cb.CONV_OPS) == set(_registry.ALL_KERNELS)
    assert _registry.TUNED_KERNELS == tuple(k for k in _registry.ALL_KERNELS if cb.KERNELS.get(k) is not None
                                            and cb.KERNELS[k].candidates is not None)


def test_run_kernel_is_a_lookup():
    with pytest.raises(KeyError):
        _registry.run_kernel("no_such_kernel", {})
    calls = []
    spec = _registry.KERNELS["swiglu_fwd"]
    orig = spec.example
    try:
        object.__setattr__(spec, "example", lambda p, config=None: calls.append(config) or (torch.ones(1), None, 3))
        assert [t.tolist() for t in _registry.run_kernel("swiglu_fwd", {}, config={"BLOCK_N": 32})] == [[1.0]]
    finally:
        object.__setattr__(spec, "example", orig)
    assert calls == [{"BLOCK_N": 32}]


def test_layer_keys_come_from_the_specs():
    rows = cb.layer_keys(chunk_size=128, headdim=32, dstate=16, nheads=8, d_nonssm=96)
    assert [r[0] for r in rows] == list(_registry.TUNED_KERNELS)
    for kernel, key, role in rows:
        spec = cb.KERNELS[kernel]
        assert tuple(key) == spec.autotune_key and role == spec.layer_dtype
    assert dict((k, v) for k, v, _ in rows)["chunk_scan_fwd"]["IS_CAUSAL"] is True
    assert dict((k, v) for k, v, _ in rows)["bmm_chunk_fwd"]["IS_CAUSAL"] is False
    assert dict((k, v) for k, v, _ in rows)["state_passing_bwd"] == {"dim": 32 * 16}
    no_swiglu = cb.layer_keys(chunk_size=128, headdim=32, dstate=16, nheads=8)
    assert [r[0] for r in no_swiglu] == [k for k in _registry.TUNED_KERNELS if not k.startswith("swiglu")]


def test_importing_every_module_loads_nothing_native():
    code = ("import sys, importlib, pkgutil, csrc_bindings; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(csrc_bindings.__path__, 'csrc_bindings.')]; "
            "bad = [m for m in ('triton', 'mamba_ssm', 'causal_conv1d', 'causal_conv1d_cuda') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
