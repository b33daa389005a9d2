"""``benchmarks/check_overhead.py``: on the CPU with a tiny model, the plain and checked loops and, with
``--parts``, the check's loop with each part left out are timed into the JSON; a part left out is really left out
(the record's digests say so) and the check's classes are back afterwards."""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import check_overhead  # noqa: E402

TINY = ["--device", "cpu", "--d-model", "32", "--n-layers", "1", "--d-state", "8", "--headdim", "16",
        "--chunk-size", "16", "--seq-len", "24", "--batch", "2", "--data-bytes", "60000"]


def test_parts_are_timed_and_the_check_is_restored(tmp_path, capsys):
    from ordered_ssd.apps.check import digests, modules, train

    path = tmp_path / "o.json"
    assert check_overhead.main([*TINY, "--steps", "2", "--rounds", "1", "--parts", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert set(r["parts_ms_per_step"]) == set(check_overhead.PARTS) == set(r["parts_s"])
    assert all(v > 0 for v in r["parts_ms_per_step"].values()) and r["plain_ms_per_step"] > 0
    stats = r["digest_stats"]  # the check loop's StepDigests: two submissions a step (gradients, parameters)
    assert stats["submits"] == 4 and stats["submit_s"] >= stats["wait_s"] >= 0 and stats["submit_s"] > 0
    printed = capsys.readouterr().out
    assert "StepDigests.submit took" in printed and r["hasher"] == "process" and "hashing in a process" in printed
    assert all(text in printed for part, text in check_overhead.PARTS.items() if part != "other_hasher")
    assert "the check's loop with the hashing in threads:" in printed
    assert train.OutputDigests is modules.OutputDigests and train.StepDigests is digests.StepDigests
    assert digests.StepDigests.submit.__qualname__ == "StepDigests.submit"


@pytest.mark.parametrize("part, grads_hashed, outputs_kept", [
    ("no_digests", False, True), ("no_outputs", True, False), ("no_norms", True, True)])
def test_a_part_left_out_is_not_in_the_record(tmp_path, part, grads_hashed, outputs_kept):
    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.cli import build_parser
    from ordered_ssd.apps.lm import ByteData, load_corpus

    spec = spec_from_args(build_parser().parse_args(["check", *TINY, "--steps", "2"]))
    corpus, _, cut = load_corpus(spec["data"], spec["data_bytes"])
    spec["data_sha256"] = ByteData(corpus, spec["seq_len"], cut=cut).sha256
    with check_overhead._without(part):
        check_overhead._checked(spec, check_overhead.torch.device("cpu"), 2, str(tmp_path))
    step = json.loads((tmp_path / "record.json").read_text())["steps"][0]
    assert all(len(v) == 64 for v in step["grads"].values()) is grads_hashed
    assert bool(step.get("outputs")) is outputs_kept
    assert bool(step.get("grad_norms")) is (part == "no_outputs")


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError,
                       match="part: expected one of other_hasher, no_outputs, no_norms, no_digests, got 'x'"):
        with check_overhead._without("x"):
            pass


@pytest.mark.parametrize("hasher", ["process", "threads"])
def test_the_hasher_reaches_the_check_loops_step_digests(tmp_path, monkeypatch, hasher):
    """``_checked(..., hasher=...)`` builds the loop's StepDigests with that hasher, and the record's digests are
    the same either way."""
    from ordered_ssd.apps.check import digests
    from ordered_ssd.apps.check.spec import spec_from_args
    from ordered_ssd.apps.cli import build_parser
    from ordered_ssd.apps.lm import ByteData, load_corpus

    made = []
    init = digests.StepDigests.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self.hasher)

    monkeypatch.setattr(digests.StepDigests, "__init__", recording)
    spec = spec_from_args(build_parser().parse_args(["check", *TINY, "--steps", "2"]))
    corpus, _, cut = load_corpus(spec["data"], spec["data_bytes"])
    spec["data_sha256"] = ByteData(corpus, spec["seq_len"], cut=cut).sha256
    check_overhead._checked(spec, check_overhead.torch.device("cpu"), 2, str(tmp_path), hasher=hasher)
    assert made == [hasher]
    grads = json.loads((tmp_path / "record.json").read_text())["steps"][1]["grads"]
    other = tmp_path / "other"
    other.mkdir()
    check_overhead._checked(spec, check_overhead.torch.device("cpu"), 2, str(other),
                            hasher={"process": "threads", "threads": "process"}[hasher])
    assert json.loads((other / "record.json").read_text())["steps"][1]["grads"] == grads


def test_plain_training_copies_its_batches_with_batch_to(monkeypatch):
    """Plain training copies each step's inputs and targets as the check's loop does (``lm.batch_to``), so that
    the two loops differ only by the check."""
    from ordered_ssd.apps import lm
    from ordered_ssd.apps.check.train import build_model

    spec, device, data = check_overhead.check_setup(TINY)
    seen = []
    real = lm.batch_to
    monkeypatch.setattr(lm, "batch_to", lambda tensor, dev: seen.append(tensor.clone()) or real(tensor, dev))
    model, optimizer = build_model(spec, device)
    for step in range(2):
        check_overhead.plain_step(spec, data, device, model, optimizer, step)
    expected = [t for step in range(2) for t in data.batch(spec["seed"], step, spec["batch"])]
    assert len(seen) == 4 and all(torch.equal(a, b) for a, b in zip(seen, expected))


@pytest.mark.parametrize("script", ["check_overhead", "check_host_time", "digest_submit", "check_first_step"])
def test_help_says_the_other_flags_are_the_checks(script, capsys):
    """The benchmarks that pass unknown flags on to the check's parser say so in their --help, and those flags exist
    there."""
    import importlib

    from ordered_ssd.apps.cli import build_parser

    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0
    assert " ".join(capsys.readouterr().out.split()).endswith(check_overhead.CHECK_FLAGS)
    check_help = build_parser().parse_known_args(["check"])[0]
    assert all(hasattr(check_help, name) for name in ("device", "steps", "batch", "seq_len"))
