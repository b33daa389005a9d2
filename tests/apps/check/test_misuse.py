"""``ordered-ssd check`` under misuse: a shared ``--out``, the smallest corpus, bad ``--lr``, a diverging run,
special files in ``--data``, a stale report."""
import fcntl
import json
import os

import pytest
import torch

from ordered_ssd.apps.errors import AppError
from ordered_ssd.apps.files import LOCK_NAME, locked_out_dir
from ordered_ssd.apps.lm import ByteData, DataError, load_corpus
from tests.apps.helpers import TINY_CHECK, run_cli

TINY = TINY_CHECK + ["--batch", "2"]


def _old_starts(data, seed, step, batch):
    """The sampler of earlier versions (never draws the last window)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, len(data.train) - data.seq_len - 1, (batch,), generator=g)


def test_second_run_into_a_locked_out_fails_with_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with locked_out_dir(str(out)):  # this process holds the folder, as a running check would
        res = run_cli("check", *TINY, "--out", str(out))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert str(out) in lines[0] and "another run holds its lock" in lines[0]
    assert sorted(os.listdir(out)) == [LOCK_NAME]  # nothing written


def test_lock_is_released_on_exit_and_on_error(tmp_path):
    with locked_out_dir(str(tmp_path)):
        with pytest.raises(AppError, match="another run holds"):
            with locked_out_dir(str(tmp_path)):
                pass
    with pytest.raises(RuntimeError):
        with locked_out_dir(str(tmp_path)):
            raise RuntimeError("boom")
    fd = os.open(tmp_path / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(fd)


def test_the_smallest_corpus_trains_and_the_last_window_is_sampled(tmp_path):
    seq = 24
    n_val = seq + 1
    with pytest.raises(DataError, match=f"expected at least {n_val + seq + 1} bytes, got {n_val + seq}"):
        ByteData(bytes(n_val + seq), seq)
    data = ByteData(bytes(range(n_val + seq + 1)), seq)  # exactly the minimum: one training window
    x, y = data.batch(0, 0, 4)
    assert x.shape == (4, seq) and torch.equal(x[0], torch.arange(seq)) and torch.equal(y[0], torch.arange(1, seq + 1))
    corpus = tmp_path / "min.txt"
    corpus.write_bytes(bytes(range(1, n_val + seq + 2)))  # text: no NUL byte (a NUL means binary)
    res = run_cli("check", *TINY, "--data", str(corpus), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr + res.stdout
    assert "verdict: REPRODUCIBLE" in res.stdout


def test_the_sampler_reaches_the_last_window_and_keeps_the_old_draws():
    seq = 8
    data = ByteData(bytes(range(200)) * 2, seq, val_fraction=0.5)  # 200 training bytes
    last = len(data.train) - seq - 1
    seen = {int(s) for step in range(400) for s in data.starts(0, step, 4)}
    assert seen == set(range(last + 1))  # every window, the last included
    # every row not replaced by the last window is the earlier versions' draw
    for step in range(50):
        new, old = data.starts(0, step, 4), _old_starts(data, 0, step, 4)
        assert bool(((new == old) | (new == last)).all())
    corpus, _, _ = load_corpus(None, 60000)  # the tests' corpus: the same windows as before
    data = ByteData(corpus, 24)
    assert all(torch.equal(data.starts(0, s, 4), _old_starts(data, 0, s, 4)) for s in range(40))


@pytest.mark.parametrize("value", ["nan", "-1e-3", "0", "inf", "abc"])
def test_bad_lr_is_a_usage_error(tmp_path, value):
    res = run_cli("check", *TINY, "--lr", value, "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--lr" in res.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_a_diverging_run_is_not_reproducible_but_diverged(tmp_path):
    out = tmp_path / "out"
    res = run_cli("check", *TINY, "--lr", "1e6", "--out", str(out))
    assert res.returncode == 1, res.stderr + res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is False and report["verdict"].startswith("DIVERGED at step ")
    step = report["diverged"]["step"]
    assert report["verdict"] == f"DIVERGED at step {step}" and f"verdict: DIVERGED at step {step}:" in res.stdout
    assert report["per_step"][step]["loss"] in ("nan", "inf", "-inf")
    assert all(float.fromhex(s["loss"]) == float.fromhex(s["loss"]) for s in report["per_step"][:step])


def test_special_files_in_data_are_skipped_and_named(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world\n" * 100)
    os.mkfifo(corpus / "pipe")
    data, source, cut = load_corpus(str(corpus), 10_000)  # would block forever reading the FIFO
    assert data == b"hello world\n" * 100 and cut is False
    assert "(1 files, sorted by path; skipped 1 special file(s), not regular files: pipe)" in source
    with pytest.raises(DataError, match="expected a regular file or a directory, got "):
        load_corpus(str(corpus / "pipe"), 10_000)


def test_a_short_corpus_names_the_flag_that_made_it_short(tmp_path):
    """``--data-bytes`` only where that limit cut the corpus; a file exactly that long is too short by ``--data``."""
    seq, need = 24, 50  # n_val 25 + seq 24 + 1
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 40)
    for data_bytes, cut in ((40, False), (41, False), (39, True), (10, True)):
        corpus, _, was_cut = load_corpus(str(short), data_bytes)
        assert (len(corpus), was_cut) == (min(40, data_bytes), cut), data_bytes
        flag = "--data-bytes" if cut else "--data"
        with pytest.raises(DataError, match=f"^{flag}: too little data for --seq-len {seq}: expected at least "
                                            f"{need} bytes, got {len(corpus)}$"):
            ByteData(corpus, seq, cut=was_cut)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"a" * 30)
    (folder / "b.txt").write_bytes(b"b" * 30)
    assert load_corpus(str(folder), 30)[1:] == (f"directory {folder} (2 files, sorted by path)", True)  # b unread
    assert load_corpus(str(folder), 60)[2] is False and load_corpus(str(folder), 59)[2] is True
    (folder / "b.txt").write_bytes(b"")  # files left unread that would give no bytes did not cut it
    (folder / "c.bin").write_bytes(b"c\0" * 15)
    assert load_corpus(str(folder), 30)[::2] == (b"a" * 30, False)
    (folder / "d.txt").write_bytes(b"d")
    assert load_corpus(str(folder), 30)[::2] == (b"a" * 30, True)
    res = run_cli("check", *TINY, "--data", str(short), "--data-bytes", "40", "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        f"--data: too little data for --seq-len {seq}: expected at least {need} bytes, got 40"), res.stderr


def test_special_data_path_is_a_usage_error(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    res = run_cli("check", *TINY, "--data", str(tmp_path / "pipe"), "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "expected a regular file or a directory, got " in res.stderr.strip().splitlines()[-1]


def test_a_stale_report_is_removed_before_the_run_writes(tmp_path, monkeypatch):
    from ordered_ssd.apps.check import run as run_mod
    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.cli import build_parser

    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text('{"verdict": "REPRODUCIBLE", "ok": true}\n')  # a previous run's
    (out / "loss.png").write_bytes(b"old")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to train on\n" * 200)
    seen = []

    def interrupted(*args, **kwargs):  # run a is interrupted (Ctrl-C)
        seen.append(sorted(os.listdir(out)))
        raise KeyboardInterrupt

    monkeypatch.setattr(run_mod, "train_run", interrupted)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY, "--data", str(corpus), "--out", str(out)]))
    with pytest.raises(KeyboardInterrupt):
        run_mod.run_check(spec, str(out), stop_at=3, native=False, progress=False, print_fn=lambda *a: None)
    assert seen and "report.json" not in seen[0] and "loss.png" not in seen[0]
    assert not (out / "report.json").exists() and not (out / "loss.png").exists()
    with locked_out_dir(str(out)):  # the lock was released
        pass


def test_a_usage_error_leaves_the_previous_report(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("{}\n")
    tiny = tmp_path / "tiny.txt"
    tiny.write_bytes(b"x" * 10)
    res = run_cli("check", *TINY, "--data", str(tiny), "--out", str(out))
    assert res.returncode == 2 and "too little" in res.stderr
    assert (out / "report.json").read_text() == "{}\n"
