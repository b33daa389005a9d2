"""Deterministic example inputs for every launcher, keyed like the pinned table.

Each kernel's example runner (beside its launcher, run by :func:`csrc_bindings._registry.run_kernel`) takes one of
these problems. Used by the tuner (``python -m csrc_bindings.pinned.tune``, timing every candidate) and by the GPU
tests (every table entry compiles and runs; bitwise reproducibility). Inputs are pure-torch random tensors from a
seeded CPU generator (the tuner: the device's own, ``on_device``), with plausible magnitudes (negative ``A``,
softplus'd ``dt``, per-chunk ``dA_cumsum``); no native kernel is used to build them, so timing one kernel never
depends on another's configuration.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _rand(gen, shape, scale=1.0, shift=0.0):
    return torch.randn(*shape, generator=gen, device=gen.device) * scale + shift


def make_problem(*, chunk_size=64, headdim=32, dstate=16, nheads=4, ngroups=2, batch=2, seqlen=200,
                 dtype=torch.float32, device="cpu", seed=0, state_dim=None, swiglu_cols=48,
                 sp_dtype=torch.float32, on_device=False):
    """A dict of tensors for one small Mamba-2 SSD problem (see the module docstring). The random values come from
    a CPU generator seeded with ``seed`` (the same on every machine), or with ``on_device`` from ``device``'s own
    generator (other values; seconds faster for the tuner's large problems, whose values only need to be finite)."""
    gen = torch.Generator(device=device if on_device else "cpu").manual_seed(seed)
    P, N, H, G, B, L = headdim, dstate, nheads, ngroups, batch, seqlen
    C = math.ceil(L / chunk_size)
    pad = C * chunk_size - L
    p = {"chunk_size": chunk_size, "headdim": P, "dstate": N, "nheads": H, "ngroups": G, "batch": B, "seqlen": L,
         "nchunks": C, "dtype": dtype}
    p["dt_raw"] = _rand(gen, (B, L, H), 0.5, -1.0)
    p["A"] = -torch.exp(_rand(gen, (H,), 0.5))
    p["dt_bias"] = _rand(gen, (H,), 0.3)
    dt = F.softplus(p["dt_raw"] + p["dt_bias"])
    dt = F.pad(dt, (0, 0, 0, pad)).reshape(B, C, chunk_size, H).permute(0, 3, 1, 2).contiguous()  # [B, H, C, cs]
    p["dt"] = dt
    p["dA_cumsum"] = torch.cumsum(dt * p["A"][None, :, None, None], dim=-1)
    for name, shape in (("x", (B, L, H, P)), ("z", (B, L, H, P)), ("dout", (B, L, H, P)), ("out_x", (B, L, H, P)),
                        ("Bm", (B, L, G, N)), ("Cm", (B, L, G, N))):
        p[name] = _rand(gen, shape)
    p["D"] = _rand(gen, (H,), 0.5, 1.0)
    Cc = F.pad(p["Cm"], (0, 0, 0, 0, 0, pad)).reshape(B, C, chunk_size, G, N)
    Bc = F.pad(p["Bm"], (0, 0, 0, 0, 0, pad)).reshape(B, C, chunk_size, G, N)
    p["CB"] = torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc).contiguous()
    p["dCB"] = torch.tril(_rand(gen, (B, C, G, chunk_size, chunk_size), 0.1))
    p["dB_res"] = _rand(gen, (B, L, G, N))
    p["states"] = _rand(gen, (B, C, H, P, N), 0.5)
    p["dstates"] = _rand(gen, (B, C, H, P, N), 0.5)
    p["ddA"] = _rand(gen, (B, H, C, chunk_size), 0.5)
    p["ddt_out"] = _rand(gen, (B, H, C, chunk_size), 0.5)
    state_dim = P * N if state_dim is None else state_dim
    p["sp_states"] = _rand(gen, (B, C, H, state_dim), 0.5)
    p["sp_init"] = _rand(gen, (B, H, state_dim), 0.5)
    p["sp_dout"] = _rand(gen, (B, C, H, state_dim), 0.5)
    p["sp_dfinal"] = _rand(gen, (B, H, state_dim), 0.5)
    p["xy"] = _rand(gen, (B * L, 2 * swiglu_cols))
    p["dsw"] = _rand(gen, (B * L, swiglu_cols))
    p["rms_w"] = _rand(gen, (H * P,), 0.1, 1.0)
    p["dy_rms"] = _rand(gen, (B * L, H * P))
    p["conv_x"] = _rand(gen, (B, L, 2 * H * P // 2 + 2 * G * N))  # xBC: [B, L, D_conv]
    p["conv_w"] = _rand(gen, (p["conv_x"].shape[-1], 4), 0.5)
    p["conv_b"] = _rand(gen, (p["conv_x"].shape[-1],), 0.1)
    p["conv_dout"] = _rand(gen, p["conv_x"].shape)
    # dtypes: activations in `dtype`; dt/dA_cumsum/A/dt_bias/D/CB/dCB/ddA/ddt_out/dB_res/sp_* fp32 like mamba-ssm
    lo = ("dt_raw", "x", "z", "dout", "out_x", "Bm", "Cm", "dstates", "xy", "dsw", "rms_w", "dy_rms", "conv_x",
          "conv_w", "conv_b", "conv_dout")
    for k in lo:
        p[k] = p[k].to(dtype)
    p["states_lo"] = p["states"].to(dtype)
    for k in ("sp_states", "sp_init", "sp_dout"):  # the state-passing kernels are keyed on the states' dtype
        p[k] = p[k].to(sp_dtype)
    for k, v in list(p.items()):
        if isinstance(v, torch.Tensor):
            p[k] = v.to(device)
    return p


def problem_for_key(kernel, key, dtype, device, *, batch=4, seqlen=None, seqlen_chunks=8, nheads=16, ngroups=1,
                    seed=0, on_device=False):
    """:func:`make_problem` sized for ``kernel``'s autotune ``key`` (missing sizes: chunk_size 256, hdim 64,
    dstate 128).
    ``seqlen`` defaults to ``seqlen_chunks * chunk_size``; ``nheads`` is overridden by a key that has it."""
    chunk_size = int(key.get("chunk_size", 256))
    P = int(key.get("hdim", 64))
    N = int(key.get("dstate", key.get("K", 128)))
    H = int(key.get("nheads", nheads))
    L = seqlen if seqlen is not None else seqlen_chunks * chunk_size
    return make_problem(chunk_size=chunk_size, headdim=P, dstate=N, nheads=H, ngroups=ngroups, batch=batch, seqlen=L,
                        dtype=dtype, device=device, seed=seed, state_dim=key.get("dim"),
                        swiglu_cols=int(key.get("ncols", 48)),
                        sp_dtype=dtype if kernel.startswith("state_passing") else torch.float32, on_device=on_device)
