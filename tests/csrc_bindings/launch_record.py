"""Record every native launch the launchers make, on the CPU, with stand-ins for the native modules.

``record_all()`` runs every kernel's example (``csrc_bindings``'s ``run_kernel``) on small CPU problems with a fake
Triton side (a JIT function that records its grid, its arguments in ``arg_names`` order and ``num_warps`` /
``num_stages``) and a fake causal-conv1d extension; tensors are described by the problem tensor they alias (or as
new buffers) with their offset, shape, strides and dtype. Nothing native is imported. The recorded launches pin the
launchers' behaviour: ``data/launch_record.json`` was written before the launchers moved into the per-upstream-file
layout, and the test compares against it.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import torch

PROBLEMS = {  # name: (make_problem kwargs)
    "f32": dict(dtype=torch.float32),
    "bf16_g1": dict(dtype=torch.bfloat16, chunk_size=32, headdim=16, dstate=8, nheads=6, ngroups=1, batch=3,
                    seqlen=70),
}


class _Jit:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        def run(*args, num_warps, num_stages):
            self.log.append({"kernel": self.name, "grid": list(grid), "args": list(args), "num_warps": num_warps,
                             "num_stages": num_stages})
        return run


class _ConvExt:
    def __init__(self, log):
        self.log = log

    def causal_conv1d_fwd(self, *args):
        self.log.append({"kernel": "causal_conv1d_fwd", "args": list(args)})

    def causal_conv1d_bwd(self, *args):
        self.log.append({"kernel": "causal_conv1d_bwd", "args": list(args)})

    def causal_conv1d_update(self, *args):
        self.log.append({"kernel": "causal_conv1d_update", "args": list(args)})


def fake_native(log):
    """(triton side, conv side) namespaces in the shape of ``csrc_bindings._native``'s cached ones, every kernel
    already checked."""
    from csrc_bindings._registry import CONV_OPS, KERNELS
    tl = SimpleNamespace(bfloat16="tl.bfloat16", float16="tl.float16", float32="tl.float32")
    tri = SimpleNamespace(tl=tl, triton_22=True, jit={k: _Jit(k, log) for k in KERNELS}, kernels={},
                          versions={"mamba_ssm": "fake", "triton": "fake"})
    ext = _ConvExt(log)
    conv = SimpleNamespace(ext=ext, ops={k: getattr(ext, s.attr) for k, s in CONV_OPS.items()},
                           versions={"causal_conv1d": "fake"})
    return tri, conv


def fake_cuda_path(monkeypatch, log, layer: bool = False):
    """Run the CUDA path's compositions on the CPU: the natives faked (:func:`fake_native`, launches appended to
    ``log``), the ops' CUDA checks off, and with ``layer`` ``OrderedMamba2`` on its CUDA path too."""
    from csrc_bindings import _native
    from ordered_ssd.ops import causal_conv1d, layernorm_gated, ssd_combined, ssd_split_conv1d
    tri, conv = fake_native(log)
    monkeypatch.setitem(_native._state, "triton", tri)
    monkeypatch.setitem(_native._state, "conv", conv)
    for mod in (ssd_combined, ssd_split_conv1d, causal_conv1d, layernorm_gated):
        monkeypatch.setattr(mod, "require_cuda", lambda name, t: None)
    if layer:
        from ordered_ssd import OrderedMamba2
        monkeypatch.setattr(OrderedMamba2, "backend_for", lambda self, u: "cuda")
        monkeypatch.setattr(OrderedMamba2, "_check_cuda_path", lambda self, batch, seqlen: None)


def _describe(v, named):
    if isinstance(v, torch.Tensor):
        base = named.get(v.untyped_storage().data_ptr())
        return {"tensor": base if base is not None else "new", "offset": v.storage_offset(),
                "shape": list(v.shape), "stride": list(v.stride()), "dtype": str(v.dtype)}
    if isinstance(v, float) and v == float("inf"):
        return "inf"
    return v


def record_all(monkeypatch):
    """``{problem/kernel: [launch, ...]}`` for every kernel of the examples, with the natives faked."""
    from csrc_bindings import _native
    from csrc_bindings._examples import make_problem
    from csrc_bindings._registry import ALL_KERNELS, run_kernel
    log = []
    tri, conv = fake_native(log)
    monkeypatch.setitem(_native._state, "triton", tri)
    monkeypatch.setitem(_native._state, "conv", conv)
    out = {}
    for pname, kw in PROBLEMS.items():
        p = make_problem(**kw)
        named = {t.untyped_storage().data_ptr(): k for k, t in p.items() if isinstance(t, torch.Tensor)}
        for kernel in ALL_KERNELS:
            log.clear()
            run_kernel(kernel, p)
            out[f"{pname}/{kernel}"] = [{k: ([_describe(a, named) for a in v] if k == "args" else v)
                                         for k, v in entry.items()} for entry in log]
    return json.loads(json.dumps(out))


#: layer shapes of ``data/layer_configs.json``
LAYER_SHAPES = ([dict(chunk_size=256, headdim=64, dstate=128, nheads=nh) for nh in (24, 32, 48, 64, 128)]
                + [dict(chunk_size=256, headdim=64, dstate=64, nheads=24),
                   dict(chunk_size=128, headdim=32, dstate=16, nheads=8, d_nonssm=96),
                   dict(chunk_size=64, headdim=64, dstate=128, nheads=12, d_nonssm=1024)])


def record_layers():
    """``table_hash()``, ``layer_keys(...)`` and ``describe_launch(...)`` (less the fingerprint, which names the
    installed versions) for :data:`LAYER_SHAPES`, several dtypes, two archs and two group counts."""
    import csrc_bindings as cb
    out = {"table_hash": cb.table_hash(), "layer_keys": [], "describe_launch": []}
    for s in LAYER_SHAPES:
        out["layer_keys"].append({"shape": s, "rows": [list(r) for r in cb.layer_keys(**s)]})
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for arch in (("sm_90", "sm_80") if dt == torch.bfloat16 else ("sm_90",)):
                for ng in ((1, 2) if s["chunk_size"] == 128 else (1,)):
                    d = cb.describe_launch(**s, ngroups=ng, dtype=dt, arch=arch)
                    assert d.pop("fingerprint").split(" table=")[1].startswith(out["table_hash"])
                    out["describe_launch"].append({"shape": s, "ngroups": ng, "dtype": str(dt), "arch": arch,
                                                   "out": d})
    return json.loads(json.dumps(out))


#: ``OrderedMamba2`` constructions of ``data/layer_launches.json`` (d_model 64, d_state 16, headdim 16, chunk 16;
#: each stepped on 2 examples of 40 positions, without and with ``seq_idx``)
LAYER_STEPS = {
    "base": {},
    "ngroups2-D_has_hdim": dict(ngroups=2, D_has_hdim=True),
    "no-rmsnorm-bias": dict(rmsnorm=False, bias=True),
    "gated-mlp": dict(d_ssm=96),
    "no-mem-eff-path": dict(use_mem_eff_path=False),
    "no-mem-eff-path-gated-mlp-no-rmsnorm": dict(use_mem_eff_path=False, d_ssm=96, rmsnorm=False),
}


def record_layer_steps(monkeypatch):
    """``{config/seq_idx: [launch, ...]}``: every native launch of one ``OrderedMamba2`` training step (forward,
    backward of ``sum(out)``) on the CUDA path's compositions, run on the CPU with the natives faked
    (:func:`fake_cuda_path`). A launch is its kernel, grid, ``num_warps``/``num_stages`` and arguments; a tensor
    argument is ``["T", storage, offset, shape, strides, dtype]``, ``storage`` numbering the storages in the order
    first seen (the log keeps every argument alive, so two live storages never share an address). The folds run
    their CPU code and are not in the log."""
    from ordered_ssd import OrderedMamba2
    log = []
    fake_cuda_path(monkeypatch, log, layer=True)
    out = {}
    for name, kw in LAYER_STEPS.items():
        for with_seq_idx in (False, True):
            torch.manual_seed(0)
            layer = OrderedMamba2(d_model=64, d_state=16, headdim=16, chunk_size=16, **kw)
            u = torch.randn(2, 40, 64, requires_grad=True)
            seq_idx = torch.tensor([[0] * 20 + [1] * 20, [0] * 40], dtype=torch.int32) if with_seq_idx else None
            log.clear()
            layer(u, seq_idx=seq_idx).sum().backward()
            ids = {}

            def describe(v):
                if isinstance(v, torch.Tensor):
                    key = v.untyped_storage().data_ptr()
                    ids.setdefault(key, len(ids))
                    return ["T", ids[key], v.storage_offset(), list(v.shape), list(v.stride()), str(v.dtype)]
                if isinstance(v, float) and v != v:
                    return "nan"
                if isinstance(v, float) and v in (float("inf"), -float("inf")):
                    return str(v)
                return v if isinstance(v, (int, float, str, bool, type(None))) else type(v).__name__

            out[f"{name}/{'seq_idx' if with_seq_idx else 'no-seq_idx'}"] = [
                {k: ([describe(a) for a in v] if k == "args" else v) for k, v in entry.items()} for entry in log]
    log.clear()
    return json.loads(json.dumps(out))


if __name__ == "__main__":  # regenerate the records: python -m tests.csrc_bindings.launch_record (only on purpose)
    import pathlib

    import pytest
    data = pathlib.Path(__file__).with_name("data")
    mp = pytest.MonkeyPatch()
    try:
        launches = record_all(mp)
    finally:
        mp.undo()
    (data / "launch_record.json").write_text(json.dumps(launches, indent=0, sort_keys=True))
    (data / "layer_configs.json").write_text(json.dumps(record_layers(), sort_keys=True, separators=(",", ":")))
    mp = pytest.MonkeyPatch()
    try:
        steps = record_layer_steps(mp)
    finally:
        mp.undo()
    (data / "layer_launches.json").write_text(json.dumps(steps, sort_keys=True, separators=(",", ":")))
