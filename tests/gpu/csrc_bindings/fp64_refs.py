"""Pure-PyTorch fp64 references ("oracles") for every kernel output compared in ``test_bindings.py``.

``reference(kernel, p)`` takes a problem dict from :func:`csrc_bindings._examples.make_problem` and returns, in
float64 and in the upstream wrapper's return format (``None`` outputs dropped), what each output of the kernel
*should* be for exactly the values in ``p`` (bf16 or fp32 values, upcast to fp64 without rounding). It uses
only torch, never mamba-ssm, causal-conv1d or csrc_bindings. The test measures both our launcher and the native
wrapper against it.

Notation: ``B`` batch, ``L`` seqlen, ``H`` nheads, ``P`` headdim, ``G`` ngroups (head ``h`` reads group
``h // (H/G)``), ``N`` dstate, ``cs`` chunk_size, ``C = ceil(L/cs)`` nchunks, ``l, s`` positions inside a chunk.
Sequences are zero-padded to ``C * cs``. ``a = dA_cumsum`` is ``[B, H, C, cs]``, ``dt`` the same shape.
``cumsum``-parametrisation: "``∂/∂dA``" means the derivative w.r.t. the per-step increments ``dA[k]`` with
``a[l] = sum_{k<=l} dA[k]`` inside a chunk (``∂/∂dA[0] = 0``: it cancels in every ``a[l] - a[s]``);
"``∂/∂a``" means w.r.t. ``dA_cumsum`` itself. The SSD pieces (within chunk ``c``, per head):

* ``S_c = sum_l exp(a[cs-1] - a[l]) dt[l] x[l] B[l]^T``  (chunk state, ``[P, N]``);
* ``Y_intra[l] = sum_{s<=l} CB[l,s] exp(a[l] - a[s]) dt[s] x[s]``  (``CB`` the *given* ``[cs, cs]`` matrix);
* ``Y_inter[l] = exp(a[l]) prev_c C[l]``  (``prev_c``: the *given* state entering chunk ``c``);
* ``Y = Y_intra + Y_inter + D x``, ``out = Y * silu(z)``.

Per kernel output (``loss`` = the given upstream gradient contracted with the named forward quantity; "autograd"
means ``torch.autograd.grad`` in fp64 through the forward written here, which is exactly the kernel's
quantity; "direct" means the closed-form formula: forward outputs, and backward outputs that are not a plain
derivative of a forward written here):

=================================  ====  =======================================================================
kernel                             out   quantity (how)
=================================  ====  =======================================================================
chunk_cumsum_fwd                   0     ``dA_cumsum = cumsum_l(dt * A)`` per chunk, ``dt = softplus(dt_raw+bias)``
                                         (identity above 20), zero past ``L`` (direct)
                                   1     ``dt`` as above, ``[B,H,C,cs]`` (direct)
chunk_cumsum_bwd                   0-2   ``∂/∂(dt_raw, A, dt_bias)`` of ``<ddA, dt*A> + <ddt_out, dt>``; ``ddA`` is
                                         a gradient w.r.t. the increments ``dt*A``, not the cumsum (autograd)
bmm_chunk_fwd                      0     ``CB[b,c,g,l,s] = C[l] . B[s]`` (direct)
bmm_chunk_bwd                      0     ``∂/∂B <dCB, C B^T> + residual`` (autograd)
chunk_state_fwd                    0     ``S_c`` (direct)
chunk_state_bwd_db                 0     ``∂/∂B <dstates, S>`` (autograd)
                                   1     ``∂/∂dA <dstates, S>`` (autograd, increments)
state_passing_fwd                  0     states entering each chunk: ``h_0 = init``,
                                         ``h_{c+1} = exp(a_c) h_c + states_c`` (``a_c = dA_cumsum[..., c, -1]``)
                                   1     final state ``h_C`` (direct)
state_passing_bwd                  0     ``g_c = ∂ loss/∂ states_c`` with ``loss = sum_c <dout_c, h_c> +
                                         <dfinal, h_C>`` (autograd through the recurrence)
                                   1     ``exp(a_c) <h_c, g_c>`` with ``h_c`` the *given* states (the kernel's
                                         adjoint formula; the given states need not come from a forward) (direct)
                                   2     ``∂ loss/∂ init`` (autograd)
                                   3     the given states, converted (identity)
chunk_scan_fwd                     0     ``out = Y * silu(z)`` (direct)
                                   1     ``Y`` (direct)
chunk_scan_bwd_dz                  0     ``∂/∂z <dout, Y*silu(z)>`` with ``Y`` = given ``out_x`` (autograd)
                                   1     ``dY = dout * silu(z)`` (autograd)
                                   2     ``∂/∂D <dY, D x> = sum dY*x`` per head (autograd)
                                   3     ``sum_p dY * (Y - D x)``: ``∂/∂a[l]`` of ``<dY, Y>`` through the row
                                         factor ``exp(a[l])`` only, evaluated on the given ``Y`` (direct)
chunk_scan_bwd_dstates             0     ``∂/∂prev_c <dout, Y_inter>``: d loss / d (state entering chunk c) from
                                         the inter-chunk output term only (autograd)
chunk_scan_bwd_dC                  0     ``∂/∂C <dout, Y_inter>`` (autograd)
                                   1     ``∂/∂a <dout, Y_inter>`` (autograd, w.r.t. the cumsum)
chunk_scan_bwd_dcb                 0     ``∂/∂CB <dout, Y_intra>`` (0 above the diagonal) (autograd)
chunk_scan_bwd_ddAcs_stable        0     ``∂/∂dA <dout, Y_intra>`` (autograd, increments)
chunk_scan_chunk_state_bwd_dx      0-2   ``∂/∂(x, dt, D)`` of ``<dout, Y_intra + D x> + <dstates, S>`` (autograd)
swiglu_fwd                         0     ``silu(x) * y`` for ``xy = [x | y]`` (direct)
swiglu_bwd                         0     ``∂/∂xy <dsw, silu(x) y>`` (autograd)
                                   1     ``silu(x) * y`` (recomputed output) (direct)
rmsnorm_gated_fwd                  0     ``u * rstd * w``, ``u = x * silu(z)``, per group of ``H*P/G`` columns
                                   1     ``rstd = 1/sqrt(mean(u^2) + 1e-5)``, laid out ``[G * M]`` (group-major)
rmsnorm_gated_bwd                  0-2   ``∂/∂(x, w, z) <dy, out>`` (autograd; the kernel's ``rstd`` input is the
                                         fp32 forward's, the reference recomputes it in fp64)
causal_conv1d_fwd[_seq_idx]        0     ``silu(bias + sum_k w[k] x[t-3+k])`` depthwise, zero history; with
                                         ``seq_idx`` taps from another sequence are dropped (direct)
causal_conv1d_bwd[_seq_idx]        0-2   ``∂/∂(x, w, bias) <dout, out>`` (autograd)
chunk_state_varlen                 0     the state at the end of each packed sequence of example 0 (its inputs in
                                         its last chunk decayed to its end, plus the given state entering that
                                         chunk, decayed, when it started before it) (direct)
causal_conv1d_update               0     ``silu(bias + sum_k w[k] s'[k])``, ``s'`` the state shifted by one with
                                         the new input last (direct)
                                   1     ``s'`` (direct)
selective_state_update             0     ``(h' C + D x) * silu(z)`` (direct)
                                   1     ``h' = exp(A dt) h + dt x B^T``, ``dt = softplus(dt_raw + bias)`` (direct)
=================================  ====  =======================================================================
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

f64 = torch.float64


def _d(t):
    return None if t is None else t.detach().to(f64)


def _grad(loss, inputs):
    return torch.autograd.grad(loss, inputs, allow_unused=False)


def _leaf(t):
    return _d(t).clone().requires_grad_(True)


# ------------------------------------------------------------------------------------------------ layout helpers
def _chunk(t, cs):
    """``[B, L, ...]`` -> ``[B, C, cs, ...]`` zero-padded."""
    B, L = t.shape[:2]
    C = -(-L // cs)
    pad = C * cs - L
    if pad:
        t = torch.cat([t, t.new_zeros((B, pad) + tuple(t.shape[2:]))], dim=1)
    return t.reshape((B, C, cs) + tuple(t.shape[2:]))


def _unchunk(t, L):
    """``[B, C, cs, ...]`` -> ``[B, L, ...]``."""
    B, C, cs = t.shape[:3]
    return t.reshape((B, C * cs) + tuple(t.shape[3:]))[:, :L]


def _heads(t, H):
    """Group axis (second to last) of ``[..., G, N]`` repeated to heads: head ``h`` reads group ``h // (H/G)``."""
    G = t.shape[-2]
    return t.repeat_interleave(H // G, dim=-2)


def _causal_decay(a):
    """``exp(a[l] - a[s])`` for ``s <= l`` else 0; ``a``: ``[B, H, C, cs]`` -> ``[B, H, C, cs(l), cs(s)]``."""
    cs = a.shape[-1]
    seg = a[..., :, None] - a[..., None, :]
    mask = torch.ones(cs, cs, dtype=torch.bool, device=a.device).tril()
    return torch.exp(seg.masked_fill(~mask, float("-inf")))


# ------------------------------------------------------------------------------------------------- SSD pieces
def dt_process(dt_raw, dt_bias, softplus=True):
    v = dt_raw + dt_bias
    if softplus:
        v = torch.where(v <= 20.0, torch.log1p(torch.exp(torch.clamp(v, max=20.0))), v)
    return v.clamp(min=0.0)


def chunk_cumsum(dt_raw, A, dt_bias, cs):
    """``(dA_cumsum, dt)`` both ``[B, H, C, cs]``; also returns the per-step ``dA = dt * A``."""
    dt = _chunk(dt_process(dt_raw, dt_bias), cs).permute(0, 3, 1, 2)  # [B, H, C, cs]
    dA = dt * A[None, :, None, None]
    return torch.cumsum(dA, dim=-1), dt, dA


def bmm_chunk(Cm, Bm, cs):
    """``CB[b, c, g, l, s] = C[l] . B[s]``."""
    return torch.einsum("bclgn,bcsgn->bcgls", _chunk(Cm, cs), _chunk(Bm, cs))


def chunk_state(Bm, x, dt, a):
    """``S[b, c, h, p, n] = sum_l exp(a[last] - a[l]) dt[l] x[l, p] B[l, n]``."""
    H, cs = x.shape[2], dt.shape[-1]
    w = torch.exp(a[..., -1:] - a) * dt  # [B, H, C, cs]
    return torch.einsum("bclhp,bclhn,bhcl->bchpn", _chunk(x, cs), _heads(_chunk(Bm, cs), H), w)


def scan_intra(CB, x, dt, a):
    """``Y_intra`` ``[B, C, cs, H, P]`` from the given ``CB`` ``[B, C, G, cs, cs]``."""
    H, cs = x.shape[2], dt.shape[-1]
    G = CB.shape[2]
    CBh = CB.repeat_interleave(H // G, dim=2)  # [B, C, H, l, s]
    M = CBh * _causal_decay(a).permute(0, 2, 1, 3, 4) * dt.permute(0, 2, 1, 3)[:, :, :, None, :]
    return torch.einsum("bchls,bcshp->bclhp", M, _chunk(x, cs))


def scan_inter(Cm, prev, a):
    """``Y_inter`` ``[B, C, cs, H, P]``: ``exp(a[l]) prev_c C[l]`` with ``prev`` ``[B, C, H, P, N]``."""
    H, cs = prev.shape[2], a.shape[-1]
    Ch = _heads(_chunk(Cm, cs), H)  # [B, C, cs, H, N]
    return torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, prev, torch.exp(a))


def _skip(D, x):
    return x * D[None, None, :, None]


def state_passing(states, a_last, init):
    """``states`` ``[B, C, H, dim]``, ``a_last`` ``[B, H, C]``, ``init`` ``[B, H, dim]`` -> (entering, final)."""
    h = init
    outs = []
    for c in range(states.shape[1]):
        outs.append(h)
        h = torch.exp(a_last[:, :, c])[..., None] * h + states[:, c]
    return torch.stack(outs, dim=1), h


def _dA_param(a):
    """``a`` as a function of zero increments ``v`` (``a + cumsum(v)``): gradients w.r.t. ``v`` are ``∂/∂dA``."""
    v = torch.zeros_like(a, requires_grad=True)
    return v, a + torch.cumsum(v, dim=-1)


def rmsnorm_gated(x, z, w, ngroups, eps=1e-5):
    M, Nc = x.shape
    u = (x * F.silu(z)).reshape(M, ngroups, Nc // ngroups)
    rstd = torch.rsqrt(u.square().mean(-1, keepdim=True) + eps)
    out = (u * rstd).reshape(M, Nc) * w
    return out, rstd[..., 0].t().reshape(-1)  # rstd layout [G * M], group-major


def causal_conv1d_silu(x, w, b, seq_idx=None):
    """``x`` ``[B, D, L]``, ``w`` ``[D, W]``, ``b`` ``[D]`` -> ``silu(b + sum_k w[:, k] x[..., t - (W-1) + k])``."""
    Bsz, Dc, L = x.shape
    W = w.shape[1]
    xp = F.pad(x, (W - 1, 0))
    acc = b[None, :, None].expand(Bsz, Dc, L)
    for k in range(W):
        tap = xp[..., k:k + L]
        if seq_idx is not None:
            sp = F.pad(seq_idx.to(torch.int64), (W - 1, 0), value=-1)[:, k:k + L]
            tap = tap * (sp == seq_idx.to(torch.int64)).to(tap.dtype)[:, None, :]
        acc = acc + w[None, :, k, None] * tap
    return F.silu(acc)


def chunk_state_varlen(Bm, x, dt, a, cu, chunk_states):
    """State at the end of each packed sequence (one example): ``Bm`` ``[L, G, N]``, ``x`` ``[L, H, P]``, ``dt``/``a``
    ``[H, C, cs]``, ``cu`` the offsets, ``chunk_states`` ``[C, H, P, N]`` the states entering each chunk. Sequence
    ``s`` ends at ``e`` in chunk ``c``: ``sum_{l in chunk c, l >= start, l <= e} exp(a[e] - a[l]) dt[l] x[l] B[l]^T``
    ``+ [start < c cs] exp(a[e]) chunk_states[c]``."""
    H, cs = x.shape[1], dt.shape[-1]
    Bh = _heads(Bm, H)  # [L, H, N]
    out = []
    for start, end in zip(cu[:-1], cu[1:]):
        c, r = divmod(end - 1, cs)
        lo = max(start, c * cs)
        pos = torch.arange(lo, end, device=x.device) - c * cs
        w = torch.exp(a[:, c, r, None] - a[:, c, pos]) * dt[:, c, pos]  # [H, n]
        st = torch.einsum("hl,lhp,lhn->hpn", w, x[lo:end], Bh[lo:end])
        if start < c * cs:
            st = st + torch.exp(a[:, c, r])[:, None, None] * chunk_states[c]
        out.append(st)
    return torch.stack(out)


def selective_state_update(state, x, dt_raw, A, Bm, Cm, D, z, dt_bias):
    """One token of the SSM (Mamba-2 per head, softplus on): ``state`` ``[B, H, P, N]``, ``x``/``z`` ``[B, H, P]``,
    ``dt_raw`` ``[B, H]``, ``A``/``D``/``dt_bias`` ``[H]``, ``Bm``/``Cm`` ``[B, G, N]`` -> ``(out, new state)`` with
    ``h' = exp(A dt) h + dt x B^T``, ``out = (h' C + D x) * silu(z)``."""
    H = x.shape[1]
    dt = dt_process(dt_raw, dt_bias)  # [B, H]
    new = state * torch.exp(A * dt)[..., None, None] + torch.einsum("bh,bhp,bhn->bhpn", dt, x, _heads(Bm, H))
    out = (torch.einsum("bhpn,bhn->bhp", new, _heads(Cm, H)) + x * D[None, :, None]) * F.silu(z)
    return out, new


# --------------------------------------------------------------------------------------------- per kernel
def reference(kernel, p, seq_idx=None):
    """fp64 reference outputs of ``kernel`` on problem ``p`` (see the module table), as a tuple.

    ``seq_idx`` (``[B, L]`` int, non-decreasing rows) is required for the ``causal_conv1d_*_seq_idx`` kernels.
    """
    cs, G, H, L = p["chunk_size"], p["ngroups"], p["nheads"], p["seqlen"]
    d = {k: _d(v) for k, v in p.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    with torch.enable_grad():
        return _reference(kernel, p, d, cs, G, H, L, seq_idx)


def _reference(kernel, p, d, cs, G, H, L, seq_idx):
    a, dt = d["dA_cumsum"], d["dt"]
    if kernel == "chunk_cumsum_fwd":
        dA_cs, dt_out, _ = chunk_cumsum(d["dt_raw"], d["A"], d["dt_bias"], cs)
        return dA_cs, dt_out
    if kernel == "chunk_cumsum_bwd":
        dt_raw, A, bias = _leaf(p["dt_raw"]), _leaf(p["A"]), _leaf(p["dt_bias"])
        _, dt_out, dA = chunk_cumsum(dt_raw, A, bias, cs)
        loss = (d["ddA"] * dA).sum() + (d["ddt_out"] * dt_out).sum()
        return _grad(loss, (dt_raw, A, bias))
    if kernel == "bmm_chunk_fwd":
        return (bmm_chunk(d["Cm"], d["Bm"], cs),)
    if kernel == "bmm_chunk_bwd":
        Bm = _leaf(p["Bm"])
        (gB,) = _grad((d["dCB"] * bmm_chunk(d["Cm"], Bm, cs)).sum(), (Bm,))
        return (gB + d["dB_res"],)
    if kernel == "chunk_state_fwd":
        return (chunk_state(d["Bm"], d["x"], dt, a),)
    if kernel == "chunk_state_bwd_db":
        Bm = _leaf(p["Bm"])
        v, av = _dA_param(a)
        loss = (d["dstates"] * chunk_state(Bm, d["x"], dt, av)).sum()
        return _grad(loss, (Bm, v))
    if kernel == "state_passing_fwd":
        return state_passing(d["sp_states"], a[..., -1], d["sp_init"])
    if kernel == "state_passing_bwd":
        given = d["sp_states"]  # the states entering each chunk, as stored by the forward
        a_last = a[..., -1]
        new, init = torch.zeros_like(given, requires_grad=True), torch.zeros_like(given[:, 0], requires_grad=True)
        ent, fin = state_passing(new, a_last, init)  # linear in (new, init): gradients do not depend on them
        loss = (d["sp_dout"] * ent).sum() + (d["sp_dfinal"] * fin).sum()
        g, dinit = _grad(loss, (new, init))
        ddA = torch.exp(a_last) * torch.einsum("bchd,bchd->bhc", given, g)
        return g, ddA, dinit, given
    if kernel == "chunk_scan_fwd":
        y = scan_intra(d["CB"], d["x"], dt, a) + scan_inter(d["Cm"], d["states_lo"], a)
        y = _unchunk(y, L) + _skip(d["D"], d["x"])
        return y * F.silu(d["z"]), y
    if kernel == "chunk_scan_bwd_dz":
        y, z = _leaf(p["out_x"]), _leaf(p["z"])
        dz, dy = _grad((d["dout"] * y * F.silu(z)).sum(), (z, y))
        D = _leaf(p["D"])
        (dD,) = _grad((dy * _skip(D, d["x"])).sum(), (D,))
        ddA = (dy * (d["out_x"] - _skip(d["D"], d["x"]))).sum(-1)  # [B, L, H]
        ddA = _chunk(ddA, cs).permute(0, 3, 1, 2)  # [B, H, C, cs], 0 past L
        return dz, dy, dD, ddA
    if kernel == "chunk_scan_bwd_dstates":
        prev = torch.zeros_like(d["states"], requires_grad=True)
        loss = (_chunk(d["dout"], cs) * scan_inter(d["Cm"], prev, a)).sum()
        return _grad(loss, (prev,))
    if kernel == "chunk_scan_bwd_dC":
        Cm, av = _leaf(p["Cm"]), _leaf(p["dA_cumsum"])
        loss = (_chunk(d["dout"], cs) * scan_inter(Cm, d["states_lo"], av)).sum()
        return _grad(loss, (Cm, av))
    if kernel == "chunk_scan_bwd_dcb":
        CB = _leaf(p["CB"])
        loss = (_chunk(d["dout"], cs) * scan_intra(CB, d["x"], dt, a)).sum()
        return _grad(loss, (CB,))
    if kernel == "chunk_scan_bwd_ddAcs_stable":
        v, av = _dA_param(a)
        loss = (_chunk(d["dout"], cs) * scan_intra(d["CB"], d["x"], dt, av)).sum()
        return _grad(loss, (v,))
    if kernel == "chunk_scan_chunk_state_bwd_dx":
        x, dtv, D = _leaf(p["x"]), _leaf(p["dt"]), _leaf(p["D"])
        y = _unchunk(scan_intra(d["CB"], x, dtv, a), L) + _skip(D, x)
        loss = (d["dout"] * y).sum() + (d["dstates"] * chunk_state(d["Bm"], x, dtv, a)).sum()
        return _grad(loss, (x, dtv, D))
    if kernel == "swiglu_fwd":
        xx, yy = d["xy"].chunk(2, dim=-1)
        return (F.silu(xx) * yy,)
    if kernel == "swiglu_bwd":
        xy = _leaf(p["xy"])
        xx, yy = xy.chunk(2, dim=-1)
        out = F.silu(xx) * yy
        (dxy,) = _grad((d["dsw"] * out).sum(), (xy,))
        return dxy, out.detach()
    if kernel in ("rmsnorm_gated_fwd", "rmsnorm_gated_bwd"):
        M = p["batch"] * L
        x2, z2 = d["out_x"].reshape(M, -1), d["z"].reshape(M, -1)
        if kernel == "rmsnorm_gated_fwd":
            return rmsnorm_gated(x2, z2, d["rms_w"], G)
        x2, z2, w = x2.clone().requires_grad_(True), z2.clone().requires_grad_(True), _leaf(p["rms_w"])
        out, _ = rmsnorm_gated(x2, z2, w, G)
        return _grad((d["dy_rms"] * out).sum(), (x2, w, z2))
    if kernel == "chunk_state_varlen":
        from csrc_bindings.ssd_chunk_state import example_cu_seqlens
        return (chunk_state_varlen(d["Bm"][0], d["x"][0], dt[0], a[0], example_cu_seqlens(p).tolist(),
                                   d["states"][0]),)
    if kernel == "selective_state_update":
        return selective_state_update(d["states"][:, 0], d["x"][:, 0], d["dt_raw"][:, 0], d["A"], d["Bm"][:, 0],
                                      d["Cm"][:, 0], d["D"], d["z"][:, 0], d["dt_bias"])
    if kernel == "causal_conv1d_update":
        state = d["conv_x"][:, :4].transpose(1, 2)  # [B, D, W]
        new = torch.cat([state[..., 1:], d["conv_x"][:, 4, :, None]], dim=-1)
        out = causal_conv1d_silu(new, d["conv_w"], d["conv_b"])[..., -1]
        return out, new
    if kernel.startswith("causal_conv1d"):
        sidx = seq_idx if kernel.endswith("seq_idx") else None
        if kernel.endswith("seq_idx") and sidx is None:
            raise ValueError(f"{kernel} needs seq_idx")
        xc = d["conv_x"].transpose(1, 2)
        if kernel.startswith("causal_conv1d_fwd"):
            return (causal_conv1d_silu(xc, d["conv_w"], d["conv_b"], sidx),)
        xc, w, b = xc.clone().requires_grad_(True), _leaf(p["conv_w"]), _leaf(p["conv_b"])
        out = causal_conv1d_silu(xc, w, b, sidx)
        return _grad((d["conv_dout"].transpose(1, 2) * out).sum(), (xc, w, b))
    raise KeyError(kernel)
