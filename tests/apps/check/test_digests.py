"""``StepDigests``: the asynchronous digests equal ``tensor_sha256`` of each tensor as it was at ``submit``, whatever
happens to the tensors afterwards, with several steps in flight."""
import pytest
import torch

from ordered_ssd.apps.check.digests import StepDigests
from ordered_ssd.digest import tensor_sha256


def _tensors(g):
    return {"w": torch.randn(5, 3, generator=g), "none": None,
            "strided": torch.randn(9, generator=g, dtype=torch.float64)[::2],
            "empty": torch.zeros(0), "ints": torch.randint(0, 9, (4,), generator=g), "half": torch.randn(3).half(),
            # contiguous, but of stride != 1 along a last dimension of size 1 (view as uint8 refuses them)
            "column": torch.randn(1, 3, generator=g).t(), "single": torch.randn(2, generator=g)[::2]}


@pytest.mark.parametrize("hasher", ["process", "threads"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_digests_are_those_of_the_tensors_at_submit(depth, hasher):
    g = torch.Generator().manual_seed(0)
    ts = _tensors(g)
    expected, keys = [], []
    with StepDigests(torch.device("cpu"), depth=depth, threads=2, hasher=hasher) as digests:
        for _ in range(6):
            keys.append(digests.submit(ts))
            expected.append({k: "none" if v is None else tensor_sha256(v) for k, v in ts.items()})
            for v in ts.values():  # the next "step" changes every tensor in place
                if v is not None and v.numel():
                    v.add_(1)
        got = [r.sha256 for r in digests.results(keys)]
    assert got == expected
    assert len({d["w"] for d in got}) == 6 and all(d["none"] == "none" for d in got)
    assert got[0]["empty"] == tensor_sha256(torch.zeros(0))


def test_bad_values_are_refused_by_name():
    with StepDigests(torch.device("cpu")) as digests:
        with pytest.raises(TypeError, match=r"tensors\['x'\]: expected a tensor or None, got list"):
            digests.submit({"x": [1.0]})
        with pytest.raises(ValueError, match=r"tensors\['x'\]: expected a tensor on cpu, got meta"):
            digests.submit({"x": torch.zeros(2, device="meta")})
    with pytest.raises(ValueError, match="depth, threads: expected >= 1, got 0, 4"):
        StepDigests(torch.device("cpu"), depth=0, threads=4)
    with pytest.raises(ValueError, match="hasher: expected 'process' or 'threads', got 'gpu'"):
        StepDigests(torch.device("cpu"), hasher="gpu")


@pytest.mark.parametrize("cores, threads", [(1, 4), (2, 4), (8, 4), (12, 6), (16, 8), (64, 8)])
def test_default_hashing_threads_follow_the_cores(monkeypatch, cores, threads):
    import os

    from ordered_ssd.apps.check.digests import default_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert default_threads() == threads


def test_norms_are_the_float64_norms_at_submit():
    g = torch.Generator().manual_seed(2)
    ts = {"w": torch.randn(4, 5, generator=g), "b": torch.randn(3, generator=g).to(torch.bfloat16), "none": None,
          "ints": torch.arange(3)}
    with StepDigests(torch.device("cpu")) as digests:
        key = digests.submit(ts, norms=True)
        expected = {k: "none" if v is None or not v.is_floating_point() else float(v.double().norm()).hex()
                    for k, v in ts.items()}
        ts["w"].mul_(2)
        plain = digests.submit(ts)
        got, without = digests.result(key), digests.result(plain)
    assert got.norms == expected and got.norms["w"] != float(ts["w"].double().norm()).hex()
    assert without.norms == {} and without.sha256["w"] == tensor_sha256(ts["w"])


def test_device_norms_group_the_snapshot_and_equal_each_tensors_float64_norm(monkeypatch):
    """:func:`device_norms` (the CUDA path's norms, run here on a CPU buffer): per span the float64 L2 norm of its
    bytes as its dtype, in the order given, whether the span was widened with its neighbours (same dtype, touching or
    apart by less than ``SPAN_ALIGN`` bytes of padding), alone (another dtype, or the group full), or in pieces (more
    than ``NORM_GROUP_ELEMENTS`` elements); the same bytes give the same bits."""
    from ordered_ssd.apps.check import norms

    g = torch.Generator().manual_seed(5)
    ts = [torch.randn(2, generator=g, dtype=torch.float64), torch.zeros(0), torch.randn(6, generator=g),
          torch.randn(5, generator=g), torch.randn(40, generator=g), torch.randn(7, generator=g) * 1e30,
          torch.randn(3, generator=g).to(torch.bfloat16), torch.randn(4, generator=g).half()]
    raw = [t.reshape(-1).view(torch.uint8) for t in ts]
    gap = torch.zeros(8, dtype=torch.uint8)  # bytes of a non-floating tensor between two float32 spans
    parts, spans, off = [], [], 0
    for i, (t, r) in enumerate(zip(ts, raw)):
        if i == 5:
            parts.append(gap)
            off += gap.numel()
        parts.append(r)
        spans.append((off, r.numel(), t.dtype))
        off += r.numel()
    snap = torch.cat(parts)
    want = [torch.linalg.vector_norm(t, dtype=torch.float64) for t in ts]
    for cap in (1 << 23, 16, 5):  # 16: the 40-element span in 3 pieces; 5: every float32 span alone or in pieces
        monkeypatch.setattr(norms, "NORM_GROUP_ELEMENTS", cap)
        got = norms.device_norms(snap, spans)
        assert got.dtype == torch.float64 and got.shape == (len(ts),)
        for i, (a, b) in enumerate(zip(got.tolist(), want)):
            assert a == pytest.approx(float(b), rel=1e-13, abs=0.0), (cap, i)
        again = norms.device_norms(snap.clone(), spans)
        assert torch.equal(got.view(torch.int64), again.view(torch.int64)), cap
    assert norms.device_norms(snap, []).shape == (0,)


def test_spans_of_any_dtypes_are_aligned_in_the_snapshot():
    """A 16-bit tensor of odd length before a float32 one (and a float32 one of odd length before a float64 one):
    each span starts at a multiple of ``SPAN_ALIGN`` bytes, so the norms can view it as its dtype; the digests are
    still the tensors' own."""
    from ordered_ssd.apps.check.digests import SPAN_ALIGN, device_norms

    g = torch.Generator().manual_seed(9)
    ts = {"a": torch.randn(3, generator=g).to(torch.bfloat16), "b": torch.randn(2, generator=g),
          "c": torch.randn(5, generator=g), "d": torch.randn(3, generator=g, dtype=torch.float64),
          "e": torch.randn(7, generator=g).half()}
    with StepDigests(torch.device("cpu")) as digests:
        got = digests.result(digests.submit(ts, norms=True))
    for name, t in ts.items():
        assert got.sha256[name] == tensor_sha256(t), name
        assert got.norms[name] == float(t.double().norm()).hex(), name
    # the snapshot's layout as submit builds it: offsets rounded up to SPAN_ALIGN, the padding between
    parts, spans, off = [], [], 0
    for t in ts.values():
        pad = -off % SPAN_ALIGN
        parts.append(torch.zeros(pad, dtype=torch.uint8))
        off += pad
        raw = t.reshape(-1).view(torch.uint8)
        parts.append(raw)
        spans.append((off, raw.numel(), t.dtype))
        off += raw.numel()
    norms = device_norms(torch.cat(parts), spans)
    for (name, t), v in zip(ts.items(), norms.tolist()):
        assert v == pytest.approx(float(t.double().norm()), rel=1e-13, abs=0.0), name


@pytest.mark.parametrize("nbytes, count, groups", [
    ([10, 10, 10, 10], 2, [[0, 2], [1, 3]]),
    ([100, 1, 1, 1], 2, [[0], [1, 2, 3]]),
    ([1, 1, 1, 100], 4, [[3], [0], [1], [2]]),
    ([5, 0, 5], 8, [[0], [2], [1]]),
    ([7, 3, 3, 3, 2, 2], 2, [[0, 4, 5], [1, 2, 3]]),
    ([], 4, []),
])
def test_hashing_groups_are_of_about_equal_bytes(nbytes, count, groups):
    from ordered_ssd.apps.check.digests import hashing_groups

    assert hashing_groups(nbytes, count) == groups


@pytest.mark.parametrize("hasher", ["process", "threads"])
def test_grouped_hashing_keeps_every_tensors_digest(hasher):
    """Many tensors of mixed sizes over 3 threads (fewer tasks than tensors): each digest is its own tensor's."""
    g = torch.Generator().manual_seed(4)
    ts = {f"t{i}": torch.randn(int(n), generator=g) for i, n in enumerate([1, 70_000, 3, 0, 5_000, 2, 90_000, 7])}
    ts["none"] = None
    with StepDigests(torch.device("cpu"), threads=3, hasher=hasher) as digests:
        got = digests.result(digests.submit(ts)).sha256
    assert got == {k: "none" if v is None else tensor_sha256(v) for k, v in ts.items()}
    assert len(set(got.values())) == len(got)


def test_hashing_groups_balance_the_check_models_tensors():
    """At most ``count`` groups, every index once, none far above the mean: the 74 tensors of the GPU check's
    model (8 layers of in_proj, conv, dt_bias, A_log, D, norm, out_proj, layer norm; embedding and head)."""
    from ordered_ssd.apps.check.digests import hashing_groups

    layer = [2192 * 512 * 4, 1152 * 4 * 4, 1152 * 4, 16 * 4, 16 * 4, 16 * 4, 1024 * 4, 512 * 1024 * 4, 512 * 4]
    nbytes = [256 * 512 * 4] + layer * 8 + [256 * 512 * 4]
    groups = hashing_groups(nbytes, 8)
    assert sorted(i for g in groups for i in g) == list(range(len(nbytes))) and len(groups) == 8
    sizes = [sum(nbytes[i] for i in g) for g in groups]
    assert max(sizes) <= 1.2 * sum(nbytes) / 8, sizes


def test_a_larger_submission_replaces_the_buffers_and_the_hashing_process():
    """Submissions growing (a gradient that was None, then a larger model's tensors), shrinking and growing again,
    several in flight: every digest is still its own tensor's; the buffers and the hashing process are replaced only
    when a submission is larger than any before, the old process ended."""
    g = torch.Generator().manual_seed(6)
    sizes = [3, 10, 10, 2, 5000, 7, 5000, 20000]
    with StepDigests(torch.device("cpu"), depth=2, threads=2, hasher="process") as digests:
        keys, expected, procs = [], [], []
        for i, n in enumerate(sizes):
            ts = {"a": torch.randn(n, generator=g), "b": None if i == 0 else torch.randn(n // 2 + 1, generator=g)}
            keys.append(digests.submit(ts))
            expected.append({k: "none" if v is None else tensor_sha256(v) for k, v in ts.items()})
            if not procs or procs[-1] is not digests._worker.proc:
                procs.append(digests._worker.proc)
        assert [r.sha256 for r in digests.results(keys)] == expected
        assert len(procs) == 4  # sizes 3 (b None), 10, 5000, 20000
        assert all(p.poll() == 0 for p in procs[:-1])
        last = procs[-1]
    assert last.poll() == 0  # close ended it


def test_a_dead_hashing_process_is_an_error_not_a_hang():
    """The hashing process killed: the result of each submission it did not answer raises ``RuntimeError`` naming
    it (later submissions reusing the failed ones' slots still go in), and close() returns; a submission after
    close() is refused, starting nothing. The process runs in a session of its own (a Ctrl-C at the terminal is the
    training's)."""
    import os

    g = torch.Generator().manual_seed(7)
    digests = StepDigests(torch.device("cpu"), depth=2, threads=1, hasher="process")
    ok = digests.submit({"w": torch.randn(100, generator=g)})
    assert digests.result(ok).sha256["w"]
    proc = digests._worker.proc
    assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    proc.kill()
    proc.wait()
    keys = [digests.submit({"w": torch.randn(100, generator=g)}) for _ in range(5)]
    for key in keys:
        with pytest.raises(RuntimeError, match=r"the SHA-256 hashing process \(pid \d+\) exited with code -9"):
            digests.result(key)
    digests.close()
    with pytest.raises(RuntimeError, match=r"StepDigests: submit after close\(\)"):
        digests.submit({"w": torch.zeros(3)})
    assert digests._worker is None


def test_the_hashing_process_imports_neither_torch_nor_ordered_ssd():
    """The worker script runs by path in an isolated interpreter: its imports are the standard library's (it starts
    in a fraction of torch's import time and cannot touch CUDA)."""
    import ast

    from ordered_ssd.apps.check.digests import WORKER_SCRIPT

    tree = ast.parse(open(WORKER_SCRIPT).read())
    imported = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"hashlib", "json", "mmap", "sys", "concurrent", "typing"}


def test_a_hashing_process_that_cannot_start_is_named(monkeypatch):
    """No usable interpreter to start the hashing process: ``RuntimeError`` naming it and the threads hasher, at the
    first submission; the threads hasher still works in the same process."""
    import sys

    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    digests = StepDigests(torch.device("cpu"), hasher="process")
    with pytest.raises(RuntimeError, match=r"could not start the SHA-256 hashing process \(/nonexistent/python -I "
                                           r".*sha256_worker.py\): .*StepDigests\(hasher='threads'\)"):
        digests.submit({"w": torch.zeros(3)})
    digests.close()
    with StepDigests(torch.device("cpu"), hasher="threads") as threads:
        assert threads.result(threads.submit({"w": torch.zeros(3)})).sha256["w"] == tensor_sha256(torch.zeros(3))


def test_a_layout_is_kept_per_names_dtypes_and_shapes(monkeypatch):
    """Submissions of the same names, dtypes, shapes and contiguity share one layout (and each slot its views of the
    snapshot); another shape, dtype or a tensor turned None gets its own, and the digests stay the tensors' own.
    Past ``MAX_LAYOUTS`` layouts the kept ones are forgotten, and the digests still follow."""
    from ordered_ssd.apps.check import digests as module

    g = torch.Generator().manual_seed(4)
    base = {"w": torch.randn(4, 3, generator=g), "s": torch.tensor(2.5), "b": torch.randn(6, generator=g).half(),
            "t": torch.randn(3, 5, generator=g).t(), "none": None}
    variants = [base, {**base, "w": torch.randn(2, 3, generator=g)}, {**base, "b": base["b"].float()},
                {**base, "none": torch.ones(2)}, {**base, "t": base["t"].contiguous()}, base]
    monkeypatch.setattr(module, "MAX_LAYOUTS", 3)
    with StepDigests(torch.device("cpu"), depth=2, threads=2) as digests:
        keys, expected, kept = [], [], []
        for i, ts in enumerate(variants + variants):
            keys.append(digests.submit(ts, norms=True))
            expected.append({k: "none" if v is None else tensor_sha256(v) for k, v in ts.items()})
            kept.append(len(digests._layouts))
            if i == 0:
                again = digests.submit(dict(ts))
                assert len(digests._layouts) == 1
                assert digests.result(again).sha256 == expected[0]
        got = digests.results(keys)
    assert [r.sha256 for r in got] == expected
    assert kept == [1, 2, 3, 1, 2, 3, 3, 1, 2, 3, 1, 2]  # base kept at 6; past 3 layouts all are forgotten
    for r, ts in zip(got, variants + variants):
        for k, v in ts.items():
            flat = None if v is None else v.contiguous().reshape(-1)  # the snapshot's order of the elements
            assert r.norms[k] == ("none" if v is None else float(flat.double().norm()).hex()), k


def test_reserve_allocates_before_the_first_submission():
    """``reserve`` (from meta tensors: nothing read) allocates every slot's buffers and starts the hashing process;
    a submission that fits reuses them (the same process), a larger one replaces them; bad values and a reserve
    after close are refused."""
    ts = {"w": torch.randn(4, 3), "none": None, "h": torch.randn(5).half()}
    with StepDigests(torch.device("cpu"), depth=2, threads=2, hasher="process") as digests:
        digests.reserve({k: None if v is None else torch.empty(v.shape, dtype=v.dtype, device="meta")
                         for k, v in ts.items()})
        worker, capacity = digests._worker, digests._capacity
        assert worker is not None and worker.proc.poll() is None and capacity >= 48 + 10
        assert all(slot.host is not None for slot in digests._slots)
        got = digests.result(digests.submit(ts))
        assert digests._worker is worker and digests._capacity == capacity and digests.stats["wait_s"] == 0.0
        assert got.sha256 == {"w": tensor_sha256(ts["w"]), "none": "none", "h": tensor_sha256(ts["h"])}
        digests.reserve({"w": torch.empty(2, device="meta")})  # smaller: nothing changes
        assert digests._worker is worker
        big = {"w": torch.randn(100)}
        assert digests.result(digests.submit(big)).sha256["w"] == tensor_sha256(big["w"])
        assert digests._worker is not worker and worker.proc.wait(timeout=30) == 0
        with pytest.raises(TypeError, match=r"tensors\['x'\]: expected a tensor or None, got int"):
            digests.reserve({"x": 3})
    with pytest.raises(RuntimeError, match="reserve after close"):
        digests.reserve({"w": torch.empty(2, device="meta")})
