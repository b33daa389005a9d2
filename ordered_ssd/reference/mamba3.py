"""The pure-PyTorch reference of the Mamba-3 layer, single-input single-output (SISO): the CPU path of
``OrderedMamba3`` and the oracle of its tests.

Mamba-3 (Lahoti et al., "Mamba-3: Improved Sequence Modeling using State Space Principles", 2026; mamba-ssm
2.3.2.post1's ``mamba_ssm/modules/mamba3.py`` and ``ops/triton/mamba3/``) changes Mamba-2's recurrence in three
ways: a trapezoidal discretisation (each step adds the previous token's ``k v^T`` as well as its own), rotary
position angles on ``B`` and ``C`` that accumulate with ``dt`` (a complex-valued state written as rotations), and
per-head biases on ``B`` and ``C`` after an RMSNorm; there is no causal conv1d. Per head ``h`` and position
``t`` (``sigma`` the logistic function):

* ``dt_t = softplus(dd_dt_t + dt_bias)``, ``A_t = min(-softplus(dd_A_t), -A_floor)``, ``a_t = A_t dt_t``,
  ``lam_t = sigma(trap_t)``;
* angles ``theta_t = (theta_{t-1} + pi tanh(angle_t) dt_t) mod 2 pi`` (``num_rope_angles`` of them, the same
  projection for every head, scaled by each head's ``dt``);
* ``q_t = rot(theta_t, rmsnorm(C_t) + C_bias)``, ``k_t = rot(theta_t, rmsnorm(B_t) + B_bias)``: the pairs
  ``(2i, 2i+1)``, ``i < num_rope_angles``, rotated by ``theta_t[i]``, the other channels unrotated;
* ``S_t = exp(a_t) S_{t-1} + (1 - lam_t) dt_t exp(a_t) v_{t-1} k_{t-1}^T + lam_t dt_t v_t k_t^T`` (``S`` of
  shape ``[P, N]``), ``y_t = S_t q_t + D v_t``, gated ``y_t silu(z_t)`` (or, with ``is_outproj_norm``, a gated
  RMSNorm over each head), then ``out_proj``.

Functions: :func:`reference_mamba3_recurrence` (the recurrence above, one position at a time: the oracle),
:func:`reference_mamba3_scan` (the same function, chunked: what the layer uses), :func:`reference_mamba3_layer`
(the whole layer), :func:`reference_mamba3_step` (one decoding step), and :func:`ordered_reference_mamba3` (the
layer with the ordered backward: per-example gradients folded in example order). Imports nothing from the CUDA
path.

Shapes: ``B`` batch, ``L`` length, ``H`` heads, ``P`` headdim, ``G`` groups of ``B``/``C`` (``ngroups``), ``N``
d_state, ``S`` num_rope_angles. The scan takes per-position tensors in ``[B, L, ...]`` layout (upstream's kernels
take ``dt``, ``a``, ``trap`` as ``[B, H, L]``).
"""
from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from .naive import reference_gated_rmsnorm
from .ordered import (_NAMESPACE, OP_TAGS, _autograd_inside_custom_op, backward_op_fake, per_example_ordered_bwd,
                      register_reference_autograd, warn_if_autocast)

__all__ = ["Mamba3Dims", "Mamba3Params", "Mamba3States", "reference_mamba3_rotary", "reference_mamba3_recurrence",
           "reference_mamba3_scan", "reference_mamba3_layer", "reference_mamba3_step", "ordered_reference_mamba3",
           "ordered_reference_mamba3_bwd"]

TWO_PI = 2 * math.pi


class Mamba3Dims(NamedTuple):
    """The sizes and constants of a Mamba-3 SISO layer (as ``Mamba3``'s attributes).

    ``d_inner = H * P``; ``num_rope_angles`` = S; ``B_norm_eps``, ``C_norm_eps``, ``norm_eps``: the epsilons of
    the RMSNorms of ``B``, of ``C`` and of the output (1e-5 upstream; each its module's ``eps``).
    """
    d_model: int
    d_inner: int
    headdim: int
    ngroups: int
    d_state: int
    num_rope_angles: int
    chunk_size: int
    A_floor: float
    is_outproj_norm: bool
    B_norm_eps: float = 1e-5
    C_norm_eps: float = 1e-5
    norm_eps: float = 1e-5

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def in_proj_sizes(self) -> Tuple[int, ...]:
        """The widths of ``[z, x, B, C, dd_dt, dd_A, trap, angle]`` in the in_proj output (upstream's order)."""
        gn, h = self.ngroups * self.d_state, self.nheads
        return (self.d_inner, self.d_inner, gn, gn, h, h, h, self.num_rope_angles)


class Mamba3Params(NamedTuple):
    """The parameters of a Mamba-3 SISO layer, in ``Mamba3``'s shapes.

    ``in_proj_weight`` [sum(in_proj_sizes), d_model]; ``dt_bias`` [H]; ``B_bias``, ``C_bias`` [H, 1, N];
    ``B_norm_weight``, ``C_norm_weight`` [N]; ``D`` [H]; ``norm_weight`` [d_inner] or None (``is_outproj_norm``
    False); ``out_proj_weight`` [d_model, d_inner].
    """
    in_proj_weight: torch.Tensor
    dt_bias: torch.Tensor
    B_bias: torch.Tensor
    C_bias: torch.Tensor
    B_norm_weight: torch.Tensor
    C_norm_weight: torch.Tensor
    D: torch.Tensor
    norm_weight: Optional[torch.Tensor]
    out_proj_weight: torch.Tensor


class Mamba3States(NamedTuple):
    """The recurrent state of one or more sequences (upstream's decoding cache, SISO).

    ``angle`` [B, H, S] (in [0, 2 pi)); ``ssm`` [B, H, P, N]; ``k`` [B, H, N] (the last position's rotated,
    biased ``k``); ``v`` [B, H, P] (its ``x``). The cache of ``Mamba3`` keeps ``k`` as [B, 1, H, N].
    """
    angle: torch.Tensor
    ssm: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def reference_mamba3_rotary(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate the channel pairs ``(2i, 2i+1)`` of ``x`` [..., N] by ``theta`` [..., S] (``i < S <= N / 2``); the
    channels from ``2 S`` on are unchanged. Source: ``rotate_pairwise`` of mamba-ssm's SISO kernels."""
    s = theta.shape[-1]
    pairs = x[..., :2 * s].unflatten(-1, (s, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = torch.cos(theta), torch.sin(theta)
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    return torch.cat((rotated, x[..., 2 * s:]), dim=-1)


def _angles(angle: torch.Tensor, dt: torch.Tensor, theta0: Optional[torch.Tensor]) -> torch.Tensor:
    """``theta`` [B, L, H, S]: ``(theta0 + cumsum_t(pi tanh(angle_t) dt_t)) mod 2 pi``; angle [B, L, S] (one
    projection for all heads), dt [B, L, H], theta0 [B, H, S] or None."""
    theta = torch.cumsum(torch.tanh(angle)[:, :, None, :] * math.pi * dt[..., None], dim=1)
    if theta0 is not None:
        theta = theta + theta0[:, None]
    return torch.remainder(theta, TWO_PI)


def _qk(C: torch.Tensor, Bm: torch.Tensor, C_bias: torch.Tensor, B_bias: torch.Tensor, theta: torch.Tensor):
    """Per-head rotated ``q``, ``k`` [B, L, H, N] from the normed ``C``, ``B`` [B, L, G, N] (head ``h`` reads
    group ``h // (H / G)``), biases [H, N] and angles [B, L, H, S]."""
    heads = C_bias.shape[0]
    rep = heads // C.shape[2]
    q = C.repeat_interleave(rep, dim=2) + C_bias
    k = Bm.repeat_interleave(rep, dim=2) + B_bias
    return reference_mamba3_rotary(q, theta), reference_mamba3_rotary(k, theta)


def _check_scan_inputs(C, Bm, x, dt, a, trap, angle):
    batch, seqlen, heads, _ = x.shape
    if C.shape != Bm.shape or C.shape[:2] != (batch, seqlen) or heads % C.shape[2] != 0:
        raise ValueError(f"C, B: expected [B, L, G, N] with G dividing H={heads}, got {tuple(C.shape)} and "
                         f"{tuple(Bm.shape)} (x {tuple(x.shape)})")
    for name, t in (("dt", dt), ("a", a), ("trap", trap)):
        if t.shape != (batch, seqlen, heads):
            raise ValueError(f"{name}: expected shape {(batch, seqlen, heads)} ([B, L, H]), got {tuple(t.shape)}")
    if angle.dim() != 3 or angle.shape[:2] != (batch, seqlen) or not 0 < 2 * angle.shape[2] <= C.shape[3]:
        raise ValueError(f"angle: expected [B, L, S] with 0 < 2 S <= N={C.shape[3]}, got {tuple(angle.shape)}")


def _prepare(C, Bm, x, dt, a, trap, C_bias, B_bias, angle, initial_states):
    """What both forms of the scan start from: the checks, ``theta`` [B, L, H, S], the rotated ``q``, ``k``
    [B, L, H, N], ``lam = sigmoid(trap)``, and the state before the first position (``[B, H, P, N]`` and the
    previous position's ``k`` [B, H, N], ``v`` [B, H, P]; zeros without ``initial_states``)."""
    _check_scan_inputs(C, Bm, x, dt, a, trap, angle)
    batch, _, heads, hdim = x.shape
    n = C.shape[-1]
    theta = _angles(angle, dt, None if initial_states is None else initial_states.angle)
    q, k = _qk(C, Bm, C_bias, B_bias, theta)
    if initial_states is None:
        state = x.new_zeros(batch, heads, hdim, n)
        k_prev, v_prev = x.new_zeros(batch, heads, n), x.new_zeros(batch, heads, hdim)
    else:
        state, k_prev, v_prev = initial_states.ssm.to(x.dtype), initial_states.k, initial_states.v
    return theta, q, k, torch.sigmoid(trap), state, k_prev, v_prev


def reference_mamba3_recurrence(C, Bm, x, dt, a, trap, C_bias, B_bias, angle, D=None, z=None,
                                initial_states: Optional[Mamba3States] = None):
    """The Mamba-3 SISO recurrence one position at a time (the module docstring's equations): the oracle.

    Args:
        C, Bm: [B, L, G, N], after the RMSNorm. x: [B, L, H, P]. dt, a (= A dt), trap (before the sigmoid):
        [B, L, H]. C_bias, B_bias: [H, N]. angle: [B, L, S] (before the tanh). D: [H] or None. z: [B, L, H, P]
        or None (no gate). initial_states: :class:`Mamba3States` or None (zeros). All of one floating dtype.
    Returns:
        ``(y [B, L, H, P], final :class:`Mamba3States`)``.
    """
    theta, q, k, lam, state, k_prev, v_prev = _prepare(C, Bm, x, dt, a, trap, C_bias, B_bias, angle, initial_states)
    seqlen = x.shape[1]
    ys = []
    for t in range(seqlen):
        alpha = torch.exp(a[:, t])
        beta = (1 - lam[:, t]) * dt[:, t] * alpha
        gamma = lam[:, t] * dt[:, t]
        state = (alpha[..., None, None] * state + beta[..., None, None] * v_prev[..., :, None] * k_prev[..., None, :]
                 + gamma[..., None, None] * x[:, t, :, :, None] * k[:, t, :, None, :])
        y = torch.einsum("bhpn,bhn->bhp", state, q[:, t])
        if D is not None:
            y = y + D[:, None] * x[:, t]
        ys.append(y)
        k_prev, v_prev = k[:, t], x[:, t]
    y = torch.stack(ys, dim=1)
    if z is not None:
        y = y * F.silu(z)
    return y, Mamba3States(theta[:, -1], state, k_prev, v_prev)


def reference_mamba3_scan(C, Bm, x, dt, a, trap, C_bias, B_bias, angle, D=None, z=None,
                          initial_states: Optional[Mamba3States] = None, chunk_size: int = 64):
    """The same function as :func:`reference_mamba3_recurrence` (same arguments and results), computed chunk by
    chunk as the native kernels do (SSD form): within a chunk of positions ``t >= s``,
    ``y_t += exp(a_s+1 + ... + a_t) (lam_s dt_s + [s < t] (1 - lam_s+1) dt_s+1) (q_t . k_s) v_s``; across chunks
    an ``[H, P, N]`` state and the last position's ``(k, v)``, whose trapezoid term belongs to the next chunk."""
    theta, q, k, lam, state, k_prev, v_prev = _prepare(C, Bm, x, dt, a, trap, C_bias, B_bias, angle, initial_states)
    seqlen = x.shape[1]
    gamma = lam * dt                  # the current position's weight
    shifted = (1 - lam) * dt          # shifted[t]: the weight of position t - 1's k v^T at t (before exp(a_t))
    ys = []
    for start in range(0, seqlen, chunk_size):
        sl = slice(start, min(seqlen, start + chunk_size))
        qc, kc, vc = q[:, sl], k[:, sl], x[:, sl]
        size = qc.shape[1]
        cum = torch.cumsum(a[:, sl], dim=1)                                     # [B, T, H]
        # the previous chunk's last k v^T enters with the trapezoid weight of this chunk's first position
        state = state + shifted[:, start, :, None, None] * v_prev[..., :, None] * k_prev[..., None, :]
        y = torch.einsum("bhpn,bthn->bthp", state, qc) * torch.exp(cum)[..., None]
        w = gamma[:, sl].clone()
        w[:, :-1] = w[:, :-1] + shifted[:, start + 1:sl.stop]                  # [B, T, H]: scale of k_s v_s
        diff = cum[:, :, None, :] - cum[:, None, :, :]                          # [B, t, s, H]
        causal = torch.ones(size, size, dtype=torch.bool, device=x.device).tril()
        decay = torch.exp(diff.masked_fill(~causal[None, :, :, None], -math.inf))
        weight = decay * w[:, None, :, :]
        # the diagonal takes only the current position's weight (the shifted part enters at t + 1)
        eye = torch.eye(size, dtype=x.dtype, device=x.device)[None, :, :, None]
        weight = weight - eye * (w - gamma[:, sl])[:, None, :, :]
        scores = torch.einsum("bthn,bshn->btsh", qc, kc) * weight
        y = y + torch.einsum("btsh,bshp->bthp", scores, vc)
        if D is not None:
            y = y + D[:, None] * vc
        ys.append(y)
        # the state after the chunk's last position, without that position's trapezoid term
        w_end = w.clone()
        w_end[:, -1] = gamma[:, sl.stop - 1]
        to_end = torch.exp(cum[:, -1:] - cum) * w_end                           # [B, T, H]
        state = (torch.exp(cum[:, -1])[..., None, None] * state
                 + torch.einsum("bth,bthp,bthn->bhpn", to_end, vc, kc))
        k_prev, v_prev = kc[:, -1], vc[:, -1]
    y = torch.cat(ys, dim=1)
    if z is not None:
        y = y * F.silu(z)
    return y, Mamba3States(theta[:, -1], state, k_prev, v_prev)


def _split(zxbcdt: torch.Tensor, dims: Mamba3Dims):
    batch, seqlen = zxbcdt.shape[:2]
    z, x, Bm, C, dd_dt, dd_A, trap, angle = torch.split(zxbcdt, list(dims.in_proj_sizes), dim=-1)
    shape4 = (batch, seqlen, dims.nheads, dims.headdim)
    gshape = (batch, seqlen, dims.ngroups, dims.d_state)
    return z.reshape(shape4), x.reshape(shape4), Bm.reshape(gshape), C.reshape(gshape), dd_dt, dd_A, trap, angle


def _scan_inputs(zxbcdt: torch.Tensor, params: Mamba3Params, dims: Mamba3Dims):
    """``(z, x, B, C, dt, a, trap, angle)`` from the in_proj output, as ``Mamba3.forward`` prepares them."""
    z, x, Bm, C, dd_dt, dd_A, trap, angle = _split(zxbcdt, dims)
    A = torch.clamp(-F.softplus(dd_A), max=-dims.A_floor)
    dt = F.softplus(dd_dt + params.dt_bias)
    Bm = reference_gated_rmsnorm(Bm, None, params.B_norm_weight, dims.B_norm_eps, dims.d_state, True)
    C = reference_gated_rmsnorm(C, None, params.C_norm_weight, dims.C_norm_eps, dims.d_state, True)
    return z, x, Bm, C, dt, A * dt, trap, angle


def _output(y: torch.Tensor, z: torch.Tensor, params: Mamba3Params, dims: Mamba3Dims) -> torch.Tensor:
    y = y.flatten(-2)
    if dims.is_outproj_norm:
        y = reference_gated_rmsnorm(y, z.flatten(-2), params.norm_weight, dims.norm_eps, dims.headdim, True)
    return F.linear(y, params.out_proj_weight)


def reference_mamba3_layer(u: torch.Tensor, params: Mamba3Params, dims: Mamba3Dims, *,
                           initial_states: Optional[Mamba3States] = None, return_final_states: bool = False,
                           cu_seqlens: Optional[torch.Tensor] = None, scan: str = "chunked"):
    """The whole Mamba-3 SISO layer as ``Mamba3(is_mimo=False).forward`` computes it (in ``u``'s dtype).

    in_proj -> split ``[z, x, B, C, dd_dt, dd_A, trap, angle]`` -> RMSNorm of ``B`` and ``C`` -> the scan
    (:func:`reference_mamba3_scan`; ``scan="recurrence"`` for :func:`reference_mamba3_recurrence`) with the
    ``silu(z)`` gate, or without it and a gated RMSNorm per head after (``is_outproj_norm``) -> out_proj.

    Args:
        u: [B, L, d_model] (fp32 or fp64; the parameters of the same dtype and device).
        initial_states: :class:`Mamba3States` of the B sequences (of the S sequences with ``cu_seqlens``) or None.
        return_final_states: also return the states after the last position of each sequence.
        cu_seqlens: None, or [S + 1] offsets of S sequences packed in one example (B == 1): each is computed
            alone, from its own initial state.
    Returns:
        ``out`` [B, L, d_model], or ``(out, Mamba3States)`` with ``return_final_states``.
    """
    zxbcdt = F.linear(u, params.in_proj_weight)
    z, x, Bm, C, dt, a, trap, angle = _scan_inputs(zxbcdt, params, dims)
    fn = reference_mamba3_scan if scan == "chunked" else reference_mamba3_recurrence
    extra = {"chunk_size": dims.chunk_size} if scan == "chunked" else {}
    gate = None if dims.is_outproj_norm else z
    C_bias, B_bias = params.C_bias[:, 0], params.B_bias[:, 0]
    if cu_seqlens is None:
        y, final = fn(C, Bm, x, dt, a, trap, C_bias, B_bias, angle, params.D, gate, initial_states, **extra)
    else:
        bounds = [int(v) for v in cu_seqlens.tolist()]
        ys, finals = [], []
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            init = None if initial_states is None else Mamba3States(*(s[i:i + 1] for s in initial_states))
            parts = [t[:, lo:hi] if t is not None else None for t in (C, Bm, x, dt, a, trap)]
            y_i, f_i = fn(*parts, C_bias, B_bias, angle[:, lo:hi], params.D,
                          None if gate is None else gate[:, lo:hi], init, **extra)
            ys.append(y_i)
            finals.append(f_i)
        y = torch.cat(ys, dim=1)
        final = Mamba3States(*(torch.cat(parts, dim=0) for parts in zip(*finals)))
    out = _output(y, z, params, dims)
    return (out, final) if return_final_states else out


def reference_mamba3_step(u: torch.Tensor, params: Mamba3Params, dims: Mamba3Dims, states: Mamba3States):
    """One decoding step: ``u`` [B, d_model] and the states before it -> ``(out [B, d_model], states after)``.

    The same function as one position of :func:`reference_mamba3_layer` continued from ``states`` (upstream's
    ``Mamba3.step``, whose CuTe-DSL kernel this replaces)."""
    zxbcdt = F.linear(u[:, None], params.in_proj_weight)
    z, x, Bm, C, dt, a, trap, angle = _scan_inputs(zxbcdt, params, dims)
    gate = None if dims.is_outproj_norm else z
    y, final = reference_mamba3_recurrence(C, Bm, x, dt, a, trap, params.C_bias[:, 0], params.B_bias[:, 0], angle,
                                           params.D, gate, states)
    return _output(y, z, params, dims)[:, 0], final


# ------------------------------------------------------------------------------------------------ ordered backward
def ordered_reference_mamba3_bwd(dout: torch.Tensor, u: torch.Tensor, params: Mamba3Params, dims: Mamba3Dims, *,
                                 cu_seqlens: Optional[torch.Tensor] = None, needs_input_grad: bool = True,
                                 needs_param_grad: Optional[Tuple[bool, ...]] = None, return_partials: bool = False):
    """Backward of :func:`reference_mamba3_layer` with the parameter gradients folded over examples in order.

    For each example ``b`` alone (a batch of one), ``torch.autograd.grad`` of the reference layer gives ``du[b]``
    and the per-example gradient of every parameter; the gradients are folded over ``b = 0, 1, ..., B-1`` with
    :class:`ordered_ssd.fold.LexicalFold` (fp32, fp64 for fp64 parameters; cast once). The partial of an example
    therefore does not depend on the rest of the batch, and the result has the same bits on every run (same torch
    build, device type and CPU thread count).

    Returns:
        ``(du or None, Mamba3Params of folded gradients (None where not asked), per-example partials or None)``.
    """
    return per_example_ordered_bwd(
        lambda b, u_b, leaves: reference_mamba3_layer(u_b, Mamba3Params(*leaves), dims, cu_seqlens=cu_seqlens),
        dout, u, params, needs_input_grad, needs_param_grad, return_partials)


# ------------------------------------------------------------------------------------------------ custom op
# As the Mamba-2 reference (:mod:`.ordered`): custom ops opaque to ``torch.compile``, so that a compiled layer runs
# exactly the eager computation (inductor would otherwise fuse the reference's arithmetic and give other bits).
def _dims_args(dims: Mamba3Dims) -> tuple:
    return (dims.d_model, dims.d_inner, dims.headdim, dims.ngroups, dims.d_state, dims.num_rope_angles,
            dims.chunk_size, float(dims.A_floor), bool(dims.is_outproj_norm), float(dims.B_norm_eps),
            float(dims.C_norm_eps), float(dims.norm_eps))


def _dims_of(*args) -> Mamba3Dims:
    return Mamba3Dims(*args)


@torch.library.custom_op(f"{_NAMESPACE}::reference_mamba3", mutates_args=(), tags=OP_TAGS)
def _reference_mamba3(u: torch.Tensor, cu_seqlens: Optional[torch.Tensor], in_proj_weight: torch.Tensor,
                      dt_bias: torch.Tensor, B_bias: torch.Tensor, C_bias: torch.Tensor, B_norm_weight: torch.Tensor,
                      C_norm_weight: torch.Tensor, D: torch.Tensor, norm_weight: Optional[torch.Tensor],
                      out_proj_weight: torch.Tensor, d_model: int, d_inner: int, headdim: int, ngroups: int,
                      d_state: int, num_rope_angles: int, chunk_size: int, A_floor: float, is_outproj_norm: bool,
                      B_norm_eps: float, C_norm_eps: float, norm_eps: float) -> torch.Tensor:
    params = Mamba3Params(in_proj_weight, dt_bias, B_bias, C_bias, B_norm_weight, C_norm_weight, D, norm_weight,
                          out_proj_weight)
    dims = _dims_of(d_model, d_inner, headdim, ngroups, d_state, num_rope_angles, chunk_size, A_floor,
                    is_outproj_norm, B_norm_eps, C_norm_eps, norm_eps)
    with torch.no_grad(), torch.autocast(u.device.type, enabled=False):
        return reference_mamba3_layer(u, params, dims, cu_seqlens=cu_seqlens).contiguous()


@_reference_mamba3.register_fake
def _(u, cu_seqlens, in_proj_weight, *rest):
    return u.new_empty((*u.shape[:-1], rest[7].shape[0]))  # rest[7]: out_proj_weight [d_model, d_inner]


@torch.library.custom_op(f"{_NAMESPACE}::reference_mamba3_backward", mutates_args=(), tags=OP_TAGS)
def _reference_mamba3_backward(dout: torch.Tensor, u: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                               params: List[Optional[torch.Tensor]], needs_grad: List[bool], d_model: int,
                               d_inner: int, headdim: int, ngroups: int, d_state: int, num_rope_angles: int,
                               chunk_size: int, A_floor: float, is_outproj_norm: bool, B_norm_eps: float,
                               C_norm_eps: float, norm_eps: float) -> List[torch.Tensor]:
    """``[du, *grads]`` (the nine fields of :class:`Mamba3Params`); an empty tensor where not computed."""
    dims = _dims_of(d_model, d_inner, headdim, ngroups, d_state, num_rope_angles, chunk_size, A_floor,
                    is_outproj_norm, B_norm_eps, C_norm_eps, norm_eps)
    with _autograd_inside_custom_op(), torch.autocast(u.device.type, enabled=False):
        du, grads, _ = ordered_reference_mamba3_bwd(dout.contiguous(), u, Mamba3Params(*params), dims,
                                                    cu_seqlens=cu_seqlens, needs_input_grad=needs_grad[0],
                                                    needs_param_grad=tuple(needs_grad[1:]))
    return [g.contiguous() if g is not None else u.new_empty((0,)) for g in (du, *grads)]


_reference_mamba3_backward.register_fake(backward_op_fake)
register_reference_autograd(_reference_mamba3, _reference_mamba3_backward, len(Mamba3Params._fields))


def ordered_reference_mamba3(u: torch.Tensor, params: Mamba3Params, dims: Mamba3Dims,
                             cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Differentiable :func:`reference_mamba3_layer` whose backward is :func:`ordered_reference_mamba3_bwd`: the
    custom op ``ordered_ssd::reference_mamba3`` (``torch.compile`` traces it without a graph break and runs it as
    in eager mode, so a compiled layer gets the eager bits). No argument checking here; ``OrderedMamba3`` validates
    its inputs. Under autocast it computes in ``u``'s dtype all the same, and warns once per process
    (:func:`~ordered_ssd.reference.ordered.warn_if_autocast`)."""
    warn_if_autocast(u)
    return _reference_mamba3(u, cu_seqlens, *params, *_dims_args(dims))
