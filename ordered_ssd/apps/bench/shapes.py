"""What the bench measures: the layers (Mamba-2, Mamba-3), the named shapes (Mamba-2's S1-S5 and grid G1-G13,
Mamba-3's M1-M6) and the modes, and their command-line syntax."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

MODES = ("native", "upstream-det", "literal", "ordered", "invariant")
IN_PROCESS_MODES = ("native", "literal", "ordered", "invariant")
#: the layers the bench measures (``--layer``): mamba-ssm's ``Mamba2`` against :class:`~ordered_ssd.OrderedMamba2`,
#: and its ``Mamba3`` (single-input single-output) against :class:`~ordered_ssd.modules.mamba3.OrderedMamba3`
LAYERS = ("mamba2", "mamba3")
LAYER_NAMES = {"mamba2": "Mamba-2", "mamba3": "Mamba-3"}
#: the modes of each layer, in canonical order: mamba-ssm has no deterministic mode for Mamba-3 (no upstream-det)
#: (``invariant``: ``OrderedMamba2`` with ``sequence_invariant = True``, Mamba-2 only, asked for by name)
LAYER_MODES = {"mamba2": MODES, "mamba3": ("native", "literal", "ordered")}
#: the modes a layer runs without ``--modes``
LAYER_DEFAULT_MODES = {"mamba2": ("native", "upstream-det", "literal", "ordered"),
                       "mamba3": ("native", "literal", "ordered")}
DTYPES = ("bf16", "fp16")  # the dtype of u/dout and of the autocast region, per shape (CUDA; the CPU runs fp32)


def torch_dtype(name: str):
    """``"bf16"`` / ``"fp16"`` / ``"fp32"`` -> the torch dtype. Raises ``ValueError`` for another name."""
    import torch

    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if name not in table:
        raise ValueError(f"dtype: expected one of {', '.join(table)}, got {name!r}")
    return table[name]


def result_layer(shape_result: dict) -> str:
    """The layer of a shape result (``bench.json``, a results file): its ``"layer"``, ``"mamba2"`` for results
    written before Mamba-3 was benched (they have none)."""
    return shape_result.get("layer") or (shape_result.get("shape") or {}).get("layer") or "mamba2"


@dataclass(frozen=True)
class Shape:
    """One benchmark problem: batch ``B``, sequence length ``L``, ``d_model``, state dim ``N``, groups ``G``,
    ``headdim``, ``chunk_size``, ``dtype`` (``"bf16"`` or ``"fp16"``) and ``layer`` (``"mamba2"`` or
    ``"mamba3"``, :data:`LAYERS`); ``expand`` 2 always, and for Mamba-2 ``d_conv`` 4, for Mamba-3 the layer's other
    defaults (``rope_fraction`` 0.5, no out-projection norm). On CUDA a Mamba-2 step runs fp32 parameters with
    ``u``/``dout`` and ``torch.autocast`` in ``dtype``; a Mamba-3 step the layer itself in ``dtype`` (``Mamba3`` and
    ``OrderedMamba3`` keep ``dt_bias``, ``B_bias``, ``C_bias`` and ``D`` in fp32), ``u``/``dout`` in ``dtype``, no
    autocast (``OrderedMamba3`` takes inputs of its weights' dtype only)."""

    name: str
    B: int
    L: int
    d_model: int
    N: int
    G: int
    headdim: int = 64
    chunk: int = 256
    dtype: str = "bf16"
    layer: str = "mamba2"

    @property
    def d_inner(self) -> int:
        """``expand * d_model`` (``expand`` 2)."""
        return 2 * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def rope_angles(self) -> int:
        """Mamba-3's rotary angles per position (``rope_fraction`` 0.5): ``d_state / 2`` rounded down to even,
        halved."""
        split = self.N // 2
        return (split - split % 2) // 2

    def projection_weights(self) -> Tuple[Tuple[int, int], Tuple[int, int]]:
        """The ``[out, in]`` shapes of the layer's two projection weights, as ``OrderedMamba2`` builds them:
        in_proj ``[2 * d_inner + 2 * G * N + nheads, d_model]`` and out_proj ``[d_model, d_inner]``; for Mamba-3
        (``OrderedMamba3``) in_proj ``[2 * d_inner + 2 * G * N + 3 * nheads + rope_angles, d_model]``."""
        extra = self.nheads if self.layer == "mamba2" else 3 * self.nheads + self.rope_angles
        return ((2 * self.d_inner + 2 * self.G * self.N + extra, self.d_model), (self.d_model, self.d_inner))

    def kernel_key(self) -> tuple:
        """Mamba-2: ``(chunk_size, headdim, d_state, dtype)``, what mamba-ssm's SSD autotuner keys most kernels on
        (with the tensors' dtypes), hence what costs native a full autotuning and ordered-ssd a compile. Mamba-3:
        ``(chunk_size, headdim, d_state, dtype, nheads / ngroups)``, what upstream's Mamba-3 SISO autotuners key on
        (``CHUNK_SIZE``, ``HEADDIM_V``, ``HEADDIM_QK`` and the rotary ``BLOCK_D`` it implies, the dtypes, and the
        rotary-bias kernel's ``GQA_RATIO``; their flags are the same in every bench step)."""
        key = (self.chunk, self.headdim, self.N, self.dtype)
        return key if self.layer == "mamba2" else key + (self.nheads // self.G,)

    def run_dtype(self, cuda: bool) -> str:
        """The dtype a step of this shape runs in: the shape's own on CUDA, ``"fp32"`` on the CPU (the reference
        path)."""
        return self.dtype if cuda else "fp32"

    def dims(self, dtype: Optional[str] = None) -> str:
        """``"B2 L2048 d1024 N128 G1 P64 cs256 bf16"``; ``dtype`` overrides the dtype shown (:meth:`run_dtype`)."""
        return (f"B{self.B} L{self.L} d{self.d_model} N{self.N} G{self.G} P{self.headdim} cs{self.chunk} "
                f"{dtype or self.dtype}")

    def spec(self) -> str:
        """The ``--shape`` text of this shape (the dtype only when it is not bf16)."""
        text = f"{self.B},{self.L},{self.d_model},{self.N},{self.G},{self.headdim},{self.chunk}"
        return text if self.dtype == "bf16" else f"{text},{self.dtype}"


SHAPES: Dict[str, Shape] = {s.name: s for s in (
    Shape("S1", 2, 2048, 1024, 128, 1),
    Shape("S2", 8, 4096, 2048, 128, 1),
    Shape("S3", 4, 4096, 4096, 128, 8),
    Shape("S4", 1, 65536, 1024, 128, 1),
    Shape("S5", 64, 512, 768, 64, 1),
)}

# The grid (--grid): the key space of issue 14 (B 1..64, L 512..16384, d_state 16..256, headdim 32..128, ngroups
# 1..8, chunk_size 64..256, bf16 and fp16) with 7 kernel keys (chunk, headdim, d_state, dtype) in all, two of them
# S1-S4's and S5's: every new key costs native a full autotuning (in the timed process) and every process a compile,
# so B, L, d_model and ngroups vary freely within a key instead. Peak memory of every row is a few GiB.
GRID: Dict[str, Shape] = {s.name: s for s in (
    Shape("G1", 64, 512, 256, 16, 1, 32, 64),             # (64, 32, 16, bf16): B 64, L 512
    Shape("G2", 4, 8192, 1024, 16, 4, 32, 64),
    Shape("G3", 4, 4096, 2048, 256, 8, 128, 128),         # (128, 128, 256, bf16): ngroups 8
    Shape("G4", 16, 1024, 1024, 256, 1, 128, 128),
    Shape("G5", 1, 16384, 2048, 128, 2, 64, 256),         # (256, 64, 128, bf16), S1-S4's key: B 1, L 16384
    Shape("G6", 32, 512, 1536, 128, 4, 64, 256),
    Shape("G7", 16, 2048, 1024, 64, 2, 64, 256),          # (256, 64, 64, bf16), S5's key
    Shape("G8", 8, 2048, 1024, 128, 1, 64, 256, "fp16"),  # (256, 64, 128, fp16)
    Shape("G9", 2, 16384, 768, 128, 2, 64, 256, "fp16"),
    Shape("G10", 32, 1024, 1024, 64, 1, 128, 64, "fp16"),  # (64, 128, 64, fp16)
    Shape("G11", 8, 4096, 2048, 64, 8, 128, 64, "fp16"),
    Shape("G12", 1, 8192, 4096, 32, 8, 32, 128, "fp16"),   # (128, 32, 32, fp16): 256 heads
    Shape("G13", 16, 2048, 512, 32, 1, 32, 128, "fp16"),
)}
NAMED: Dict[str, Shape] = {**SHAPES, **GRID}

# Mamba-3 (--layer mamba3), bf16. Native Mamba3 autotunes every one of its kernels at each new key (chunk_size,
# headdim, d_state, dtype, nheads / ngroups; Shape.kernel_key): about 230 candidate configurations per key, timed
# in the timed process's warm-up. So the six rows share three keys, two rows each, and vary B, L and d_model within
# a key (ngroups scaled with the heads, so that nheads / ngroups stays 32 and the rotary-bias kernel's key with it);
# the keys cover d_state 32, 64, 128, headdim 32 and 64, chunk 32 and 64: (32, 32, 32) is the shape of
# docs/mamba3.md's "Cost" (M1), (64, 64, 64) that of the GPU tests, (64, 64, 128) upstream's defaults.
MAMBA3_SHAPES: Dict[str, Shape] = {s.name: s for s in (
    Shape("M1", 8, 1024, 512, 32, 1, 32, 32, layer="mamba3"),     # (32, 32, 32, bf16, 32)
    Shape("M2", 2, 4096, 1024, 32, 2, 32, 32, layer="mamba3"),
    Shape("M3", 4, 2048, 1024, 64, 1, 64, 64, layer="mamba3"),    # (64, 64, 64, bf16, 32)
    Shape("M4", 16, 1024, 2048, 64, 2, 64, 64, layer="mamba3"),
    Shape("M5", 8, 2048, 1024, 128, 1, 64, 64, layer="mamba3"),   # (64, 64, 128, bf16, 32)
    Shape("M6", 1, 4096, 2048, 128, 2, 64, 64, layer="mamba3"),
)}
#: the named shapes of every layer (``--shapes``)
ALL_NAMED: Dict[str, Shape] = {**NAMED, **MAMBA3_SHAPES}
#: the named shapes of each layer, the default ones (those ``--shapes`` gives when neither it nor ``--shape`` is)
LAYER_DEFAULT_SHAPES = {"mamba2": SHAPES, "mamba3": MAMBA3_SHAPES}
#: ``headdim`` and ``chunk`` of a ``--shape`` that does not give them (each layer's constructor default chunk)
SHAPE_DEFAULTS = {"mamba2": (64, 256), "mamba3": (64, 64)}

SHAPE_FORMAT = "B,L,d_model,N,G[,headdim,chunk[,dtype]]"


def _parse_int(label: str, p: str, text: str) -> int:
    try:
        v = int(p)
    except ValueError:
        raise ValueError(f"--shape: {label} must be a positive integer, got {p!r} in {text!r}") from None
    if v < 1:
        raise ValueError(f"--shape: {label} must be a positive integer, got {v} in {text!r}")
    return v


def parse_shape(text: str, name: Optional[str] = None, layer: str = "mamba2") -> Shape:
    """Parse ``"B,L,d_model,N,G[,headdim,chunk[,dtype]]"`` (positive integers; headdim 64, chunk 256 (64 for
    ``layer`` ``"mamba3"``) and dtype bf16 by default; dtype ``bf16`` or ``fp16``) as a shape of ``layer``.

    Returns a :class:`Shape` named ``name`` (default: the normalised spec). Raises ``ValueError`` with a message
    naming the problem: not 5, 7 or 8 fields, a value < 1, an unknown dtype, ``headdim`` not dividing
    ``2 * d_model`` (expand 2), ``G`` not dividing the number of heads ``2 * d_model / headdim``, for Mamba-3
    ``N``, ``headdim`` or ``chunk`` not a power of two >= 16 (what ``OrderedMamba3``'s CUDA path takes), or an
    unknown ``layer``.
    """
    if layer not in LAYERS:
        raise ValueError(f"--layer: expected one of {', '.join(LAYERS)}, got {layer!r}")
    if not isinstance(text, str):
        raise ValueError(f"--shape: expected a string {SHAPE_FORMAT}, got {type(text).__name__}")
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (5, 7, 8):
        raise ValueError(f"--shape: expected {SHAPE_FORMAT} (5 or 7 comma-separated positive integers, then "
                         f"optionally a dtype), got {text!r}")
    vals = [_parse_int(label, p, text) for label, p in zip(("B", "L", "d_model", "N", "G", "headdim", "chunk"),
                                                            parts[:7])]
    B, L, d, N, G = vals[:5]
    headdim, chunk_size = (vals[5], vals[6]) if len(vals) == 7 else SHAPE_DEFAULTS[layer]
    dtype = parts[7].lower() if len(parts) == 8 else "bf16"
    if dtype not in DTYPES:
        raise ValueError(f"--shape: dtype must be one of {', '.join(DTYPES)}, got {parts[7]!r} in {text!r}")
    if (2 * d) % headdim:
        raise ValueError(f"--shape: headdim {headdim} must divide d_inner = 2 * d_model = {2 * d} in {text!r}")
    if ((2 * d) // headdim) % G:
        raise ValueError(f"--shape: G {G} must divide the number of heads 2 * d_model / headdim = {(2 * d) // headdim} "
                         f"in {text!r}")
    if layer == "mamba3":  # OrderedMamba3's CUDA path (and mamba-ssm's Mamba-3 kernels) take these only
        for label, v in (("N", N), ("headdim", headdim), ("chunk", chunk_size)):
            if v < 16 or v & (v - 1):
                raise ValueError(f"--shape: {label} must be a power of two >= 16 for Mamba-3 (mamba-ssm's Mamba-3 "
                                 f"kernels), got {v} in {text!r}")
    shape = Shape(name or "", B, L, d, N, G, headdim, chunk_size, dtype, layer)
    return shape if name else replace(shape, name=shape.spec())


def named_or_parsed_shape(text: str, names: Optional[Dict[str, Shape]] = None, layer: str = "mamba2") -> Shape:
    """A named shape of ``names`` (default :data:`NAMED`, Mamba-2's: ``"S2"``, ``"G3"``, any case) or a
    :func:`parse_shape` spec parsed as a shape of ``layer``. Raises ``ValueError`` as that does."""
    names = NAMED if names is None else names
    key = text.strip().upper()
    return names[key] if key in names else parse_shape(text, layer=layer)


def parse_shape_list(text: str) -> List[Shape]:
    """``"S1,S3,G2"`` -> the named shapes, in the order given (``grid`` stands for G1..G13; M1-M6 are Mamba-3's,
    for ``--layer mamba3``). Raises ``ValueError`` for an unknown or empty name."""
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--shapes: expected comma-separated names from {', '.join(ALL_NAMED)} or grid, got "
                         f"{text!r}")
    out: List[Shape] = []
    for n in names:
        key = n.upper()
        if key == "GRID":
            picked = list(GRID.values())
        elif key in ALL_NAMED:
            picked = [ALL_NAMED[key]]
        else:
            raise ValueError(f"--shapes: unknown shape {n!r}; known: {', '.join(ALL_NAMED)}, grid (use --shape "
                             f"{SHAPE_FORMAT} for any other)")
        out += [s for s in picked if s not in out]
    return out


def parse_modes(text: str) -> List[str]:
    """``"ordered,native"`` -> the modes in canonical order (native, upstream-det, literal, ordered, invariant; which of them a
    layer has: :data:`LAYER_MODES`). Raises ``ValueError`` for an unknown or empty name."""
    names = [n.strip().lower() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--modes: expected comma-separated names from {', '.join(MODES)}, got {text!r}")
    for n in names:
        if n not in MODES:
            raise ValueError(f"--modes: unknown mode {n!r}; known: {', '.join(MODES)}")
    return [m for m in MODES if m in names]
