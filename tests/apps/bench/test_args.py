"""The bench's command line (:mod:`ordered_ssd.apps.bench.args`)."""
import pytest

from ordered_ssd.apps import bench

TINY = "2,64,32,16,1,16,32"


def test_parser_defaults_and_selection():
    a = bench.build_parser().parse_args([])
    assert (a.repeats, a.warmup, a.bit_repeats, a.breakdown_shape, a.device) == (20, 5, 10, "S2", "cuda")
    assert a.shapes is None and a.shape == [] and a.modes is None
    a = bench.build_parser().parse_args(["--shapes", "S1,S3", "--shape", TINY, "--shape", "1,128,64,16,1",
                                         "--modes", "ordered,literal"])
    assert [s.name for s in bench.resolve_shapes(a)] == ["S1", "S3", "X1", "X2"]
    assert a.modes == ["literal", "ordered"]
    assert [s.name for s in bench.resolve_shapes(bench.build_parser().parse_args([]))] == list(bench.SHAPES)
    for bad in (["--repeats", "0"], ["--warmup", "-1"], ["--modes", "x"], ["--time-budget", "0"]):
        with pytest.raises(SystemExit):
            bench.build_parser().parse_args(bad)
