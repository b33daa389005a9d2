"""The named shapes and the shape / mode syntax (:mod:`ordered_ssd.apps.bench.shapes`)."""
import pytest

from ordered_ssd.apps import bench

TINY = "2,64,32,16,1,16,32"


def test_named_shapes_match_the_issue():
    s = bench.SHAPES
    assert list(s) == ["S1", "S2", "S3", "S4", "S5"]
    assert (s["S1"].B, s["S1"].L, s["S1"].d_model, s["S1"].N, s["S1"].G) == (2, 2048, 1024, 128, 1)
    assert (s["S2"].B, s["S2"].L, s["S2"].d_model, s["S2"].N, s["S2"].G) == (8, 4096, 2048, 128, 1)
    assert (s["S3"].B, s["S3"].L, s["S3"].d_model, s["S3"].N, s["S3"].G) == (4, 4096, 4096, 128, 8)
    assert (s["S4"].B, s["S4"].L, s["S4"].d_model, s["S4"].N, s["S4"].G) == (1, 65536, 1024, 128, 1)
    assert (s["S5"].B, s["S5"].L, s["S5"].d_model, s["S5"].N, s["S5"].G) == (64, 512, 768, 64, 1)
    assert all(x.headdim == 64 and x.chunk == 256 and x.dtype == "bf16" for x in s.values())
    assert s["S3"].nheads == 128
    assert s["S1"].dims() == "B2 L2048 d1024 N128 G1 P64 cs256 bf16"


def test_grid_spans_the_key_space_of_issue_14_with_few_kernel_keys():
    """The grid covers B 1..64, L 512..16384, d_state 16..256, headdim 32..128, ngroups 1..8, chunk 64..256, bf16
    and fp16 (at least 3 fp16 rows), in at least 12 rows, with 7 kernel keys (chunk, headdim, d_state, dtype) in
    all with S1-S5 (each new key is a full native autotuning); every row is a valid --shape."""
    g = list(bench.GRID.values())
    assert len(g) >= 12 and [s.name for s in g] == [f"G{i}" for i in range(1, len(g) + 1)]
    for field, lo, hi in (("B", 1, 64), ("L", 512, 16384), ("N", 16, 256), ("headdim", 32, 128), ("G", 1, 8),
                          ("chunk", 64, 256)):
        values = [getattr(s, field) for s in g]
        assert (min(values), max(values)) == (lo, hi), field
    assert {s.chunk for s in g} == {64, 128, 256} and {s.headdim for s in g} == {32, 64, 128}
    assert {s.dtype for s in g} == {"bf16", "fp16"} and sum(s.dtype == "fp16" for s in g) >= 3
    keys = {s.kernel_key() for s in g} | {s.kernel_key() for s in bench.SHAPES.values()}
    assert len(keys) == 7, sorted(keys)
    assert {s.kernel_key() for s in bench.SHAPES.values()} <= {s.kernel_key() for s in g}
    for s in g:
        assert bench.parse_shape(s.spec(), name=s.name) == s  # headdim divides d_inner, G divides the heads
        conv_dim = 2 * s.d_model + 2 * s.G * s.N
        assert conv_dim % 8 == 0 and (conv_dim + 2 * s.d_model + s.nheads) % 8 == 0, s  # causal-conv1d strides
    assert bench.GRID["G12"].nheads == 256 and bench.GRID["G8"].dims() == "B8 L2048 d1024 N128 G1 P64 cs256 fp16"


def test_parse_shape():
    s = bench.parse_shape("4, 1024, 512, 64, 2")
    assert (s.B, s.L, s.d_model, s.N, s.G, s.headdim, s.chunk) == (4, 1024, 512, 64, 2, 64, 256)
    assert s.name == "4,1024,512,64,2,64,256"
    t = bench.parse_shape(TINY, name="T")
    assert (t.name, t.headdim, t.chunk, t.nheads) == ("T", 16, 32, 4)
    assert bench.parse_shape(t.spec()) == bench.Shape(t.spec(), 2, 64, 32, 16, 1, 16, 32)
    assert bench.named_or_parsed_shape(" s2 ") is bench.SHAPES["S2"]
    assert bench.named_or_parsed_shape("g3") is bench.GRID["G3"]
    assert bench.named_or_parsed_shape(TINY) == bench.parse_shape(TINY)
    with pytest.raises(ValueError, match="unknown|5 or 7"):
        bench.named_or_parsed_shape("S9")


def test_parse_shape_with_a_dtype():
    h = bench.parse_shape(TINY + ", FP16")
    assert (h.dtype, h.headdim, h.chunk, h.name) == ("fp16", 16, 32, TINY + ",fp16")
    assert h.spec() == TINY + ",fp16" and h.dims() == "B2 L64 d32 N16 G1 P16 cs32 fp16"
    assert h.dims("fp32") == "B2 L64 d32 N16 G1 P16 cs32 fp32" and h.kernel_key() == (32, 16, 16, "fp16")
    b = bench.parse_shape(TINY + ",bf16")
    assert b.dtype == "bf16" and b.spec() == TINY and b == bench.parse_shape(TINY)  # bf16 is the default
    assert bench.parse_shape(h.spec()) == h


@pytest.mark.parametrize("text,needle", [
    ("1,2", "5 or 7 comma-separated positive integers"),
    ("1,2,3,4,5,6", "5 or 7"),
    ("2,64,32,16,1,fp16", "5 or 7"),
    ("2,64,32,16,1,16,32,fp32", "dtype must be one of bf16, fp16, got 'fp32'"),
    ("2,64,32,16,1,16,32,bf16,9", "5 or 7"),
    ("2,64,32,16,x", "G must be a positive integer, got 'x'"),
    ("2,0,32,16,1", "L must be a positive integer, got 0"),
    ("2,64,32,16,1,48,32", "headdim 48 must divide d_inner = 2 * d_model = 64"),
    ("2,64,64,16,3,16,32", "G 3 must divide the number of heads"),
])
def test_bad_shape_is_a_clear_error(text, needle):
    with pytest.raises(ValueError, match="--shape") as ei:
        bench.parse_shape(text)
    assert needle in str(ei.value)


def test_shape_list_and_modes():
    assert [s.name for s in bench.parse_shape_list("s3,S1,S3")] == ["S3", "S1"]
    assert [s.name for s in bench.parse_shape_list("g2,S1,grid")] == ["G2", "S1"] + [
        n for n in bench.GRID if n != "G2"]
    with pytest.raises(ValueError, match="unknown shape 'S9'"):
        bench.parse_shape_list("S1,S9")
    with pytest.raises(ValueError, match="--shapes"):
        bench.parse_shape_list("S1,,S2")
    assert bench.parse_modes("ordered, native,upstream-det") == ["native", "upstream-det", "ordered"]
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        bench.parse_modes("ordered,fast")


@pytest.mark.parametrize("spec", ["2,16,64,16,1,16,32", "1,8,96,8,2,32,16", "1,8,64,24,4,16,16"])
def test_projection_weights_are_the_bench_layers_parameter_shapes(spec):
    """The shapes of the projection weights of the layer the bench builds (``LayerRunner``, small CPU shapes with
    1, 2 and 4 groups)."""
    import torch

    from ordered_ssd.apps.bench.runner import LayerRunner

    s = bench.named_or_parsed_shape(spec)
    layer = LayerRunner(s, ["ordered"], torch.device("cpu"), 0).ordered
    assert s.d_inner == layer.d_inner and s.nheads == layer.nheads
    assert s.projection_weights() == (tuple(layer.in_proj.weight.shape), tuple(layer.out_proj.weight.shape))
