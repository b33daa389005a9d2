"""GPU tests of csrc_bindings (marker ``gpu``; skipped without CUDA / mamba-ssm / causal-conv1d).

* every launcher vs the mamba-ssm / causal-conv1d wrapper on random inputs, in bf16 and fp32 (run in a
  subprocess with ``MAMBA_DETERMINISTIC=1`` so the native autotuners compile one config each instead of all);
  both measured against a pure-PyTorch fp64 reference on the same input values (``fp64_refs.py``, which
  documents per kernel output which quantity it is); passes if ``err_ours <= 2 * err_native + floor * max|ref|``
  with ``err_* = max|out - ref|`` (``floor``: 1e-2 bf16, 2e-3 fp32, which runs TF32 dots);
* every pinned config in the table compiles and runs (finite outputs);
* outputs bitwise identical over repeats and across two fresh processes with separate ``TRITON_CACHE_DIR`` (and
  this process): SHA-256 of the bytes;
* importing and using the launchers leaves mamba-ssm's kernel objects (``configs``, ``cache``, hooks), module
  attributes, the environment and torch's deterministic flag unchanged;
* ``import csrc_bindings`` loads no native module; the version/signature check reports clear errors.

This module is also the subprocess worker:
``python -m tests.gpu.csrc_bindings.test_bindings compare|hashes --dtype bfloat16``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
WORKER = "tests.gpu.csrc_bindings.test_bindings"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FLOOR = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 2e-3}


# ----------------------------------------------------------------------------------------------- worker code
def _ours_folded(kernel, p):
    """Our launcher's outputs, partials folded (plain torch sums) into the upstream wrapper's return format."""
    from csrc_bindings._registry import run_kernel
    import csrc_bindings as cb
    G = p["ngroups"]
    if kernel == "chunk_cumsum_bwd":
        ddt, dA_p, ddtb_p = cb.launch_chunk_cumsum_bwd(p["ddA"], p["ddt_out"], p["dt_raw"], p["A"],
                                                       dt_bias=p["dt_bias"], dt_softplus=True)
        return ddt, dA_p.sum((0, 1)), ddtb_p.sum((0, 1))
    if kernel == "chunk_state_bwd_db":
        dB_p, ddA_p = cb.launch_chunk_state_bwd_db(p["x"], p["dt"], p["dA_cumsum"], p["dstates"], B=p["Bm"], ngroups=G)
        return dB_p.sum(2), torch.cumsum(ddA_p.sum(-1), dim=-1)
    if kernel == "state_passing_bwd":
        dst, ddA_p, dinit, sconv = cb.launch_state_passing_bwd(
            p["sp_states"], p["dA_cumsum"][..., -1], p["sp_dout"], dfinal_states=p["sp_dfinal"],
            has_initial_states=True, dstates_dtype=p["dtype"], states_dtype=p["dtype"])
        return dst, ddA_p.sum(-1), dinit, sconv
    if kernel == "chunk_scan_bwd_dz":
        dz, dout_x, dD_p, ddA, _ = cb.launch_chunk_scan_bwd_dz(p["x"], p["z"], p["out_x"], p["dout"],
                                                               p["chunk_size"], D=p["D"])
        return dz, dout_x, dD_p.sum((0, 1, 2)).reshape(-1).to(p["D"].dtype), ddA
    if kernel == "chunk_scan_bwd_dC":
        dC_p, ddA_p = cb.launch_chunk_scan_bwd_dC(p["states_lo"], p["dA_cumsum"], p["dout"], C=p["Cm"], ngroups=G)
        return dC_p.sum(2), ddA_p.sum(-1)
    if kernel == "chunk_scan_bwd_dcb":
        return (cb.launch_chunk_scan_bwd_dcb(p["x"], p["dt"], p["dA_cumsum"], p["dout"], ngroups=G).sum(2),)
    if kernel == "chunk_scan_bwd_ddAcs_stable":
        return (cb.launch_chunk_scan_bwd_ddAcs_stable(p["x"], p["dt"], p["dA_cumsum"], p["dout"], p["CB"]).sum(3),)
    if kernel == "chunk_scan_chunk_state_bwd_dx":
        dx, ddt_p, dD_p = cb.launch_chunk_scan_chunk_state_bwd_dx(p["x"], p["dt"], p["dA_cumsum"], p["Bm"], p["CB"],
                                                                  p["dout"], p["dstates"], D=p["D"])
        return dx, ddt_p.sum(-1), dD_p.sum((0, 1, 2)).sum(-1).to(p["D"].dtype)
    if kernel == "rmsnorm_gated_fwd":
        out, rstd = run_kernel(kernel, p)
        return out, rstd
    if kernel == "rmsnorm_gated_bwd":
        dx, dw_p, dz = run_kernel(kernel, p)
        return dx, dw_p.sum(0).to(p["rms_w"].dtype), dz
    if kernel in ("causal_conv1d_bwd", "causal_conv1d_bwd_seq_idx"):
        # the launcher gives dx only; the weight/bias gradients are ordered-ssd's own partials, folded
        from ordered_ssd.ops.causal_conv1d import ordered_causal_conv1d_bwd
        xc, dc = p["conv_x"].transpose(1, 2), p["conv_dout"].transpose(1, 2)
        sidx = _seq_idx(p) if kernel.endswith("seq_idx") else None
        dx, dw, db, _, _ = ordered_causal_conv1d_bwd(xc, p["conv_w"], p["conv_b"], dc, seq_idx=sidx, silu=True)
        return dx, dw, db
    if kernel == "causal_conv1d_fwd_seq_idx":
        return (cb.launch_causal_conv1d_fwd(p["conv_x"].transpose(1, 2), p["conv_w"], p["conv_b"],
                                            seq_idx=_seq_idx(p), silu_activation=True),)
    return run_kernel(kernel, p)


def _seq_idx(p):
    B, L = p["batch"], p["seqlen"]
    idx = torch.zeros(B, L, dtype=torch.int32)
    idx[:, L // 3:] = 1
    idx[1:, (2 * L) // 3:] = 2
    return idx.to(p["x"].device)


def _native(kernel, p):
    """The mamba-ssm / causal-conv1d wrapper for the same computation, in its own return format."""
    from mamba_ssm.ops.triton import ssd_bmm as bm
    from mamba_ssm.ops.triton import ssd_chunk_scan as sn
    from mamba_ssm.ops.triton import ssd_chunk_state as cs
    from mamba_ssm.ops.triton import ssd_combined as sc
    from mamba_ssm.ops.triton import ssd_state_passing as sp
    from mamba_ssm.ops.triton import k_activations as ka
    from mamba_ssm.ops.triton import layernorm_gated as lg
    G, csz = p["ngroups"], p["chunk_size"]
    f32 = torch.float32
    if kernel == "chunk_cumsum_fwd":
        return cs._chunk_cumsum_fwd(p["dt_raw"], p["A"], csz, dt_bias=p["dt_bias"], dt_softplus=True)
    if kernel == "chunk_cumsum_bwd":
        return cs._chunk_cumsum_bwd(p["ddA"], p["ddt_out"], p["dt_raw"], p["A"], dt_bias=p["dt_bias"],
                                    dt_softplus=True)
    if kernel == "bmm_chunk_fwd":
        return (bm._bmm_chunk_fwd(p["Cm"], p["Bm"], csz, output_dtype=f32),)
    if kernel == "bmm_chunk_bwd":
        return (bm._bmm_chunk_bwd(p["Cm"], p["dCB"], residual=p["dB_res"]),)
    if kernel == "chunk_state_fwd":
        return (cs._chunk_state_fwd(p["Bm"], p["x"], p["dt"], p["dA_cumsum"]),)
    if kernel == "chunk_state_bwd_db":
        return cs._chunk_state_bwd_db(p["x"], p["dt"], p["dA_cumsum"], p["dstates"], B=p["Bm"], ngroups=G)
    if kernel == "state_passing_fwd":
        return sp._state_passing_fwd(p["sp_states"], p["dA_cumsum"][..., -1], initial_states=p["sp_init"])
    if kernel == "state_passing_bwd":
        return sp._state_passing_bwd(p["sp_states"], p["dA_cumsum"][..., -1], p["sp_dout"],
                                     dfinal_states=p["sp_dfinal"], has_initial_states=True,
                                     dstates_dtype=p["dtype"], states_dtype=p["dtype"])
    if kernel == "chunk_scan_fwd":
        return sn._chunk_scan_fwd(p["CB"], p["x"], p["dt"], p["dA_cumsum"], p["Cm"], p["states_lo"], D=p["D"],
                                  z=p["z"])
    if kernel == "chunk_scan_bwd_dz":
        return sn._chunk_scan_bwd_dz(p["x"], p["z"], p["out_x"], p["dout"], chunk_size=csz, D=p["D"])
    if kernel == "chunk_scan_bwd_dstates":
        return (sn._chunk_scan_bwd_dstates(p["Cm"], p["dA_cumsum"], p["dout"], dtype=f32),)
    if kernel == "chunk_scan_bwd_dC":
        return sn._chunk_scan_bwd_dC(p["states_lo"], p["dA_cumsum"], p["dout"], C=p["Cm"], ngroups=G)
    if kernel == "chunk_scan_bwd_dcb":
        return (sn._chunk_scan_bwd_dcb(p["x"], p["dt"], p["dA_cumsum"], p["dout"], ngroups=G),)
    if kernel == "chunk_scan_bwd_ddAcs_stable":
        return (sn._chunk_scan_bwd_ddAcs_stable(p["x"], p["dt"], p["dA_cumsum"], p["dout"], p["CB"]),)
    if kernel == "chunk_scan_chunk_state_bwd_dx":
        return sc._chunk_scan_chunk_state_bwd_dx(p["x"], p["dt"], p["dA_cumsum"], p["Bm"], p["CB"], p["dout"],
                                                 p["dstates"], D=p["D"])
    if kernel == "chunk_state_varlen":
        from csrc_bindings.ssd_chunk_state import example_cu_seqlens
        return (cs.chunk_state_varlen(p["Bm"][0], p["x"][0], p["dt"][0], p["dA_cumsum"][0], example_cu_seqlens(p),
                                      p["states"][0]),)
    if kernel == "selective_state_update":
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
        Bsz, H, P, N = p["batch"], p["nheads"], p["headdim"], p["dstate"]
        state = p["states"][:, 0].clone()
        out = selective_state_update(state, p["x"][:, 0], p["dt_raw"][:, 0, :, None].expand(Bsz, H, P),
                                     p["A"][:, None, None].expand(H, P, N), p["Bm"][:, 0], p["Cm"][:, 0],
                                     D=p["D"][:, None].expand(H, P), z=p["z"][:, 0],
                                     dt_bias=p["dt_bias"][:, None].expand(H, P), dt_softplus=True)
        return out, state
    if kernel == "swiglu_fwd":
        return (ka._swiglu_fwd(p["xy"]),)
    if kernel == "swiglu_bwd":
        return ka._swiglu_bwd(p["xy"], p["dsw"], recompute_output=True)
    x2 = p["out_x"].reshape(p["batch"] * p["seqlen"], -1)
    z2 = p["z"].reshape(p["batch"] * p["seqlen"], -1)
    gs = x2.shape[1] // G
    if kernel == "rmsnorm_gated_fwd":
        out, _, rstd = lg._layer_norm_fwd(x2, p["rms_w"], None, 1e-5, z=z2, group_size=gs, norm_before_gate=False,
                                          is_rms_norm=True)
        return out, rstd
    if kernel == "rmsnorm_gated_bwd":
        import csrc_bindings as cb
        _, rstd = cb.launch_rmsnorm_gated_fwd(x2, p["rms_w"], 1e-5, z=z2, group_size=gs, norm_before_gate=False)
        dx, dw, _, dz = lg._layer_norm_bwd(p["dy_rms"], x2, p["rms_w"], None, 1e-5, None, rstd, z2, group_size=gs,
                                           norm_before_gate=False, is_rms_norm=True)
        return dx, dw, dz
    from causal_conv1d.cpp_functions import causal_conv1d_bwd_function, causal_conv1d_fwd_function
    xc, dc = p["conv_x"].transpose(1, 2), p["conv_dout"].transpose(1, 2)
    w, b = p["conv_w"], p["conv_b"]
    if kernel == "causal_conv1d_fwd":
        return (causal_conv1d_fwd_function(xc, w, b, None, None, None, True),)
    if kernel == "causal_conv1d_update":
        from causal_conv1d import causal_conv1d_update
        state = p["conv_x"][:, :4].clone().transpose(1, 2)
        return causal_conv1d_update(p["conv_x"][:, 4].contiguous(), state, w, b, "silu"), state
    if kernel == "causal_conv1d_fwd_seq_idx":
        return (causal_conv1d_fwd_function(xc, w, b, _seq_idx(p), None, None, True),)
    if kernel in ("causal_conv1d_bwd", "causal_conv1d_bwd_seq_idx"):
        sidx = _seq_idx(p) if kernel.endswith("seq_idx") else None
        dx, dw, db, _ = causal_conv1d_bwd_function(xc, w, b, dc, sidx, None, None, None, False, True)
        return dx, dw, db
    raise KeyError(kernel)


def _compare_kernels(with_conv=True):
    from csrc_bindings._registry import ALL_KERNELS
    ks = [k for k in ALL_KERNELS if with_conv or "conv1d" not in k]
    if with_conv:
        ks += ["causal_conv1d_fwd_seq_idx", "causal_conv1d_bwd_seq_idx"]
    return ks


def _fp64_reference(kernel, p):
    """The fp64 oracle (``tests/gpu/csrc_bindings/fp64_refs.py``) for ``kernel`` on the same values as ``p``."""
    from tests.gpu.csrc_bindings.fp64_refs import reference
    sidx = _seq_idx(p) if kernel.endswith("seq_idx") else None
    return reference(kernel, p, seq_idx=sidx)


def _problem(dtype, device):
    from csrc_bindings._examples import make_problem
    return make_problem(chunk_size=64, headdim=32, dstate=16, nheads=4, ngroups=2, batch=2, seqlen=200,
                        dtype=dtype, device=device, seed=1234)


def worker_compare(dtype_name, device, with_conv=True):
    """Ours and native vs the fp64 reference on the same inputs; ours within ``2 * err_native + floor * max|ref|``."""
    dtype = DTYPES[dtype_name]
    p = _problem(dtype, device)
    rows = []
    for k in _compare_kernels(with_conv):
        try:
            ours = [t for t in _ours_folded(k, p) if t is not None]
            nat = [t for t in _native(k, p) if t is not None]
            ref = [t for t in _fp64_reference(k, p) if t is not None]
        except Exception as exc:  # report, the test fails on it
            rows.append({"kernel": k, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        if not (len(ours) == len(nat) == len(ref)):
            rows.append({"kernel": k, "ok": False, "error": f"output counts {len(ours)}/{len(nat)}/{len(ref)}"})
            continue
        for i, (a, n, r) in enumerate(zip(ours, nat, ref)):
            if not (tuple(a.shape) == tuple(n.shape) == tuple(r.shape)):
                rows.append({"kernel": k, "output": i, "ok": False,
                             "error": f"shape {list(a.shape)} vs native {list(n.shape)} vs ref {list(r.shape)}"})
                continue
            a64, n64, r64 = a.double(), n.double(), r.double()
            empty = a.numel() == 0
            err_ours = 0.0 if empty else (a64 - r64).abs().max().item()
            err_native = 0.0 if empty else (n64 - r64).abs().max().item()
            diff = 0.0 if empty else (a64 - n64).abs().max().item()
            scale = 0.0 if empty else r64.abs().max().item()
            tol = 2 * err_native + FLOOR[dtype_name] * scale
            ok = bool(torch.isfinite(a64).all()) and err_ours <= tol
            rows.append({"kernel": k, "output": i, "ok": ok, "err_ours": err_ours, "err_native": err_native,
                         "tol": tol, "scale": scale, "max_abs_diff": diff,
                         "bitwise": bool(a.dtype == n.dtype and torch.equal(a, n))})
    return rows


def _sha(t):
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()


def worker_hashes(dtype_name, device, with_conv=True):
    """SHA-256 of every launcher's outputs, run twice; plus whether the repeat was bitwise identical."""
    from csrc_bindings._registry import ALL_KERNELS, run_kernel
    dtype = DTYPES[dtype_name]
    p = _problem(dtype, device)
    out = {}
    for k in ALL_KERNELS:
        if "conv1d" in k and not with_conv:
            continue
        h1 = [_sha(t) for t in run_kernel(k, p)]
        h2 = [_sha(t) for t in run_kernel(k, p)]
        out[k] = {"sha": h1, "repeat_identical": h1 == h2}
    return out


def worker_pinned(shard: str, device: str = "cuda") -> dict:
    """Shard ``i/n`` of this device arch's pinned table entries (entries ``i, i + n, ...`` in sorted order): each
    compiled and run on its key's problem at its table configuration; ``{"checked", "failures"}``, a failure being
    a configuration not from the table, an exception, or a non-finite output."""
    from csrc_bindings._configs import _parse_key, _table, device_arch
    from csrc_bindings._examples import problem_for_key
    from csrc_bindings._registry import pinned_config, run_kernel
    i, n = (int(v) for v in shard.split("/"))
    arch = device_arch(device)
    entries = sorted(k for k in _table() if k.startswith(arch + "/"))[i::n]
    failures = []
    for tk in entries:
        _, dtname, kernel, keystr = tk.split("/")
        key = _parse_key(keystr)
        try:
            cfg = pinned_config(kernel, key, DTYPES[dtname], arch)
            if cfg.source != "table":
                failures.append((tk, f"source {cfg.source!r}, expected 'table'"))
                continue
            # a small problem drawn on the GPU: the check is that the configuration compiles, fits and runs
            p = problem_for_key(kernel, key, DTYPES[dtname], device, batch=2, seqlen_chunks=2, nheads=8,
                                on_device=True)
            outs = run_kernel(kernel, p)
            torch.cuda.synchronize()
            if not all(bool(torch.isfinite(t.float()).all()) for t in outs if t.is_floating_point()):
                failures.append((tk, "non-finite output"))
        except Exception as exc:  # noqa: BLE001
            failures.append((tk, f"{type(exc).__name__}: {exc}"))
    return {"checked": len(entries), "failures": failures}


def _main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["compare", "hashes", "pinned"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-conv", action="store_true")
    ap.add_argument("--shard", default="0/1", help="pinned: the slice i/n of the table entries")
    a = ap.parse_args(argv)
    if a.mode == "pinned":
        res = worker_pinned(a.shard, a.device)
    else:
        fn = worker_compare if a.mode == "compare" else worker_hashes
        res = fn(a.dtype, a.device, with_conv=not a.no_conv)
    print("@@RESULT@@" + json.dumps(res))


# ----------------------------------------------------------------------------------------------- pytest side
def _spawn(mode, dtype, env_extra, args=()):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", WORKER, mode, "--dtype", dtype, *args], env=env, cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _collect(proc, timeout=480):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("worker timed out:\n" + out[-4000:])
    marker = [ln for ln in out.splitlines() if ln.startswith("@@RESULT@@")]
    assert proc.returncode == 0 and marker, f"worker failed (rc={proc.returncode}):\n{out[-6000:]}"
    return json.loads(marker[-1][len("@@RESULT@@"):])


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Start all subprocess workers at once (they compile in parallel), collect their results."""
    d1 = tmp_path_factory.mktemp("triton_cache_a")
    d2 = tmp_path_factory.mktemp("triton_cache_b")
    procs = {
        "compare_bf16": _spawn("compare", "bfloat16", {"MAMBA_DETERMINISTIC": "1"}),
        "compare_fp32": _spawn("compare", "float32", {"MAMBA_DETERMINISTIC": "1"}),
        "hashes_a": _spawn("hashes", "bfloat16", {"TRITON_CACHE_DIR": str(d1)}),
        "hashes_b": _spawn("hashes", "bfloat16", {"TRITON_CACHE_DIR": str(d2)}),
    }
    results = {}
    for name, proc in procs.items():
        try:
            results[name] = _collect(proc)
        except AssertionError as exc:
            results[name] = exc
    return results


def _get(workers, name):
    r = workers[name]
    if isinstance(r, Exception):
        raise r
    return r


def test_import_loads_no_native_module():
    code = ("import sys, csrc_bindings as cb; cb.describe_launch(chunk_size=256, headdim=64, dstate=128, nheads=8,"
            " arch='sm_90'); cb.fingerprint(); "
            "bad=[m for m in ('triton','mamba_ssm','causal_conv1d','causal_conv1d_cuda') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT),
                   env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})


def test_version_and_signature_check():
    import csrc_bindings as cb
    versions = cb.check_native()
    assert versions["mamba_ssm"] == cb.SUPPORTED_VERSIONS["mamba_ssm"]
    assert versions["causal_conv1d"] == cb.SUPPORTED_VERSIONS["causal_conv1d"]


def test_version_mismatch_message(monkeypatch):
    from types import SimpleNamespace
    from csrc_bindings import _native
    monkeypatch.setattr(_native, "installed_version", lambda dist: "9.9.9")
    with pytest.raises(RuntimeError) as ei:
        _native._check_version("mamba_ssm", SimpleNamespace(__version__="9.9.9"))
    msg = str(ei.value)
    assert "9.9.9" in msg and "2.3.2.post1" in msg and "pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0" in msg


def test_describe_launch_and_fingerprint():
    import csrc_bindings as cb
    d = cb.describe_launch(chunk_size=256, headdim=64, dstate=128, nheads=24, dtype=torch.bfloat16)
    assert d["arch"].startswith("sm_")
    assert d["fingerprint"] == cb.fingerprint() and f"table={cb.table_hash()}" in d["fingerprint"]
    assert "mamba_ssm=2.3.2.post1" in d["fingerprint"] and "causal_conv1d=1.7.0" in d["fingerprint"]
    assert set(d["kernels"]) >= {"chunk_scan_fwd", "chunk_scan_chunk_state_bwd_dx", "rmsnorm_gated"}
    print("FINGERPRINT", d["fingerprint"])


def test_embedded_candidates_match_native_configs():
    if os.environ.get("MAMBA_DETERMINISTIC", "")[:1] == "1" or torch.are_deterministic_algorithms_enabled():
        pytest.skip("mamba-ssm deterministic mode filtered its autotuner configs at import")
    import csrc_bindings as cb
    from csrc_bindings._registry import KERNELS
    cb.check_native(conv=False)  # checks every kernel, filling native().kernels
    ns = cb._native.native()
    for name, spec in KERNELS.items():
        if spec.candidates is None:
            continue
        live = tuple((dict(c.kwargs), c.num_warps, c.num_stages) for c in ns.kernels[name].configs)
        assert live == spec.candidates, name


def test_every_pinned_config_compiles_and_runs():
    """Every table entry of this GPU's arch compiles and runs at its configuration with finite outputs; the
    entries are split over 8 worker processes started at once (they compile in parallel; 646 entries on sm_90)."""
    from csrc_bindings._configs import _table, device_arch
    arch = device_arch("cuda")
    total = sum(1 for k in _table() if k.startswith(arch + "/"))
    if not total:
        pytest.skip(f"no pinned entries for {arch}")
    shards = 8
    procs = [_spawn("pinned", "bfloat16", {}, ("--shard", f"{i}/{shards}")) for i in range(shards)]
    results, errors = [], []
    for proc in procs:
        try:
            results.append(_collect(proc, timeout=540))
        except AssertionError as exc:  # the others are still collected (or killed at their time limit)
            errors.append(str(exc)[-2000:])
    assert not errors, errors
    assert sum(r["checked"] for r in results) == total
    failures = [f for r in results for f in r["failures"]]
    assert not failures, failures


@pytest.mark.parametrize("which", ["compare_bf16", "compare_fp32"])
def test_launchers_match_native_wrappers(workers, which):
    rows = _get(workers, which)
    bad = [r for r in rows if not r["ok"]]
    nbit = sum(1 for r in rows if r.get("bitwise"))
    print(f"{which}: {len(rows)} outputs compared, {nbit} bitwise equal to native, {len(bad)} out of tolerance")
    assert not bad, json.dumps(bad, indent=1)
    kernels = {r["kernel"] for r in rows}
    assert len(kernels) == len(_compare_kernels(True))


def test_bitwise_repeat_and_across_processes(workers):
    a, b = _get(workers, "hashes_a"), _get(workers, "hashes_b")
    assert all(v["repeat_identical"] for v in a.values()), {k: v for k, v in a.items() if not v["repeat_identical"]}
    assert all(v["repeat_identical"] for v in b.values())
    assert {k: v["sha"] for k, v in a.items()} == {k: v["sha"] for k, v in b.items()}
    here = worker_hashes("bfloat16", "cuda")
    assert {k: v["sha"] for k, v in here.items()} == {k: v["sha"] for k, v in a.items()}


def test_every_launcher_writes_every_entry_it_returns(workers, nan_fresh_buffers):
    """Every launcher's outputs have the same bits when the buffers it allocates start full of NaN (the fixture):
    it writes every entry it returns and zeroes first what it accumulates into."""
    reference = {k: v["sha"] for k, v in _get(workers, "hashes_a").items()}
    assert {k: v["sha"] for k, v in worker_hashes("bfloat16", "cuda").items()} == reference


def _snapshot():
    import mamba_ssm.ops.triton.k_activations as ka
    import mamba_ssm.ops.triton.layernorm_gated as lg
    import mamba_ssm.ops.triton.ssd_bmm as bm
    import mamba_ssm.ops.triton.ssd_chunk_scan as sn
    import mamba_ssm.ops.triton.ssd_chunk_state as cs
    import mamba_ssm.ops.triton.ssd_combined as sc
    import mamba_ssm.ops.triton.ssd_state_passing as sp
    import mamba_ssm.utils.determinism as det
    import causal_conv1d.cpp_functions as cf
    from triton.runtime.autotuner import Autotuner
    mods = [ka, lg, bm, sn, cs, sc, sp, det, cf]
    snap = {}
    for m in mods:
        snap[m.__name__] = {k: id(v) for k, v in vars(m).items()}
        for k, v in vars(m).items():
            if isinstance(v, Autotuner):
                snap[f"{m.__name__}.{k}"] = {
                    "configs": [(c.kwargs, c.num_warps, c.num_stages, id(c.pre_hook)) for c in v.configs],
                    "cache": {str(kk): str(vv) for kk, vv in v.cache.items()},
                    "hooks": (id(v.pre_hook), id(v.post_hook), id(v.fn)),
                }
    snap["det_override"] = det._deterministic_override
    snap["env"] = {k: v for k, v in os.environ.items() if k.startswith(("TRITON", "MAMBA", "CAUSAL"))}
    snap["torch_det"] = torch.are_deterministic_algorithms_enabled()
    return snap


@pytest.mark.native_timing  # the timing goes through upstream's autotuners: they must be left as they were
def test_no_global_state_changed():
    before = _snapshot()
    from csrc_bindings._registry import ALL_KERNELS, run_kernel
    p = _problem(torch.bfloat16, "cuda")
    for k in ALL_KERNELS:
        run_kernel(k, p)
    torch.cuda.synchronize()
    after = _snapshot()
    assert before == after


if __name__ == "__main__":
    _main()
