"""Helpers of the application tests: the ``ordered-ssd`` command in a fresh process, the tiny check model."""
from __future__ import annotations

import os
import subprocess
import sys

from ordered_ssd.distributed import TEST_SKEW_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: ``ordered-ssd check`` arguments of a model that trains in seconds on the CPU (add ``--batch``).
TINY_CHECK = ["--device", "cpu", "--d-model", "32", "--n-layers", "1", "--d-state", "8", "--headdim", "16",
              "--chunk-size", "16", "--steps", "6", "--stop-at", "3", "--seq-len", "24", "--data-bytes", "60000",
              "--quiet"]


def cli_env(**extra) -> dict:
    """This environment with the worktree first on ``PYTHONPATH``, the testing-only fingerprint skew unset, and
    ``extra``."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(TEST_SKEW_ENV, None)
    env.update(extra)
    return env


def run_cli(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    """``python -m ordered_ssd ARGS`` in a fresh process (output captured)."""
    return subprocess.run([sys.executable, "-m", "ordered_ssd", *args], capture_output=True, text=True,
                          env=env or cli_env(), cwd=cwd, timeout=600)
