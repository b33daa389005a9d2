"""Every Triton launcher zeroes exactly the arguments its spec's ``pre_hook_zero`` names (upstream's autotuner
pre-hook zeroes them; the launchers never run the autotuner, so they zero by hand). CPU, natives faked.

Each output buffer the launchers take through ``out_buffer`` is handed over NaN-filled (or 7-filled for integers)
instead of left to allocate; at the launch of the spec's kernel, the buffers that are all zeros must be exactly the
``pre_hook_zero`` arguments, and each of those must have come through ``out_buffer``.
"""
import torch

from csrc_bindings import _native, _registry, _util
from csrc_bindings._examples import make_problem
from tests.csrc_bindings.launch_record import PROBLEMS, fake_native


def test_launchers_zero_exactly_the_pre_hook_arguments(monkeypatch):
    tri, conv = fake_native([])
    seen = {}  # kernel -> [set of out_buffer argument names that were all zeros at launch, set of out_buffer names]

    class CheckingJit:
        def __init__(self, spec):
            self.spec = spec

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages):
                zeroed, buffers = set(), set()
                for name, a in zip(self.spec.arg_names, args):
                    if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in from_out_buffer:
                        buffers.add(name)
                        if a.numel() and bool((a == 0).all()):
                            zeroed.add(name)
                seen.setdefault(self.spec.name, []).append((zeroed, buffers))
            return run

    tri.jit = {k: CheckingJit(s) for k, s in _registry.KERNELS.items()}
    monkeypatch.setitem(_native._state, "triton", tri)
    monkeypatch.setitem(_native._state, "conv", conv)
    from_out_buffer = set()
    real = _util.out_buffer

    def filled_out_buffer(buf, shape, dtype, like, name, zero=False):
        if buf is None:
            fill = float("nan") if dtype.is_floating_point else 7
            buf = torch.full(tuple(int(v) for v in shape), fill, dtype=dtype, device=like.device)
        got = real(buf, shape, dtype, like, name, zero)
        from_out_buffer.add(got.untyped_storage().data_ptr())
        return got

    for mirror in _registry.MIRRORS:
        if hasattr(mirror, "out_buffer"):
            monkeypatch.setattr(mirror, "out_buffer", filled_out_buffer)
    for kw in PROBLEMS.values():
        p = make_problem(**kw)
        for name, spec in _registry.KERNELS.items():
            seen.clear()
            _registry.run_kernel(name, p)
            own = seen[name][-1]  # the example may launch other kernels first; its own launch is the last
            zeroed, buffers = own
            assert set(spec.pre_hook_zero) <= buffers, (name, spec.pre_hook_zero, buffers)
            assert zeroed == set(spec.pre_hook_zero), (name, zeroed, spec.pre_hook_zero)
    assert {s.name for s in _registry.KERNELS.values() if s.pre_hook_zero} == {
        "chunk_cumsum_bwd", "chunk_state_bwd_db", "chunk_scan_bwd_dC", "chunk_scan_chunk_state_bwd_dx"}


def test_live_pre_hook_zero_reads_config_and_autotuner_hooks(monkeypatch):
    """``live_pre_hook_zero`` on a stand-in autotuner (upstream's hooks are ``init_to_zero(names)`` lambdas)."""
    from types import SimpleNamespace

    from csrc_bindings.pinned import live

    def init_to_zero(names):
        return lambda nargs: [nargs[n].zero_() for n in names if nargs[n] is not None]

    spec = _registry.KERNELS["chunk_scan_chunk_state_bwd_dx"]
    kernel = SimpleNamespace(configs=[SimpleNamespace(pre_hook=init_to_zero(["ddt_ptr"])),
                                      SimpleNamespace(pre_hook=None)],
                             pre_hook=lambda kwargs, reset_only=False: kwargs["dD_ptr"].zero_(), reset_to_zero=[])
    monkeypatch.setattr(_native, "kernel_jit", lambda s: None)
    monkeypatch.setattr(_native, "native", lambda: SimpleNamespace(kernels={spec.name: kernel}))
    assert live.live_pre_hook_zero(spec) == {"ddt_ptr", "dD_ptr"}
