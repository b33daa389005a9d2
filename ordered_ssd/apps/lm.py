"""A small byte-level Mamba-2 (or Mamba-3) language model and its data, for the ``ordered-ssd check`` main job.

Model: token embedding (256 bytes) -> ``n_layers`` x [RMSNorm -> mixer, residual] -> RMSNorm -> tied head.
The mixer is :class:`ordered_ssd.OrderedMamba2` or, as a control, mamba-ssm's ``Mamba2`` (same constructor); with
``ModelConfig.layer = "mamba3"``, :class:`ordered_ssd.modules.mamba3.OrderedMamba3` or mamba-ssm's ``Mamba3``.
The embedding lookup and the tied head are matmuls with a one-hot matrix / the embedding matrix, and the
loss is a plain log-softmax sum: no scatter/index-add kernels whose backward might use atomics.

Data: bytes of real text. By default the ``.py`` files of the Python standard library found on this
machine (sorted by path relative to the stdlib root, ``site-packages`` excluded, concatenated), up to a
byte budget; or a user file / directory. The last ``val_fraction`` of the bytes is the validation split.
The training batch of step ``s`` is a pure function of ``(seed, s)``: windows at offsets drawn from a
``torch.Generator`` seeded with ``seed`` and ``s``, so the data position of a run is just its step.
"""
from __future__ import annotations

import os
import stat
import sysconfig
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..digest import tensor_sha256
from .errors import plural

VOCAB = 256


class DataError(ValueError):
    """The training data cannot be read or is unusable (message is one line for the CLI)."""


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 64
    n_layers: int = 2
    d_state: int = 16
    headdim: int = 16
    ngroups: int = 1
    chunk_size: int = 32
    expand: int = 2
    #: the mixer's kind: ``"mamba2"`` or ``"mamba3"`` (a spec's ``model`` names it only when it is not mamba2)
    layer: str = "mamba2"

    def mixer_kwargs(self) -> dict:
        return dict(d_model=self.d_model, d_state=self.d_state, headdim=self.headdim, ngroups=self.ngroups,
                    chunk_size=self.chunk_size, expand=self.expand)


class ByteLM(nn.Module):
    """Byte-level language model: ``forward(tokens [B, L] int64) -> logits [B, L, 256]``."""

    def __init__(self, cfg: ModelConfig, mixer_cls, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.embedding = nn.Parameter(torch.randn(VOCAB, cfg.d_model, **factory) * 0.02)
        self.norms = nn.ModuleList([nn.RMSNorm(cfg.d_model, eps=1e-5, **factory) for _ in range(cfg.n_layers)])
        self.mixers = nn.ModuleList([mixer_cls(**cfg.mixer_kwargs(), layer_idx=i, **factory)
                                     for i in range(cfg.n_layers)])
        self.norm_f = nn.RMSNorm(cfg.d_model, eps=1e-5, **factory)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = F.one_hot(tokens, VOCAB).to(self.embedding.dtype) @ self.embedding
        for norm, mixer in zip(self.norms, self.mixers):
            h = h + mixer(norm(h))
        return self.norm_f(h) @ self.embedding.t()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy in fp32 (log-softmax times a one-hot mask; no gather/scatter). The logits'
    last dimension is the vocabulary (256 for the byte LM; a Hugging Face model's may be larger)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp * F.one_hot(targets, logits.shape[-1]).to(logp.dtype)).sum(-1).mean()


# ----------------------------------------------------------------------------------------------- data
def batch_to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (a batch on the CPU) copied to ``device`` without making the host wait for the device.

    On CUDA the copy goes from pinned (page-locked) host memory with ``non_blocking=True``: a copy from pageable
    memory makes PyTorch synchronise the stream, so the host would wait, every step, for the device to finish the
    previous step before it could queue the next one. The pinned buffer comes from PyTorch's caching host
    allocator, which does not reuse it until the copy has run. The result is contiguous, with ``tensor``'s values:
    the layout of ``tensor.to(device)`` for a batch (a strided view of its windows, not dense), but contiguous also
    where ``.to`` would keep a dense tensor's strides. Elsewhere ``tensor.to(device)``.
    """
    if device.type == "cuda":
        pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        pinned.copy_(tensor)
        return pinned.to(device, non_blocking=True)
    return tensor.to(device)


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def _python_files(root: str) -> List[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
        found.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: os.path.relpath(p, root))


def _is_special(path: str) -> bool:
    """Whether ``path`` (symlinks followed) is there but not a regular file: a FIFO, a device, a socket (reading
    one can block forever). A path that cannot be stat-ed is not special: reading it gives the error."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _unreadable_folder(e: OSError) -> None:
    """``os.walk``'s ``onerror``: a folder of ``--data`` that cannot be listed is an error, not a silent skip."""
    raise DataError(f"--data: expected a readable folder, got {e.filename}: {e.strerror}")


def _text_files(root: str, skipped: Optional[List[str]] = None) -> List[str]:
    """The non-hidden files under ``root``, sorted by relative path; special files (:func:`_is_special`) are left
    out and appended to ``skipped``.

    Raises:
        DataError: a folder under ``root`` cannot be listed (e.g. no permission)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_unreadable_folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in filenames:
            if f.startswith("."):
                continue
            path = os.path.join(dirpath, f)
            if _is_special(path):
                if skipped is not None:
                    skipped.append(os.path.relpath(path, root))
            else:
                found.append(path)
    return sorted(found, key=lambda p: os.path.relpath(p, root))


#: A user's ``--data`` file is binary (not text) if a NUL byte occurs in its first this many bytes (the heuristic
#: of git and GNU grep).
BINARY_SNIFF_BYTES = 8000


def _has_text(path: str, sniff: bool) -> bool:
    """Whether :func:`load_corpus` would take bytes from file ``path``: it is readable and not empty, and (with
    ``sniff``) has no NUL byte in its first :data:`BINARY_SNIFF_BYTES` bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(BINARY_SNIFF_BYTES)
    except OSError:
        return False
    return bool(head) and not (sniff and b"\0" in head)


#: :func:`load_corpus` reads a file in pieces of at most this many bytes (never the whole ``--data-bytes`` at once)
READ_CHUNK = 1 << 20

#: Memory :func:`load_corpus` and :class:`ByteData` hold per corpus byte at their peak: the pieces read, the joined
#: corpus, and :class:`ByteData`'s copy (its train and validation tensors are views of it).
CORPUS_MEMORY_PER_BYTE = 3


def _read_upto(f: str, limit: int) -> Tuple[bytes, bool]:
    """At most ``limit`` bytes of file ``f`` read in pieces of :data:`READ_CHUNK`, and whether bytes were left."""
    pieces, got = [], 0
    with open(f, "rb") as fh:
        while got < limit:
            piece = fh.read(min(READ_CHUNK, limit - got))
            if not piece:
                return b"".join(pieces), False
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces), fh.read(1) != b""


def _planned_bytes(files: List[str], max_bytes: int) -> int:
    """How many bytes :func:`load_corpus` would read from ``files`` (their sizes, up to ``max_bytes`` in all)."""
    total = 0
    for f in files:
        if total >= max_bytes:
            break
        try:
            total += min(os.stat(f).st_size, max_bytes - total)
        except OSError:
            continue  # reading it gives the error
    return total


def load_corpus(path: Optional[str], max_bytes: int, memory: Optional[int] = None) -> Tuple[bytes, str, bool]:
    """Bytes of the corpus (at most ``max_bytes``), a description of where they came from, and whether the
    ``max_bytes`` limit (``--data-bytes``) cut it: True where the last file read had bytes left, or a file left
    unread would have given bytes (readable, not empty, not binary).

    Files are read in pieces of :data:`READ_CHUNK` bytes up to the limit: memory follows the bytes there are, not
    ``max_bytes`` (a corpus smaller than ``max_bytes`` is read whole). With ``memory`` (bytes available), the files'
    sizes are added up first and a corpus that would need more than that (:data:`CORPUS_MEMORY_PER_BYTE` per byte)
    is refused before anything is read.

    Raises:
        DataError: the path does not exist, is a special file (FIFO, device, socket), cannot be read (a file, or a
            folder that cannot be listed), is a binary file (a NUL byte in the first :data:`BINARY_SNIFF_BYTES`
            bytes read), holds no bytes, or would not fit in ``memory``. In a directory, special files and binary
            files are skipped and named in the description.
    """
    if path is None:
        root = stdlib_root()
        files = _python_files(root)
        where = f"Python standard library at {root}"
        source = f"{where} ({len(files)} .py files, sorted by path)"
    elif os.path.isfile(path):
        root, files = os.path.dirname(path), [path]
        source = where = f"file {path}"
    elif os.path.isdir(path):
        skipped: List[str] = []
        root, files = path, _text_files(path, skipped)
        where = f"directory {path}"
        source = f"{where} ({plural(len(files), 'file')}, sorted by path)"
        if skipped:
            skipped.sort()
            kinds = "a FIFO, device or socket" if len(skipped) == 1 else "FIFOs, devices or sockets"
            source = (f"directory {path} ({plural(len(files), 'file')}, sorted by path; skipped "
                      f"{plural(len(skipped), 'special file')} ({kinds}): "
                      f"{', '.join(skipped[:5])}{', ...' if len(skipped) > 5 else ''})")
    elif _is_special(path):
        raise DataError(f"--data: expected a regular file or a directory, got {path} (a FIFO, device or socket)")
    else:
        raise DataError(f"--data: expected an existing file or directory, got {path} (no such file or directory)")
    if memory is not None:
        planned = _planned_bytes(files, max_bytes)
        if planned * CORPUS_MEMORY_PER_BYTE > memory:
            fits = memory // CORPUS_MEMORY_PER_BYTE
            raise DataError(f"--data-bytes: expected at most {fits} bytes, what fits in the {memory} bytes "
                            f"({memory / 2**30:.1f} GiB) of memory available ({CORPUS_MEMORY_PER_BYTE} bytes per "
                            f"corpus byte), got {max_bytes}, which would read {planned} bytes of the {where}")
    chunks, total, binary, cut = [], 0, [], False
    for k, f in enumerate(files):
        if total >= max_bytes:
            cut = any(_has_text(g, sniff=path is not None) for g in files[k:])  # a file left unread had bytes to use
            break
        try:
            data, more = _read_upto(f, max_bytes - total)
        except OSError as e:
            raise DataError(f"--data: expected a readable file, got {f}: {e.strerror}") from None
        nul = data.find(b"\0", 0, BINARY_SNIFF_BYTES) if path is not None else -1
        if nul >= 0:
            if len(files) == 1 and files[0] == path:  # --data names this file
                raise DataError(f"--data: expected a text file, got binary data in {f} (a NUL byte at offset {nul})")
            binary.append(os.path.relpath(f, root))
            continue
        chunks.append(data)
        total += len(data)
        cut = more  # the last file read decides, where no file is left unread
    if binary:
        source += (f"; skipped {plural(len(binary), 'binary file')}, with a NUL byte in the first {BINARY_SNIFF_BYTES} "
                   f"bytes: {', '.join(binary[:5])}{', ...' if len(binary) > 5 else ''}")
    corpus = b"".join(chunks)
    if not corpus:
        raise DataError(f"--data: expected some bytes to train on, got 0 bytes in {source}")
    return corpus, source, cut


class ByteData:
    """Train/validation split of a byte corpus and the deterministic batch of every step."""

    def __init__(self, corpus: bytes, seq_len: int, val_fraction: float = 0.05, cut: bool = False):
        """``cut``: :func:`load_corpus` cut the corpus at ``--data-bytes`` (then a too short corpus names that flag,
        else ``--data``)."""
        data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)  # one byte per byte; int64 per batch
        n_val = max(seq_len + 1, int(len(data) * val_fraction))
        if len(data) < n_val + seq_len + 1:
            flag = "--data-bytes" if cut else "--data"
            raise DataError(f"{flag}: too little data for --seq-len {seq_len}: expected at least "
                            f"{n_val + seq_len + 1} bytes, got {len(data)}")
        self.train, self.val = data[:-n_val], data[-n_val:]
        self.seq_len = seq_len
        self.sha256 = tensor_sha256(data)
        self.n_bytes = len(data)

    def starts(self, seed: int, step: int, batch_size: int) -> torch.Tensor:
        """The start of every row's window of step ``step``'s batch, uniform over the ``last + 1`` windows
        ``0 .. last`` (``last = len(train) - seq_len - 1``, the last window ends at the last training byte).

        Drawn as in earlier versions: ``randint(0, last)`` (which never gives ``last``), then a second draw
        ``randint(0, last + 1)`` per row replaces the row's start by ``last`` where it gives ``last``, so every
        window has probability ``1 / (last + 1)``; a row's window differs from the earlier versions' only where
        the second draw hits (probability ``1 / (last + 1)``). With ``last == 0`` (the smallest corpus) every row
        is window 0.
        """
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        last = len(self.train) - self.seq_len - 1
        if last > 0:
            starts = torch.randint(0, last, (batch_size,), generator=generator)
        else:
            starts = torch.zeros(batch_size, dtype=torch.int64)
        hit = torch.randint(0, last + 1, (batch_size,), generator=generator) == last
        return torch.where(hit, torch.full_like(starts, last), starts)

    def batch(self, seed: int, step: int, batch_size: int, offset: int = 0, count: Optional[int] = None):
        """Inputs and targets ``[count, seq_len]`` of rows ``offset .. offset+count`` of step ``step``'s batch."""
        starts = self.starts(seed, step, batch_size)
        count = batch_size if count is None else count
        starts = starts[offset:offset + count]
        idx = starts[:, None] + torch.arange(self.seq_len + 1)
        win = self.train[idx].to(torch.int64)
        return win[:, :-1], win[:, 1:]

    def val_windows(self) -> int:
        """The number of non-overlapping validation windows of ``seq_len + 1`` bytes."""
        return (len(self.val) - 1) // self.seq_len

    def val_batches(self, batch_size: int, max_windows: Optional[int] = None):
        """Non-overlapping validation windows, in order: all of them, or with ``max_windows`` at most that many,
        spread evenly over the validation split (window ``floor(i * n / max_windows)`` for ``i < max_windows``)."""
        seq_len = self.seq_len
        n_windows = self.val_windows()
        if max_windows is not None and max_windows < n_windows:
            starts = (torch.arange(max_windows) * n_windows // max_windows) * seq_len
        else:
            starts = torch.arange(n_windows) * seq_len
        n_windows = len(starts)
        for i in range(0, n_windows, batch_size):
            idx = starts[i:i + batch_size, None] + torch.arange(seq_len + 1)
            win = self.val[idx].to(torch.int64)
            yield win[:, :-1], win[:, 1:]

