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
    assert all(x.headdim == 64 and x.chunk == 256 for x in s.values())
    assert s["S3"].nheads == 128


def test_parse_shape():
    s = bench.parse_shape("4, 1024, 512, 64, 2")
    assert (s.B, s.L, s.d_model, s.N, s.G, s.headdim, s.chunk) == (4, 1024, 512, 64, 2, 64, 256)
    assert s.name == "4,1024,512,64,2,64,256"
    t = bench.parse_shape(TINY, name="T")
    assert (t.name, t.headdim, t.chunk, t.nheads) == ("T", 16, 32, 4)
    assert bench.parse_shape(t.spec()) == bench.Shape(t.spec(), 2, 64, 32, 16, 1, 16, 32)
    assert bench.named_or_parsed_shape(" s2 ") is bench.SHAPES["S2"]
    assert bench.named_or_parsed_shape(TINY) == bench.parse_shape(TINY)
    with pytest.raises(ValueError, match="unknown|5 or 7"):
        bench.named_or_parsed_shape("S9")


@pytest.mark.parametrize("text,needle", [
    ("1,2", "5 or 7 comma-separated positive integers"),
    ("1,2,3,4,5,6", "5 or 7"),
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
    with pytest.raises(ValueError, match="unknown shape 'S9'"):
        bench.parse_shape_list("S1,S9")
    with pytest.raises(ValueError, match="--shapes"):
        bench.parse_shape_list("S1,,S2")
    assert bench.parse_modes("ordered, native,upstream-det") == ["native", "upstream-det", "ordered"]
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        bench.parse_modes("ordered,fast")
