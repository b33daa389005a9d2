"""What the bench measures: the named shapes and the modes, and their command-line syntax."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

MODES = ("native", "upstream-det", "literal", "ordered")
IN_PROCESS_MODES = ("native", "literal", "ordered")


@dataclass(frozen=True)
class Shape:
    """One benchmark problem: batch ``B``, sequence length ``L``, ``d_model``, state dim ``N``, groups ``G``,
    ``headdim`` and ``chunk_size`` (``d_conv`` 4 and ``expand`` 2 always)."""

    name: str
    B: int
    L: int
    d_model: int
    N: int
    G: int
    headdim: int = 64
    chunk: int = 256

    @property
    def nheads(self) -> int:
        return 2 * self.d_model // self.headdim

    def dims(self) -> str:
        return f"B{self.B} L{self.L} d{self.d_model} N{self.N} G{self.G} P{self.headdim} cs{self.chunk}"

    def spec(self) -> str:
        return f"{self.B},{self.L},{self.d_model},{self.N},{self.G},{self.headdim},{self.chunk}"


SHAPES: Dict[str, Shape] = {s.name: s for s in (
    Shape("S1", 2, 2048, 1024, 128, 1),
    Shape("S2", 8, 4096, 2048, 128, 1),
    Shape("S3", 4, 4096, 4096, 128, 8),
    Shape("S4", 1, 65536, 1024, 128, 1),
    Shape("S5", 64, 512, 768, 64, 1),
)}


SHAPE_FORMAT = "B,L,d_model,N,G[,headdim,chunk]"


def parse_shape(text: str, name: Optional[str] = None) -> Shape:
    """Parse ``"B,L,d_model,N,G[,headdim,chunk]"`` (positive integers; headdim 64 and chunk 256 by default).

    Returns a :class:`Shape` named ``name`` (default: the normalised spec). Raises ``ValueError`` with a message
    naming the problem: not 5 or 7 integers, a value < 1, ``headdim`` not dividing ``2 * d_model`` (expand 2), or
    ``G`` not dividing the number of heads ``2 * d_model / headdim``.
    """
    if not isinstance(text, str):
        raise ValueError(f"--shape: expected a string {SHAPE_FORMAT}, got {type(text).__name__}")
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (5, 7):
        raise ValueError(f"--shape: expected {SHAPE_FORMAT} (5 or 7 comma-separated positive integers), "
                         f"got {text!r}")
    vals = []
    for label, p in zip(("B", "L", "d_model", "N", "G", "headdim", "chunk"), parts):
        try:
            v = int(p)
        except ValueError:
            raise ValueError(f"--shape: {label} must be a positive integer, got {p!r} in {text!r}") from None
        if v < 1:
            raise ValueError(f"--shape: {label} must be a positive integer, got {v} in {text!r}")
        vals.append(v)
    B, L, d, N, G = vals[:5]
    headdim, chunk_size = (vals[5], vals[6]) if len(vals) == 7 else (64, 256)
    if (2 * d) % headdim:
        raise ValueError(f"--shape: headdim {headdim} must divide d_inner = 2 * d_model = {2 * d} in {text!r}")
    if ((2 * d) // headdim) % G:
        raise ValueError(f"--shape: G {G} must divide the number of heads 2 * d_model / headdim = {(2 * d) // headdim} "
                         f"in {text!r}")
    shape = Shape(name or "", B, L, d, N, G, headdim, chunk_size)
    return shape if name else Shape(shape.spec(), B, L, d, N, G, headdim, chunk_size)


def named_or_parsed_shape(text: str) -> Shape:
    """A named shape (``"S2"``, any case) or a :func:`parse_shape` spec. Raises ``ValueError`` as that does."""
    key = text.strip().upper()
    return SHAPES[key] if key in SHAPES else parse_shape(text)


def parse_shape_list(text: str) -> List[Shape]:
    """``"S1,S3"`` -> the named shapes, in the order given. Raises ``ValueError`` for an unknown or empty name."""
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--shapes: expected comma-separated names from {', '.join(SHAPES)}, got {text!r}")
    out = []
    for n in names:
        key = n.upper()
        if key not in SHAPES:
            raise ValueError(f"--shapes: unknown shape {n!r}; known: {', '.join(SHAPES)} (use --shape "
                             f"{SHAPE_FORMAT} for any other)")
        if SHAPES[key] not in out:
            out.append(SHAPES[key])
    return out


def parse_modes(text: str) -> List[str]:
    """``"ordered,native"`` -> the modes in canonical order (native, upstream-det, literal, ordered).
    Raises ``ValueError`` for an unknown or empty name."""
    names = [n.strip().lower() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--modes: expected comma-separated names from {', '.join(MODES)}, got {text!r}")
    for n in names:
        if n not in MODES:
            raise ValueError(f"--modes: unknown mode {n!r}; known: {', '.join(MODES)}")
    return [m for m in MODES if m in names]
