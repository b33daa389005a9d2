"""``ordered-ssd check`` under misuse: a shared ``--out``, the smallest corpus, bad ``--lr``, a diverging run,
special files in ``--data``, a stale report; then every failure outside a verdict as one line with exit status 2:
a huge ``--data-bytes``, ``--out`` holding entries of the wrong kind, a failed child run, a model too large for
memory, the earlier run's results (kept when a run is refused, set aside whole when one starts), unreadable data, a
read-only ``--out``, ``--layer mamba3`` where it cannot run."""
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from ordered_ssd.apps.errors import AppError
from ordered_ssd.apps.files import LOCK_NAME, locked_out_dir
from ordered_ssd.apps.lm import ByteData, DataError, load_corpus
from tests.apps.helpers import TINY_CHECK, cli_env, run_cli

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
    assert "(1 file, sorted by path; skipped 1 special file (a FIFO, device or socket): pipe)" in source
    with pytest.raises(DataError, match="expected a regular file or a directory, got "):
        load_corpus(str(corpus / "pipe"), 10_000)


def test_binary_files_in_data_are_skipped_and_counted_in_words(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world\n" * 100)
    (corpus / "b.bin").write_bytes(b"\0" * 10)
    _, source, _ = load_corpus(str(corpus), 10_000)
    assert source == (f"directory {corpus} (2 files, sorted by path); skipped 1 binary file, with a NUL byte in the "
                      f"first 8000 bytes: b.bin")
    (corpus / "c.bin").write_bytes(b"\0" * 10)
    assert "; skipped 2 binary files, with a NUL byte" in load_corpus(str(corpus), 10_000)[1]


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


# ------------------------------------------------------------------------------------------------------------------
# Every failure outside a verdict is one line on stderr with exit status 2, and a refused run changes nothing.
def _one_line(res) -> str:
    """The one stderr line of a refused run (exit status 2, no traceback)."""
    assert res.returncode == 2, res.stderr + res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def _tree(root, skip=(LOCK_NAME,)) -> dict:
    """``{relative path: content or "dir"}`` of everything under ``root`` (``skip``: names left out)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = "dir"
        for f in filenames:
            if f not in skip:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(dirpath, f), root)] = fh.read()
    return out


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("some text to train on\n" * 300)
    return path


def _earlier_run(out, finished=True):
    """An earlier check's files in ``out``: ``report.json`` (if ``finished``), ``loss.png`` and ``runs/``."""
    (out / "runs").mkdir(parents=True)
    for name in ("spec.json", "a.json", "b.json", "b.log"):
        (out / "runs" / name).write_text(f"earlier {name}\n")
    (out / "runs" / "checkpoint-step99.pt").write_bytes(b"earlier checkpoint")
    (out / "loss.png").write_bytes(b"earlier plot")
    if finished:
        (out / "report.json").write_text('{"verdict": "REPRODUCIBLE", "earlier": true}\n')


# ----------------------------------------------------------------------------------------- 1. --data-bytes
def test_data_bytes_is_read_in_bounded_pieces_up_to_what_there_is(tmp_path, monkeypatch):
    from ordered_ssd.apps import lm

    text = tmp_path / "t.txt"
    text.write_bytes(b"0123456789" * 550)  # 5500 bytes
    sizes = []
    real_open = open

    class Spy:
        def __init__(self, fh):
            self.fh = fh

        def read(self, n=-1):
            sizes.append(n)
            return self.fh.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(lm, "READ_CHUNK", 1000)
    monkeypatch.setattr(lm, "open", lambda *a, **k: Spy(real_open(*a, **k)), raising=False)
    data, source, cut = load_corpus(str(text), 99999999999999)
    assert (data, source, cut) == (b"0123456789" * 550, f"file {text}", False)
    assert sizes and max(sizes) == 1000 and all(0 < n <= 1000 for n in sizes), sizes  # never the asked size
    sizes.clear()
    assert load_corpus(str(text), 2500)[::2] == (b"0123456789" * 250, True)
    assert sizes == [1000, 1000, 500, 1], sizes  # then one byte to see that more was left
    with pytest.raises(DataError, match=r"^--data-bytes: expected at most 1000 bytes, what fits in the 3000 bytes "
                                        r"\(0\.0 GiB\) of memory available \(3 bytes per corpus byte\), got "
                                        rf"99999999999999, which would read 5500 bytes of the file {text}$"):
        load_corpus(str(text), 99999999999999, memory=3000)
    assert load_corpus(str(text), 1000, memory=3000)[0] == b"0123456789" * 100  # what fits is read


def test_huge_data_bytes_reads_the_default_corpus_without_running_out_of_memory(tmp_path):
    """The user's command (--data-bytes 99999999999999 on the default corpus: a MemoryError before); here --out is a
    file, so the run stops with that error only after the corpus was read whole."""
    taken = tmp_path / "taken"
    taken.write_text("keep me\n")
    res = run_cli("check", *TINY, "--data-bytes", "99999999999999", "--out", str(taken))
    assert _one_line(res) == (f"ordered-ssd check: error: --out: expected a directory, got an existing file that is "
                              f"not one: {taken}")
    assert taken.read_text() == "keep me\n"


def test_a_corpus_larger_than_memory_is_refused_before_reading(tmp_path):
    sparse = tmp_path / "sparse.txt"
    sparse.write_text("hello world\n" * 100)
    try:
        os.truncate(sparse, 8 << 40)  # 8 TiB, sparse: nothing on disk
    except OSError as e:
        pytest.skip(f"this file system does not take an 8 TiB sparse file: {e}")
    res = run_cli("check", *TINY, "--data", str(sparse), "--data-bytes", "99999999999999",
                  "--out", str(tmp_path / "out"))
    line = _one_line(res)
    m = re.fullmatch(r"ordered-ssd check: error: --data-bytes: expected at most (\d+) bytes, what fits in the (\d+) "
                     r"bytes \([\d.]+ GiB\) of memory available \(3 bytes per corpus byte\), got 99999999999999, which "
                     rf"would read {8 << 40} bytes of the file {re.escape(str(sparse))}", line)
    assert m and int(m.group(1)) == int(m.group(2)) // 3 and 0 < int(m.group(2)) < (8 << 40) * 3, line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------ 2. --out of the wrong kind
def _file(path, text="x\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


OUT_KINDS = [  # (id, make the wrong entry under out, the message after "ordered-ssd check: error: --out: ")
    ("runs is a file", lambda o: (shutil.rmtree(o / "runs"), _file(o / "runs")),
     "expected {o}/runs to be a directory (the runs of an earlier check) or absent, got a regular file; move it away "
     "or choose another --out"),
    ("runs/a.json is a directory", lambda o: (os.unlink(o / "runs" / "a.json"), os.mkdir(o / "runs" / "a.json")),
     "expected {o}/runs/a.json to be a regular file (a spec, record, log or checkpoint), got a directory; move it "
     "away or choose another --out"),
    ("runs/checkpoint-step3.pt is a directory", lambda o: os.mkdir(o / "runs" / "checkpoint-step3.pt"),
     "expected {o}/runs/checkpoint-step3.pt to be a regular file (a spec, record, log or checkpoint), got a "
     "directory; move it away or choose another --out"),
    ("runs/checkpoints-2x2 is a file", lambda o: _file(o / "runs" / "checkpoints-2x2"),
     "expected {o}/runs/checkpoints-2x2 to be a directory (a checkpoint folder), got a regular file; move it away or "
     "choose another --out"),
    ("runs/notes.txt is not a check's", lambda o: _file(o / "runs" / "notes.txt"),
     "expected only the files of an earlier check in {o}/runs (*.json, *.log, *.pt, checkpoints-*), got notes.txt; "
     "move it away or choose another --out"),
    ("report.json is a directory", lambda o: (os.unlink(o / "report.json"), os.mkdir(o / "report.json")),
     "expected {o}/report.json to be a regular file (the verdict of an earlier check) or absent, got a directory; "
     "move it away or choose another --out"),
    ("loss.png is a directory", lambda o: (os.unlink(o / "loss.png"), os.mkdir(o / "loss.png")),
     "expected {o}/loss.png to be a regular file (the loss plot of an earlier check) or absent, got a directory; "
     "move it away or choose another --out"),
    ("previous is a file", lambda o: _file(o / "previous"),
     "expected {o}/previous to be a directory (an earlier check's results, replaced by the last run's) or absent, "
     "got a regular file; move it away or choose another --out"),
    ("previous/notes.txt is not a check's", lambda o: _file(o / "previous" / "notes.txt"),
     "expected {o}/previous to hold only an earlier check's report.json, loss.png, runs (it is replaced by the last "
     "run's), got notes.txt; move it away or choose another --out"),
    (".lock is a directory", lambda o: os.mkdir(o / LOCK_NAME),
     "expected a lock file at {o}/.lock (made if absent), got a directory"),
]


@pytest.mark.parametrize("make, message", [k[1:] for k in OUT_KINDS], ids=[k[0] for k in OUT_KINDS])
def test_out_holding_entries_of_the_wrong_kind_is_refused_and_left_as_it_was(tmp_path, corpus, make, message):
    out = tmp_path / "out"
    _earlier_run(out)
    make(out)
    before = _tree(out)
    res = run_cli("check", *TINY, "--data", str(corpus), "--out", str(out))
    assert _one_line(res) == "ordered-ssd check: error: --out: " + message.format(o=out)
    assert _tree(out) == before  # nothing moved, removed or written (but the lock file)


# ------------------------------------------------------------------------- 3. a failed child run gives its reason
@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory):
    """The spec file of the tiny check model on a small corpus (as ``check`` writes it for its fresh processes)."""
    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.cli import build_parser

    d = tmp_path_factory.mktemp("spec")
    text = d / "corpus.txt"
    text.write_text("some text to train on\n" * 300)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY, "--data", str(text)]))
    spec["data_sha256"] = ByteData(load_corpus(spec["data"], spec["data_bytes"])[0], spec["seq_len"]).sha256
    path = d / "spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("flags, message", [
    (["--stop-at", "2", "--ckpt", "{d}"], "checkpoint {d}: expected a path where a file can be written, got a "
                                           "directory"),
    (["--resume", "{d}"], "checkpoint {d}: expected a checkpoint file, got a directory"),
    (["--record", "{d}"], "run record {d}: expected a path where a file can be written, got a directory"),
], ids=["--ckpt", "--resume", "--record"])
def test_train_refuses_a_directory_as_checkpoint_or_record(tmp_path, tiny_spec, flags, message):
    d = tmp_path / "a-directory"
    d.mkdir()
    flags = [f.format(d=d) for f in flags]
    record = [] if "--record" in flags else ["--record", str(tmp_path / "r.json")]
    res = run_cli("_train", "--spec", str(tiny_spec), *record, "--label", "x", "--quiet", *flags)
    assert _one_line(res) == "ordered-ssd _train: error: " + message.format(d=d)
    assert os.listdir(d) == [] and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("content, message", [
    (None, "--spec: expected a readable spec file, got {p}: No such file or directory"),
    ("{", "--spec: expected the JSON spec of a check, got {p}, which does not parse: Expecting property name enclosed "
          "in double quotes: line 1 column 2 (char 1)"),
    ("[1, 2]", "--spec: expected the JSON object of a check's spec, got a list in {p}"),
], ids=["missing", "not JSON", "not an object"])
def test_train_refuses_a_bad_spec_file(tmp_path, content, message):
    spec = tmp_path / "spec.json"
    if content is not None:
        spec.write_text(content)
    res = run_cli("_train", "--spec", str(spec), "--record", str(tmp_path / "r.json"), "--label", "x")
    assert _one_line(res) == "ordered-ssd _train: error: " + message.format(p=spec)


def test_a_failed_fresh_process_gives_its_reason(tmp_path):
    from ordered_ssd.apps.check.errors import CheckError
    from ordered_ssd.apps.check.launch import run_fresh_process

    log = tmp_path / "b.log"
    missing = tmp_path / "missing.json"
    with pytest.raises(CheckError) as info:  # the child's own one-line error
        run_fresh_process(str(missing), str(tmp_path / "b.json"), "b", [], False, str(log))
    assert str(info.value) == (f"run b (a fresh process) failed with exit code 2: --spec: expected a readable spec "
                               f"file, got {missing}: No such file or directory (full output: {log})")
    assert log.read_text() == (f"ordered-ssd _train: error: --spec: expected a readable spec file, got {missing}: No "
                               f"such file or directory\n")
    keyless = tmp_path / "keyless.json"
    keyless.write_text('{"steps": 3}')
    with pytest.raises(CheckError) as info:  # a crash: the last line of its traceback
        run_fresh_process(str(keyless), str(tmp_path / "b.json"), "b", [], False, str(log))
    assert str(info.value) == (f"run b (a fresh process) failed with exit code 1: KeyError: 'device' (full output: "
                               f"{log})")
    assert "Traceback (most recent call last)" in log.read_text()


def test_failure_reason_picks_the_meaningful_line():
    from ordered_ssd.apps.check.launch import failure_reason

    progress = "[       b] |####                    | 2/10 loss 5.1 3.0 step/s\n"
    assert failure_reason([progress, "ordered-ssd _train: error: checkpoint x: expected a, got b\n"], 2) == (
        "checkpoint x: expected a, got b")
    ranks = ["[rank1]: Traceback (most recent call last):\n", "[rank1]: ValueError: bad rows\n",
             "[rank0]: RuntimeError: gloo timeout\n", "torch.distributed.elastic.multiprocessing.errors."
             "ChildFailedError: \n", "=" * 60 + "\n"]
    assert failure_reason(ranks, 1) == "[rank1]: ValueError: bad rows"
    killed = ["Root Cause (first observed failure):\n", "  exitcode  : -9 (pid: 4242)\n",
              "  traceback : Signal 9 (SIGKILL) received by PID 4242\n", "=" * 60 + "\n"]
    assert failure_reason(killed, 1) == "killed: Signal 9 (SIGKILL) received by PID 4242"
    assert failure_reason(killed[:2], 1) == "killed: exitcode  : -9 (pid: 4242)"
    assert failure_reason([progress], -9) == "killed by SIGKILL (out of memory?) without an error message"
    assert failure_reason([progress, "something odd\n", "-" * 20 + "\n"], 3) == "something odd"
    assert failure_reason([], 1) == "it printed nothing"
    assert failure_reason(["ordered-ssd: error: unrecognized arguments: --bogus\n"], 2) == (
        "ordered-ssd: error: unrecognized arguments: --bogus")


def test_check_gives_the_reason_of_a_failed_fresh_process(tmp_path, corpus, monkeypatch, capsys):
    """Run b's record path is a directory (a child that fails): the check's one line carries the child's reason."""
    from ordered_ssd.apps.check import launch
    from ordered_ssd.apps.cli import main

    out = tmp_path / "out"
    real = launch._train_command

    def broken(spec_path, record_path, label, extra, progress):
        if label == "b":
            record_path = os.path.dirname(record_path)  # runs/: a directory
        return real(spec_path, record_path, label, extra, progress)

    monkeypatch.setattr(launch, "_train_command", broken)
    threads = torch.get_num_threads()
    try:
        code = main(["check", *TINY, "--data", str(corpus), "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    runs = out / "runs"
    assert code == 2 and err == (f"ordered-ssd check: error: run b (a fresh process) failed with exit code 2: run "
                                 f"record {runs}: expected a path where a file can be written, got a directory (full "
                                 f"output: {runs}/b.log)\n")
    assert not (out / "report.json").exists() and (runs / "a.json").exists()


# --------------------------------------------------------------------------------------- 4. a model too large
def test_a_model_too_large_for_memory_is_refused_before_training(tmp_path, corpus):
    from ordered_ssd.apps.check.memory import byte_lm_params

    out = tmp_path / "out"
    _earlier_run(out)
    before = _tree(out)
    res = run_cli("check", *TINY, "--d-state", "1000000000", "--data", str(corpus), "--out", str(out))
    line = _one_line(res)
    shape = dict(d_model=32, n_layers=1, d_state=10 ** 9, headdim=16, ngroups=1, chunk_size=16, expand=2)
    params = byte_lm_params(shape)
    assert params == 32 * 256 + (32 + (2 * 64 + 2 * 10 ** 9 + 4) * 32 + 5 * (64 + 2 * 10 ** 9) + 3 * 4 + 64
                                 + 32 * 64) + 32
    assert line.startswith("ordered-ssd check: error: --d-model 32 --n-layers 1 --d-state 1000000000 --headdim 16 "
                           "--ngroups 1 --chunk-size 16 --batch 2 --seq-len 24: expected a training that fits in the ")
    assert ("of memory available on the host (MemAvailable), got an estimated " in line
            and f"({params / 1e6:.2f}M parameters: {16 * params / 2 ** 30:.2f} GiB of parameters, gradients and AdamW "
                f"states, " in line and line.endswith("choose a smaller model, --batch or --seq-len")), line
    assert _tree(out) == before  # the earlier run's verdict and files are untouched


@pytest.mark.parametrize("shape", [dict(d_model=64, n_layers=2, d_state=16, headdim=16, ngroups=1, chunk_size=32),
                                   dict(d_model=48, n_layers=3, d_state=40, headdim=8, ngroups=3, chunk_size=16),
                                   dict(d_model=512, n_layers=8, d_state=64, headdim=64, ngroups=1, chunk_size=128),
                                   # Mamba-3 layers: d_state 4 and 7 give one rotary angle, 8 two, 40 ten, 64 sixteen
                                   dict(d_model=64, n_layers=2, d_state=16, headdim=16, ngroups=1, chunk_size=32,
                                        layer="mamba3"),
                                   dict(d_model=48, n_layers=3, d_state=40, headdim=8, ngroups=3, chunk_size=16,
                                        layer="mamba3"),
                                   dict(d_model=32, n_layers=1, d_state=4, headdim=16, ngroups=2, chunk_size=16,
                                        layer="mamba3"),
                                   dict(d_model=32, n_layers=2, d_state=7, headdim=16, ngroups=1, chunk_size=16,
                                        layer="mamba3"),
                                   dict(d_model=512, n_layers=8, d_state=64, headdim=64, ngroups=1, chunk_size=128,
                                        layer="mamba3")])
def test_the_parameter_count_of_the_estimate_is_the_model_s(shape):
    from ordered_ssd.apps.check.memory import byte_lm_params
    from ordered_ssd.apps.check.train import build_model

    model, _ = build_model({"seed": 0, "mixer": "ordered", "lr": 1e-3, "weight_decay": 0.1,
                            "model": dict(shape, expand=2)}, torch.device("meta"))
    assert byte_lm_params(dict(shape, expand=2)) == sum(p.numel() for p in model.parameters())
    if shape.get("layer") == "mamba3":  # the formula of the brief, written out: no convolution, no A_log
        from ordered_ssd.apps.check.memory import mamba3_layer_params

        d, n, g = shape["d_model"], shape["d_state"], shape["ngroups"]
        e, h = 2 * d, 2 * d // shape["headdim"]
        s = model.mixers[0].num_rope_angles
        assert s == (n // 2 - (n // 2) % 2) // 2 >= 1
        assert mamba3_layer_params(dict(shape, expand=2)) == (2 * e + 2 * g * n + 3 * h + s) * d + h + 2 * h * n \
            + 2 * n + h + d * e == sum(p.numel() for p in model.mixers[0].parameters())


def test_the_estimate_refuses_the_users_model_and_passes_the_defaults():
    from ordered_ssd.apps.check.memory import check_memory, training_bytes
    from ordered_ssd.apps.check.spec import DEFAULTS
    from ordered_ssd.apps.lm import DataError as Refused

    def spec(device, **model):
        d = DEFAULTS[device]
        shape = dict(d_model=d["d_model"], n_layers=d["n_layers"], d_state=d["d_state"], headdim=d["headdim"],
                     ngroups=1, chunk_size=d["chunk_size"], expand=2)
        return {"device": "cpu", "batch": d["batch"], "seq_len": d["seq_len"], "model": dict(shape, **model)}

    eight = (8 * 2 ** 30, "test")
    users = spec("cpu", d_state=100000)  # the CPU defaults with --d-state 100000
    est = training_bytes(users, 4, 2_000_000)
    # 27.67M parameters (422.2 MiB with their gradients and AdamW states), 9.58 GiB in all
    assert (est["n_params"], round(est["total"] / 2 ** 30, 2)) == (27668336, 9.58)
    with pytest.raises(Refused) as info:
        check_memory(users, rows=4, processes=1, corpus_bytes=2_000_000, available=eight)
    assert str(info.value) == (
        "--d-model 64 --n-layers 2 --d-state 100000 --headdim 16 --ngroups 1 --chunk-size 32 --batch 4 --seq-len 128: "
        "expected a training that fits in the 8.00 GiB of memory available on the host (test), got an estimated "
        "9.58 GiB (27.67M parameters: 422.2 MiB of parameters, gradients and AdamW states, 9.17 GiB of activations in "
        "one step, 1.9 MiB of corpus; the formula: docs/check.md, Memory); choose a smaller model, --batch or "
        "--seq-len")
    for device in ("cpu", "cuda"):  # the defaults fit in 8 GiB (the CUDA defaults' estimate: 1.46 GiB)
        s = spec(device)
        line = check_memory(s, rows=s["batch"], processes=1, corpus_bytes=DEFAULTS[device]["data_bytes"],
                            available=eight)
        assert line.startswith("memory: estimated ") and line.endswith("of 8.00 GiB available on the host"), line
    s = spec("cpu")  # four processes on the CPU share the host: four estimates
    one = training_bytes(s, 1, 0)["total"]
    check_memory(s, rows=1, processes=4, corpus_bytes=0, available=(4 * one, "test"))
    with pytest.raises(Refused, match=r"\(4 processes of 1 row\): expected a training that fits in the .* got an "
                                      r"estimated [\d.]+ MiB per process x 4 = "):
        check_memory(s, rows=1, processes=4, corpus_bytes=0, available=(4 * one - 1, "test"))
    g = dict(s, device="cuda")  # the runs alongside one another on one GPU share it: three estimates
    check_memory(g, rows=1, processes=3, corpus_bytes=0, available=(3 * one, "test"), one_gpu=True)
    assert check_memory(g, rows=1, processes=3, corpus_bytes=0, available=(one, "test")).endswith(
        "available on the GPU")  # each rank of --nproc 3 has its own GPU
    with pytest.raises(Refused, match=r"\(3 processes of 1 row\): expected a training that fits in the .* available on "
                                      r"the GPU \(test\), got an estimated [\d.]+ MiB per process x 3 = "):
        check_memory(g, rows=1, processes=3, corpus_bytes=0, available=(3 * one - 1, "test"), one_gpu=True)


def test_the_estimate_of_mamba3_layers_names_the_layer_and_grows_with_the_model():
    from ordered_ssd.apps.check.memory import check_memory, training_bytes
    from ordered_ssd.apps.lm import DataError as Refused

    shape = dict(d_model=64, n_layers=2, d_state=16, headdim=16, ngroups=1, chunk_size=32, expand=2, layer="mamba3")
    spec = {"device": "cpu", "batch": 4, "seq_len": 128, "model": shape}
    small = training_bytes(spec, 4, 0)["activations"]
    for bigger in (dict(shape, d_state=64), dict(shape, n_layers=4), dict(shape, chunk_size=128)):
        assert training_bytes(dict(spec, model=bigger), 4, 0)["activations"] > small, bigger
    assert training_bytes(dict(spec, seq_len=512), 4, 0)["activations"] > small
    with pytest.raises(Refused, match=r"^--d-model 64 --n-layers 2 --d-state 16 --headdim 16 --ngroups 1 --chunk-size "
                                      r"32 --layer mamba3 --batch 4 --seq-len 128: expected a training that fits"):
        check_memory(spec, rows=4, processes=1, corpus_bytes=0, available=(1000, "test"))


def test_host_memory_is_what_the_cgroup_leaves_where_that_is_less(tmp_path, monkeypatch):
    from ordered_ssd.apps.check import memory

    free, how = memory.host_available()
    with open("/proc/meminfo") as fh:
        avail = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("MemAvailable:"))
    assert how in ("MemAvailable", "the cgroup's memory.max less memory.current")
    assert 0 < free <= avail * 1.5 + 2 ** 30  # MemAvailable moves a little between the two reads
    (tmp_path / "max").write_text(f"{5 * 2 ** 20}\n")
    (tmp_path / "current").write_text(f"{2 ** 20}\n")
    monkeypatch.setattr(memory, "CGROUP_MAX", str(tmp_path / "max"))
    monkeypatch.setattr(memory, "CGROUP_CURRENT", str(tmp_path / "current"))
    assert memory.host_available() == (4 * 2 ** 20, "the cgroup's memory.max less memory.current")
    (tmp_path / "max").write_text("max\n")
    assert memory.host_available()[1] == "MemAvailable"


def test_running_out_of_memory_anyway_is_one_line(monkeypatch, capsys, corpus, tmp_path):
    import ordered_ssd.apps.check as check_pkg
    from ordered_ssd.apps.cli import main

    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 256000016896 bytes.\nmore")

    monkeypatch.setattr(check_pkg, "run_check", oom)
    assert main(["check", *TINY, "--data", str(corpus), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        "ordered-ssd check: error: memory: expected the training to fit (it was estimated to, see the memory line and "
        "docs/check.md, Memory), got RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
        "can't allocate memory: you tried to allocate 256000016896 bytes.\n")
    monkeypatch.setattr(check_pkg, "run_check", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # other errors are not hidden
        main(["check", *TINY, "--data", str(corpus), "--out", str(tmp_path / "out")])


# ------------------------------------------------------------------- 5. earlier results: kept, or set aside whole
def _interrupted_check(out, corpus, monkeypatch):
    """Start a check into ``out`` and stop it (Ctrl-C) where run a would train; ``_tree(out)`` at that moment."""
    from ordered_ssd.apps.check import run as run_mod
    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.cli import build_parser

    seen = []

    def interrupted(*args, **kwargs):
        seen.append(_tree(out))
        raise KeyboardInterrupt

    monkeypatch.setattr(run_mod, "train_run", interrupted)
    lines = []
    spec = spec_from_args(build_parser().parse_args(["check", *TINY, "--data", str(corpus), "--out", str(out)]))
    with pytest.raises(KeyboardInterrupt):
        run_mod.run_check(spec, str(out), stop_at=3, native=False, progress=False, print_fn=lines.append)
    return seen[0], lines


def test_an_accepted_run_sets_the_earlier_run_aside_whole(tmp_path, corpus, monkeypatch):
    out = tmp_path / "out"
    _earlier_run(out)
    (out / "runs" / "checkpoints-2x2").mkdir()  # a split run's checkpoints
    _file(out / "previous" / "report.json", "the run before\n")
    earlier = _tree(out)
    at_start, lines = _interrupted_check(out, corpus, monkeypatch)
    # this run's files only: its spec, nothing of the earlier run (no stale checkpoint or record beside it)
    assert {k for k in at_start if not k.startswith("previous/")} == {"runs/", "runs/spec.json"}
    moved = {k[len("previous/"):]: v for k, v in at_start.items() if k.startswith("previous/") and k != "previous/"}
    assert moved == {k: v for k, v in earlier.items() if not k.startswith("previous")}  # whole, the one before gone
    assert f"earlier run: its loss.png, report.json, runs moved to {out}/previous" in lines
    # a second start: the first was unfinished (no report.json), so its runs/ goes and previous/ stays
    again, lines = _interrupted_check(out, corpus, monkeypatch)
    assert again == at_start
    assert "earlier run: unfinished (no report.json); its runs removed" in lines


def test_a_move_that_fails_puts_everything_back(tmp_path, monkeypatch):
    from ordered_ssd.apps.check import outdir
    from ordered_ssd.apps.check.errors import CheckError

    out = tmp_path / "out"
    _earlier_run(out)
    before = _tree(out)
    real = os.rename

    def rename(src, dst):
        if str(src).endswith("loss.png"):
            raise PermissionError(13, "Permission denied")
        real(src, dst)

    monkeypatch.setattr(outdir.os, "rename", rename)
    with pytest.raises(CheckError) as info:
        outdir.set_aside_earlier_results(str(out))
    assert str(info.value) == (f"--out: expected to move the earlier run's {out}/loss.png to {out}/previous, got "
                               f"Permission denied; nothing was moved")
    assert _tree(out) == before


# ------------------------------------------------------------------------------------------ 6. other escapes
def test_a_seed_beyond_the_generator_is_a_usage_error(tmp_path, corpus):
    res = run_cli("check", *TINY, "--seed", "100000000000000000000000", "--data", str(corpus),
                  "--out", str(tmp_path / "out"))
    assert _one_line(res) == ("ordered-ssd check: error: --seed: expected |seed| * 1000003 + --steps < 2**63 (the "
                              "batch of step s is drawn from a generator seeded with seed * 1000003 + s), got "
                              "100000000000000000000000")
    assert not (tmp_path / "out").exists()


@pytest.fixture()
def unprivileged():
    """``run(*args)``: ``ordered-ssd ARGS`` in a fresh process that file permissions bind: as this user, or, where the
    tests run as root (who ignores them), as root without the capabilities that override them (``setpriv``)."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file permissions cannot be made to bind")
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", "--bounding-set", caps, "--inh-caps", caps]

    def run(*args):
        return subprocess.run(prefix + [sys.executable, "-m", "ordered_ssd", *args], capture_output=True, text=True,
                              env=cli_env(), timeout=600)

    return run


def test_unreadable_data_is_one_line(unprivileged, tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("some text to train on\n" * 300)
    (data / "sub" / "b.txt").write_text("more text\n")
    os.chmod(data / "sub", 0o000)  # a folder that cannot be listed: an error, not a silent skip
    try:
        res = unprivileged("check", *TINY, "--data", str(data), "--out", str(tmp_path / "out"))
        assert _one_line(res) == (f"ordered-ssd check: error: --data: expected a readable folder, got {data}/sub: "
                                  f"Permission denied")
        os.chmod(data / "a.txt", 0o000)
        res = unprivileged("check", *TINY, "--data", str(data / "a.txt"), "--out", str(tmp_path / "out"))
        assert _one_line(res) == (f"ordered-ssd check: error: --data: expected a readable file, got {data}/a.txt: "
                                  f"Permission denied")
    finally:
        os.chmod(data / "sub", 0o755)
    assert not (tmp_path / "out").exists()


def test_a_read_only_out_is_one_line_and_keeps_the_earlier_run(unprivileged, tmp_path, corpus):
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o555)
    try:
        res = unprivileged("check", *TINY, "--data", str(corpus), "--out", str(out))
        assert _one_line(res) == (f"ordered-ssd check: error: --out: expected a writable output directory, got "
                                  f"{out}, which is not writable: Permission denied")
        os.chmod(out, 0o755)
        _earlier_run(out)
        os.chmod(out / "runs", 0o555)  # moving a folder to previous/ needs write permission on it
        before = _tree(out)
        res = unprivileged("check", *TINY, "--data", str(corpus), "--out", str(out))
        assert _one_line(res) == (f"ordered-ssd check: error: --out: expected to move the earlier run's {out}/runs "
                                  f"to {out}/previous, got Permission denied; nothing was moved")
        assert _tree(out) == before
    finally:
        os.chmod(out, 0o755)
        if (out / "runs").exists():
            os.chmod(out / "runs", 0o755)


# ------------------------------------------------------------------------------- 7. --layer mamba3 where it cannot run
LAYER_MISUSE = [  # (id, arguments after `check` (--out added), CUDA faked present, the message after "error: ")
    ("--d-state 24 with --layer mamba3 on cuda", [*TINY, "--layer", "mamba3", "--device", "cuda", "--d-state", "24"],
     True,
     "--d-state: expected a power of two >= 16 with --layer mamba3 on CUDA (mamba-ssm's Mamba-3 kernels), got 24"),
    ("--headdim 8 with --layer mamba3 on cuda:1", [*TINY, "--layer", "mamba3", "--device", "cuda:1", "--headdim", "8",
                                                  "--d-state", "16", "--chunk-size", "16"], True,
     "--headdim: expected a power of two >= 16 with --layer mamba3 on CUDA (mamba-ssm's Mamba-3 kernels), got 8"),
    ("--chunk-size 48 with --layer mamba3 --nproc on cuda",
     [*TINY, "--layer", "mamba3", "--device", "cuda", "--nproc", "2", "--d-state", "16", "--headdim", "16",
      "--chunk-size", "48"], True,
     "--chunk-size: expected a power of two >= 16 with --layer mamba3 on CUDA (mamba-ssm's Mamba-3 kernels), got 48"),
    ("--layer with --hf-config", ["--device", "cpu", "--layer", "mamba3", "--hf-config", "config.json"], False,
     "--layer: not with --hf-config (the config gives the model)"),
    ("--d-state 3 with --layer mamba3", [*TINY, "--layer", "mamba3", "--d-state", "3"], False,
     "--d-state: expected at least 4 with --layer mamba3 (Mamba-3 rotates d_state / 2 channels, rounded down to "
     "even, in pairs: at least one rotary angle), got 3"),
    ("--native with --layer mamba3 on cpu", [*TINY, "--layer", "mamba3", "--native"], False,
     "--native: the native Mamba3 control needs a CUDA device (and mamba-ssm), got --device cpu"),
]


@pytest.mark.parametrize("args, cuda, message", [k[1:] for k in LAYER_MISUSE], ids=[k[0] for k in LAYER_MISUSE])
def test_layer_misuse_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, args, cuda, message):
    from ordered_ssd.apps.cli import main

    if cuda:  # the refusal comes before anything asks the (absent) GPU more than whether there is one
        import ordered_ssd.modules as modules

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(modules, "cuda_path_available", lambda: (True, ""))
    out = tmp_path / "out"
    assert main(["check", *args, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"ordered-ssd check: error: {message}\n"
    assert not out.exists()


def test_auto_is_the_gpu_where_there_is_one_and_rope_angles(monkeypatch):
    import ordered_ssd.modules as modules
    from ordered_ssd.apps.check.spec import resolve_device, rope_angles
    from ordered_ssd.apps.lm import DataError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(modules, "cuda_path_available", lambda: (True, ""))
    assert resolve_device("auto") == torch.device("cuda")
    # a GPU without the native extras: refused as --device cuda is, never a silent run on the CPU
    monkeypatch.setattr(modules, "cuda_path_available", lambda: (False, "mamba-ssm is not installed"))
    with pytest.raises(DataError) as info:
        resolve_device("auto")
    assert str(info.value) == ("--device: cuda needs the ordered CUDA path, which cannot run here (mamba-ssm is not "
                               "installed); install the native extras (README, GPU section) or pass --device cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert [rope_angles(n) for n in (1, 3, 4, 7, 8, 12, 16, 64)] == [0, 0, 1, 1, 2, 3, 4, 16]
