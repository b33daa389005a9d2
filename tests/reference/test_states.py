"""State passing and varlen states of the reference scan (fp64): initial_states, final states, varlen states.

Oracles: the per-time-step recurrence (:func:`reference_sequential_scan`), one long run against the same tokens cut
into pieces with the state handed over, and packed sequences against the same sequences run one by one.
"""
import pytest
import torch

from ordered_ssd.reference import reference_chunk_scan, reference_sequential_scan
from tests.helpers import rel_err

H, P, G, N = 4, 3, 2, 5
TOL = 1e-11


def _inputs(Bsz, L, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(Bsz, L, H, P, generator=g, dtype=dtype)
    dt = torch.randn(Bsz, L, H, generator=g, dtype=dtype) - 1.0
    A = -torch.rand(H, generator=g, dtype=dtype) - 0.5
    B = torch.randn(Bsz, L, G, N, generator=g, dtype=dtype)
    C = torch.randn(Bsz, L, G, N, generator=g, dtype=dtype)
    D = torch.randn(H, generator=g, dtype=dtype)
    dt_bias = torch.randn(H, generator=g, dtype=dtype) * 0.5
    init = torch.randn(Bsz, H, P, N, generator=g, dtype=dtype)
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias), init


def _scan(kind, t, chunk_size=4, **kw):
    if kind == "chunked":
        return reference_chunk_scan(t["x"], t["dt"], t["A"], t["B"], t["C"], chunk_size, D=t["D"],
                                    dt_bias=t["dt_bias"], dt_softplus=True, **kw)
    return reference_sequential_scan(t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"], dt_bias=t["dt_bias"],
                                     dt_softplus=True, **kw)


@pytest.mark.parametrize("L", [1, 3, 4, 5, 13])
@pytest.mark.parametrize("with_init", [False, True])
def test_final_states_and_initial_states_match_recurrence(L, with_init):
    t, init = _inputs(2, L, seed=L)
    init = init if with_init else None
    y, final = _scan("chunked", t, initial_states=init, return_final_states=True)
    y_ref, final_ref = _scan("sequential", t, initial_states=init, return_final_states=True)
    assert final.shape == (2, H, P, N)
    assert final_ref.abs().max() > 0
    assert rel_err(y, y_ref) < TOL
    assert rel_err(final, final_ref) < TOL
    if with_init:  # the initial state changes the output: the check is not vacuous
        assert not torch.allclose(y, _scan("chunked", t))


@pytest.mark.parametrize("L", [6, 13])
def test_initial_states_with_seq_idx_belong_to_sequence_zero(L):
    t, init = _inputs(2, L, seed=40 + L)
    seq_idx = torch.tensor([[0] * 3 + [1] * (L - 3), [2] * L], dtype=torch.int32)  # example 1 never has id 0
    y, final = _scan("chunked", t, seq_idx=seq_idx, initial_states=init, return_final_states=True)
    y_ref, final_ref = _scan("sequential", t, seq_idx=seq_idx, initial_states=init, return_final_states=True)
    assert rel_err(y, y_ref) < TOL
    assert rel_err(final, final_ref) < TOL
    y0 = _scan("chunked", t, seq_idx=seq_idx)
    assert torch.equal(y[1], y0[1])  # id 2 never sees the initial state
    assert not torch.allclose(y[0, :3], y0[0, :3])  # id 0 does


def _cut(t, lo, hi):
    return {k: (v[:, lo:hi] if v.dim() > 1 else v) for k, v in t.items()}


@pytest.mark.parametrize("cuts", [(5,), (4, 8), (1, 2, 9), (7,)])
def test_chunked_run_with_states_handed_over_equals_one_long_run(cuts):
    """Outputs and gradients of every input (d initial_states included) through pieces == one long run."""
    L = 12
    t, init = _inputs(2, L, seed=sum(cuts))
    dout = torch.randn(2, L, H, P, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    dfinal = torch.randn(2, H, P, N, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def run(pieces):
        leaves = {k: v.clone().requires_grad_(True) for k, v in t.items()}
        s0 = init.clone().requires_grad_(True)
        state, ys = s0, []
        bounds = [0, *pieces, L]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            y, state = _scan("chunked", _cut(leaves, lo, hi), initial_states=state, return_final_states=True)
            ys.append(y)
        y = torch.cat(ys, dim=1)
        grads = torch.autograd.grad((y * dout).sum() + (state * dfinal).sum(), [s0, *leaves.values()])
        return y.detach(), state.detach(), grads

    y_long, final_long, g_long = run(())
    y_cut, final_cut, g_cut = run(cuts)
    assert rel_err(y_cut, y_long) < TOL
    assert rel_err(final_cut, final_long) < TOL
    names = ["initial_states", *t.keys()]
    for name, a, b in zip(names, g_cut, g_long):
        assert b.abs().max() > 0, name
        assert rel_err(a, b) < 1e-10, name


def test_d_initial_states_matches_recurrence_gradient():
    t, init = _inputs(2, 9, seed=5)
    dout = torch.randn(2, 9, H, P, dtype=torch.float64)
    grads = []
    for kind in ("chunked", "sequential"):
        s0 = init.clone().requires_grad_(True)
        y, final = _scan(kind, t, initial_states=s0, return_final_states=True)
        grads.append(torch.autograd.grad((y * dout).sum() + final.square().sum(), s0)[0])
    assert grads[1].abs().max() > 0
    assert rel_err(grads[0], grads[1]) < TOL


@pytest.mark.parametrize("lengths", [(3, 5, 4), (9, 1, 6), (4, 4, 4), (2, 11)])
@pytest.mark.parametrize("with_init", [False, True])
def test_packed_sequences_equal_separate_sequences(lengths, with_init):
    """One packed example (seq_idx, cu_seqlens) == each sequence run alone: outputs, final and varlen states; the
    initial state goes to the first sequence only."""
    L = sum(lengths)
    t, init = _inputs(1, L, seed=L + len(lengths))
    init = init if with_init else None
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))[None]
    y, final, varlen = _scan("chunked", t, seq_idx=seq_idx, initial_states=init, return_final_states=True,
                             cu_seqlens=cu, return_varlen_states=True)
    assert varlen.shape == (len(lengths), H, P, N)
    for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        y_i, final_i = _scan("chunked", _cut(t, lo, hi), initial_states=init if i == 0 else None,
                             return_final_states=True)
        assert rel_err(y[:, lo:hi], y_i) < TOL, i
        assert rel_err(varlen[i], final_i[0]) < TOL, i
    assert rel_err(final, varlen[-1:]) < TOL


def test_varlen_state_of_an_empty_sequence_is_zero():
    t, _ = _inputs(1, 7, seed=3)
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    seq_idx = torch.tensor([[0, 0, 0, 2, 2, 2, 2]], dtype=torch.int32)
    _, varlen = _scan("chunked", t, seq_idx=seq_idx, cu_seqlens=cu, return_varlen_states=True)
    assert torch.equal(varlen[1], torch.zeros_like(varlen[1]))
    assert varlen[0].abs().max() > 0 and varlen[2].abs().max() > 0
