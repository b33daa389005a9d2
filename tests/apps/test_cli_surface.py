"""The ``ordered-ssd`` command as a new user meets it: ``--version``, the defaults in ``--help``, a closed pipe
(``ordered-ssd env | head -1``) without a traceback, and the default output folders ignored by git."""
import os
import shutil
import subprocess
import sys

import pytest

from ordered_ssd import __version__
from ordered_ssd.apps.bench.args import build_parser as bench_parser
from ordered_ssd.apps.check.spec import DEFAULTS
from ordered_ssd.apps.cli import build_parser, main
from tests.apps.helpers import ROOT, cli_env, run_cli


def test_version_prints_name_and_version_and_exits_0():
    res = run_cli("--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"ordered-ssd {__version__}\n"


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare on single spaces


def test_check_help_shows_the_defaults(capsys):
    text = _help(["check"], capsys)
    cpu, cuda = DEFAULTS["cpu"], DEFAULTS["cuda"]
    for key in ("steps", "batch", "seq_len", "d_model", "n_layers", "d_state", "headdim", "chunk_size", "lr",
                "data_bytes"):
        assert f"(default: {cpu[key]} on the CPU, {cuda[key]} on CUDA)" in text, key
    for default in ("(default: auto,", "(default: ./ordered-ssd-check)", "(default: 1)", "(default: 0)",
                    "(default: steps/2)"):
        assert default in text


def test_every_visible_option_of_check_and_bench_says_its_default():
    """Every option with a help string names its default (``default``), except flags that only switch on."""
    import argparse

    parsers = [build_parser()._subparsers._group_actions[0].choices["check"], bench_parser()]
    for parser in parsers:
        for action in parser._actions:
            if action.help in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction) \
                    or action.dest == "help":
                continue
            assert "default" in action.help, (parser.prog, action.option_strings)


def test_top_level_help_lists_no_internal_command(capsys):
    text = _help([], capsys)
    assert "--version" in text and "check" in text and "_train" not in text and "SUPPRESS" not in text


@pytest.mark.parametrize("args", [["env"], ["check", "--help"], ["--help"], ["--version"]])
def test_closed_stdout_is_not_a_traceback(args):
    """stdout a pipe whose reader is already gone: every write fails with EPIPE, deterministically."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run([sys.executable, "-m", "ordered_ssd", *args], stdout=write_end,
                             stderr=subprocess.PIPE, text=True, env=cli_env(), timeout=300)
    finally:
        os.close(write_end)
    assert "Traceback" not in res.stderr and "BrokenPipeError" not in res.stderr, res.stderr
    assert res.returncode in (0, 1)


@pytest.mark.skipif(shutil.which("sh") is None or shutil.which("head") is None, reason="needs sh and head")
@pytest.mark.parametrize("args", ["env", "check --help"])
def test_piped_into_head_prints_one_line(args):
    res = subprocess.run(["sh", "-c", f'"{sys.executable}" -m ordered_ssd {args} | head -1'],
                         capture_output=True, text=True, env=cli_env(), timeout=300)
    assert res.returncode == 0
    assert res.stdout.count("\n") == 1 and res.stdout.strip()
    assert "Traceback" not in res.stderr and "Broken" not in res.stderr, res.stderr


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git"))
                    and not os.path.isfile(os.path.join(ROOT, ".git")), reason="needs git and a checkout")
def test_default_output_folders_are_ignored_by_git():
    """The folders the README's commands write by default stay out of ``git status``."""
    defaults = [build_parser()._subparsers._group_actions[0].choices["check"].get_default("out"),
                bench_parser().get_default("out"), "bench-out", "gpu-gate-out", "stress-out"]
    assert "ordered-ssd-check" in defaults and "ordered-ssd-bench" in defaults
    for folder in defaults:
        res = subprocess.run(["git", "check-ignore", "-q", f"{folder}/report.json"], cwd=ROOT)
        assert res.returncode == 0, f"{folder}/ is not ignored by .gitignore"
