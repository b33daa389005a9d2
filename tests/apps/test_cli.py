"""The ``ordered-ssd`` command (:mod:`ordered_ssd.apps.cli`): usage errors in one line, ``env``, ``bench``
passed through."""
import pytest
import torch

from ordered_ssd.apps.cli import main
from tests.apps.helpers import TINY_CHECK, run_cli

TINY = TINY_CHECK + ["--batch", "2"]
SMOKE = ["--device", "cpu", "--shape", "2,64,32,16,1,16,32", "--repeats", "3", "--warmup", "1", "--bit-repeats",
         "2", "--quiet"]


@pytest.mark.parametrize("args,message", [
    (["--data", "/nonexistent/corpus"],
     "--data: expected an existing file or directory, got /nonexistent/corpus (no such file or directory)"),
    (["--stop-at", "9"], "--stop-at: expected 0 < k < --steps=6, got 9"),
    (["--headdim", "24"], "--headdim: expected a divisor of 2 * d_model = 64, got 24"),
    (["--native"], "--native: the native Mamba2 control needs a CUDA device"),
    (["--device", "tpu"], "--device"),
])
def test_check_usage_errors_are_one_line(args, message, tmp_path, capsys):
    code = main(["check", *TINY, "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o" / "report.json").exists()


def test_native_without_a_gpu_says_what_chose_the_cpu(tmp_path, capsys, monkeypatch):
    """--native where torch sees no GPU: without --device the line says --device auto chose the CPU (the user
    passed no --device cpu); with --device cpu it names that flag."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    no_device = [a for i, a in enumerate(TINY) if "--device" not in (a, TINY[i - 1] if i else "")]
    assert "--device" not in no_device and "cpu" not in no_device
    head = "ordered-ssd check: error: --native: the native Mamba2 control needs a CUDA device (and mamba-ssm), got "
    assert main(["check", *no_device, "--native", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (head + "no CUDA GPU: torch sees none here, so --device auto (the default) "
                                       "chose the CPU\n")
    assert main(["check", *no_device, "--device", "cpu", "--native", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == head + "--device cpu\n"
    assert not (tmp_path / "o").exists()


def test_empty_data_and_unwritable_output(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert main(["check", *TINY, "--data", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "--data: expected some bytes to train on, got 0 bytes in file" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["check", *TINY, "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert "--out: expected a writable output directory, got" in err and "is not writable" in err


def test_env_prints_versions_and_fingerprint():
    res = run_cli("env")
    assert res.returncode == 0, res.stderr
    assert "ordered-ssd: 0.1.0.dev0" in res.stdout and "fingerprint:" in res.stdout
    assert "device_type = cpu" in res.stdout or "device_type = cuda" in res.stdout


def test_uneven_global_batch_is_a_one_line_error(tmp_path, capsys):
    code = main(["check", *TINY, "--nproc", "2", "--batch", "3", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert ("ordered-ssd check: error: --batch: the global batch 3 is not divisible by --nproc 2 (rank r takes "
            "rows [r*B/N, (r+1)*B/N) of every step's batch)") in err
    assert not (tmp_path / "o").exists()


def test_nproc_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", *TINY, "--nproc", "0", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "argument --nproc: expected a positive integer, got 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,line", [
    (["check", "--steps", "0"], "ordered-ssd check: error: argument --steps: expected a positive integer, got 0"),
    (["check", "--batch", "0"], "ordered-ssd check: error: argument --batch: expected a positive integer, got 0"),
    (["check", "--no-such-flag"], "ordered-ssd: error: unrecognized arguments: --no-such-flag"),
    (["foo"], "ordered-ssd: error: command: expected check, env or bench, got 'foo'"),
    (["bench", "--shapes", "ZZ"], "ordered-ssd bench: error: argument --shapes: unknown shape 'ZZ'"),
])
def test_argparse_errors_are_the_error_line_alone(argv, line, capsys):
    """argparse's own errors (types, unknown flags, commands) are one line on stderr, no usage lines, exit 2."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and err.startswith(line), err
    assert "_train" not in err  # the internal command is not offered


def test_help_still_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: ordered-ssd check")


def test_bad_shape_on_the_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["bench", "--shape", "1,2,3"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shape: expected B,L,d_model,N,G[,headdim,chunk[,dtype]]" in err and "'1,2,3'" in err


def test_bench_subcommand_passes_its_options_through(tmp_path, capsys):
    rc = main(["bench", *SMOKE, "--modes", "ordered", "--out", str(tmp_path)])
    assert rc == 0
    assert "| X1 | B2 L64 d32 N16 G1 P16 cs32 fp32 | ordered |" in capsys.readouterr().out


def test_bench_without_cuda_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("ordered-ssd bench: error: no CUDA device")
    assert "pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0" in err
