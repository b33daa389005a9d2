"""One table of bad inputs across ordered-ssd: the module, the functional API, the bindings, the CLI and the restart
checkpoints (issue #17, item 3).

Every row is ``(id, call, exception type, regex)``. ``call(ctx)`` must raise that exception before anything is
computed, launched or written, with a message that is ONE line, names the argument and says what was expected and
what came (the regex pins the argument, the expected and the actual value). CLI rows run ``ordered-ssd`` in this
process (:func:`ordered_ssd.apps.cli.main`) and raise :class:`CliFailed` with its error line, which must be all it wrote
to stderr (argparse's errors too: no usage lines). Every row that names a file or folder also checks that
nothing on disk changed (a SHA-256 of every file under the test's folder before and after). The CPU test machine
has no native extras, so a row that reached a native kernel would raise ImportError instead: the checks come first.
The GPU rows are in ``tests/gpu/test_bad_inputs.py``.

The documented non-errors (NaN/inf values propagate; a chunk size that is not a power of two is accepted) are at the
end.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import pickle
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch

import csrc_bindings as cb
from ordered_ssd import OrderedMamba2
from ordered_ssd.apps.cli import build_parser, main
from ordered_ssd.ops import (ordered_causal_conv1d, ordered_gated_rmsnorm, ordered_mamba_chunk_scan_combined,
                             ordered_mamba_split_conv1d_scan_combined)
from tests.apps.helpers import TINY_CHECK
from tests.helpers import make_layer, to_fake_cuda

BASE = dict(d_model=16, d_state=8, headdim=8, chunk_size=8)
TINY = TINY_CHECK + ["--batch", "2"]
BIG = 1 << 16  # B of the size-limit rows: 2**16 * 2**10 * 32 * 64 = 2**37 elements, on the meta device


class CliFailed(Exception):
    """``ordered-ssd ARGS`` exited non-zero; ``str()`` is its error line, ``usage`` any argparse usage lines."""

    def __init__(self, code: int, line: str, usage: list[str]):
        super().__init__(line)
        self.code, self.usage = code, usage


def cli(ctx, *argv: str) -> None:
    """Run ``ordered-ssd ARGV`` in this process; raise :class:`CliFailed` unless it exits 0. First records the digest
    of the test's folder (``ctx.before``: the row's input files are made by then)."""
    ctx.before = _tree_digest(ctx.tmp)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse
            code = e.code
    lines = err.getvalue().splitlines()
    if code != 0:
        errors = [ln for ln in lines if not ln.startswith(("usage:", " "))]
        raise CliFailed(code, "\n".join(errors), [ln for ln in lines if ln not in errors])


# ------------------------------------------------------------------------------------------------- the context
class Ctx:
    """Paths and objects the rows use (files are made lazily, under the test's ``tmp_path``)."""

    def __init__(self, tmp_path, checkpoints):
        self.tmp = tmp_path
        self.ckpt = checkpoints
        self.before = None  # digest of tmp_path when the CLI started
        self.layer = None  # the layer of a module row

    def file(self, name: str, data: bytes) -> str:
        path = self.tmp / name
        path.write_bytes(data)
        return str(path)

    def train(self, resume: str) -> None:
        """``ordered-ssd _train`` resuming from ``resume`` with the spec of the good checkpoint."""
        cli(self, "_train", "--spec", self.ckpt["spec"], "--record", str(self.tmp / "record.json"), "--label", "x",
            "--resume", resume, "--quiet")

    def bad_ckpt(self, name: str, obj) -> str:
        path = self.tmp / name
        torch.save(obj, path)
        return str(path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A spec and a real restart checkpoint of the tiny check model (one step, in this process), and a checkpoint of
    a model with another d_model."""
    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.check.train import train_run
    from ordered_ssd.apps.lm import ByteData, load_corpus

    d = tmp_path_factory.mktemp("ckpt")
    out = {}
    threads = torch.get_num_threads()
    try:
        for name, extra in (("good", []), ("other", ["--d-model", "48", "--headdim", "16"])):
            args = build_parser().parse_args(["check", *TINY, *extra])
            spec = spec_from_args(args)
            spec["data_sha256"] = ByteData(load_corpus(spec["data"], spec["data_bytes"])[0], spec["seq_len"]).sha256
            spec_path = d / f"spec-{name}.json"
            spec_path.write_text(json.dumps(spec))
            train_run(spec, str(d / f"{name}.json"), label=name, stop_at=1, ckpt_path=str(d / f"{name}.pt"),
                      progress=False)
            out[name] = str(d / f"{name}.pt")
            out[f"spec-{name}"] = str(spec_path)
    finally:
        torch.set_num_threads(threads)
    out["spec"] = out["spec-good"]
    return out


# ------------------------------------------------------------------------------------------------- row makers
class Row(NamedTuple):
    id: str
    call: Callable
    exc: type
    pattern: str
    disk: bool = False  # the row involves files: the test folder must be unchanged


def _layer(**kw):
    return make_layer(seed=0, dtype=torch.float32, **{**BASE, **kw})


def _as_cuda_path(layer):
    """The layer, told that its CUDA path would run (as on a GPU with the extras): the CUDA path's checks run first,
    and nothing of it can run on the CPU (a check that came late would fail on a CPU/meta tensor instead)."""
    layer.backend_for = lambda u: "cuda"
    return layer


def _forward(layer_kw=None, *, cuda_path=False, meta=False, u=None, **fwd):
    """A forward of a fresh layer; ``layer_kw`` are constructor arguments, except ``validate_seq_idx`` (an
    attribute)."""
    def call(ctx):
        kw = dict(layer_kw or {})
        validate = kw.pop("validate_seq_idx", False)
        layer = OrderedMamba2(**{**BASE, **kw}, device="meta") if meta else _layer(**kw)
        layer.validate_seq_idx = validate
        if cuda_path:
            _as_cuda_path(layer)
        ctx.layer = layer
        layer(u() if callable(u) else u, **fwd)
    return call


def _fake_cuda_forward(u_dtype, *, dtype=torch.bfloat16, backend="reference"):
    """A forward of a layer of ``dtype`` whose parameters are fake CUDA tensors (no GPU needed: the checks run
    before any computation), with ``layer.backend`` set, on a fake CUDA input of ``u_dtype``."""
    def call(ctx):
        from torch._subclasses.fake_tensor import FakeTensorMode

        layer = OrderedMamba2(**BASE, device="meta", dtype=dtype)
        layer.backend = backend
        with FakeTensorMode(allow_non_fake_inputs=True):
            to_fake_cuda(layer)
            layer(torch.empty(2, 5, 16, dtype=u_dtype, device="cuda"))
    return call


def _set_then_forward(**attrs):
    """A forward of a fresh fp32 layer whose attributes ``attrs`` were set after construction."""
    def call(ctx):
        layer = _layer()
        for k, v in attrs.items():
            setattr(layer, k, v)
        layer(torch.randn(2, 5, 16))
    return call


def _ctor(**kw):
    return lambda ctx: OrderedMamba2(**{**BASE, **kw})


def _ssd(device="cpu", *, b=2, l=8, h=2, p=4, g=1, n=4, **over):
    """``ordered_mamba_chunk_scan_combined``'s arguments for sizes B, L, H, P, G, N (``over`` replaces any)."""
    args = dict(x=torch.empty(b, l, h, p, device=device), dt=torch.empty(b, l, h, device=device),
                A=torch.empty(h, device=device), B=torch.empty(b, l, g, n, device=device),
                C=torch.empty(b, l, g, n, device=device), chunk_size=4)
    args.update(over)
    return lambda ctx: ordered_mamba_chunk_scan_combined(**args)


def _split(device="cpu", *, b=2, l=8, h=2, p=4, g=1, n=2, w=4, d_mlp=4, **over):
    """``ordered_mamba_split_conv1d_scan_combined``'s arguments (D [H], ``headdim=P``; ``over`` replaces any)."""
    dim = h * p
    args = dict(zxbcdt=torch.empty(b, l, 2 * d_mlp + 2 * dim + 2 * g * n + h, device=device),
                conv1d_weight=torch.empty(dim + 2 * g * n, w, device=device), conv1d_bias=None,
                dt_bias=torch.empty(h, device=device), A=torch.empty(h, device=device),
                D=torch.empty(h, device=device), chunk_size=4, headdim=p, ngroups=g)
    args.update(over)
    return lambda ctx: ordered_mamba_split_conv1d_scan_combined(**args)


def _conv(**over):
    args = dict(x=torch.empty(2, 8, 16), weight=torch.empty(8, 4), bias=None)
    args.update(over)
    return lambda ctx: ordered_causal_conv1d(**args)


def _check(*argv, out="out"):
    def call(ctx):
        where = [] if out is None else ["--out", str(ctx.tmp / out) if isinstance(out, str) else out(ctx)]
        cli(ctx, "check", *TINY, *where, *[a(ctx) if callable(a) else a for a in argv])
    return call


def _truncated(ctx):
    with open(ctx.ckpt["good"], "rb") as fh:
        data = fh.read()
    return ctx.file("truncated.pt", data[: len(data) // 2])


class _Opaque:
    """An object ``weights_only=True`` refuses to unpickle."""


F32 = dict(dtype=torch.float32)


def U(*shape, **kw):
    """A thunk making a random fp32 (or ``dtype=``) input of ``shape``."""
    return lambda: torch.randn(*shape, **{**F32, **kw})



ROWS = [
    # --------------------------------------------------------------------------- the module: constructor
    Row("ctor/d_model=0", _ctor(d_model=0), ValueError, r"^d_model: expected an int >= 1, got 0$"),
    Row("ctor/chunk_size=0", _ctor(chunk_size=0), ValueError, r"^chunk_size: expected an int >= 1, got 0$"),
    Row("ctor/chunk_size<0", _ctor(chunk_size=-64), ValueError, r"^chunk_size: expected an int >= 1, got -64$"),
    Row("ctor/chunk_size float", _ctor(chunk_size=64.0), TypeError,
        r"^chunk_size: expected an int >= 1, got float 64\.0$"),
    Row("ctor/d_conv=0", _ctor(d_conv=0), ValueError, r"^d_conv: expected an int >= 1, got 0$"),
    Row("ctor/headdim not dividing d_ssm", _ctor(headdim=12), ValueError,
        r"^headdim: expected a divisor of d_ssm = expand \* d_model = 32, got 12$"),
    Row("ctor/d_ssm not a multiple of headdim", _ctor(d_ssm=12), ValueError,
        r"^d_ssm: expected a multiple of headdim=8, got 12$"),
    Row("ctor/dtype int", _ctor(dtype=torch.int32), TypeError,
        r"^dtype: expected None or a floating torch\.dtype \(e\.g\. torch\.float32, torch\.bfloat16\), "
        r"got dtype torch\.int32$"),
    Row("ctor/dtype str", _ctor(dtype="float32"), TypeError,
        r"^dtype: expected None or a floating torch\.dtype .*, got str 'float32'$"),
    Row("ctor/device unparsable", _ctor(device="gpu0"), ValueError,
        r"^device: expected None, a torch\.device or a device string such as 'cuda', got 'gpu0' \("),
    Row("ctor/flag not a bool", _ctor(use_mem_eff_path="no"), TypeError,
        r"^use_mem_eff_path: expected a bool \(or 0/1, or None for False\), got str 'no'$"),
    Row("ctor/ngroups not dividing nheads", _ctor(ngroups=3), ValueError,
        r"^ngroups: expected a divisor of nheads = d_ssm / headdim = 4, got 3$"),
    Row("ctor/dt_limit nan", _ctor(dt_limit=(float("nan"), 1.0)), ValueError,
        r"^dt_limit\[0\]: expected a real number, got nan$"),
    Row("ctor/dt_min inf > dt_max", _ctor(dt_min=float("inf")), ValueError,
        r"^dt_min: expected dt_min <= dt_max=0\.1, got inf$"),
    # --------------------------------------------------------------------------- the module: forward
    Row("fwd/int dtype", _forward(u=lambda: torch.ones(2, 5, 16, dtype=torch.int64)), TypeError,
        r"^u: expected dtype in \(torch\.float32, torch\.float64\) on cpu, got torch\.int64$"),
    Row("fwd/bf16 layer on the cpu", lambda ctx: OrderedMamba2(**BASE, dtype=torch.bfloat16)(
        torch.randn(2, 5, 16, dtype=torch.bfloat16)), TypeError,
        r"^the layer's parameters: expected dtype in \(torch\.float32, torch\.float64\) on cpu, got "
        r"torch\.bfloat16 \(bf16/fp16 layers run on CUDA only: move the layer to a CUDA device, or call "
        r"\.float\(\)\)$"),
    Row("fwd/bf16 layer, reference backend on cuda", _fake_cuda_forward(torch.bfloat16), TypeError,
        r"^the layer's parameters: expected dtype in \(torch\.float32, torch\.float64\) with layer\.backend = "
        r"'reference', got torch\.bfloat16 \(torch\.bfloat16 layers run on the CUDA path here: set layer\.backend = "
        r"None, or call \.float\(\)\)$"),
    Row("fwd/fp16 layer, reference backend on cuda, fp32 input", _fake_cuda_forward(torch.float32, dtype=torch.float16),
        TypeError, r"^the layer's parameters: expected dtype in \(torch\.float32, torch\.float64\) with "
        r"layer\.backend = 'reference', got torch\.float16 \(torch\.float16 layers run on the CUDA path here: set "
        r"layer\.backend = None, or call \.float\(\)\)$"),
    Row("fwd/chunk_size set to 0 after construction", _set_then_forward(chunk_size=0), ValueError,
        r"^chunk_size: expected an int >= 1, got 0$"),
    Row("fwd/fp64 into fp32 layer", _forward(u=U(2, 5, 16, dtype=torch.float64)), TypeError,
        r"^u: expected dtype torch\.float32 \(the dtype of the layer's parameters\), got torch\.float64$"),
    Row("fwd/d_model", _forward(u=U(2, 5, 15)), ValueError,
        r"^u: expected last dimension d_model=16, got shape \(2, 5, 15\)$"),
    Row("fwd/rank 2", _forward(u=U(5, 16)), ValueError,
        r"^u: expected a 3-d tensor \[B, L, d_model=16\], got shape \(5, 16\)$"),
    Row("fwd/empty batch", _forward(u=U(0, 5, 16)), ValueError,
        r"^u: expected B >= 1 and L >= 1, got shape \(0, 5, 16\)$"),
    Row("fwd/device", _forward(u=lambda: torch.empty(2, 5, 16, device="meta")), ValueError,
        r"^u: expected device cpu \(the device of the layer's parameters\), got meta$"),
    Row("fwd/seq_idx dtype", _forward(u=U(2, 5, 16), seq_idx=torch.zeros(2, 5)), TypeError,
        r"^seq_idx: expected an integer dtype \(torch\.int32\), got torch\.float32$"),
    Row("fwd/seq_idx device", _forward(u=U(2, 5, 16), seq_idx=torch.zeros(2, 5, dtype=torch.int32, device="meta")),
        ValueError, r"^seq_idx: expected device cpu, got meta$"),
    Row("fwd/seq_idx decreasing (validate_seq_idx on)",
        _forward(dict(validate_seq_idx=True), u=U(1, 3, 16), seq_idx=torch.tensor([[0, 1, 0]], dtype=torch.int32)),
        ValueError, r"^seq_idx: expected non-decreasing ids along L \(packed sequences\), got a decrease in row 0 "
                    r"from 1 to 0 at position 2$"),
    Row("fwd/cuda path d_conv=5", _forward(dict(d_conv=5), cuda_path=True, u=U(2, 5, 16)), ValueError,
        r"^d_conv: expected 2, 3 or 4 on the CUDA path \(causal-conv1d's kernel widths\), got 5$"),
    Row("fwd/cuda path B*L*H*P >= 2**31", _forward(dict(d_model=1024, headdim=64, d_state=16, chunk_size=64),
                                                   cuda_path=True, meta=True,
                                                   u=lambda: torch.empty(BIG, 1024, 1024, device="meta")),
        ValueError, r"^B=65536, L=1024: expected fewer than 2\*\*31 elements in every tensor of the CUDA path .*got "
                    r"\d+ in .*; split the batch or the sequence$"),
    # --------------------------------------------------------------------------- the functional API
    Row("ssd/x int dtype", _ssd(x=torch.zeros(2, 8, 2, 4, dtype=torch.int32)), TypeError,
        r"^x: expected dtype in \(torch\.float32, torch\.float16, torch\.bfloat16\), got torch\.int32$"),
    Row("ssd/x fp64", _ssd(x=torch.zeros(2, 8, 2, 4, dtype=torch.float64)), TypeError,
        r"^x: expected dtype in \(.*\), got torch\.float64$"),
    Row("ssd/x rank 3", _ssd(x=torch.zeros(2, 8, 8)), ValueError,
        r"^x: expected a 4-d tensor \[B, L, H, P\], got shape \(2, 8, 8\)$"),
    Row("ssd/dt shape", _ssd(dt=torch.zeros(2, 8, 3)), ValueError,
        r"^dt: expected shape \[B, L, H\] = \(2, 8, 2\), got \(2, 8, 3\)$"),
    Row("ssd/groups", _ssd(B=torch.zeros(2, 8, 3, 4), C=torch.zeros(2, 8, 3, 4)), ValueError,
        r"^B: expected shape \[B, L, G, N\] = \(2, 8, G, N\) with G dividing H = 2, got \(2, 8, 3, 4\)$"),
    Row("ssd/D shape", _ssd(D=torch.zeros(3)), ValueError,
        r"^D: expected shape \[H\] = \(2,\) or \[H, P\] = \(2, 4\), got \(3,\)$"),
    Row("ssd/dt_limit min > max", _ssd(dt_limit=(1.0, 0.0)), ValueError,
        r"^dt_limit: expected min <= max, got min=1\.0 > max=0\.0$"),
    Row("split/dt_limit min > max", _split(dt_limit=(0.5, 0.1)), ValueError,
        r"^dt_limit: expected min <= max, got min=0\.5 > max=0\.1$"),
    Row("ssd/chunk_size=0", _ssd(chunk_size=0), ValueError, r"^chunk_size: expected an int >= 1, got 0$"),
    Row("ssd/chunk_size bool", _ssd(chunk_size=True), TypeError, r"^chunk_size: expected an int >= 1, got bool True$"),
    Row("ssd/mismatched devices", _ssd(dt=torch.zeros(2, 8, 2, device="meta")), ValueError,
        r"^dt: expected device cpu \(that of x\), got meta$"),
    Row("ssd/B*L*H*P >= 2**31", _ssd("meta", b=BIG, l=1024, h=32, p=64, n=16), ValueError,
        r"^B=65536, L=1024: expected fewer than 2\*\*31 elements .*got 137438953472 in x / dx \[B, L, H, P\]"),
    Row("ssd/CPU tensors", _ssd(), ValueError,
        r"^x: expected a CUDA tensor \(the ordered CUDA path\), got device cpu$"),
    Row("split/conv width 5", _split(w=5), ValueError,
        r"^conv1d_weight\.shape\[1\] \(W\): expected 2, 3 or 4 on the CUDA path .*got 5$"),
    Row("split/zxbcdt width", _split(zxbcdt=torch.empty(2, 8, 29)), ValueError,
        r"^zxbcdt: expected last dimension 2 d_mlp \+ 2 d_ssm \+ 2 G N \+ H = 2 d_mlp \+ 22 with d_mlp >= 0 "
        r"\(d_ssm = 8, G = 1, N = 2, H = 2\), got 29$"),
    Row("split/D 1-d without headdim", _split(headdim=None), ValueError,
        r"^headdim: required when D is 1-d \(\[H\]\), got None$"),
    Row("split/outproj_weight", _split(outproj_weight=torch.empty(16, 7)), ValueError,
        r"^outproj_weight: expected shape \[d_out, d_mlp \+ d_ssm\] = \[d_out, 12\], got \(16, 7\)$"),
    Row("split/mismatched devices", _split(A=torch.empty(2, device="meta")), ValueError,
        r"^A: expected device cpu \(that of zxbcdt\), got meta$"),
    Row("split/states >= 2**31", _split("meta", b=64, l=4096, h=64, p=64, n=256, chunk_size=64), ValueError,
        r"^B=64, L=4096: expected fewer than 2\*\*31 elements .*got 4294967296 in states \[B, C, H, P, N\]"),
    Row("conv/width 5", _conv(weight=torch.empty(8, 5)), ValueError,
        r"^weight\.shape\[1\] \(W\): expected 2, 3 or 4 on the CUDA path \(causal-conv1d's kernel widths\), got 5$"),
    Row("conv/bias shape", _conv(bias=torch.empty(7)), ValueError,
        r"^bias: expected shape \[D\] = \(8,\), got \(7,\)$"),
    Row("conv/not a tensor", _conv(x=[[1.0]]), TypeError, r"^x: expected a torch\.Tensor, got list$"),
    Row("rmsnorm/CPU tensor", lambda ctx: ordered_gated_rmsnorm(torch.empty(2, 8, 16), torch.ones(16)), ValueError,
        r"^x: expected a CUDA tensor \(the ordered CUDA path\), got device cpu$"),
    # --------------------------------------------------------------------------- the bindings (before any import)
    Row("bind/chunk_cumsum A shape", lambda ctx: cb.launch_chunk_cumsum_fwd(torch.zeros(2, 10, 4), torch.zeros(3), 8),
        ValueError, r"^A: expected shape \[H\] = \(4,\), got \(3,\)$"),
    Row("bind/conv width 5", lambda ctx: cb.launch_causal_conv1d_fwd(torch.zeros(2, 8, 16), torch.zeros(8, 5)),
        ValueError, r"^weight: expected a width W in 2\.\.4 \(causal-conv1d\), got 5$"),
    Row("bind/conv dout dtype", lambda ctx: cb.launch_causal_conv1d_bwd_dx(
        torch.zeros(2, 8, 16), torch.zeros(8, 4), None, torch.zeros(2, 8, 16, dtype=torch.float16)),
        ValueError, r"^dout: expected the dtype of x \(torch\.float32\), got torch\.float16$"),
    Row("bind/rmsnorm stride", lambda ctx: cb.launch_rmsnorm_gated_fwd(torch.zeros(16, 8).t(), torch.ones(16), 1e-5),
        ValueError, r"^x: expected stride 1 in the last dim, got strides \(1, 8\)$"),
    Row("bind/chunk_state_bwd_db dstates", lambda ctx: cb.launch_chunk_state_bwd_db(
        torch.zeros(2, 16, 4, 8), torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8), torch.zeros(2, 2, 4, 7, 3)),
        ValueError, r"^dstates: expected shape \[B, C, H, P, N\] = \(2, 2, 4, 8, 3\), got \(2, 2, 4, 7, 3\)$"),
    # --------------------------------------------------------------------------- the CLI
    Row("cli/--steps 0", _check("--steps", "0"), CliFailed,
        r"^ordered-ssd check: error: argument --steps: expected a positive integer, got 0$", True),
    Row("cli/--steps 1", _check("--steps", "1"), CliFailed,
        r"--steps: expected at least 2 \(the replay restarts from a step in between\), got 1$"),
    Row("cli/--chunk-size 0", _check("--chunk-size", "0"), CliFailed,
        r"^ordered-ssd check: error: argument --chunk-size: expected a positive integer, got 0$", True),
    Row("cli/--lr nan", _check("--lr", "nan"), CliFailed,
        r"^ordered-ssd check: error: argument --lr: expected a finite positive number, got 'nan'$", True),
    Row("cli/--headdim", _check("--headdim", "24"), CliFailed,
        r"^ordered-ssd check: error: --headdim: expected a divisor of 2 \* d_model = 64, got 24$", True),
    Row("cli/--data missing", _check("--data", lambda ctx: str(ctx.tmp / "none.txt")), CliFailed,
        r"^ordered-ssd check: error: --data: expected an existing file or directory, got .*none\.txt \(no such", True),
    Row("cli/--data empty", _check("--data", lambda ctx: ctx.file("empty.txt", b"")), CliFailed,
        r"^ordered-ssd check: error: --data: expected some bytes to train on, got 0 bytes in file .*empty\.txt$",
        True),
    Row("cli/--data binary", _check("--data", lambda ctx: ctx.file("blob.bin", b"text\x00" + bytes(range(256)) * 40)),
        CliFailed, r"^ordered-ssd check: error: --data: expected a text file, got binary data in .*blob\.bin \(a NUL "
                   r"byte at offset 4\)$", True),
    Row("cli/--data shorter than a sequence", _check("--data", lambda ctx: ctx.file("short.txt", b"x" * 10)),
        CliFailed, r"^ordered-ssd check: error: --data: too little data for --seq-len 24: expected at least 50 bytes, "
                   r"got 10$", True),
    Row("cli/--data-bytes shorter than a sequence", _check("--data-bytes", "10"), CliFailed,
        r"^ordered-ssd check: error: --data-bytes: too little data for --seq-len 24: expected at least 50 bytes, "
        r"got 10$", True),
    Row("cli/--out is a file", _check(out=lambda ctx: ctx.file("taken", b"keep me")), CliFailed,
        r"^ordered-ssd check: error: --out: expected a directory, got an existing file that is not one: .*taken$",
        True),
    Row("cli/--out under a file", _check(out=lambda ctx: os.path.join(ctx.file("blocker", b"keep"), "sub")),
        CliFailed, r"^ordered-ssd check: error: --out: expected a writable output directory, got .*blocker/sub, "
                   r"which is not writable: Not a directory$", True),
    Row("cli/bench --shape", lambda ctx: cli(ctx, "bench", "--shape", "1,2,3"), CliFailed,
        r"^ordered-ssd bench: error: argument --shape: expected .*got '1,2,3'", True),
    # --------------------------------------------------------------------------- restart checkpoints
    Row("ckpt/missing", lambda ctx: ctx.train(str(ctx.tmp / "nope.pt")), CliFailed,
        r"^ordered-ssd _train: error: checkpoint .*nope\.pt: expected a checkpoint file, got no such file$", True),
    Row("ckpt/corrupt", lambda ctx: ctx.train(ctx.file("corrupt.pt", os.urandom(4096))), CliFailed,
        r"^ordered-ssd _train: error: checkpoint .*corrupt\.pt: expected a torch\.save file that loads with "
        r"weights_only=True, got one that does not \(corrupt or truncated\?\): \w+: .+$", True),
    Row("ckpt/truncated", lambda ctx: ctx.train(_truncated(ctx)), CliFailed,
        r"^ordered-ssd _train: error: checkpoint .*truncated\.pt: expected a torch\.save file .*got one that does "
        r"not", True),
    Row("ckpt/pickled object", lambda ctx: ctx.train(ctx.bad_ckpt("code.pt", {"model": _Opaque()})), CliFailed,
        r"^ordered-ssd _train: error: checkpoint .*code\.pt: expected a torch\.save file that loads with "
        r"weights_only=True, got one that does not .*UnpicklingError: ", True),
    Row("ckpt/not a dict", lambda ctx: ctx.train(ctx.bad_ckpt("list.pt", [1, 2])), CliFailed,
        r"^ordered-ssd _train: error: checkpoint .*list\.pt: expected a dict of checkpoint fields, got list$", True),
    Row("ckpt/missing fields", lambda ctx: ctx.train(ctx.bad_ckpt("fields.pt", {"step": 1})), CliFailed,
        r"^ordered-ssd _train: error: checkpoint .*fields\.pt: expected the fields \[.*\], got \['step'\] \(missing "
        r"\['data_position', ", True),
    Row("ckpt/another model", lambda ctx: ctx.train(ctx.ckpt["other"]), CliFailed,
        r"^ordered-ssd _train: error: checkpoint .*other\.pt: expected one written for this run's model "
        r"\(chunk_size=16, d_model=32, .*\), got one written for another model \(chunk_size=16, d_model=48, .*\); "
        r"resume it with the spec it was written with$", True),
]


def _tree_digest(root) -> dict:
    """``{relative path: sha256}`` of every file under ``root`` (and the set of folders)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def test_the_table_is_large_and_spans_every_layer():
    assert len(ROWS) >= 30 and len({r.id for r in ROWS}) == len(ROWS)
    kinds = {r.id.split("/")[0] for r in ROWS}
    assert {"ctor", "fwd", "ssd", "split", "conv", "bind", "cli", "ckpt"} <= kinds


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input(row, tmp_path, checkpoints):
    ctx = Ctx(tmp_path, checkpoints)
    ckpt_before = {k: _sha(v) for k, v in checkpoints.items()}
    with pytest.raises(row.exc) as info:
        row.call(ctx)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message, f"not one line: {message!r}"
    assert "expected" in message or "required" in message, message
    assert re.search(row.pattern, message), f"{message!r} !~ {row.pattern!r}"
    if row.exc is CliFailed:
        assert info.value.code == 2
        assert info.value.usage == []  # the error line alone
    if row.disk:
        assert ctx.before is not None, "the CLI was not reached"
        assert _tree_digest(tmp_path) == ctx.before  # nothing written, removed or changed
        assert {k: _sha(v) for k, v in checkpoints.items()} == ckpt_before
    if ctx.layer is not None:  # the module's rows: no parameter touched, no gradient
        assert all(p.grad is None for p in ctx.layer.parameters())


def _sha(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


# ------------------------------------------------------------------------------------- documented non-errors
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("param", ["dt_bias", "D", "in_proj.weight"])
def test_nan_or_inf_parameters_propagate_without_an_error(param, value):
    """NaN/inf in a parameter is not checked (it would cost a device sync per step): the forward runs and its
    output carries the non-finite value (docs/guarantees.md)."""
    layer = _layer()
    with torch.no_grad():
        dict(layer.named_parameters())[param].view(-1)[0] = value
    out = layer(torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(0)))
    assert out.shape == (2, 12, 16)
    assert not bool(torch.isfinite(out).all())


def test_a_chunk_size_that_is_not_a_power_of_two_is_accepted():
    """The kernels take chunk_size as a runtime argument and mask the last tile, so any int >= 1 is valid; the
    reference gives the same function for chunk sizes 12 and 16 (up to rounding)."""
    u = torch.randn(2, 30, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outs = [make_layer(seed=0, dtype=torch.float64, chunk_size=cs)(u) for cs in (12, 16)]
    assert torch.allclose(outs[0], outs[1], rtol=1e-10, atol=1e-12)
    assert math.isfinite(float(outs[0].sum()))


def test_checkpoints_are_written_atomically_and_read_weights_only(checkpoints, tmp_path, monkeypatch):
    """A checkpoint write that fails half-way leaves the previous file whole and no temporary file behind; a file
    whose unpickling would run code is refused (weights_only=True)."""
    from ordered_ssd.apps.check.checkpoint import read_checkpoint
    from ordered_ssd.apps.check.errors import CheckError
    from ordered_ssd.apps.files import atomic_torch_save

    path = tmp_path / "ck.pt"
    atomic_torch_save(str(path), {"step": 1})
    before = _tree_digest(tmp_path)

    def broken_save(obj, f):
        with open(f, "wb") as fh:
            fh.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="No space left"):
        atomic_torch_save(str(path), {"step": 2})
    monkeypatch.undo()
    assert _tree_digest(tmp_path) == before
    assert torch.load(path, weights_only=True) == {"step": 1}

    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    evil = tmp_path / "evil.pt"
    with open(evil, "wb") as fh:
        pickle.dump(OrderedDict(x=Evil()), fh, protocol=2)
    with pytest.raises(CheckError, match=r"weights_only=True, got one that does not"):
        read_checkpoint(str(evil))


def test_functional_api_checks_seq_idx_without_reading_its_values():
    """The functional API's checks read no value of seq_idx (no host synchronisation, docs/compile.md): on the meta
    device, whose values cannot be read, a decreasing-or-not seq_idx passes every check and the call stops only at
    require_cuda; ordered_ssd.validate_seq_idx is the opt-in check of the values."""
    from ordered_ssd import validate_seq_idx

    seq_idx = torch.empty(2, 8, dtype=torch.int32, device="meta")
    calls = [_ssd("meta", seq_idx=seq_idx), _split("meta", seq_idx=seq_idx),
             lambda ctx: ordered_causal_conv1d(torch.empty(2, 16, 8, device="meta"),
                                               torch.empty(16, 4, device="meta"), seq_idx=seq_idx)]
    for call in calls:
        with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor|^zxbcdt: expected a CUDA tensor"):
            call(None)
    with pytest.raises(ValueError, match=r"^seq_idx: expected non-decreasing ids along L .* row 0 from 1 to 0 "
                                         r"at position 2$"):
        validate_seq_idx(torch.tensor([[0, 1, 0]], dtype=torch.int32))
