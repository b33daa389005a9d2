"""State passing and varlen states of the ordered SSD functions on the GPU, against the fp64 reference
(``ordered_ssd.reference.reference_chunk_scan``) and mamba-ssm's own functions on the same inputs.

* initial_states / return_final_states: outputs and every gradient (d initial_states included) within twice
  mamba-ssm's error against fp64 (plus a floor);
* a run cut into pieces with the final state handed over as the next initial state == one long run (fp64 of the
  long run as the oracle, mamba-ssm's long run's error as the yardstick);
* d initial_states: bitwise repeatable (10 repeats, integer views), literal == fast, example b's value alone ==
  in the batch;
* packed sequences (seq_idx, cu_seqlens, return_varlen_states) == the sequences run separately;
* ordered_mamba_split_conv1d_scan_combined with initial_states / return_final_states against a composed fp64
  reference and mamba-ssm.
"""
import pytest
import torch
import torch.nn.functional as F

from ordered_ssd.reference import reference_causal_conv1d, reference_chunk_scan, reference_gated_rmsnorm
from tests.helpers import bits_equal, rel_err

H, P, G, N, CS = 8, 32, 2, 16, 64
FLOOR = {torch.float32: 1e-5, torch.bfloat16: 2e-3}
NAMES = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")


def _inputs(Bsz, L, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape, scale=1.0, shift=0.0, dt=dtype):
        return (torch.randn(*shape, device="cuda", generator=g) * scale + shift).to(dt)
    return dict(x=r(Bsz, L, H, P), dt=r(Bsz, L, H, scale=0.5, shift=-1.0), A=-torch.exp(r(H, scale=0.5,
                dt=torch.float32)), B=r(Bsz, L, G, N), C=r(Bsz, L, G, N), D=r(H, scale=0.5, shift=1.0,
                dt=torch.float32), dt_bias=r(H, scale=0.3, dt=torch.float32),
                initial_states=r(Bsz, H, P, N, scale=0.5, dt=torch.float32))


def _run(fn, t, dout, dfinal, **kw):
    """Forward + backward of ``fn`` (ours or mamba-ssm's) with initial and final states; returns out, final and the
    gradient of every input."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in t.items()}
    out, final = fn(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], CS, D=leaves["D"],
                    dt_bias=leaves["dt_bias"], initial_states=leaves["initial_states"], dt_softplus=True,
                    return_final_states=True, **kw)
    torch.autograd.backward([out, final], [dout, dfinal])
    res = {"out": out.detach(), "final": final.detach()}
    res.update({"d" + k: v.grad.detach() for k, v in leaves.items()})
    return res


def _reference(t, dout, dfinal, seq_idx=None):
    leaves = {k: v.detach().double().cpu().requires_grad_(True) for k, v in t.items()}
    out, final = reference_chunk_scan(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], CS,
                                      D=leaves["D"], dt_bias=leaves["dt_bias"], dt_softplus=True,
                                      initial_states=leaves["initial_states"], return_final_states=True,
                                      seq_idx=None if seq_idx is None else seq_idx.cpu())
    torch.autograd.backward([out, final], [dout.double().cpu(), dfinal.double().cpu()])
    res = {"out": out.detach(), "final": final.detach()}
    res.update({"d" + k: v.grad.detach() for k, v in leaves.items()})
    return res


def _ours(*args, **kw):
    from ordered_ssd.ops import ordered_mamba_chunk_scan_combined
    return ordered_mamba_chunk_scan_combined(*args, **kw)


def _native(*args, **kw):
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined(*args, **kw)


def _douts(Bsz, L, dtype, seed=9):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(Bsz, L, H, P, device="cuda", generator=g).to(dtype),
            torch.randn(Bsz, H, P, N, device="cuda", generator=g))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("L", [40, 200])
def test_initial_and_final_states_within_twice_native(dtype, L):
    t = _inputs(3, L, dtype)
    dout, dfinal = _douts(3, L, dtype)
    ref = _reference(t, dout, dfinal)
    ours, nat = _run(_ours, t, dout, dfinal), _run(_native, t, dout, dfinal)
    assert set(ours) == set(ref) == {"out", "final", *("d" + k for k in NAMES)}
    for name, r in ref.items():
        assert r.abs().max() > 0, name
        e_o, e_n = rel_err(ours[name].double().cpu(), r), rel_err(nat[name].double().cpu(), r)
        assert e_o <= 2 * e_n + FLOOR[dtype], (name, e_o, e_n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cuts", [(64,), (100,), (30, 150), (1, 64, 129)])
def test_pieces_with_states_handed_over_equal_one_long_run(dtype, cuts):
    L = 200
    t = _inputs(2, L, dtype, seed=len(cuts))
    dout, dfinal = _douts(2, L, dtype)
    ref = _reference(t, dout, dfinal)
    nat = _run(_native, t, dout, dfinal)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in t.items()}
    state, outs = leaves["initial_states"], []
    bounds = [0, *cuts, L]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        out, state = _ours(leaves["x"][:, lo:hi], leaves["dt"][:, lo:hi], leaves["A"], leaves["B"][:, lo:hi],
                           leaves["C"][:, lo:hi], CS, D=leaves["D"], dt_bias=leaves["dt_bias"], initial_states=state,
                           dt_softplus=True, return_final_states=True)
        outs.append(out)
    torch.autograd.backward([torch.cat(outs, 1), state], [dout, dfinal])
    got = {"out": torch.cat(outs, 1).detach(), "final": state.detach()}
    got.update({"d" + k: v.grad.detach() for k, v in leaves.items()})
    for name, r in ref.items():
        e_o, e_n = rel_err(got[name].double().cpu(), r), rel_err(nat[name].double().cpu(), r)
        assert e_o <= 2 * e_n + FLOOR[dtype], (name, e_o, e_n)


@pytest.mark.parametrize("fn", ["chunk_scan", "split_conv1d_scan"])
def test_d_initial_states_bitwise_repeatable_literal_and_per_example(fn):
    dtype, Bsz, L = torch.bfloat16, 4, 150
    if fn == "chunk_scan":
        t = _inputs(Bsz, L, dtype, seed=3)
        dout, dfinal = _douts(Bsz, L, dtype)

        def run(lo, hi, literal=False):
            s = {k: (v[lo:hi] if k in ("x", "dt", "B", "C", "initial_states") else v) for k, v in t.items()}
            return _run(lambda *a, **k: _ours(*a, literal=literal, **k), s, dout[lo:hi], dfinal[lo:hi])
    else:
        layer_args, z, dout, dfinal = _split_problem(Bsz, L, dtype)

        def run(lo, hi, literal=False):
            sliced = {**layer_args, "initial_states": layer_args["initial_states"][lo:hi]}
            return _split_run(_split_ours(literal), sliced, z[lo:hi], dout[lo:hi], dfinal[lo:hi])
    first = run(0, Bsz)
    assert first["dinitial_states"].abs().max() > 0
    for _ in range(9):
        again = run(0, Bsz)
        for k in first:
            assert bits_equal(again[k], first[k]), k
    lit = run(0, Bsz, literal=True)
    for k in first:
        assert bits_equal(lit[k], first[k]), ("literal", k)
    for b in range(Bsz):
        alone = run(b, b + 1)
        assert bits_equal(alone["dinitial_states"], first["dinitial_states"][b:b + 1]), b
        assert bits_equal(alone["final"], first["final"][b:b + 1]), b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_init", [False, True])
def test_packed_sequences_equal_separate_sequences_and_varlen_states(dtype, with_init):
    lengths = [30, 90, 5, 75]  # ends inside chunk 0, spans chunks, short, to the end
    L = sum(lengths)
    t = _inputs(1, L, dtype, seed=11)
    init = t.pop("initial_states") if with_init else None
    t.pop("initial_states", None)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32, device="cuda"),
                                      torch.tensor(lengths, device="cuda"))[None]
    args = (t["x"], t["dt"], t["A"], t["B"], t["C"], CS)
    kw = dict(D=t["D"], dt_bias=t["dt_bias"], dt_softplus=True, seq_idx=seq_idx, cu_seqlens=cu,
              initial_states=init, return_final_states=True, return_varlen_states=True)
    with torch.no_grad():
        out, final, varlen = _ours(*args, **kw)
        out_n, final_n, varlen_n = _native(*args, **kw)
        ref_args = [a.double().cpu() if torch.is_tensor(a) else a for a in args]
        ref_out, ref_final, ref_varlen = reference_chunk_scan(
            *ref_args, D=t["D"].double().cpu(), dt_bias=t["dt_bias"].double().cpu(), dt_softplus=True,
            seq_idx=seq_idx.cpu(), initial_states=None if init is None else init.double().cpu(),
            return_final_states=True, cu_seqlens=cu.cpu(), return_varlen_states=True)
    assert varlen.shape == (len(lengths), H, P, N)
    yardstick = {}
    for name, o, n, r in (("out", out, out_n, ref_out), ("final", final, final_n, ref_final)):
        e_o, e_n = rel_err(o.double().cpu(), r), rel_err(n.double().cpu(), r)
        assert e_o <= 2 * e_n + FLOOR[dtype], (name, e_o, e_n)
        yardstick[name] = e_n
    # upstream's varlen kernel drops the initial state of a first sequence that ends inside chunk 0 (ours adds it
    # back): mamba-ssm's error on the other sequences is the yardstick
    e_n = rel_err(varlen_n[1:].double().cpu(), ref_varlen[1:])
    for i in range(len(lengths)):
        e_o = rel_err(varlen[i].double().cpu(), ref_varlen[i])
        assert e_o <= 2 * e_n + FLOOR[dtype], (i, e_o, e_n)
    # packed == separate: each sequence alone, its final state == its varlen state (both carry rounding errors of
    # the size of mamba-ssm's own against fp64: 4x that is the tolerance)
    tol = 4 * max(*yardstick.values(), e_n) + FLOOR[dtype]
    with torch.no_grad():
        for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            sep, sep_final = _ours(t["x"][:, lo:hi], t["dt"][:, lo:hi], t["A"], t["B"][:, lo:hi], t["C"][:, lo:hi],
                                   CS, D=t["D"], dt_bias=t["dt_bias"], dt_softplus=True,
                                   initial_states=init if i == 0 else None, return_final_states=True)
            assert rel_err(out[:, lo:hi].double(), sep.double()) < tol, i
            assert rel_err(varlen[i].double(), sep_final[0].double()) < tol, i


def test_varlen_states_have_no_backward():
    t = _inputs(1, 100, torch.float32)
    x = t["x"].clone().requires_grad_(True)
    cu = torch.tensor([0, 40, 100], dtype=torch.int32, device="cuda")
    seq_idx = torch.zeros(1, 100, dtype=torch.int32, device="cuda")
    seq_idx[0, 40:] = 1
    out, varlen = _ours(x, t["dt"], t["A"], t["B"], t["C"], CS, seq_idx=seq_idx, cu_seqlens=cu,
                        return_varlen_states=True)
    assert not varlen.requires_grad
    with pytest.raises(NotImplementedError, match="return_varlen_states"):
        out.sum().backward()


# ------------------------------------------------------------------------------ split conv1d scan with states
D_SSM, D_MLP = H * P, 64


def _split_problem(Bsz, L, dtype, seed=5):
    g = torch.Generator(device="cuda").manual_seed(seed)
    conv_dim = D_SSM + 2 * G * N

    def r(*shape, scale=1.0, shift=0.0, dt=dtype):
        return (torch.randn(*shape, device="cuda", generator=g) * scale + shift).to(dt)
    layer_args = dict(conv1d_weight=r(conv_dim, 4, scale=0.3), conv1d_bias=r(conv_dim, scale=0.1),
                      dt_bias=r(H, scale=0.3), A=-torch.exp(r(H, scale=0.5, dt=torch.float32)),
                      D=r(H, scale=0.5, shift=1.0, dt=torch.float32), rmsnorm_weight=r(D_SSM, scale=0.1, shift=1.0),
                      outproj_weight=r(128, D_MLP + D_SSM, scale=0.05))
    z = r(Bsz, L, 2 * D_MLP + 2 * D_SSM + 2 * G * N + H)
    init = r(Bsz, H, P, N, scale=0.5, dt=torch.float32)
    return {**layer_args, "initial_states": init}, z, r(Bsz, L, 128), r(Bsz, H, P, N, dt=torch.float32)


def _split_ours(literal=False):
    def fn(zxbcdt, a, initial_states):
        from ordered_ssd.ops import ordered_mamba_split_conv1d_scan_combined
        return ordered_mamba_split_conv1d_scan_combined(
            zxbcdt, a["conv1d_weight"], a["conv1d_bias"], a["dt_bias"], a["A"], a["D"], CS,
            initial_states=initial_states, return_final_states=True, rmsnorm_weight=a["rmsnorm_weight"],
            rmsnorm_eps=1e-5, outproj_weight=a["outproj_weight"], headdim=P, ngroups=G, norm_before_gate=False,
            literal=literal)
    return fn


def _split_native(zxbcdt, a, initial_states):
    from mamba_ssm.ops.triton.ssd_combined import mamba_split_conv1d_scan_combined
    return mamba_split_conv1d_scan_combined(
        zxbcdt, a["conv1d_weight"], a["conv1d_bias"], a["dt_bias"], a["A"], a["D"], CS,
        initial_states=initial_states, return_final_states=True, rmsnorm_weight=a["rmsnorm_weight"],
        rmsnorm_eps=1e-5, outproj_weight=a["outproj_weight"], headdim=P, ngroups=G, norm_before_gate=False)


def _split_reference(zxbcdt, a, initial_states):
    """The same function composed from the fp64 reference pieces."""
    Bsz, L, _ = zxbcdt.shape
    z0, x0, z, xBC, dt = torch.split(zxbcdt, [D_MLP, D_MLP, D_SSM, D_SSM + 2 * G * N, H], dim=-1)
    xBC = reference_causal_conv1d(xBC, a["conv1d_weight"], a["conv1d_bias"], activation="silu")
    x, B, C = torch.split(xBC, [D_SSM, G * N, G * N], dim=-1)
    y, final = reference_chunk_scan(x.reshape(Bsz, L, H, P), dt, a["A"], B.reshape(Bsz, L, G, N),
                                    C.reshape(Bsz, L, G, N), CS, D=a["D"], dt_bias=a["dt_bias"], dt_softplus=True,
                                    initial_states=initial_states, return_final_states=True)
    y = reference_gated_rmsnorm(y.reshape(Bsz, L, D_SSM), z, a["rmsnorm_weight"], 1e-5, D_SSM // G, False)
    return F.linear(torch.cat([F.silu(z0) * x0, y], -1), a["outproj_weight"]), final


def _split_run(fn, layer_args, zxbcdt, dout, dfinal, device="cuda", dtype=None):
    a = {k: v.detach().clone().to(device=device, dtype=dtype or v.dtype).requires_grad_(True)
         for k, v in layer_args.items()}
    init = a.pop("initial_states")
    zz = zxbcdt.detach().clone().to(device=device, dtype=dtype or zxbcdt.dtype).requires_grad_(True)
    out, final = fn(zz, a, init)
    torch.autograd.backward([out, final], [dout.to(device=device, dtype=dtype or dout.dtype),
                                           dfinal.to(device=device, dtype=dtype or dfinal.dtype)])
    res = {"out": out.detach(), "final": final.detach(), "dzxbcdt": zz.grad.detach()}
    res.update({"d" + k: v.grad.detach() for k, v in a.items()})
    res["dinitial_states"] = init.grad.detach()
    return res


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_conv1d_scan_states_within_twice_native(dtype):
    layer_args, z, dout, dfinal = _split_problem(2, 150, dtype)
    ours = _split_run(_split_ours(), layer_args, z, dout, dfinal)
    nat = _split_run(_split_native, layer_args, z, dout, dfinal)
    ref = _split_run(_split_reference, layer_args, z, dout, dfinal, device="cpu", dtype=torch.float64)
    assert set(ours) == set(ref)
    for name, r in ref.items():
        assert r.abs().max() > 0, name
        e_o, e_n = rel_err(ours[name].double().cpu(), r), rel_err(nat[name].double().cpu(), r)
        assert e_o <= 2 * e_n + FLOOR[dtype], (name, e_o, e_n)
