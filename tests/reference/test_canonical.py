"""A sequence's bits are its own on the reference path: random layouts (batches of 1 to 9 rows and one of all 24
sequences, random lengths, right padding, packing at the offsets the lengths give into 1 and 3 rows) give every sequence the output, input gradient and parameter partials of the
sequence alone (``ordered_ssd.reference.canonical``; docs/guarantees.md, "A sequence's bits are its own")."""
import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from ordered_ssd import OrderedMamba2
from ordered_ssd.fold import lexical_fold
from ordered_ssd.reference import ordered_reference_mamba2_bwd
from ordered_ssd.reference.canonical import canonical_mamba2_sequence, sequence_spans
from tests.helpers import bits_equal, make_layer, sha256

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
D_MODEL = 32
CONFIGS = {
    "default": dict(d_state=8, headdim=8, chunk_size=8),
    "ngroups2-dt_limit": dict(d_state=8, headdim=8, chunk_size=16, ngroups=2, dt_limit=(0.01, 0.5)),
    "mlp-Dhdim-nonorm-bias": dict(d_state=8, headdim=8, chunk_size=8, d_ssm=32, D_has_hdim=True, rmsnorm=False,
                                  bias=True),
    "chunk2-conv4": dict(d_state=4, headdim=8, chunk_size=2, d_conv=4),  # the carry spans two chunks
}


def _layer(name, dtype):
    layer = make_layer(seed=3, dtype=dtype, d_model=D_MODEL, **CONFIGS[name])
    return layer


def _run(layer, u, dout, seq_idx=None):
    """``(out, du, {name: grad})`` of one forward and backward."""
    layer.zero_grad(set_to_none=True)
    u = u.detach().clone().requires_grad_(True)
    out = layer(u, seq_idx=seq_idx)
    out.backward(dout)
    return out.detach(), u.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


def _sequences(rng, n, dtype, max_len=40):
    gen = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    lengths = [rng.randint(1, max_len) for _ in range(n)]
    return ([torch.randn(t, D_MODEL, generator=gen, dtype=dtype) for t in lengths],
            [torch.randn(t, D_MODEL, generator=gen, dtype=dtype) for t in lengths])


def _padded(rng, seqs, douts, members, dtype):
    """Rows of ``members`` right-padded to the longest plus a random extra; the padding has random values and a
    zero output gradient. Returns (u, dout, [(row, start)])."""
    width = max(seqs[m].shape[0] for m in members) + rng.randint(0, 9)
    u = torch.randn(len(members), width, D_MODEL, dtype=dtype, generator=torch.Generator().manual_seed(rng.randrange(99)))
    dout = torch.zeros_like(u)
    for r, m in enumerate(members):
        u[r, :seqs[m].shape[0]] = seqs[m]
        dout[r, :seqs[m].shape[0]] = douts[m]
    return u, dout, [(r, 0) for r in range(len(members))]


def _packed(rng, seqs, douts, members, dtype, rows):
    """``members`` in order, packed into ``rows`` rows (consecutive runs), marked by ``seq_idx``. Returns
    (u, dout, seq_idx, [(row, start)])."""
    cuts = sorted(rng.sample(range(1, len(members)), min(rows, len(members)) - 1)) if rows > 1 else []
    groups = [members[a:b] for a, b in zip([0] + cuts, cuts + [len(members)])]
    width = max(sum(seqs[m].shape[0] for m in g) for g in groups)
    u = torch.zeros(len(groups), width, D_MODEL, dtype=dtype)
    dout = torch.zeros_like(u)
    seq_idx = torch.zeros(len(groups), width, dtype=torch.int32)
    where = []
    for r, g in enumerate(groups):
        start = 0
        for j, m in enumerate(g):
            t = seqs[m].shape[0]
            u[r, start:start + t], dout[r, start:start + t] = seqs[m], douts[m]
            seq_idx[r, start:] = j
            where.append((r, start))
            start += t
        seq_idx[r, start:] = len(g)  # the row's tail: one more sequence (zeros, zero gradient)
    return u, dout, seq_idx, where


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_layouts_give_each_sequence_its_canonical_bits(name, dtype):
    rng = random.Random(f"{name}-{dtype}")
    layer = _layer(name, dtype)
    seqs, douts = _sequences(rng, 24, dtype)
    alone = [_run(layer, s[None], d[None]) for s, d in zip(seqs, douts)]

    def check(out, du, where, members):
        for (r, start), m in zip(where, members):
            t = seqs[m].shape[0]
            assert bits_equal(out[r, start:start + t], alone[m][0][0]), (m, r, start)
            assert bits_equal(du[r, start:start + t], alone[m][1][0]), (m, r, start)

    order = list(range(len(seqs)))
    rng.shuffle(order)
    i = 0
    while i < len(order):  # batches of random sizes, right-padded
        members = order[i:i + rng.randint(1, 9)]
        i += len(members)
        u, dout, where = _padded(rng, seqs, douts, members, dtype)
        out, du, _ = _run(layer, u, dout)
        check(out, du, where, members)
    u, dout, where = _padded(rng, seqs, douts, order, dtype)  # all of them in one batch
    check(*_run(layer, u, dout)[:2], where, order)
    for rows in (1, 3):  # packed at the offsets the lengths give
        u, dout, seq_idx, where = _packed(rng, seqs, douts, order, dtype, rows)
        out, du, _ = _run(layer, u, dout, seq_idx)
        check(out, du, where, order)


@pytest.mark.parametrize("name", ["default", "mlp-Dhdim-nonorm-bias"])
def test_parameter_gradients_are_the_fold_over_sequences_in_every_layout(name):
    """The same sequences in the same order: padded rows, packed into one row, packed into rows of random lengths
    and one at a time give the same bits of every parameter gradient: the lexical fold of the sequences' partials
    (each computed alone)."""
    dtype = torch.float32
    rng = random.Random(name)
    layer = _layer(name, dtype)
    seqs, douts = _sequences(rng, 12, dtype, max_len=30)
    members = list(range(len(seqs)))
    params = layer.layer_params()
    partials = [ordered_reference_mamba2_bwd(d[None], s[None], params, layer.dims, return_partials=True)[2][0]
                for s, d in zip(seqs, douts)]
    want = {f: lexical_fold([p[i] for p in partials]) for i, f in enumerate(params._fields) if params[i] is not None}
    u, dout, _ = _padded(rng, seqs, douts, members, dtype)
    layouts = {"padded": _run(layer, u, dout)[2]}
    for rows in (1, 4):
        u, dout, seq_idx, _ = _packed(rng, seqs, douts, members, dtype, rows)
        # the packed rows' tails are one more sequence of zeros: its partial is zero and leaves the fold unchanged
        layouts[f"packed-{rows}"] = _run(layer, u, dout, seq_idx)[2]
    names = dict(zip(params._fields, ["in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "dt_bias",
                                      "A_log", "D", "norm.weight", "out_proj.weight", "out_proj.bias"]))
    for layout, grads in layouts.items():
        for field, g in want.items():
            got = grads[names[field]]
            assert bits_equal(got.reshape(g.shape), g.to(got.dtype)), (layout, field)


def test_prefix_of_a_sequence_keeps_its_bits():
    """A sequence's first t outputs are the bits of its first t tokens alone, for every t (the chunk-by-chunk
    computation never reads ahead)."""
    layer = _layer("default", torch.float64)
    params = layer.layer_params()
    u = torch.randn(29, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = canonical_mamba2_sequence(u, params, layer.dims)
        for t in range(1, 30):
            assert bits_equal(canonical_mamba2_sequence(u[:t], params, layer.dims), full[:t]), t


def test_sequence_spans_order():
    seq_idx = torch.tensor([[0, 0, 1, 1, 1], [4, 4, 4, 4, 4], [0, 1, 2, 2, 3]], dtype=torch.int32)
    assert sequence_spans(3, 5, seq_idx) == [(0, 0, 2), (0, 2, 5), (1, 0, 5), (2, 0, 1), (2, 1, 2), (2, 2, 4),
                                             (2, 4, 5)]
    assert sequence_spans(2, 7) == [(0, 0, 7), (1, 0, 7)]


_CHILD = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {root!r})
    from tests.reference.test_canonical import packed_digests
    print(json.dumps(packed_digests()))
""")


def packed_digests():
    """SHA-256 of a packed step's output, input gradient and parameter gradients (for the fresh-process test)."""
    rng = random.Random(7)
    layer = _layer("ngroups2-dt_limit", torch.float32)
    seqs, douts = _sequences(rng, 6, torch.float32)
    u, dout, seq_idx, _ = _packed(rng, seqs, douts, list(range(6)), torch.float32, 2)
    out, du, grads = _run(layer, u, dout, seq_idx)
    return {"out": sha256(out), "du": sha256(du), **{k: sha256(v) for k, v in grads.items()}}


def test_packed_bits_repeat_and_equal_in_a_fresh_process():
    first = packed_digests()
    assert packed_digests() == first
    res = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == first


def test_native_order_is_not_what_the_layout_gives():
    """The control: the vectorised oracle (``reference_mamba2_layer``, the whole layout at once) does depend on the
    layout for some sequence here, so the tests above can tell the canonical computation from a plain one."""
    from ordered_ssd.reference import reference_mamba2_layer

    rng = random.Random(11)
    layer = _layer("default", torch.float32)
    seqs, douts = _sequences(rng, 16, torch.float32)
    u, _, seq_idx, where = _packed(rng, seqs, douts, list(range(16)), torch.float32, 1)
    with torch.no_grad():
        packed = reference_mamba2_layer(u, layer.layer_params(), layer.dims, seq_idx)
        differs = 0
        for (r, start), s in zip(where, seqs):
            alone = reference_mamba2_layer(s[None], layer.layer_params(), layer.dims)
            differs += int(not bits_equal(packed[r, start:start + s.shape[0]], alone[0]))
    assert differs > 0
    assert isinstance(layer, OrderedMamba2)
