"""Whether a check's training fits in memory, decided before anything is trained or written.

The estimate (bytes, fp32) of one training process, documented in docs/check.md ("Memory"):

* ``16 * n_params``: the parameters, their gradients and AdamW's two states;
* the activations of one step: ``4 * max(forward, backward)`` with ``T = rows * seq_len`` tokens in a forward
  (``rows``: the examples one process trains on at once), ``E = expand * d_model``, ``H = E / headdim`` heads,
  ``N = d_state``, ``K = 2 E + 2 ngroups N + H`` (the in-projection), ``Q = chunk_size``, ``Lp`` = ``seq_len``
  rounded up to whole chunks (the scan pads), ``S = 4 H N + 2 Q H`` (one layer's scan intermediates per padded
  position, the intra-chunk decays included) and ``V = 256``:
  ``forward = T * (4 n_layers K + 12 V) + rows * Lp * S`` (the saved in-projections of every layer, the logits and
  the loss, one layer's scan at a time) and ``backward = 4 seq_len K + Lp * (E N + S) + 12 T V`` (the CPU path
  recomputes one layer for one example at a time, with a graph, while the logits' gradient is alive);
* the corpus, one byte per byte.

Fitted on the CPU path (torch 2.13, 2 cores): between 0.6 and 1.25 times the measured growth of a process's peak
memory (``ru_maxrss``) over two training steps, for d_state 16..100000, d_model 64..512, 1..4 layers, 1..16 rows,
seq_len 128..1024, chunk_size 32..128; not counted: the interpreter and torch themselves (about 0.1 GiB more there).
On CUDA (the fused kernels) the formula is not measured.

With ``--layer mamba3`` (``OrderedMamba3``; the formula follows its pure-PyTorch reference path) the parameters
are counted exactly (:func:`mamba3_layer_params`) but the activation formula is adapted, not fitted: ``K = 2 E +
2 G N + 3 H + S`` with ``S`` the rotary angles here (not the scan term above), ``Q = chunk_size``, ``C =
ceil(seq_len / Q)`` chunks, ``Lp = C Q``;
``forward = T * (4 n_layers d + 12 V) + T * (K + 2 G N + 6 H N + 5 H S + 4 E) + 5 rows Q^2 H`` (every layer keeps
only its input, as its autograd function saves ``u``; one layer's graph-free forward, one chunk's ``[Q, Q, H]``
decays and scores at a time) and ``backward = T * (4 n_layers d + 12 V) + seq_len * (2 K + 4 G N + 8 H N + 5 H S +
6 E) + 10 Lp Q H + 3 C E N`` (the saved inputs and logits stay alive while one layer is recomputed for one example,
with a graph over every chunk). Checked once against ``ru_maxrss`` (torch 2.13, 2 cores; d_model 64..256, d_state
16..1000, chunk_size 32..256, seq_len 256..1024): 0.65 to 0.9 times the growth over two steps, that growth holding
about 90 MiB that does not depend on the model (the Mamba-2 formula gives 0.57 there at d_model 128, d_state 64, 8
rows of 512 bytes).

A ``--hf-config`` model counts ``16 * n_params`` and its logits (``48 T vocab_size`` bytes) only: a lower bound.

``processes`` runs train at once (``--nproc`` ranks, a split's ranks); on the CPU they share the host's memory, on
CUDA each rank has its own GPU.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch

from ..lm import VOCAB, DataError
from .errors import plural
from .spec import DEFAULT_LAYER, layer_of, rope_angles

GIB = float(2 ** 30)


def _size(n: float) -> str:
    """``1.25 GiB``, or ``12.3 MiB`` below 1 GiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


#: cgroup v2's limit and usage of this process's group (containers), read where present
CGROUP_MAX, CGROUP_CURRENT = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"


def byte_lm_params(model: dict) -> int:
    """The number of parameters of the byte-level LM of ``model`` (the spec's shape), without building it: the tied
    embedding ``256 d``, per layer an RMSNorm ``d`` and an ``OrderedMamba2`` (``in_proj`` ``K d``, ``conv1d``
    ``5 C`` with ``C = E + 2 G N`` and width 4, ``dt_bias``, ``A_log``, ``D`` ``H`` each, the gated norm ``E``,
    ``out_proj`` ``d E``), the final RMSNorm ``d``. With ``layer`` ``mamba3`` each layer's mixer is an
    ``OrderedMamba3`` instead (:func:`mamba3_layer_params`)."""
    d, n, g = model["d_model"], model["d_state"], model["ngroups"]
    e = model.get("expand", 2) * d
    h = e // model["headdim"]
    if layer_of(model) == "mamba3":
        return VOCAB * d + model["n_layers"] * (d + mamba3_layer_params(model)) + d
    k = 2 * e + 2 * g * n + h
    conv = e + 2 * g * n
    layer = d + k * d + 5 * conv + 3 * h + e + d * e
    return VOCAB * d + model["n_layers"] * layer + d


def mamba3_layer_params(model: dict) -> int:
    """The parameters of one ``OrderedMamba3`` of the check (``rope_fraction`` 0.5, no out-projection norm):
    ``in_proj`` ``(2 E + 2 G N + 3 H + S) d`` with ``S`` rotary angles (:func:`.spec.rope_angles`), ``dt_bias`` and
    ``D`` ``H`` each, ``B_bias`` and ``C_bias`` ``H N`` each, ``B_norm`` and ``C_norm`` ``N`` each, ``out_proj``
    ``d E``; no convolution."""
    d, n, g = model["d_model"], model["d_state"], model["ngroups"]
    e = model.get("expand", 2) * d
    h = e // model["headdim"]
    k = 2 * e + 2 * g * n + 3 * h + rope_angles(n)
    return k * d + 2 * h + 2 * h * n + 2 * n + d * e


def activation_bytes(spec: dict, rows: int) -> int:
    """The activations of one step of a process training ``rows`` examples at once (see the module docstring)."""
    seq = spec["seq_len"]
    tokens = rows * seq
    hf = spec.get("hf")
    if hf is not None:
        return 4 * 12 * tokens * int(hf.get("vocab_size", VOCAB))
    m = spec["model"]
    if layer_of(m) == "mamba3":
        return _mamba3_activation_bytes(m, rows, seq)
    e = m.get("expand", 2) * m["d_model"]
    h = e // m["headdim"]
    n, q = m["d_state"], m["chunk_size"]
    k = 2 * e + 2 * m["ngroups"] * n + h
    padded = -(-seq // q) * q  # the scan pads the sequence to whole chunks
    scan = 4 * h * n + 2 * q * h
    forward = tokens * (4 * m["n_layers"] * k + 12 * VOCAB) + rows * padded * scan
    backward = seq * 4 * k + padded * (e * n + scan) + 12 * tokens * VOCAB
    return 4 * max(forward, backward)


def _mamba3_activation_bytes(m: dict, rows: int, seq: int) -> int:
    """The activations of one step of the byte LM of Mamba-3 layers (the module docstring: not fitted)."""
    d, n, g, q = m["d_model"], m["d_state"], m["ngroups"], m["chunk_size"]
    e = m.get("expand", 2) * d
    h = e // m["headdim"]
    s = rope_angles(n)
    k = 2 * e + 2 * g * n + 3 * h + s
    tokens = rows * seq
    chunks = -(-seq // q)
    padded = chunks * q
    saved = tokens * (4 * m["n_layers"] * d + 12 * VOCAB)  # every layer's saved inputs, the logits and the loss
    layer = k + 2 * g * n + 6 * h * n + 5 * h * s + 4 * e  # one layer's forward (no graph) per token
    forward = saved + tokens * layer + 5 * rows * q * q * h
    backward = saved + seq * (2 * k + 4 * g * n + 8 * h * n + 5 * h * s + 6 * e) + 10 * padded * q * h \
        + 3 * chunks * e * n
    return 4 * max(forward, backward)


def n_params(spec: dict) -> int:
    """The parameters of the spec's model (the byte LM's counted from its shape; a Hugging Face model's were counted
    on the meta device when the spec was made)."""
    return int(spec["hf"]["n_params"]) if spec.get("hf") is not None else byte_lm_params(spec["model"])


def training_bytes(spec: dict, rows: int, corpus_bytes: int) -> dict:
    """The estimate of one process: ``{"n_params", "states", "activations", "corpus", "total"}`` (bytes)."""
    params = n_params(spec)
    states, acts = 16 * params, activation_bytes(spec, rows)
    return {"n_params": params, "states": states, "activations": acts, "corpus": corpus_bytes,
            "total": states + acts + corpus_bytes}


def _cgroup_free() -> Optional[int]:
    """Bytes this process's cgroup (v2) may still use, or None where it has no limit or none is readable."""
    try:
        with open(CGROUP_MAX) as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open(CGROUP_CURRENT) as fh:
            return max(0, int(limit) - int(fh.read().strip()))
    except (OSError, ValueError):
        return None


def host_available() -> Tuple[Optional[int], str]:
    """Bytes of host memory available to a new allocation, and where the number comes from: ``MemAvailable`` of
    ``/proc/meminfo`` (Linux), else ``os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_AVPHYS_PAGES')``; lowered to the
    room left under the cgroup v2 limit where that is smaller. ``(None, why)`` where neither can be read."""
    found: Optional[int] = None
    how = ""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found, how = int(line.split()[1]) * 1024, "MemAvailable"
                    break
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            found, how = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), "SC_AVPHYS_PAGES"
        except (ValueError, OSError, AttributeError):
            return None, "neither /proc/meminfo nor sysconf SC_AVPHYS_PAGES is readable here"
    room = _cgroup_free()
    if room is not None and room < found:
        found, how = room, "the cgroup's memory.max less memory.current"
    return found, how


def device_available(device: torch.device, processes: int) -> Tuple[Optional[int], str]:
    """Bytes available to one training process on ``device``: the host's (:func:`host_available`, shared by the
    ``processes``: the caller multiplies), or on CUDA the free memory of the GPU (``torch.cuda.mem_get_info``; with
    several processes, the least free of GPUs ``0 .. processes-1``, one per rank)."""
    if device.type != "cuda":
        return host_available()
    indices: List[int] = [device.index or 0] if processes == 1 else list(range(processes))
    free = min(torch.cuda.mem_get_info(i)[0] for i in indices)
    return free, "torch.cuda.mem_get_info"


def _size_flags(spec: dict, rows: int, processes: int) -> str:
    """The options that make the estimate, as they would be typed: ``--d-model 64 ... --batch 4 --seq-len 128``."""
    if spec.get("hf") is not None:
        flags = [f"--hf-config {spec['hf'].get('path')}"]
    else:
        m = spec["model"]
        flags = [f"--{k.replace('_', '-')} {m[k]}" for k in ("d_model", "n_layers", "d_state", "headdim", "ngroups",
                                                              "chunk_size")]
        if layer_of(m) != DEFAULT_LAYER:
            flags.append(f"--layer {layer_of(m)}")
    flags += [f"--batch {spec['batch']}", f"--seq-len {spec['seq_len']}"]
    if processes > 1:
        flags.append(f"({plural(processes, 'process', 'processes')} of {plural(rows, 'row')})")
    return " ".join(flags)


def check_memory(spec: dict, *, rows: int, processes: int, corpus_bytes: int,
                 available: Optional[Tuple[Optional[int], str]] = None, one_gpu: bool = False) -> str:
    """Refuse a run whose training would not fit (:class:`DataError`, one line naming the options, the estimate and
    the memory available) before anything is trained; return the line the check prints about it.

    ``rows``: the examples one process trains on at once; ``processes``: how many train at once; ``available``:
    ``(bytes, source)`` (default: :func:`device_available`). On the CPU the processes share the host's memory; on
    CUDA each has its GPU, or with ``one_gpu`` they all share the spec's GPU.
    """
    device = torch.device(spec["device"])
    est = training_bytes(spec, rows, corpus_bytes)
    free, how = available if available is not None else device_available(device, 1 if one_gpu else processes)
    shared = device.type != "cuda" or one_gpu
    need = est["total"] * processes if shared else est["total"]
    per = (f"{_size(est['total'])} per process x {processes}" if shared and processes > 1
           else _size(est["total"]) + (" per GPU" if not shared and processes > 1 else ""))
    parts = (f"{est['n_params'] / 1e6:.2f}M parameters: {_size(est['states'])} of parameters, gradients and AdamW "
             f"states, {_size(est['activations'])} of activations in one step, {_size(est['corpus'])} of corpus")
    where = "on the GPU" if device.type == "cuda" else "on the host"
    if free is None:
        return f"memory: estimated {per} ({parts}); not compared: the memory available is unknown ({how})"
    if need > free:
        raise DataError(f"{_size_flags(spec, rows, processes)}: expected a training that fits in the "
                        f"{_size(free)} of memory available {where} ({how}), got an estimated {per}"
                        f"{f' = {_size(need)}' if shared and processes > 1 else ''} ({parts}; the formula: "
                        f"docs/check.md, Memory); choose a smaller model, --batch or --seq-len")
    return f"memory: estimated {per} ({parts}) of {_size(free)} available {where}"
