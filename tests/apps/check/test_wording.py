"""A number and its noun agree in the check's lines (:func:`ordered_ssd.apps.check.errors.plural`): "1 layer",
"1 process", "2 processes"."""
import pytest

from ordered_ssd.apps.check import CheckError
from ordered_ssd.apps.check.errors import plural
from ordered_ssd.apps.check.memory import _size_flags
from ordered_ssd.apps.check.spec import DEFAULTS
from ordered_ssd.apps.check.world import DDP_CKPT_FORMAT, DataParallel


def test_plural():
    assert [plural(n, "layer") for n in (0, 1, 2)] == ["0 layers", "1 layer", "2 layers"]
    assert [plural(n, "process", "processes") for n in (1, 4)] == ["1 process", "4 processes"]


def test_memory_flags_say_one_row():
    d = DEFAULTS["cpu"]
    spec = {"model": {k: d[k] for k in ("d_model", "n_layers", "d_state", "headdim", "chunk_size")} | {"ngroups": 1},
            "batch": 4, "seq_len": 128}
    assert _size_flags(spec, rows=1, processes=4).endswith("--batch 4 --seq-len 128 (4 processes of 1 row)")
    assert _size_flags(spec, rows=2, processes=2).endswith("(2 processes of 2 rows)")
    assert "process" not in _size_flags(spec, rows=4, processes=1)


def test_data_parallel_errors_say_one_rank_and_one_process():
    with pytest.raises(CheckError, match=r"^the spec's split has 1 rank but nproc 2$"):
        DataParallel({"nproc": 2, "device": "cpu", "split": {"ranks": 1}})
    world = DataParallel({"nproc": 2, "device": "cpu"})
    with pytest.raises(CheckError, match=r"^checkpoint c\.pt was written by 1 process, this run has 2: "):
        world.check_checkpoint({"format": DDP_CKPT_FORMAT, "world_size": 1}, "c.pt")
    with pytest.raises(CheckError, match=r"^checkpoint c\.pt was written by 4 processes, this run has 2: "):
        world.check_checkpoint({"format": DDP_CKPT_FORMAT, "world_size": 4}, "c.pt")
