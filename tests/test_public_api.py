"""The names the README and docs/ give as user API are exported by ``ordered_ssd`` itself (in ``__all__``), are the
very objects of their modules, and exporting them makes ``import ordered_ssd`` import nothing more (no
``transformers``)."""
import importlib
import os
import subprocess
import sys

import pytest
import torch

import ordered_ssd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: documented name -> the module the docs name it from
DOCUMENTED = {
    "init_distributed": "ordered_ssd.distributed",   # docs/distributed.md
    "rank_fingerprint": "ordered_ssd.distributed",   # ordered_ssd/distributed.py's docstring, docs/distributed.md
    "audit_model": "ordered_ssd.hf",                 # README.md, docs/convert.md, docs/guarantees.md
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_name_is_exported_and_is_its_modules_object(name):
    module = importlib.import_module(DOCUMENTED[name])
    assert name in ordered_ssd.__all__
    assert getattr(ordered_ssd, name) is getattr(module, name)
    namespace = {}
    exec(f"from ordered_ssd import {name}", namespace)
    assert namespace[name] is getattr(module, name)


def test_star_import_gives_every_name_of_all():
    namespace = {}
    exec("from ordered_ssd import *", namespace)
    assert set(ordered_ssd.__all__) <= set(namespace)
    assert {namespace[n] for n in DOCUMENTED} == {getattr(importlib.import_module(m), n) for n, m in DOCUMENTED.items()}


def test_exported_rank_fingerprint_carries_the_world_size():
    info = ordered_ssd.rank_fingerprint("cpu", 4)
    assert info["world_size"] == 4
    assert info == ordered_ssd.distributed.rank_fingerprint(torch.device("cpu"), 4)


def test_exported_audit_model_reports_a_dropout():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.25), torch.nn.Dropout(0.0))
    findings = ordered_ssd.audit_model(model)
    assert [(f.module, f.kind) for f in findings] == [("1", "dropout")]
    assert findings[0].detail.startswith("p=0.25: ")
    assert ordered_ssd.audit_model(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []


def test_import_does_not_pull_in_transformers():
    code = "import sys, ordered_ssd; print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
