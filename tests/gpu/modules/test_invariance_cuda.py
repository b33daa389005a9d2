"""A sequence's bits are its own on the CUDA path (``layer.sequence_invariant = True``): the row-count-invariant GEMM
gives a row the same bits whatever the number of rows; OrderedMamba2 gives each sequence its canonical outputs and
input gradients (the sequence alone, batch 1) in random right-padded batches and random packings (``seq_idx``, at
offsets off the chunk grid), and the same parameter gradients padded and packed for the same sequences in the same
order; in a fresh process too (docs/guarantees.md, "A sequence's bits are its own")."""
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import bits_equal, rel_err, sha256

from ordered_ssd import OrderedMamba2
from ordered_ssd.ops.row_invariant_gemm import row_invariant_matmul

pytestmark = pytest.mark.gpu
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("transposed", [True, False])
def test_row_invariant_gemm_gives_a_row_the_same_bits_whatever_the_row_count(dtype, transposed):
    g = torch.Generator(device="cuda").manual_seed(0)
    M, K, N = 4097, 1000, 1154  # none a multiple of the tiles
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    bias = torch.randn(N, device="cuda", dtype=dtype, generator=g)
    b = w.t() if transposed else w.t().contiguous()  # a weight as F.linear takes it, or a plain [K, N] matrix
    full = row_invariant_matmul(a, b, bias)
    want = (a.double() @ b.double() + bias.double())
    # one rounding to the output dtype (bf16: up to 2^-8 of the largest value); fp32: IEEE products, no TF32
    assert rel_err(full, want) < {torch.bfloat16: 5e-3, torch.float16: 1e-3, torch.float32: 1e-6}[dtype]
    for start, rows in [(0, 1), (5, 1), (4096, 1), (3, 2), (100, 3), (17, 7), (64, 64), (1, 127), (999, 1000),
                        (0, 4096)]:
        got = row_invariant_matmul(a[start:start + rows], b, bias)
        assert bits_equal(got, full[start:start + rows]), (start, rows)
    assert bits_equal(row_invariant_matmul(a, b, bias), full)  # repeatable


def _layer(dtype, seed=0, **extra):
    torch.manual_seed(seed)
    layer = OrderedMamba2(d_model=256, d_state=64, headdim=32, ngroups=2, chunk_size=64, device="cuda", **extra)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    layer = layer.to(dtype) if dtype != torch.float32 else layer
    layer.sequence_invariant = True
    return layer


def _step(layer, u, dout, autocast, **kw):
    layer.zero_grad(set_to_none=True)
    u = u.clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = layer(u, **kw)
    out.backward(dout.to(out.dtype))
    return out.detach(), u.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


CASES = [(torch.bfloat16, False, {}), (torch.float32, False, dict(use_mem_eff_path=False)),
         (torch.float32, True, {}), (torch.float16, False, dict(bias=True))]
CASE_IDS = ["bf16", "fp32-no-mem-eff", "fp32-autocast-bf16", "fp16-bias"]


@pytest.mark.parametrize("dtype,autocast,extra", CASES, ids=CASE_IDS)
def test_each_sequence_gets_its_canonical_bits_padded_and_packed_and_the_same_parameter_gradients(dtype, autocast,
                                                                                                  extra):
    layer = _layer(dtype, **extra)
    rng = random.Random(7)
    g = torch.Generator(device="cuda").manual_seed(1)
    lengths = [rng.choice([1, 2, 63, 64, 65, 130, 300, rng.randint(1, 400)]) for _ in range(14)]
    seqs = [torch.randn(n, 256, device="cuda", dtype=dtype, generator=g) for n in lengths]
    douts = [torch.randn(n, 256, device="cuda", dtype=dtype, generator=g) for n in lengths]
    alone = [_step(layer, s[None], d[None], autocast) for s, d in zip(seqs, douts)]
    out_dtype = alone[0][0].dtype

    def check(out, du, where, members):
        for m, (r, start) in zip(members, where):
            n = lengths[m]
            assert bits_equal(out[r, start:start + n], alone[m][0][0]), ("out", m, r, start)
            assert bits_equal(du[r, start:start + n], alone[m][1][0]), ("du", m, r, start)

    order = list(range(14))
    for trial in range(2):
        rng.shuffle(order)
        i = 0
        while i < 14:  # right-padded batches of random sizes (padding: junk inputs, zero output gradients)
            members = order[i:i + rng.choice([1, 3, 5, 14])]
            i += len(members)
            width = max(lengths[m] for m in members) + rng.randint(0, 70)
            u = torch.randn(len(members), width, 256, device="cuda", dtype=dtype, generator=g)
            dout = torch.zeros(len(members), width, 256, device="cuda", dtype=dtype)
            for r, m in enumerate(members):
                u[r, :lengths[m]], dout[r, :lengths[m]] = seqs[m], douts[m]
            out, du, _ = _step(layer, u, dout, autocast)
            check(out, du, [(r, 0) for r in range(len(members))], members)
        for nrows in (1, 3):  # packed into rows at random offsets (gaps of junk with their own seq_idx)
            rows = [[] for _ in range(nrows)]
            for m in order:
                rows[rng.randrange(nrows)].append(m)
            width = max(sum(lengths[m] + 5 for m in r) for r in rows) + 1
            u = torch.randn(nrows, width, 256, device="cuda", dtype=dtype, generator=g)
            dout = torch.zeros(nrows, width, 256, device="cuda", dtype=dtype)
            seq_idx = torch.zeros(nrows, width, dtype=torch.int32, device="cuda")
            where, members, sid = [], [], 0
            for r, ms in enumerate(rows):
                pos = rng.randint(0, 5)
                seq_idx[r, :pos] = sid
                sid += 1
                for m in ms:
                    n = lengths[m]
                    u[r, pos:pos + n], dout[r, pos:pos + n] = seqs[m], douts[m]
                    seq_idx[r, pos:] = sid
                    where.append((r, pos))
                    members.append(m)
                    sid += 1
                    gap = rng.randint(0, 5)
                    if gap:
                        seq_idx[r, pos + n:] = sid
                        sid += 1
                    pos += n + gap
                seq_idx[r, pos:] = sid
                sid += 1
            out, du, _ = _step(layer, u, dout, autocast, seq_idx=seq_idx)
            assert out.dtype == out_dtype
            check(out, du, where, members)
    # parameter gradients: the same sequences in the same order, padded as rows or packed into 1 or 2 rows
    width = max(lengths) + 9
    u = torch.zeros(14, width, 256, device="cuda", dtype=dtype)
    dout = torch.zeros_like(u)
    for r in range(14):
        u[r, :lengths[r]], dout[r, :lengths[r]] = seqs[r], douts[r]
    padded = _step(layer, u, dout, autocast)[2]
    for split in (14, 6):
        parts = [list(range(split)), list(range(split, 14))] if split < 14 else [list(range(14))]
        L = max(sum(lengths[m] for m in p) for p in parts)
        u = torch.zeros(len(parts), L, 256, device="cuda", dtype=dtype)
        dout = torch.zeros_like(u)
        seq_idx = torch.full((len(parts), L), 99, dtype=torch.int32, device="cuda")
        for r, p in enumerate(parts):
            pos = 0
            for m in p:
                u[r, pos:pos + lengths[m]], dout[r, pos:pos + lengths[m]] = seqs[m], douts[m]
                seq_idx[r, pos:pos + lengths[m]] = m
                pos += lengths[m]
            seq_idx[r, pos:] = 100 + r  # the row's tail: one more (empty-gradient) sequence of its own
        packed = _step(layer, u, dout, autocast, seq_idx=seq_idx)[2]
        for name in padded:
            assert bits_equal(packed[name], padded[name]), (split, name)


def test_without_sequence_invariance_a_packed_sequence_gets_other_bits():
    """The control: the default CUDA path (native's chunk grid of the packed row) gives a sequence packed off the
    grid other bits than alone, so the test above can see a difference."""
    layer = _layer(torch.bfloat16)
    layer.sequence_invariant = False
    g = torch.Generator(device="cuda").manual_seed(2)
    u = torch.randn(1, 300, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    seq_idx = torch.zeros(1, 300, dtype=torch.int32, device="cuda")
    seq_idx[0, 37:] = 1
    with torch.no_grad():
        packed = layer(u, seq_idx=seq_idx)[0, 37:]
        alone = layer(u[:, 37:])[0]
    assert not bits_equal(packed, alone)
    assert rel_err(packed, alone) < 0.05


_CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from tests.gpu.modules.test_invariance_cuda import _layer, _step
    from tests.helpers import sha256
    layer = _layer(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(3)
    u = torch.randn(2, 200, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(2, 200, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    seq_idx = torch.zeros(2, 200, dtype=torch.int32, device="cuda")
    seq_idx[0, 41:] = 1
    seq_idx[1, 150:] = 2
    out, du, grads = _step(layer, u, dout, False, seq_idx=seq_idx)
    print(sha256(out), sha256(du), *[sha256(grads[k]) for k in sorted(grads)])
""")


def test_a_fresh_process_gives_the_same_packed_bits():
    script = _CHILD.format(root=ROOT)
    here = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert here.returncode == 0, here.stderr[-3000:]
    layer = _layer(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(3)
    u = torch.randn(2, 200, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(2, 200, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    seq_idx = torch.zeros(2, 200, dtype=torch.int32, device="cuda")
    seq_idx[0, 41:] = 1
    seq_idx[1, 150:] = 2
    out, du, grads = _step(layer, u, dout, False, seq_idx=seq_idx)
    mine = " ".join([sha256(out), sha256(du), *[sha256(grads[k]) for k in sorted(grads)]])
    assert here.stdout.strip().splitlines()[-1] == mine


def test_an_invariant_linear_on_cuda_gives_a_row_its_bits_in_any_batch_and_under_autocast():
    from ordered_ssd import InvariantLinear

    torch.manual_seed(0)
    lin = InvariantLinear.from_linear(torch.nn.Linear(96, 1000, device="cuda"))
    x = torch.randn(300, 96, device="cuda", requires_grad=True)  # several row tiles (64 rows in fp32)
    full = lin(x)
    assert rel_err(full, F.linear(x.double(), lin.weight.double(), lin.bias.double())) < 1e-6
    for i, n in ((0, 1), (5, 1), (70, 3), (130, 64), (299, 1)):
        assert bits_equal(lin(x[i:i + n]), full[i:i + n]), (i, n)
    full.square().sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(x.detach())
        assert y.dtype == torch.bfloat16 and bits_equal(lin(x.detach()[150:151]), y[150:151])
