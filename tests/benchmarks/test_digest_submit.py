"""``benchmarks/digest_submit.py`` on the CPU with a tiny model: every part is timed into the JSON, for the check
model's tensors."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import digest_submit  # noqa: E402
from tests.benchmarks.test_check_overhead import TINY  # noqa: E402


def test_every_part_is_timed(tmp_path, capsys):
    path = tmp_path / "d.json"
    assert digest_submit.main([*TINY, "--repeats", "3", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    parts = ["submit, norms", "submit", "views", "foreach_copy", "cat"]
    assert all(r[k] > 0 for k in parts) and "copy to host" not in r and "norms" not in r  # CUDA only
    import torch

    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.check.train import build_model
    from ordered_ssd.apps.cli import build_parser

    model, _ = build_model(spec_from_args(build_parser().parse_args(["check", *TINY])), torch.device("cpu"))
    params = list(model.parameters())
    assert r["tensors"] == len(params) and r["bytes"] >= sum(p.numel() * p.element_size() for p in params)
    printed = capsys.readouterr().out
    assert f"{len(params)} tensors" in printed and all(f"  {k}: " in printed for k in parts)


def test_bad_repeats_are_refused():
    with pytest.raises(SystemExit):
        digest_submit.main([*TINY, "--repeats", "0"])
