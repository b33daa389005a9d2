"""The check runs several tests read: one 1-process and one 2-process ``ordered-ssd check`` (one per pytest run)."""
import pytest

from tests.apps.helpers import TINY_CHECK, run_cli


@pytest.fixture(scope="session")
def check_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("check")
    res = run_cli("check", *TINY_CHECK, "--batch", "2", "--out", str(out))
    return res, out


@pytest.fixture(scope="session")
def ddp_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-check")
    res = run_cli("check", *TINY_CHECK, "--batch", "4", "--nproc", "2", "--out", str(out))
    return res, out
