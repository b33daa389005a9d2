"""The bench's command line (:mod:`ordered_ssd.apps.bench.args`)."""
import pytest

from ordered_ssd.apps import bench

TINY = "2,64,32,16,1,16,32"


def test_parser_defaults_and_selection():
    a = bench.build_parser().parse_args([])
    assert (a.breakdown_shape, a.device, a.host_steps, a.launch_steps) == (None, "cuda", 5, 2)
    assert (a.precompile_jobs, a.results_json, a.render, a.grid) == (None, None, None, False)
    assert bench.resolve_settings(a) == {
        "default": {"repeats": 20, "warmup": 5, "bit_repeats": 10, "host_steps": 5, "launch_steps": 2, "seed": 0},
        "grid": {"repeats": 15, "warmup": 3, "bit_repeats": 5, "host_steps": 5, "launch_steps": 2, "seed": 0}}
    assert a.shapes is None and a.shape == [] and a.modes is None
    a = bench.build_parser().parse_args(["--shapes", "S1,S3", "--shape", TINY, "--shape", "1,128,64,16,1",
                                         "--modes", "ordered,literal"])
    assert [s.name for s in bench.resolve_shapes(a)] == ["S1", "S3", "X1", "X2"]
    assert a.modes == ["literal", "ordered"]
    assert [s.name for s in bench.resolve_shapes(bench.build_parser().parse_args([]))] == list(bench.SHAPES)
    for bad in (["--repeats", "0"], ["--warmup", "-1"], ["--modes", "x"], ["--time-budget", "0"],
                ["--precompile-jobs", "-1"], ["--host-steps", "0"], ["--shape", "1,2,3,4,5,6,7,int8"]):
        with pytest.raises(SystemExit):
            bench.build_parser().parse_args(bad)


def test_grid_option_and_per_row_settings():
    """--grid adds G1-G13 after the shapes asked for (S1-S5 by default); grid rows take the grid's settings unless
    an option is given, which then applies to every row."""
    from ordered_ssd.apps.bench.args import shape_settings

    a = bench.build_parser().parse_args(["--grid"])
    names = [s.name for s in bench.resolve_shapes(a)]
    assert names == list(bench.SHAPES) + list(bench.GRID)
    a = bench.build_parser().parse_args(["--grid", "--shapes", "G3,S2", "--shape", TINY + ",fp16", "--repeats", "7"])
    shapes = bench.resolve_shapes(a)
    assert [s.name for s in shapes] == ["G3", "S2", "X1"] + [n for n in bench.GRID if n != "G3"]
    assert shapes[2].dtype == "fp16" and shapes[2].spec() == TINY + ",fp16"
    settings = bench.resolve_settings(a)
    g, s2, x1 = (shape_settings(x, settings) for x in shapes[:3])
    assert (g["repeats"], g["warmup"], g["bit_repeats"]) == (7, 3, 5)
    assert (s2["repeats"], s2["warmup"], s2["bit_repeats"]) == (7, 5, 10) and x1 == s2
    renamed = bench.Shape("G3", *[getattr(bench.GRID["G3"], f) for f in ("B", "L", "d_model", "N", "G")])
    assert shape_settings(renamed, settings) is settings["default"]  # the name alone does not make a grid row
