"""The check's precompile phase (:mod:`ordered_ssd.apps.check.precompile`) on the CPU: the slice syntax, a worker's
one step (mamba-ssm's autotuners restricted to its slice, a forward and backward of the spec's model, nothing
written), and a failed worker named in one line without stopping anything. The GPU's cache is what it fills; its
effect on the wall time is measured on the GPU (docs/check.md)."""
import json

import pytest
import torch

from ordered_ssd.apps.check import precompile as pre
from ordered_ssd.apps.check.spec import spec_from_args
from ordered_ssd.apps.cli import build_parser
from tests.apps.helpers import TINY_CHECK


@pytest.mark.parametrize("text, expected", [("0/1", (0, 1)), ("3/8", (3, 8))])
def test_parse_slice(text, expected):
    assert pre.parse_slice(text) == expected


@pytest.mark.parametrize("text, message", [
    ("1/1", "--precompile: expected 0 <= I < K, got '1/1'"),
    ("-1/4", "--precompile: expected 0 <= I < K, got '-1/4'"),
    ("a/4", "--precompile: expected I/K (two integers), got 'a/4'"),
    ("2", "--precompile: expected I/K (two integers), got '2'"),
])
def test_parse_slice_refuses(text, message):
    with pytest.raises(ValueError) as info:
        pre.parse_slice(text)
    assert str(info.value) == message


def _spec(*extra):
    spec = spec_from_args(build_parser().parse_args(["check", *TINY_CHECK, "--batch", "2", *extra]))
    return dict(spec, mixer="ordered")


def test_warm_step_restricts_the_autotuners_then_runs_a_forward_and_backward(monkeypatch):
    from ordered_ssd.apps.bench import precompile as bench_pre
    from ordered_ssd.apps.check import train

    calls, models = [], []
    monkeypatch.setattr(bench_pre, "restrict_native_autotuners",
                        lambda index, count, layers: calls.append((index, count, tuple(layers))) or 0)
    build = train.build_model

    def recording(spec, device):
        model, opt = build(spec, device)
        models.append(model)
        return model, opt
    monkeypatch.setattr(train, "build_model", recording)
    spec = _spec("--layer", "mamba3", "--d-state", "16")
    pre.warm_step(spec, 2, 4)
    assert calls == [(2, 4, ("mamba3",))]
    grads = [p.grad for p in models[0].parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_a_failed_worker_is_named_in_one_line(tmp_path, monkeypatch):
    """Without mamba-ssm (CI) every worker fails at the import; each failure is one line with its reason."""
    try:
        import mamba_ssm  # noqa: F401
        pytest.skip("mamba-ssm is installed: the workers would succeed")
    except ImportError:
        pass
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(_spec()))
    seconds, failures = pre.precompile([str(spec_path)], str(tmp_path), 2)
    assert seconds > 0 and len(failures) == 2
    for i, line in enumerate(failures):
        assert line.startswith(f"precompile-{i}.log: exit code 1: ") and "mamba_ssm" in line, line
        assert "\n" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precompile-0.log", "precompile-1.log", "spec.json"]
