"""``benchmarks/parity.py`` on the CPU: the parity model's sampled log-probabilities are the training forward's on
every token, padded and packed, and its tokens the same at every batch size (exit 0); the recurrent control differs
on some tokens (so the comparison can fail)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import parity  # noqa: E402


def test_parity_is_exact_and_the_control_is_not(tmp_path, capsys):
    out = tmp_path / "parity.json"
    assert parity.main(["--prompts", "6", "--new-tokens", "10", "--batch-sizes", "1,4,6", "--d-model", "32",
                        "--chunk-size", "8", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["models"]
    assert set(r) == {"parity", "recurrent"} and len(r["parity"]) == 6
    for row in r["parity"].values():
        assert row["tokens"] == 60 and row["differing"] == 0 and row["same_tokens_as_first_batch_size"]
    assert sum(row["differing"] for row in r["recurrent"].values()) > 0
    assert len(capsys.readouterr().out.splitlines()) == 12
