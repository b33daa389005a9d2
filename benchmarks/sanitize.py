"""The ordered forward + backward over a grid of small cases, for NVIDIA's ``compute-sanitizer``.

Every case builds an ``OrderedMamba2`` (fixed seed), runs one training step (forward, backward with a fixed output
gradient) and synchronises, so that every kernel of the ordered CUDA path and every code path runs at least once:
partial last chunk, ``L < d_conv``, ``L = 1``, ``ngroups > 1``, ``D_has_hdim``, ``rmsnorm=False``, ``seq_idx``,
fp16 / bf16 / fp32, the literal mode, ``use_mem_eff_path=False``, the gated MLP and the projection biases,
``d_conv`` 2 and 3, a chunk size that is not a power of two; :data:`EXTRA` adds decoding (a prefill, then steps),
a varlen prefill and the functional API with initial and final states, forward and backward. Three
more cases (:data:`PROBES`) run no layer: causal-conv1d's channel-last forward alone (on a ``randn`` input and on
the output of a cuBLAS GEMM) and a cuBLAS GEMM followed by a torch elementwise kernel: the smallest reproducers of
``initcheck``'s findings (see ``docs/guarantees.md``).

    python benchmarks/sanitize.py --list
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python benchmarks/sanitize.py                                     # every case
    ... python benchmarks/sanitize.py --case bf16-seq_idx --case fp32-literal

``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` gives every tensor its own ``cudaMalloc``, so the checker sees tensor bounds
(torch's caching allocator would hide out-of-bounds accesses inside a larger block). Exit status 0 when every
case ran; the sanitizer's own exit status (``--error-exitcode``) says whether it found anything.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ordered_ssd import OrderedMamba2  # noqa: E402

_BASE = {"d_model": 64, "d_state": 16, "headdim": 16, "chunk_size": 16}

#: name: (dtype, B, L, layer options, packed sequences, literal mode)
CASES = {
    "bf16-partial-chunk": (torch.bfloat16, 2, 40, {}, False, False),
    "bf16-L-below-d_conv": (torch.bfloat16, 2, 3, {}, False, False),
    "bf16-L1": (torch.bfloat16, 2, 1, {}, False, False),
    "bf16-ngroups2": (torch.bfloat16, 2, 48, {"ngroups": 2}, False, False),
    "bf16-D_has_hdim": (torch.bfloat16, 2, 40, {"D_has_hdim": True}, False, False),
    "bf16-no-rmsnorm": (torch.bfloat16, 2, 40, {"rmsnorm": False}, False, False),
    "bf16-seq_idx": (torch.bfloat16, 3, 50, {}, True, False),
    "fp16-partial-chunk": (torch.float16, 2, 40, {}, False, False),
    "fp32-partial-chunk": (torch.float32, 2, 40, {}, False, False),
    "fp32-literal": (torch.float32, 2, 40, {}, False, True),
    "bf16-literal-seq_idx": (torch.bfloat16, 2, 50, {}, True, True),
    "bf16-not-mem-eff": (torch.bfloat16, 2, 40, {"use_mem_eff_path": False}, False, False),
    "bf16-not-mem-eff-seq_idx-no-rmsnorm": (torch.bfloat16, 2, 50,
                                            {"use_mem_eff_path": False, "rmsnorm": False}, True, False),
    "bf16-mlp-bias": (torch.bfloat16, 2, 40, {"d_ssm": 32, "bias": True, "conv_bias": True}, False, False),
    "fp32-not-mem-eff-mlp": (torch.float32, 2, 33, {"use_mem_eff_path": False, "d_ssm": 32}, False, False),
    "bf16-d_conv2": (torch.bfloat16, 2, 40, {"d_conv": 2}, False, False),
    "fp16-d_conv3-seq_idx": (torch.float16, 2, 50, {"d_conv": 3}, True, False),
    "bf16-chunk48": (torch.bfloat16, 2, 100, {"chunk_size": 48}, False, False),
}


def run_layer_case(name: str) -> None:
    dtype, batch, seqlen, options, packed, literal = CASES[name]
    torch.manual_seed(0)
    layer = OrderedMamba2(**{**_BASE, **options}, device="cuda").to(dtype)
    layer.literal = literal
    u = torch.randn(batch, seqlen, layer.d_model, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn_like(u)
    seq_idx = None
    if packed:
        seq_idx = torch.zeros(batch, seqlen, dtype=torch.int32, device="cuda")
        for b in range(batch):
            seq_idx[b, 7 + 5 * b:] += 1
            seq_idx[b, 30 + b:] += 1
    out = layer(u, seq_idx=seq_idx)
    out.backward(dout)
    torch.cuda.synchronize()
    bad = [n for n, p in layer.named_parameters() if p.grad is None or not bool(torch.isfinite(p.grad).all())]
    if bad or not bool(torch.isfinite(u.grad).all()):
        raise RuntimeError(f"{name}: non-finite or missing gradients: {bad or ['u']}")


def _conv_channel_last_fwd(x_bld: torch.Tensor) -> None:
    """causal-conv1d's channel-last forward (W 4, SiLU) on ``x_bld`` [B, L, D] viewed as [B, D, L]."""
    import csrc_bindings

    weight = torch.randn(x_bld.shape[2], 4, device="cuda", dtype=x_bld.dtype)
    csrc_bindings.launch_causal_conv1d_fwd(x_bld.transpose(1, 2), weight, None, silu_activation=True)
    torch.cuda.synchronize()


def run_conv_channel_last_fwd() -> None:
    """causal-conv1d's channel-last forward alone, on a fully written [B, L, D] input (B 2, L 40, D 96, W 4)."""
    _conv_channel_last_fwd(torch.randn(2, 40, 96, device="cuda", dtype=torch.bfloat16))


def run_matmul_then_add() -> None:
    """No ordered-ssd code: ``c = a @ b`` (cuBLAS, bf16) then ``c + 1`` (a torch elementwise kernel reads ``c``)."""
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    (a @ a + 1).sum()
    torch.cuda.synchronize()


def run_conv_after_matmul() -> None:
    """causal-conv1d's channel-last forward on an input written by a cuBLAS GEMM (as ``in_proj`` writes xBC)."""
    a = torch.randn(80, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
    _conv_channel_last_fwd((a @ b).reshape(2, 40, 96))


class _InferenceParams:
    """The fields of mamba-ssm's ``InferenceParams`` that a layer reads (so this script needs no mamba-ssm import)."""

    def __init__(self, max_seqlen, max_batch_size):
        self.max_seqlen, self.max_batch_size = max_seqlen, max_batch_size
        self.seqlen_offset, self.batch_size_offset = 0, 0
        self.key_value_memory_dict, self.lengths_per_sample = {}, None


def run_decode(dtype) -> None:
    """A prefill of 21 tokens through ``inference_params`` (conv and SSM state written), then 5 single-token steps
    (causal-conv1d's ``causal_conv1d_update``, mamba-ssm's ``selective_state_update``)."""
    torch.manual_seed(0)
    layer = OrderedMamba2(**_BASE, layer_idx=0, device="cuda").to(dtype)
    u = torch.randn(2, 26, layer.d_model, device="cuda", dtype=dtype)
    params = _InferenceParams(26, 2)
    with torch.no_grad():
        layer(u[:, :21], inference_params=params)
        for t in range(21, 26):
            params.seqlen_offset = t
            layer(u[:, t:t + 1], inference_params=params)
    torch.cuda.synchronize()


def run_varlen_prefill() -> None:
    """A prefill of three packed sequences (``cu_seqlens`` + ``seq_idx``, B = 1): ``_chunk_state_varlen_kernel``."""
    torch.manual_seed(0)
    layer = OrderedMamba2(**_BASE, layer_idx=0, device="cuda").to(torch.bfloat16)
    cu_seqlens = torch.tensor([0, 7, 30, 45], dtype=torch.int32, device="cuda")
    seq_idx = torch.zeros(1, 45, dtype=torch.int32, device="cuda")
    seq_idx[0, 7:] += 1
    seq_idx[0, 30:] += 1
    u = torch.randn(1, 45, layer.d_model, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer(u, seq_idx=seq_idx, cu_seqlens=cu_seqlens, inference_params=_InferenceParams(45, 3))
    torch.cuda.synchronize()


def run_states() -> None:
    """The functional API with ``initial_states`` and ``return_final_states``, forward and backward (the
    state-passing kernels with initial states and a final-state gradient), for the chunk scan and the whole layer."""
    from ordered_ssd.ops import ordered_mamba_chunk_scan_combined, ordered_mamba_split_conv1d_scan_combined

    torch.manual_seed(0)
    dev, dt16 = "cuda", torch.bfloat16
    Bsz, L, H, P, G, N = 2, 40, 4, 16, 1, 16
    x = torch.randn(Bsz, L, H, P, device=dev, dtype=dt16, requires_grad=True)
    dt = torch.randn(Bsz, L, H, device=dev, dtype=dt16, requires_grad=True)
    A = (-torch.rand(H, device=dev) - 0.5).requires_grad_(True)
    Bm = torch.randn(Bsz, L, G, N, device=dev, dtype=dt16, requires_grad=True)
    Cm = torch.randn(Bsz, L, G, N, device=dev, dtype=dt16, requires_grad=True)
    init = torch.randn(Bsz, H, P, N, device=dev, requires_grad=True)
    y, final = ordered_mamba_chunk_scan_combined(x, dt, A, Bm, Cm, 16, initial_states=init, dt_softplus=True,
                                                 return_final_states=True)
    (y.float().sum() + final.sum()).backward()
    d_ssm, conv_dim = H * P, H * P + 2 * G * N
    zxbcdt = torch.randn(Bsz, L, 2 * d_ssm + 2 * G * N + H, device=dev, dtype=dt16, requires_grad=True)
    conv_w = torch.randn(conv_dim, 4, device=dev, dtype=dt16, requires_grad=True)
    out, final = ordered_mamba_split_conv1d_scan_combined(
        zxbcdt, conv_w, None, torch.zeros(H, device=dev, requires_grad=True), A, torch.ones(H, device=dev), 16,
        initial_states=init, return_final_states=True, headdim=P, ngroups=G)
    (out.float().sum() + final.sum()).backward()
    torch.cuda.synchronize()


#: cases beyond a training step (decoding, varlen prefill, state passing); added after the H200 runs of 2026-11-30
EXTRA = {"bf16-decode": lambda: run_decode(torch.bfloat16), "fp32-decode": lambda: run_decode(torch.float32),
         "bf16-varlen-prefill": run_varlen_prefill, "bf16-states": run_states}


#: the cases without a layer: the smallest reproducers of ``initcheck``'s findings
PROBES = {"conv-channel-last-fwd": run_conv_channel_last_fwd, "matmul-then-add": run_matmul_then_add,
          "conv-after-matmul": run_conv_after_matmul}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="run only this case (repeatable; default: every case)")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    args = ap.parse_args(argv)
    names = [*CASES, *EXTRA, *PROBES]
    if args.list:
        print("\n".join(names))
        return 0
    if not torch.cuda.is_available():
        print("sanitize: needs a CUDA GPU with the native extras (see the README's GPU install)", file=sys.stderr)
        return 2
    for name in args.case or names:
        if name not in names:
            print(f"sanitize: --case: expected one of {names}, got {name!r}", file=sys.stderr)
            return 2
        if name in PROBES:
            PROBES[name]()
        elif name in EXTRA:
            EXTRA[name]()
        else:
            run_layer_case(name)
        print(f"sanitize: {name} ran", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
