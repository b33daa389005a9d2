"""The SHA-256 hashing process of :class:`ordered_ssd.apps.check.digests.StepDigests` (standard library only).

Hashing a step's tensors in threads of the training process costs the training thread the GIL: ``hashlib`` releases
it while it hashes, but every tensor's hash takes it back twice (to start and to finish), and a training loop that
launches kernels from Python holds it nearly all the time, so each hand-over stalls one of them. This process hashes
instead, with its own GIL: the training process writes each step's bytes into shared memory and asks for the digests
of its spans in one line; the only GIL the training process gives up is its coordinating thread's, a few times a
submission.

Run by :class:`StepDigests` as ``python -I sha256_worker.py THREADS FD [FD ...]`` in a session of its own (by path, so
that importing it imports neither torch nor ordered_ssd; a Ctrl-C at the terminal reaches the training process only):
each ``FD`` is a file descriptor (inherited) of a shared buffer. Protocol, one JSON line per message: a request
``[buffer index, [[offset, nbytes], ...]]`` on stdin, its answer on stdout, in order: the hex SHA-256 of each span,
in the order given. End of stdin ends the process (so does the training process's death: its end of the pipe
closes).
"""
import hashlib
import json
import mmap
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import List, Sequence, Tuple

__all__ = ["hashing_groups", "sha256_spans", "sha256_group", "main"]


def hashing_groups(nbytes: Sequence[int], count: int) -> List[List[int]]:
    """The indices ``0..len(nbytes)-1`` in at most ``count`` groups of about equal bytes: largest first, each to the
    group with the fewest bytes so far (ties: the lower index), each group's indices ascending; empty groups left
    out. One hashing task per group, so that a step's tensors cost a few tasks rather than one per tensor; each
    tensor's digest is its own whatever its group."""
    k = max(1, min(count, len(nbytes)))
    loads = [0] * k
    groups: List[List[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        j = min(range(k), key=lambda j: (loads[j], j))
        groups[j].append(i)
        loads[j] += nbytes[i]
    return [sorted(g) for g in groups if g]


def sha256_group(buf: memoryview, spans: Sequence[Tuple[int, int]]) -> List[str]:
    """SHA-256 of each ``(offset, nbytes)`` span of ``buf``, in order (each span a slice of the one memoryview: no
    copy; ``hashlib`` hashes it with the GIL released)."""
    return [hashlib.sha256(buf[off:off + n]).hexdigest() for off, n in spans]


def sha256_spans(pool: ThreadPoolExecutor, threads: int, buf: memoryview,
                 spans: Sequence[Tuple[int, int]]) -> List[str]:
    """SHA-256 of each span of ``buf``, in order, hashed by ``pool`` in at most ``threads`` tasks of about equal
    bytes (:func:`hashing_groups`)."""
    tasks = [(group, pool.submit(sha256_group, buf, [spans[i] for i in group]))
             for group in hashing_groups([n for _, n in spans], threads)]
    out = [""] * len(spans)
    for group, task in tasks:
        for i, digest in zip(group, task.result()):
            out[i] = digest
    return out


def main(argv: Sequence[str]) -> int:
    threads, fds = int(argv[0]), [int(fd) for fd in argv[1:]]
    maps = [mmap.mmap(fd, 0, prot=mmap.PROT_READ) for fd in fds]
    views = [memoryview(m) for m in maps]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ordered-ssd-sha256") as pool:
        for line in sys.stdin:
            index, spans = json.loads(line)
            sys.stdout.write(json.dumps(sha256_spans(pool, threads, views[index], spans)) + "\n")
            sys.stdout.flush()
    for v in views:
        v.release()
    for m in maps:
        m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
