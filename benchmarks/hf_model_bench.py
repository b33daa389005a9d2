"""Model-level speed of converted Hugging Face models: a full training step, ordered against the original.

Usage::

    python benchmarks/hf_model_bench.py                                  # CUDA: both configs, 4x2048 and 2x4096
    python benchmarks/hf_model_bench.py --configs mamba2-130m --shapes 4x2048 --steps 30 --out bench-hf.json
    python benchmarks/hf_model_bench.py --device cpu --tiny              # CPU smoke run (tiny configs, fp32)

A training step is ``opt.zero_grad(set_to_none=True)``, ``model(input_ids=ids, labels=ids, use_cache=False).loss``,
``loss.backward()``, ``opt.step()`` (``torch.optim.AdamW``, torch's default implementation: elementwise, hence
deterministic), the parameters in ``--dtype`` (bf16 by default: ``model.to(torch.bfloat16)``), the token ids from a
seeded generator. Two configs (``--configs``), each randomly initialised from ``--seed``:

* ``mamba2-130m``: ``Mamba2ForCausalLM`` as ``state-spaces/mamba2-130m`` (hidden 768, 24 layers, d_state 128,
  head_dim 64, 1 group, expand 2, chunk 256, vocab 50280, tied embeddings), about 129M parameters;
* ``bamba-hybrid``: ``BambaForCausalLM`` (hidden 1024, 16 layers, attention at layers 4, 9 and 14 with 16 query /
  8 key-value heads, MLP 2048, Mamba-2 mixers of 32 heads x 64, d_state 128, chunk 256, vocab 50280, tied
  embeddings), about 245M parameters; its attention runs ``--attn`` (``sdpa`` by default: what a user would run).

Modes:

* ``original``: the unconverted model; its mixers call mamba-ssm's kernels as ``transformers`` picks them (the
  fused ``mamba_split_conv1d_scan_combined`` in training). On CUDA the script refuses to run if ``transformers``
  resolved that function to its own PyTorch fallback (mamba-ssm missing): a fallback is never timed;
* ``ordered``: a copy of the same model (the same weights) converted by :func:`ordered_ssd.convert_to_ordered`;
* ``upstream-det``: the unconverted model in a fresh child process (this script with ``--child``) whose environment
  has ``MAMBA_DETERMINISTIC=1`` and ``CAUSAL_CONV1D_DETERMINISTIC=1`` from its start (never set in this process);
  the child also times ``ordered``, interleaved with ``upstream-det``, for a same-process ratio, and writes JSON.

Per config and shape (``--shapes BxL,...``), in each process: both models and their optimizers are built; ``--warmup``
steps per mode (autotuning, compilation); ``--steps`` rounds, each one step of every mode on the round's batch, the
order alternating from round to round, each step between two ``torch.cuda.synchronize()`` timed with
``time.perf_counter`` (median reported; tokens/s = B * L / median); memory: per mode, one step after
``torch.cuda.reset_peak_memory_stats`` (``peak_alloc_delta_bytes``: ``max_memory_allocated`` minus what was allocated
before the step; ``resident_bytes``: the mode's own parameters and optimizer state; ``peak_bytes``: their sum, what one
model alone would peak at; ``max_memory_allocated_bytes`` also counts the other mode's resident model); bits: per
mode, the initial weights loaded back, ``--bitwise-repeats`` forward + backward passes on one fixed batch (no
optimizer step), the SHA-256 (:func:`ordered_ssd.digest.tensor_sha256`) of every parameter gradient, combined into
one digest per repeat (also one over the Mamba-2 mixers' gradients alone and one over the rest), with the distinct
digests counted and the parameters whose gradients differ between repeats listed by kind (mamba_mixer, attention,
mlp, embedding, other). For a model with attention run under sdpa, the bit check is repeated with eager attention
(``bitwise_eager_attn``; ``--no-eager-bitwise`` skips it), to show what the whole model gives when its attention
is deterministic too.

Results: ``--out`` (JSON; default ``bench-hf.json``) with the environment (versions, GPU, git commit), settings,
configs, parameter counts, per-mode results, ratios (ordered / original tokens/s in this process; ordered /
upstream-det in the child's process and across processes) and whether the targets are met (ordered >= 0.97 x
original, ordered >= upstream-det, judged on the same-process ratio); a markdown table on stdout (and ``--md``).

On the CPU (``--device cpu``; ``--tiny`` for the tiny configs) everything runs in fp32 on the pure-PyTorch paths
(the ordered reference, transformers' torch path): a smoke test of the harness, not a speed measurement. The child
runs there too (the switches do nothing on the CPU).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SCHEMA = "ordered-ssd/hf-model-bench/1"
DET_ENV = ("MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC")
TARGET_VS_ORIGINAL = 0.97
TARGET_VS_UPSTREAM_DET = 1.0
CONFIGS = ("mamba2-130m", "bamba-hybrid")
VOCAB = 50280
TINY_VOCAB = 256


# ---------------------------------------------------------------------------------------------------- arguments
def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--shapes", default=None, help="comma-separated BxL (default 4x2048,2x4096; --tiny: 2x64)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="parameter dtype on CUDA (the CPU: fp32)")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention of the hybrid while timed")
    p.add_argument("--steps", type=int, default=None, help="timed rounds (default 20; --tiny: 2)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps per mode (default 3; --tiny: 1)")
    p.add_argument("--bitwise-repeats", type=int, default=None, help="forward+backward repeats (default 5; --tiny 3)")
    p.add_argument("--no-eager-bitwise", action="store_true", help="skip the bit check with eager attention")
    p.add_argument("--no-upstream-det", action="store_true", help="skip the upstream-det child process")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="tiny configs (2 layers, hidden 64) for a smoke run")
    p.add_argument("--out", default="bench-hf.json", help="the JSON results (default bench-hf.json)")
    p.add_argument("--md", default=None, help="also write the markdown table here")
    p.add_argument("--child-timeout", type=float, default=1800.0, help="seconds for one upstream-det child")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: write the child's JSON here
    a = p.parse_args(argv)
    a.configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = [c for c in a.configs if c not in CONFIGS]
    if bad or not a.configs:
        p.error(f"--configs: expected names of {list(CONFIGS)}, got {bad or a.configs}")
    if a.shapes is None:
        a.shapes = "2x64" if a.tiny else "4x2048,2x4096"
    try:
        a.shape_list = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--shapes: expected comma-separated BxL, got {a.shapes!r}")
    if not a.shape_list or any(len(s) != 2 or min(s) < 1 for s in a.shape_list):
        p.error(f"--shapes: expected comma-separated BxL of positive sizes, got {a.shapes!r}")
    a.steps = a.steps if a.steps is not None else (2 if a.tiny else 20)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 3)
    a.bitwise_repeats = a.bitwise_repeats if a.bitwise_repeats is not None else (3 if a.tiny else 5)
    if a.steps < 1 or a.warmup < 0 or a.bitwise_repeats < 2:
        p.error("--steps must be >= 1, --warmup >= 0, --bitwise-repeats >= 2")
    return a


# ---------------------------------------------------------------------------------------------------- models
def build_config(name: str, tiny: bool, attn: str):
    """(model class, config, config kwargs) of a named config."""
    import transformers as T

    if name == "mamba2-130m":
        kw = dict(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=24, state_size=128, head_dim=64,
                  num_heads=24, n_groups=1, expand=2, chunk_size=256, conv_kernel=4, tie_word_embeddings=True)
        if tiny:
            kw.update(vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=2, state_size=16, head_dim=16,
                      num_heads=8, chunk_size=16)
        cls, cfg = T.Mamba2ForCausalLM, T.Mamba2Config(**kw)
    elif name == "bamba-hybrid":
        kw = dict(vocab_size=VOCAB, hidden_size=1024, num_hidden_layers=16, attn_layer_indices=[4, 9, 14],
                  num_attention_heads=16, num_key_value_heads=8, intermediate_size=2048, mamba_n_heads=32,
                  mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_expand=2, mamba_d_conv=4,
                  mamba_chunk_size=256, tie_word_embeddings=True)
        if tiny:
            kw.update(vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=2, attn_layer_indices=[1],
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, mamba_n_heads=8,
                      mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16)
        cls, cfg = T.BambaForCausalLM, T.BambaConfig(**kw)
        cfg._attn_implementation = attn
    else:  # pragma: no cover - guarded by _args
        raise ValueError(name)
    return cls, cfg, kw


def has_attention(model) -> bool:
    return any("Attention" in type(m).__name__ for m in model.modules())


def build_models(name, args, device, dtype):
    """The original model and an ordered copy with the same weights, each with its AdamW; the initial state."""
    import torch
    from ordered_ssd import convert_to_ordered

    cls, cfg, kw = build_config(name, args.tiny, args.attn)
    torch.manual_seed(args.seed)
    original = cls(cfg)  # initialised on the CPU: the same weights in every process
    original = original.to(device=device, dtype=dtype).train()
    ordered = copy.deepcopy(original)
    convert_to_ordered(ordered)
    init = {k: v.detach().clone() for k, v in original.state_dict().items()}
    return cls, cfg, kw, original, ordered, init


def param_kinds(model) -> dict:
    """Parameter name -> mamba_mixer / attention / mlp / embedding / other (by the modules that hold it)."""
    from ordered_ssd.hf import OrderedHFMamba2Mixer, hf_mixer_family

    modules = dict(model.named_modules())
    kinds = {}
    for pname, _ in model.named_parameters():
        parts = pname.split(".")[:-1]
        owners = [modules.get(".".join(parts[:i])) for i in range(len(parts), 0, -1)]
        owners = [m for m in owners if m is not None]
        if any(type(m) is OrderedHFMamba2Mixer or hf_mixer_family(m) is not None for m in owners):
            kind = "mamba_mixer"
        elif any("Attention" in type(m).__name__ for m in owners):
            kind = "attention"
        elif any("MLP" in type(m).__name__ or "FeedForward" in type(m).__name__ for m in owners):
            kind = "mlp"
        elif "embed" in pname or "lm_head" in pname:
            kind = "embedding"
        else:
            kind = "other"
        kinds[pname] = kind
    return kinds


# ---------------------------------------------------------------------------------------------------- checks
def _closure(fn) -> dict:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    return dict(zip(code.co_freevars, (c.cell_contents for c in cells))) if code is not None and cells else {}


def _resolved_implementation(fn):
    """What a ``use_kernel_func_from_hub_with_fallback`` wrapper calls: its closure's ``implementation``, following
    ``__wrapped__`` through any outer wrapper and, where the ``kernels`` package made the function a module
    (transformers 5.25 with ``kernels`` installed), that module class's ``forward``'s ``func``; else None."""
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        found = _closure(fn)
        if "implementation" in found:
            return found["implementation"]
        inner = getattr(fn, "__wrapped__", None)
        if inner is None and getattr(fn, "__code__", None) is None and hasattr(type(fn), "forward"):
            inner = _closure(type(fn).forward).get("func")
        fn = inner
    return None


def check_original_kernels(model_classes, device) -> dict:
    """On CUDA: the fused function each model's mixer calls in training must be mamba-ssm's, else SystemExit (a
    transformers fallback is never timed). Returns what was found."""
    import importlib

    mods = sorted({c.__module__ for c in model_classes})
    if device.type != "cuda":
        return {"status": "cpu: transformers' PyTorch path (the only one on the CPU)", "modules": mods}
    try:
        import causal_conv1d  # noqa: F401  (mamba-ssm's fused conv needs it)
        from mamba_ssm.ops.triton.ssd_combined import mamba_split_conv1d_scan_combined as want
    except ImportError as e:
        raise SystemExit(f"hf_model_bench: the 'original' mode needs mamba-ssm and causal-conv1d on CUDA ({e}); "
                         "without them transformers runs its PyTorch fallback, which this benchmark never times. "
                         "pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0")
    found = {}
    for name in mods:
        mod = importlib.import_module(name)
        fn = getattr(mod, "mamba2_split_conv1d_scan_combined", None)
        impl = _resolved_implementation(fn) if fn is not None else None
        where = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
        if impl is not want:
            raise SystemExit(f"hf_model_bench: {name}.mamba2_split_conv1d_scan_combined resolves to {where}, not "
                             f"mamba_ssm's mamba_split_conv1d_scan_combined: the 'original' mode would time "
                             f"transformers' fallback (or something unknown). Import order or a missing / broken "
                             f"mamba-ssm install? Refusing to time it.")
        found[name] = where
    return {"status": "mamba_ssm", "modules": found}


def fused_path_probe(model, ids):
    """Whether every mixer call of one forward got no cache and no mask (the fused training path of both modes)."""
    import torch
    from ordered_ssd.hf import OrderedHFMamba2Mixer, hf_mixer_family

    seen = []

    def hook(mod, a, kw):
        seen.append(kw.get("cache") is None and kw.get("cache_params") is None and kw.get("attention_mask") is None)

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules()
               if type(m) is OrderedHFMamba2Mixer or hf_mixer_family(m) is not None]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return {"mixer_calls": len(seen), "all_without_cache_and_mask": bool(seen) and all(seen)}


# ---------------------------------------------------------------------------------------------------- steps
def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_batch(vocab, B, L, seed, device):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, L), generator=g).to(device)


def train_step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    return loss


def resident_bytes(model, opt) -> int:
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    n += sum(p.numel() * p.element_size() for p in model.buffers())
    for st in opt.state.values():
        n += sum(v.numel() * v.element_size() for v in st.values() if hasattr(v, "element_size"))
    return int(n)


def grad_digests(model, kinds, repeats, ids):
    """Per repeat: (loss digest, {param name: grad digest}) of forward + backward on ``ids`` (no optimizer step)."""
    from ordered_ssd.digest import tensor_sha256

    out = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        grads = {n: tensor_sha256(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        out.append((tensor_sha256(loss.detach().float()), grads))
    model.zero_grad(set_to_none=True)
    return out


def _combine(grads: dict, names) -> str:
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode())
        h.update(grads.get(n, "none").encode())
    return h.hexdigest()


def bitwise_summary(runs, kinds, attn) -> dict:
    names = sorted(kinds)
    mixer = [n for n in names if kinds[n] == "mamba_mixer"]
    rest = [n for n in names if kinds[n] != "mamba_mixer"]
    full = [_combine(g, names) for _, g in runs]
    differing = sorted(n for n in names if len({g.get(n) for _, g in runs}) > 1)
    by_kind = {}
    for n in differing:
        by_kind[kinds[n]] = by_kind.get(kinds[n], 0) + 1
    return {
        "attn_implementation": attn,
        "repeats": len(runs),
        "digests": full,
        "distinct_digests": len(set(full)),
        "distinct_mixer_digests": len({_combine(g, mixer) for _, g in runs}),
        "distinct_rest_digests": len({_combine(g, rest) for _, g in runs}),
        "distinct_loss_digests": len({d for d, _ in runs}),
        "params_with_grad": len(runs[0][1]),
        "differing_params_by_kind": by_kind,
        "differing_params": differing[:40],
        "differing_params_total": len(differing),
    }


def set_attn(model, attn):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attn)
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = attn


def measure(name, B, L, args, device, dtype, modes):
    """Time, memory and bits of ``modes`` (("original" or "upstream-det", "ordered")) for one config and shape in
    this process. The first mode runs the unconverted model."""
    import torch

    cls, cfg, kw, original, ordered, init = build_models(name, args, device, dtype)
    models = {modes[0]: original, "ordered": ordered}
    opts = {m: torch.optim.AdamW(models[m].parameters(), lr=args.lr) for m in modes}
    kinds = param_kinds(original)
    vocab = cfg.vocab_size
    tokens = B * L
    res = {"config": name, "batch": B, "seq_len": L, "tokens_per_step": tokens,
           "model_class": cls.__name__, "params": sum(p.numel() for p in original.parameters()),
           "param_dtype": str(dtype).replace("torch.", ""), "attn_implementation": args.attn,
           "has_attention": has_attention(original), "modes": {m: {} for m in modes}}
    probe_ids = make_batch(vocab, B, L, args.seed + 7, device)
    for m in modes:
        res["modes"][m]["fused_path_probe"] = fused_path_probe(models[m], probe_ids)
    del probe_ids

    # warm-up
    for i in range(args.warmup):
        ids = make_batch(vocab, B, L, args.seed + 1000 + i, device)
        for m in modes:
            train_step(models[m], opts[m], ids)
    _sync(device)

    # timing: interleaved rounds, the order alternating
    times = {m: [] for m in modes}
    for r in range(args.steps):
        ids = make_batch(vocab, B, L, args.seed + 2000 + r, device)
        order = modes if r % 2 == 0 else modes[::-1]
        for m in order:
            _sync(device)
            t0 = time.perf_counter()
            train_step(models[m], opts[m], ids)
            _sync(device)
            times[m].append((time.perf_counter() - t0) * 1e3)
    for m in modes:
        med = statistics.median(times[m])
        res["modes"][m].update({"ms_per_step_median": med, "ms_per_step_min": min(times[m]),
                                "ms_per_step_all": [round(t, 4) for t in times[m]],
                                "tokens_per_s": tokens / (med / 1e3)})

    # memory: one step per mode, in its own phase
    ids = make_batch(vocab, B, L, args.seed + 3000, device)
    for m in modes:
        for o in opts.values():  # no gradients of either mode resident
            o.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            _sync(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            train_step(models[m], opts[m], ids)
            _sync(device)
            peak = torch.cuda.max_memory_allocated(device)
            own = resident_bytes(models[m], opts[m])
            res["modes"][m].update({"peak_alloc_delta_bytes": int(peak - before), "resident_bytes": own,
                                    "peak_bytes": int(own + peak - before), "max_memory_allocated_bytes": int(peak)})
        else:
            res["modes"][m].update({"peak_alloc_delta_bytes": None, "peak_bytes": None,
                                    "resident_bytes": resident_bytes(models[m], opts[m]),
                                    "max_memory_allocated_bytes": None})

    # bits: the initial weights back, repeats of forward + backward on one batch
    ids = make_batch(vocab, B, L, args.seed + 4000, device)
    eager_too = res["has_attention"] and args.attn != "eager" and not args.no_eager_bitwise
    for m in modes:
        models[m].load_state_dict(init)
        runs = grad_digests(models[m], kinds, args.bitwise_repeats, ids)
        res["modes"][m]["bitwise"] = bitwise_summary(runs, kinds, args.attn)
        if eager_too:
            set_attn(models[m], "eager")
            runs = grad_digests(models[m], kinds, args.bitwise_repeats, ids)
            res["modes"][m]["bitwise_eager_attn"] = bitwise_summary(runs, kinds, "eager")
            set_attn(models[m], args.attn)
    res["config_kwargs"] = kw
    del models, opts, original, ordered, init
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


# ---------------------------------------------------------------------------------------------------- child
def deterministic_mode_here():
    try:
        from mamba_ssm.utils.determinism import use_deterministic_mode
    except ImportError as e:
        return f"unknown ({e})"
    return bool(use_deterministic_mode())


def run_child(args):
    """In the fresh process: upstream-det (the unconverted model) and ordered, one config and shape."""
    import torch  # noqa: F401

    device = resolve_device(args.device)
    dtype = run_dtype(args, device)
    name, (B, L) = args.configs[0], args.shape_list[0]
    out = {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in DET_ENV}}
    try:
        from transformers import BambaForCausalLM, Mamba2ForCausalLM  # noqa: F401

        cls, _, _ = build_config(name, args.tiny, args.attn)
        out["original_kernels"] = check_original_kernels([cls], device)
        out["deterministic_mode"] = deterministic_mode_here() if device.type == "cuda" else None
        out["result"] = measure(name, B, L, args, device, dtype, ("upstream-det", "ordered"))
    except SystemExit as e:
        out["error"] = str(e)
    except Exception as e:  # reported in the parent's JSON
        import traceback

        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-4000:]
    with open(args.child, "w") as f:
        json.dump(out, f)


def child_argv(args, name, B, L, path):
    argv = [sys.executable, os.path.abspath(__file__), "--child", path, "--configs", name, "--shapes", f"{B}x{L}",
            "--device", args.device_resolved, "--dtype", args.dtype, "--attn", args.attn, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--bitwise-repeats", str(args.bitwise_repeats), "--lr", str(args.lr),
            "--seed", str(args.seed)]
    if args.tiny:
        argv.append("--tiny")
    if args.no_eager_bitwise:
        argv.append("--no-eager-bitwise")
    return argv


def run_upstream_det(args, name, B, L) -> dict:
    from ordered_ssd.apps.bench.children import child_env  # the bench's: DET_ENV set, no autotune cache, our root

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "child.json")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(child_argv(args, name, B, L, path), env=child_env("upstream-det"),
                                  capture_output=True, text=True, timeout=args.child_timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"the upstream-det child ran past --child-timeout {args.child_timeout:g} s"}
        wall = time.perf_counter() - t0
        if not os.path.exists(path):
            return {"error": f"the upstream-det child exited {proc.returncode} without results",
                    "stderr_tail": proc.stderr[-4000:], "wall_s": wall}
        with open(path) as f:
            out = json.load(f)
    out["returncode"] = proc.returncode
    out["wall_s"] = wall
    return out


# ---------------------------------------------------------------------------------------------------- report
def resolve_device(name):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("hf_model_bench: --device cuda: no CUDA device here")
    return torch.device(name)


def run_dtype(args, device):
    import torch

    if device.type != "cuda":
        return torch.float32  # the ordered reference path on the CPU runs fp32/fp64
    return torch.bfloat16 if args.dtype == "bf16" else torch.float32


def environment(device) -> dict:
    import importlib.metadata as md

    import torch

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    from ordered_ssd.apps.bench.suite import _commit, _tree  # as ordered-ssd bench records them

    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "transformers": version("transformers"), "mamba_ssm": version("mamba-ssm"),
           "causal_conv1d": version("causal-conv1d"), "triton": version("triton"),
           "ordered_ssd": version("ordered-ssd"), "git_commit": _commit(), "git_tree": _tree(), "device": device.type}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_capability"] = list(torch.cuda.get_device_capability(device))
    return env


def _ratio(a, b):
    return a / b if a and b else None


def finish_run(res, child):
    modes = res["modes"]
    ratios = {"ordered_vs_original": _ratio(modes["ordered"]["tokens_per_s"], modes["original"]["tokens_per_s"])}
    met = {"vs_original": ratios["ordered_vs_original"] is not None and
           ratios["ordered_vs_original"] >= TARGET_VS_ORIGINAL}
    if child is not None:
        res["upstream_det_child"] = {k: v for k, v in child.items() if k != "result"}
        cres = child.get("result")
        if cres is not None:
            up = cres["modes"]["upstream-det"]
            modes["upstream-det"] = up
            res["upstream_det_child"]["ordered"] = cres["modes"]["ordered"]
            same = _ratio(cres["modes"]["ordered"]["tokens_per_s"], up["tokens_per_s"])
            cross = _ratio(modes["ordered"]["tokens_per_s"], up["tokens_per_s"])
            ratios["ordered_vs_upstream_det_same_process"] = same
            ratios["ordered_vs_upstream_det_cross_process"] = cross
            met["vs_upstream_det"] = same is not None and same >= TARGET_VS_UPSTREAM_DET
            here = modes["ordered"]["bitwise"]["digests"]
            there = cres["modes"]["ordered"]["bitwise"]["digests"]
            res["ordered_same_bits_across_processes"] = set(here) == set(there) and len(set(here)) == 1
            if "bitwise_eager_attn" in modes["ordered"] and "bitwise_eager_attn" in cres["modes"]["ordered"]:
                here = modes["ordered"]["bitwise_eager_attn"]["digests"]
                there = cres["modes"]["ordered"]["bitwise_eager_attn"]["digests"]
                res["ordered_same_bits_across_processes_eager_attn"] = (set(here) == set(there)
                                                                        and len(set(here)) == 1)
        else:
            met["vs_upstream_det"] = None
    res["ratios"] = ratios
    res["targets_met"] = met
    return res


def _mb(b):
    return "-" if b is None else f"{b / 2**20:,.0f}"


def _bits(mode):
    b = mode.get("bitwise")
    if not b:
        return "-"
    s = f"{b['distinct_digests']}/{b['repeats']} (mixers {b['distinct_mixer_digests']})"
    e = mode.get("bitwise_eager_attn")
    if e:
        s += f"; eager attn {e['distinct_digests']}/{e['repeats']}"
    return s


def markdown(report) -> str:
    lines = ["| config | params | B x L | mode | ms/step | tokens/s | × original | × upstream-det | peak MiB | "
             "distinct grad digests |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        orig = r["modes"]["original"]["tokens_per_s"]
        up = r["modes"].get("upstream-det", {}).get("tokens_per_s")
        rows = [(m, r["modes"][m]) for m in ("original", "upstream-det", "ordered") if m in r["modes"]]
        child_ord = (r.get("upstream_det_child") or {}).get("ordered")
        if child_ord:
            rows.append(("ordered (det child)", child_ord))
        for m, d in rows:
            vs_up = "-"
            if m == "ordered" and up:
                vs_up = f"{d['tokens_per_s'] / up:.3f}"
            if m == "ordered (det child)":
                vs_up = f"{r['ratios'].get('ordered_vs_upstream_det_same_process', 0):.3f} (same process)"
            lines.append(f"| {r['config']} | {r['params'] / 1e6:.1f}M | {r['batch']}x{r['seq_len']} | {m} | "
                         f"{d['ms_per_step_median']:.2f} | {d['tokens_per_s']:,.0f} | "
                         f"{d['tokens_per_s'] / orig:.3f} | {vs_up} | {_mb(d.get('peak_bytes'))} | {_bits(d)} |")
    s = report["summary"]
    lines += ["", "ms/step: median over interleaved rounds; × original: tokens/s over this process's original (for "
              "rows of the upstream-det child, across processes); × upstream-det: ordered here over the child's "
              "upstream-det, or (det child row) the same-process ratio; peak MiB: the mode's own parameters and "
              "optimizer state plus the step's peak allocation; distinct grad digests: over the bit-check repeats "
              "(whole model; mixers alone in brackets; with eager attention after ';')."]
    lines += ["", f"Targets (ordered ≥ {TARGET_VS_ORIGINAL} × original; ordered ≥ upstream-det, same process): "
              f"{'all met' if s['all_targets_met'] else 'NOT all met'}"
              + (f" — {'; '.join(s['not_met'])}" if s["not_met"] else "")]
    lines += [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = _args(argv)
    if args.child:
        run_child(args)
        return 0
    # the switches are the upstream-det child's alone (mamba-ssm reads them at call time): never in this process
    had = [k for k in DET_ENV if os.environ.pop(k, None) is not None]
    import torch
    import transformers  # noqa: F401  (the mixer modules resolve their kernels at import)

    device = resolve_device(args.device)
    args.device_resolved = device.type
    dtype = run_dtype(args, device)
    notes = []
    if had:
        notes.append(f"{', '.join(had)} removed from this process's environment (set in the upstream-det child only)")
    if device.type != "cuda":
        notes.append("CPU: fp32, the pure-PyTorch paths (ordered reference, transformers' torch path): a smoke run "
                     "of the harness, not a speed measurement; the upstream-det switches do nothing on the CPU.")
    if torch.are_deterministic_algorithms_enabled():
        raise SystemExit("hf_model_bench: torch.use_deterministic_algorithms is on in this process; the 'original' "
                         "mode would run mamba-ssm's deterministic mode. Run without it.")
    classes = [build_config(n, args.tiny, args.attn)[0] for n in args.configs]
    kernels = check_original_kernels(classes, device)
    report = {"schema": SCHEMA, "environment": environment(device), "original_kernels": kernels,
              "settings": {"configs": args.configs, "shapes": [f"{b}x{l}" for b, l in args.shape_list],
                           "dtype": str(dtype).replace("torch.", ""), "attn": args.attn, "steps": args.steps,
                           "warmup": args.warmup, "bitwise_repeats": args.bitwise_repeats, "lr": args.lr,
                           "seed": args.seed, "tiny": args.tiny, "optimizer": "torch.optim.AdamW (default impl)",
                           "timing": "torch.cuda.synchronize + time.perf_counter per step, median of interleaved "
                                     "rounds" if device.type == "cuda" else "time.perf_counter per step (CPU)",
                           "upstream_det": not args.no_upstream_det},
              "targets": {"ordered_vs_original_tokens_per_s": TARGET_VS_ORIGINAL,
                          "ordered_vs_upstream_det_tokens_per_s": TARGET_VS_UPSTREAM_DET},
              "runs": [], "notes": notes}
    t_all = time.perf_counter()
    for name in args.configs:
        for B, L in args.shape_list:
            t0 = time.perf_counter()
            print(f"[hf_model_bench] {name} {B}x{L}: original + ordered ...", file=sys.stderr, flush=True)
            res = measure(name, B, L, args, device, dtype, ("original", "ordered"))
            child = None
            if not args.no_upstream_det:
                print(f"[hf_model_bench] {name} {B}x{L}: upstream-det child ...", file=sys.stderr, flush=True)
                child = run_upstream_det(args, name, B, L)
                if child.get("error"):
                    notes.append(f"{name} {B}x{L}: upstream-det child failed: {child['error']}")
                elif device.type == "cuda" and child.get("deterministic_mode") is not True:
                    notes.append(f"{name} {B}x{L}: the upstream-det child reports deterministic_mode = "
                                 f"{child.get('deterministic_mode')!r}")
            res = finish_run(res, child)
            res["wall_s"] = time.perf_counter() - t0
            report["runs"].append(res)
            with open(args.out, "w") as f:  # partial results survive a later failure
                json.dump(report | {"summary": summary(report), "complete": False}, f, indent=1)
    report["summary"] = summary(report)
    report["wall_s"] = time.perf_counter() - t_all
    report["complete"] = True
    for r in report["runs"]:
        for m, d in r["modes"].items():
            b = d.get("bitwise")
            if b and b["distinct_digests"] > 1:
                kinds = ", ".join(f"{k} {n}" for k, n in sorted(b["differing_params_by_kind"].items()))
                notes.append(f"{r['config']} {r['batch']}x{r['seq_len']} {m}: {b['distinct_digests']} distinct "
                             f"gradient digests over {b['repeats']} repeats (attn {b['attn_implementation']}; "
                             f"differing params: {kinds})")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    md = markdown(report)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)
    print(f"results: {args.out}", file=sys.stderr)
    return 0


def summary(report) -> dict:
    """Targets missed or not measured; whether ordered's gradients repeat bitwise (mixers alone, the whole model,
    the whole model under eager attention) and give the same bits in the upstream-det child (None: not measured)."""
    runs = report["runs"]
    not_met = []
    for r in runs:
        for k, v in r.get("targets_met", {}).items():
            if v is not True:
                not_met.append(f"{r['config']} {r['batch']}x{r['seq_len']} {k}: "
                               f"{'not measured' if v is None else 'missed'}")

    def every(values):
        values = [v for v in values if v is not None]
        return all(values) if values else None

    ordered = [r["modes"]["ordered"] for r in runs]
    return {"all_targets_met": not not_met and bool(runs), "not_met": not_met,
            "ordered_mixer_grads_bitwise": every(o["bitwise"]["distinct_mixer_digests"] == 1 for o in ordered),
            "ordered_all_grads_bitwise": every(o["bitwise"]["distinct_digests"] == 1 for o in ordered),
            "ordered_all_grads_bitwise_eager_attn": every(o["bitwise_eager_attn"]["distinct_digests"] == 1
                                                          for o in ordered if "bitwise_eager_attn" in o),
            "ordered_same_bits_across_processes": every(r.get("ordered_same_bits_across_processes") for r in runs)}

if __name__ == "__main__":
    sys.exit(main())
