"""The bench's Mamba-3 layer (``--layer mamba3``), on the CPU: the option and the shapes M1-M6, the refusals, a
smoke run on the reference path, the layers built with shared parameters, the tables of both layers kept apart,
and the results written before Mamba-3 (no ``layer`` in their rows) read and rendered as before."""
import copy
import json
import os
import sys
import types

import pytest
import torch

from ordered_ssd.apps import bench
from ordered_ssd.apps.bench import precompile
from ordered_ssd.apps.bench.report import format_table
from ordered_ssd.apps.bench.results import current, load_runs, render, render_run
from ordered_ssd.apps.bench.shapes import NAMED, result_layer
from ordered_ssd.apps.bench.timing import shape_result

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
COMMITTED = os.path.join(ROOT, "docs", "results", "bench_h200.json")
TINY = "2,64,32,16,1,16,32"
SMOKE = ["--device", "cpu", "--repeats", "3", "--warmup", "1", "--bit-repeats", "2", "--quiet"]


def _args(*argv):
    return bench.build_parser().parse_args(list(argv))


def test_layer_option_default_and_shapes():
    a = _args()
    assert a.layer is None and bench.resolve_layer(a) == "mamba2"
    assert [s.name for s in bench.resolve_shapes(a)] == list(bench.SHAPES)
    a = _args("--layer", "mamba3")
    assert bench.resolve_layer(a) == "mamba3"
    assert bench.resolve_shapes(a) == list(bench.MAMBA3_SHAPES.values())
    a = _args("--layer", "mamba3", "--shapes", "m5,M2", "--shape", "4,1024,512,64,2", "--shape", TINY + ",fp16")
    shapes = bench.resolve_shapes(a)
    assert [s.name for s in shapes] == ["M5", "M2", "MX1", "MX2"] and {s.layer for s in shapes} == {"mamba3"}
    assert (shapes[2].headdim, shapes[2].chunk, shapes[2].dtype) == (64, 64, "bf16")  # Mamba3's default chunk
    assert (shapes[3].headdim, shapes[3].chunk, shapes[3].dtype) == (16, 32, "fp16")
    # Mamba-2's --shape rows are as they were: X1, chunk 256 by default
    (x1,) = bench.resolve_shapes(_args("--shape", "4,1024,512,64,2"))
    assert (x1.name, x1.layer, x1.chunk) == ("X1", "mamba2", 256)
    with pytest.raises(SystemExit):
        _args("--layer", "mamba4")
    with pytest.raises(SystemExit):
        _args("--shapes", "M7")


def test_mamba3_shapes_cover_the_issue_with_shared_kernel_keys():
    """M1-M6: bf16, realistic sizes, d_state 32/64/128, headdim 32/64, chunk 32/64, B and L varied; three native
    autotuning keys, two rows each; M1 is docs/mamba3.md's "Cost" shape; each row a valid Mamba-3 --shape whose
    projection shapes are OrderedMamba3's."""
    from ordered_ssd.modules.mamba3 import OrderedMamba3

    m = list(bench.MAMBA3_SHAPES.values())
    assert [s.name for s in m] == [f"M{i}" for i in range(1, 7)]
    assert all(s.layer == "mamba3" and s.dtype == "bf16" for s in m)
    assert {s.N for s in m} == {32, 64, 128} and {s.headdim for s in m} == {32, 64} and {s.chunk for s in m} == {32, 64}
    assert all(512 <= s.d_model <= 2048 and 1024 <= s.L <= 4096 for s in m)
    assert len({s.B for s in m}) >= 4 and len({s.L for s in m}) >= 3 and len({s.d_model for s in m}) >= 2
    keys = [s.kernel_key() for s in m]
    assert len(set(keys)) == 3 and all(keys.count(k) == 2 for k in keys), keys
    m1 = bench.MAMBA3_SHAPES["M1"]
    assert (m1.d_model, m1.N, m1.headdim, m1.chunk, m1.B, m1.L) == (512, 32, 32, 32, 8, 1024)
    for s in m:
        assert bench.parse_shape(s.spec(), name=s.name, layer="mamba3") == s
    assert not set(bench.MAMBA3_SHAPES) & set(NAMED)  # the committed Mamba-2 file's names unchanged
    layer = OrderedMamba3(d_model=m1.d_model, d_state=m1.N, headdim=m1.headdim, ngroups=2, chunk_size=m1.chunk)
    two = bench.Shape("T", 1, 64, m1.d_model, m1.N, 2, m1.headdim, m1.chunk, layer="mamba3")
    assert two.projection_weights() == (tuple(layer.in_proj.weight.shape), tuple(layer.out_proj.weight.shape))
    assert two.kernel_key() == (32, 32, 32, "bf16", 16)
    assert bench.SHAPES["S1"].kernel_key() == (256, 64, 128, "bf16")  # Mamba-2's keys as they were


@pytest.mark.parametrize("argv, message", [
    (["--modes", "upstream-det,ordered"], "--modes upstream-det: mamba-ssm has no deterministic mode for Mamba-3"),
    (["--grid"], "--grid is a Mamba-2 option"),
    (["--shape", TINY, "--breakdown", "--breakdown-shape", "S2"],
     "--breakdown-shape S2: a Mamba-2 shape, not a Mamba-3 one"),
    (["--shape", TINY, "--breakdown", "--breakdown-shape", "2,64,32,8,1"],
     "--breakdown-shape: N must be a power of two >= 16"),
    (["--no-native-child"], "--no-native-child is a Mamba-2 option"),
    (["--shapes", "M1,S1"], "--shapes S1: a Mamba-2 shape, not a Mamba-3 one"),
    (["--shapes", "grid"], "--shapes G1: a Mamba-2 shape"),
    (["--shape", "2,64,32,8,1,16,32"], "N must be a power of two >= 16 for Mamba-3"),
    (["--shape", "2,64,48,16,1,24,32"], "headdim must be a power of two >= 16 for Mamba-3"),
    (["--shape", "2,64,32,16,1,16,48"], "chunk must be a power of two >= 16 for Mamba-3"),
])
def test_refusals_with_layer_mamba3_are_one_line_exit_2(argv, message, tmp_path, capsys):
    assert bench.main(["--layer", "mamba3", *SMOKE, *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ordered-ssd bench: error: ") and message in err, err
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_a_mamba3_shape_without_the_layer_is_refused(tmp_path, capsys):
    assert bench.main([*SMOKE, "--shapes", "M1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shapes M1: a Mamba-3 shape, not a Mamba-2 one; add --layer mamba3" in err


def test_requirements_name_the_layer():
    msg = bench.missing_requirements("cuda", ["ordered"], cuda_available=True, find_spec=lambda name: object(),
                                     cuda_path=lambda: (False, "no GPU"), layer="mamba3")
    assert msg.startswith("OrderedMamba3's CUDA path is unavailable here (no GPU)")
    assert "native need a CUDA device" in bench.missing_requirements("cpu", ["native"], layer="mamba3")
    assert bench.missing_requirements("cpu", ["ordered", "literal"], layer="mamba3") is None


def test_cpu_smoke_run_of_mamba3(tmp_path, capsys):
    """The harness on OrderedMamba3's reference path: rows of layer mamba3 (the run's meta too, without grid
    settings), the Mamba-3 table (no upstream-det columns, time and memory targets), literal's bits = ordered's."""
    out = tmp_path / "out"
    rc = bench.main(["--layer", "mamba3", *SMOKE, "--shape", TINY, "--modes", "ordered,literal", "--out", str(out)])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert stdout.startswith("# ordered-ssd bench: one Mamba-3 layer, forward + backward")
    assert ("| shape | dims | mode | ms/step | × native | host ms | launches | peak MiB | × native | bitwise | "
            "targets |") in stdout and "upstream-det |" not in stdout
    assert "| MX1 | B2 L64 d32 N16 G1 P16 cs32 fp32 | ordered |" in stdout and "time — · mem — |" in stdout
    res = json.loads((out / "bench.json").read_text())
    assert res["meta"]["layer"] == "mamba3" and res["meta"]["grid_settings"] is None and res["modes"] == [
        "literal", "ordered"]
    (sr,) = res["shapes"]
    assert sr["layer"] == "mamba3" and sr["shape"]["layer"] == "mamba3" and sr["pinned"] is None
    assert sr["rows"]["ordered"]["bitwise"] is True and sr["rows"]["literal"]["same_bits_as_ordered"] is True
    assert "in_proj.weight" in sr["rows"]["ordered"]["digests"] and "B_bias" in sr["rows"]["ordered"]["digests"]
    assert sr["rows"]["ordered"]["targets"] == {"time": None, "memory": None, "met": None}


def test_layer_runner_shares_the_ordered_layers_parameters_with_native_mamba3(monkeypatch):
    """The native layer of a Mamba-3 shape is mamba-ssm's Mamba3 (here a stand-in module on the CPU) built with the
    shape's arguments and the ordered layer's parameter objects; the Mamba-2 runner is unchanged (autocast on CUDA
    only for Mamba-2)."""
    from ordered_ssd.modules.mamba3 import OrderedMamba3

    built = {}

    class Mamba3(OrderedMamba3):
        def __init__(self, **kw):
            built.update(kw)
            super().__init__(**kw)

    fake = types.ModuleType("mamba_ssm.modules.mamba3")
    fake.Mamba3 = Mamba3
    monkeypatch.setitem(sys.modules, "mamba_ssm.modules.mamba3", fake)
    shape = bench.parse_shape(TINY, name="T", layer="mamba3")
    runner = bench.LayerRunner(shape, ["native", "ordered"], torch.device("cpu"), 0)
    native, ordered = runner.layers["native"], runner.layers["ordered"]
    assert type(native) is Mamba3 and type(ordered) is OrderedMamba3 and runner.layers["literal"] is ordered
    assert {k: built[k] for k in ("d_model", "d_state", "expand", "headdim", "ngroups", "chunk_size")} == {
        "d_model": 32, "d_state": 16, "expand": 2, "headdim": 16, "ngroups": 1, "chunk_size": 32}
    assert all(p is dict(ordered.named_parameters())[n] for n, p in native.named_parameters())
    assert runner.in_dtype == torch.float32 and runner.u.dtype == torch.float32 and runner.autocast is False
    for mode in ("native", "ordered", "literal"):
        runner.step(mode)
        assert runner.u.grad is not None and ordered.D.grad is not None
    assert runner.start("literal").literal is True and runner.start("ordered").literal is False


def test_precompile_of_mamba3_shapes_groups_their_three_keys_and_imports_mamba3(monkeypatch):
    tasks = bench.precompile_tasks(list(bench.MAMBA3_SHAPES.values()), ["native", "literal", "ordered"], jobs=6)
    assert len({tuple(t["key"]) for t in tasks}) == 3 and all(t["kind"] == "plain" for t in tasks)
    assert [t["shapes"][0].name for t in tasks if t["slice"][0] == 0] == ["M1", "M3", "M5", "M2", "M4", "M6"]
    spec = json.loads(bench.worker_command(tasks[0], "cuda", 0, "r.json")[0][4])
    assert spec["shapes"][0]["layer"] == "mamba3"
    imported = []
    monkeypatch.setattr(precompile, "importlib", types.SimpleNamespace(import_module=imported.append))
    assert precompile.restrict_native_autotuners(0, 2, layers=["mamba3"]) >= 0
    assert imported == ["mamba_ssm.modules.mamba3"]


def _mamba3_run(run_id="m3run", names=("M1", "M3")):
    """A synthetic Mamba-3 bench.json (the suite's structure): native and ordered rows of ``names``."""
    rows = lambda k: {  # noqa: E731
        "native": {"mode": "native", "ms": 6.0 + k, "peak_mib": 250.0, "bitwise": False, "bit_repeats": 10,
                   "distinct_digest_sets": 4, "host_ms": 2.0, "host_steps": 5, "launches": 40.0},
        "literal": {"mode": "literal", "ms": 20.0, "peak_mib": 300.0, "bitwise": True, "bit_repeats": 10,
                    "same_bits_as_ordered": True, "host_ms": 9.0, "host_steps": 5, "launches": 90.0},
        "ordered": {"mode": "ordered", "ms": 6.3 + 1.5 * k, "peak_mib": 260.0, "bitwise": True, "bit_repeats": 10,
                    "host_ms": 2.5, "host_steps": 5, "launches": 45.0}}
    shapes = []
    for k, name in enumerate(names):
        s = bench.MAMBA3_SHAPES[name]
        shapes.append(dict(shape_result(s, torch.device("cuda")), rows=rows(k), pinned=None))
    return {"meta": {"gpu": "NVIDIA H100 80GB HBM3 (sm_90)", "date": "2026-12-07 00:00 UTC", "run_id": run_id,
                     "commit": "m3c0mm1", "command": "ordered-ssd bench --layer mamba3", "layer": "mamba3",
                     "precision": "the layers built in the row's dtype", "timer": "torch.cuda.Event per step",
                     "versions": {"torch": "2.11.0+cu130"}, "pinned_configs": "csrc_bindings/abi1 table=ee",
                     "settings": {"repeats": 20, "warmup": 5, "bit_repeats": 10, "host_steps": 5},
                     "grid_settings": None},
            "modes": ["native", "literal", "ordered"], "children": {}, "shapes": shapes}


def test_rows_of_both_layers_render_into_separate_tables(tmp_path, capsys):
    """A results file with the committed Mamba-2 rows and a newer Mamba-3 run: --render prints Mamba-2's section
    exactly as before (its own runs' provenance, not the newer Mamba-3 run's), then Mamba-3's under its own heading
    with its own columns and targets; --layer picks one; a Mamba-3 run's rows never replace Mamba-2 rows."""
    path = str(tmp_path / "results.json")
    with open(COMMITTED) as fh:
        committed = json.load(fh)
    with open(path, "w") as fh:
        json.dump(committed, fh)
    before = render(COMMITTED)
    runs = bench.merge_run(path, _mamba3_run())
    assert runs[0]["meta"]["run_id"] == "m3run" and len(runs) == len(committed["runs"]) + 1
    assert sorted(s["name"] for r in runs[1:] for s in r["shapes"]) == sorted(NAMED)
    md = render(path)
    assert md.startswith(before) and md[len(before):].startswith("\n### Mamba-3: NVIDIA H100 80GB HBM3, 2026-12-07")
    m3 = md[len(before) + 1:]
    assert "| M1 | B8 L1024 d512 N32 G1 P32 cs32 bf16 | ordered | 6.300 | 1.050 | 2.50 | 45 | 260 | 1.040 | yes " \
           "(10/10) | time ✓ · mem ✓ |" in m3
    assert "| M3 | B4 L2048 d1024 N64 G1 P64 cs64 bf16 | literal |" in m3 and "= ordered" in m3
    assert "upstream-det" not in m3.split("× native: to the native median")[0] and "| S1 |" not in m3
    assert "Targets (ordered / native ≤ 1.05 step time and ≤ 1.10 peak memory): all met on 1 of 2 shapes (M1); " \
           "missed on M3 (time 1.114)" in m3
    assert render(path, layer="mamba2") == before and render(path, layer="mamba3") == m3
    assert render(path, 0) == m3  # run 0 is the Mamba-3 run
    assert bench.main(["--render", path, "--layer", "mamba3"]) == 0 and capsys.readouterr().out == m3
    assert bench.main(["--render", COMMITTED, "--layer", "mamba3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no Mamba-3 row (--layer mamba3)" in err
    # one bench.json holding both layers (a --merge of a Mamba-2 and a Mamba-3 run): one table each
    both = _mamba3_run()
    both["shapes"] = [copy.deepcopy(committed["runs"][0]["shapes"][0])] + both["shapes"]
    for sr in both["shapes"]:
        bench.finalize_ratios(sr)
    table = format_table(both)
    assert table.startswith("# ordered-ssd bench: one Mamba-2 / Mamba-3 layer, forward + backward")
    assert table.index("#### Mamba-2") < table.index("| × upstream-det |") < table.index("#### Mamba-3")
    assert table.count("| shape | dims | mode |") == 2 and table.count("Targets (") == 2


def test_results_written_before_mamba3_load_and_render_unchanged():
    """The committed file's rows have no "layer": they are Mamba-2's, their targets keep upstream-det, and their
    table is the same with or without a "layer": "mamba2" in every row (new Mamba-2 runs record it)."""
    runs = load_runs(COMMITTED)
    shapes = [s for r in runs for s in r["shapes"]]
    assert shapes and all("layer" not in s and result_layer(s) == "mamba2" for s in shapes)
    md = render(COMMITTED)
    assert md == render(COMMITTED, layer="mamba2") and "Mamba-3" not in md
    assert md.startswith("### NVIDIA H200, ") and "det ✓ (same process)" in md
    with open(COMMITTED) as fh:
        data = json.load(fh)
    for run in data["runs"]:
        for sr in run["shapes"]:
            sr["layer"] = "mamba2"
            sr.setdefault("shape", {})["layer"] = "mamba2"
    assert render_run(current(data["runs"])) == md
    rows = {"ordered": {"ratio_ms": 1.0, "ratio_mem": 1.0}}
    assert bench.targets(rows) == {"time": True, "memory": True, "upstream_det": None, "met": None,
                                   "upstream_det_ratio": None}  # Mamba-2: the det target not measured
    assert bench.targets(rows, "mamba3") == {"time": True, "memory": True, "met": True}
    assert bench.targets({"ordered": {"ratio_ms": 1.0, "ratio_mem": 1.2}}, "mamba3")["met"] is False


def test_breakdown_of_a_mamba3_shape_on_the_cpu(tmp_path, capsys):
    """``--breakdown`` with ``--layer mamba3`` profiles a Mamba-3 layer (its spec parsed for Mamba-3: chunk 64 by
    default, not Mamba-2's 256); the default breakdown shape is the layer's (M1, S2 for Mamba-2)."""
    out = tmp_path / "out"
    rc = bench.main(["--layer", "mamba3", *SMOKE, "--shape", TINY, "--modes", "ordered", "--out", str(out),
                     "--breakdown", "--breakdown-shape", "1,32,32,16,1", "--breakdown-steps", "1"])
    assert rc == 0, capsys.readouterr().err
    bd = json.loads((out / "breakdown.json").read_text())
    assert bd["shape"] == "1,32,32,16,1,64,64" and bd["dims"] == "B1 L32 d32 N16 G1 P64 cs64 fp32"
    assert bd["modes"]["ordered"]["error"] is None and bd["modes"]["ordered"]["kernels"]
    ops = {k["name"] for k in bd["modes"]["ordered"]["kernels"]}
    assert any("mm" in n for n in ops), sorted(ops)[:20]  # the projections of the reference layer ran
    from ordered_ssd.apps.bench.args import build_parser, resolve_breakdown_shape
    for argv, name in ((["--layer", "mamba3", "--breakdown"], "M1"), (["--breakdown"], "S2"), ([], None)):
        got = resolve_breakdown_shape(build_parser().parse_args(argv))
        assert (got.name if got is not None else None) == name
