"""``loss.png`` (:mod:`ordered_ssd.apps.check.plot`): what is drawn per step is each run's difference from its
reference: a map of cells (identical bits in one colour, a difference coloured by its size or by its category), a
magnitude panel only for what differs, the loss curves; the restart, the verdict and a divergence in the figure."""
import math

import pytest

from ordered_ssd.apps.check.plot import (CELL_COLORS, CELL_LABELS, IDENTICAL, MAGNITUDE_RANGE, NORMS_EQUAL, NOT_FINITE,
                                         _magnitude_colors, cell_kind, differences, figure, map_rows, plot,
                                         plot_data, plot_pairs, tensor_difference)

NAMES = ["w", "v", "u"]


def _rec(losses, grads=None, params=None, final="f", grad_norms=None, param_norms=None, mixer="ordered",
         restarts=None):
    """A run record: ``losses`` as float.hex; ``grads``/``params``: ``{step: {name: suffix}}``, a suffix that makes
    that tensor's digest differ from the reference's (``params`` None: no per-step parameters recorded)."""
    steps = []
    for i, loss in enumerate(losses):
        s = {"step": i, "loss": float(loss).hex(), "grads": {n: f"g{i}" + (grads or {}).get(i, {}).get(n, "")
                                                              for n in NAMES}}
        if params is not None:
            s["params"] = {n: f"p{i}" + params.get(i, {}).get(n, "") for n in NAMES}
        if grad_norms is not None:
            s["grad_norms"] = {n: float(grad_norms[i][n]).hex() for n in NAMES}
        if param_norms is not None:
            s["param_norms"] = {n: float(param_norms[i][n]).hex() for n in NAMES}
        steps.append(s)
    return {"steps": steps, "final": {n: final for n in NAMES}, "param_names": NAMES, "mixer": mixer,
            "restarts": restarts or [], "val_loss": "0x1p+0"}


LOSSES = [5.5, 5.25, 5.0, 4.75]


def _axes(fig) -> dict:
    """The figure's axes by their labels (``map``, ``colorbar``, ``loss``, ``grads``, ``params``, ``curves``)."""
    return {ax.get_label(): ax for ax in fig.axes}


def _cells(ax):
    """The map's cell colours, ``[row][step]`` as RGBA tuples."""
    image = ax.images[0].get_array()
    return [[tuple(float(c) for c in image[i, j]) for j in range(image.shape[1])] for i in range(image.shape[0])]


def _rgba(color):
    from matplotlib.colors import to_rgba

    return tuple(float(c) for c in to_rgba(color))


GREEN, WHITE, BLACK = _rgba(CELL_COLORS[IDENTICAL]), _rgba(CELL_COLORS[None]), _rgba(CELL_COLORS[NOT_FINITE])


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_identical_runs_are_identical_at_every_step_and_the_restart_and_verdict_are_drawn():
    a = _rec(LOSSES)
    runs = {"a": a, "b": _rec(LOSSES), "c": _rec(LOSSES)}
    data = plot_data(runs, stop_at=2, verdict="REPRODUCIBLE")
    assert [(p["run"], p["ref"]) for p in data["pairs"]] == [("b", "a"), ("c", "a")]
    for pair in data["pairs"]:
        assert pair["steps"] == [0, 1, 2, 3]
        assert pair["loss"] == pair["grads"] == [IDENTICAL] * 4
        assert pair["params"] == [None, None, None, IDENTICAL]  # the final parameters only, at the last step
    assert data["grads_measure"] == "count" and data["params_measure"] == "final" and data["n_params"] == 3
    assert data["restarts"] == [{"step": 2, "runs": ["c"]}]
    assert data["title"] == "ordered-ssd check: REPRODUCIBLE" and data["ok"] is True
    assert data["annotation"] is None and data["nonfinite"] == {}
    fig = figure(data)
    try:
        assert fig._suptitle.get_text() == "ordered-ssd check: REPRODUCIBLE"
        axes = _axes(fig)
        # nothing differs: the map and the loss curves only, no magnitude panel and no colour bar
        assert list(axes) == ["map", "curves"]
        cells = _cells(axes["map"])
        assert [t.get_text() for t in axes["map"].get_yticklabels()] == ["loss", "gradients", "parameters"] * 2
        assert [t.get_text() for t in axes["map"].texts] == ["b vs a", "c vs a"]
        # every loss and gradient cell green; the parameters recorded at the last step only (white before it)
        for pair in (0, 1):
            assert cells[3 * pair] == cells[3 * pair + 1] == [GREEN] * 4
            assert cells[3 * pair + 2] == [WHITE, WHITE, WHITE, GREEN]
        legend = [t.get_text() for t in axes["map"].get_legend().get_texts()]
        assert legend == ["identical bits", "not recorded", "resumed from a checkpoint (before step 2)"]
        # the restart: just before step 2, across c's rows of the map (3 to 5) and across the loss curves
        dashed = [(ax.get_label(), tuple(line.get_xdata()), tuple(line.get_ydata())) for ax in fig.axes
                  for line in ax.lines if line.get_linestyle() == "--" and tuple(line.get_xdata()) == (1.5, 1.5)]
        assert dashed == [("map", (1.5, 1.5), (2.5, 5.5)), ("curves", (1.5, 1.5), (0, 1))]
        assert axes["map"].get_position().height < axes["curves"].get_position().height
    finally:
        _close(fig)


def test_a_failing_split_has_positive_differences_from_the_step_it_differs():
    """The gradients of 2x2 differ from step 1 in two tensors, its parameters after step 1 in one, its loss from
    step 2 (by 2**-20); the replay equals the reference."""
    ref = _rec(LOSSES, params={})
    losses = LOSSES[:2] + [x + 2 ** -20 for x in LOSSES[2:]]
    bad = _rec(losses, grads={1: {"w": "!", "v": "!"}, 2: {"w": "!"}, 3: {"w": "!", "v": "!", "u": "!"}},
               params={1: {"u": "!"}, 2: {"u": "!"}, 3: {"u": "!", "v": "!"}}, final="F")
    replay = _rec(LOSSES, params={}, restarts=[2])
    runs = {"1x4": ref, "2x2": bad, "replay": replay}
    data = plot_data(runs, stop_at=2, verdict="NOT SPLIT-INVARIANT", command="ordered-ssd check --split-invariance")
    two, rep = data["pairs"]
    assert two["label"] == "2x2 vs 1x4" and rep["label"] == "replay vs 1x4"
    assert two["loss"] == [IDENTICAL, IDENTICAL, 2 ** -20, 2 ** -20]
    assert two["grads"] == [IDENTICAL, 2, 1, 3] and two["params"] == [IDENTICAL, 1, 1, 2]
    assert rep["loss"] == rep["grads"] == rep["params"] == [IDENTICAL] * 4
    assert data["params_measure"] == "count" and data["restarts"] == [{"step": 2, "runs": ["replay"]}]
    assert data["title"] == "ordered-ssd check --split-invariance: NOT SPLIT-INVARIANT" and data["ok"] is False
    assert differences(data)["pairs"]["2x2 vs 1x4"]["grads"] == [IDENTICAL, 2, 1, 3]
    rows = map_rows(data)
    assert [r["cells"] for r in rows[:3]] == [[IDENTICAL, IDENTICAL, 2 ** -20, 2 ** -20],
                                              [IDENTICAL, "count", "count", "count"],
                                              [IDENTICAL, "count", "count", "count"]]
    fig = figure(data)
    try:
        axes = _axes(fig)
        # every metric has a difference to draw: a magnitude panel each, and the colour bar of the loss's sizes
        assert list(axes) == ["map", "colorbar", "loss", "grads", "params", "curves"]
        cmap, norm = _magnitude_colors()
        size = tuple(float(c) for c in cmap(norm(2 ** -20)))
        red = _rgba(CELL_COLORS["count"])
        cells = _cells(axes["map"])
        assert cells[0] == [GREEN, GREEN, size, size] and size not in (GREEN, red)
        assert cells[1] == cells[2] == [GREEN, red, red, red]
        assert all(row == [GREEN] * 4 for row in cells[3:])  # the replay
        # the counts written in their cells (gradients row, then parameters row)
        assert [t.get_text() for t in axes["map"].texts[2:]] == ["2", "1", "3", "1", "1", "2"]
        legend = [t.get_text() for t in axes["map"].get_legend().get_texts()]
        assert legend == ["identical bits", CELL_LABELS["count"], "resumed from a checkpoint (before step 2)"]
        assert axes["colorbar"].get_ylabel() == "size of a difference\nloss: nats/byte"
        # the loss panel: the two equal differences on a linear axis from 0; identical steps leave a gap
        loss_ax = axes["loss"]
        assert loss_ax.get_yscale() == "linear" and loss_ax.get_ylim()[0] == 0
        drawn = [line for line in loss_ax.lines if len(line.get_xdata()) == 4]
        assert len(drawn) == 1 and list(drawn[0].get_ydata()[2:]) == [2 ** -20, 2 ** -20]
        assert all(math.isnan(y) for y in drawn[0].get_ydata()[:2])
        assert [t.get_text() for t in loss_ax.get_legend().get_texts()] == ["2x2 vs 1x4"]  # the replay: nothing
        assert axes["grads"].get_ylim() == (0.5, 3.5) and axes["grads"].get_yscale() == "linear"
    finally:
        _close(fig)


def test_a_magnitude_panel_only_for_what_differs_and_sizes_on_a_log_scale():
    """Only the gradients differ (relative norm differences 1e-7 and 1e-4): one magnitude panel, on a log axis;
    the map colours the two by their sizes, the larger darker."""
    norms = [{"w": 1.0, "v": 1.0, "u": 1.0}] * 3
    other = [{"w": 1.0, "v": 1.0, "u": 1.0}, {"w": 1.0 + 1e-7, "v": 1.0, "u": 1.0}, {"w": 1.0 + 1e-4, "v": 1.0, "u": 1.0}]
    ref = _rec(LOSSES[:3], grad_norms=norms)
    run = _rec(LOSSES[:3], grads={1: {"w": "!"}, 2: {"w": "!"}}, grad_norms=other)
    data = plot_data({"a": ref, "b": run, "c": ref}, stop_at=1, verdict="NOT REPRODUCIBLE")
    assert data["pairs"][0]["grads"] == [IDENTICAL, pytest.approx(1e-7, rel=1e-6), pytest.approx(1e-4, rel=1e-9)]
    fig = figure(data)
    try:
        axes = _axes(fig)
        assert list(axes) == ["map", "colorbar", "grads", "curves"]
        assert axes["grads"].get_yscale() == "log"
        assert axes["colorbar"].get_ylabel() == "size of a difference\ngradients: relative"
        cells = _cells(axes["map"])
        cmap, norm = _magnitude_colors()
        small, large = (tuple(float(c) for c in cmap(norm(v))) for v in data["pairs"][0]["grads"][1:])
        assert cells[1] == [GREEN, small, large] and small != large
        assert sum(large[:3]) < sum(small[:3])  # the larger difference is the darker colour
        assert cells[0] == [GREEN] * 3 and cells[2] == [WHITE, WHITE, GREEN]  # the final parameters only
    finally:
        _close(fig)


def test_cell_kinds():
    assert cell_kind(IDENTICAL, "norm") == IDENTICAL and cell_kind(None, "norm") is None
    assert cell_kind(NOT_FINITE, "norm") == NOT_FINITE and cell_kind(NORMS_EQUAL, "norm") == NORMS_EQUAL
    assert cell_kind(3, "count") == "count" and cell_kind(1, "final") == "count"
    assert cell_kind(2.5e-7, "norm") == 2.5e-7 and cell_kind(2.5e-7, "number") == 2.5e-7
    assert MAGNITUDE_RANGE == (1e-10, 1.0)


def test_with_recorded_norms_the_gradient_panel_is_the_largest_relative_norm_difference():
    norms = [{"w": 2.0, "v": 4.0, "u": 1.0}] * 3
    other = [{"w": 2.0, "v": 4.0, "u": 1.0}, {"w": 2.5, "v": 4.0, "u": 1.0}, {"w": 2.0, "v": 3.0, "u": 1.0}]
    ref = _rec(LOSSES[:3], grad_norms=norms)
    run = _rec(LOSSES[:3], grads={1: {"w": "!"}, 2: {"w": "!", "v": "!"}}, grad_norms=other)
    data = plot_data({"a": ref, "b": run, "c": ref}, stop_at=1, verdict="NOT REPRODUCIBLE")
    assert data["grads_measure"] == "norm"
    # step 2: w's digest differs but its norm is equal; v's norm differs by 1/4
    assert data["pairs"][0]["grads"] == [IDENTICAL, 0.25, 0.25]
    assert tensor_difference({"w": "x"}, {"w": "y"}, {"w": "0x1p+0"}, {"w": "0x1p+0"}) == NORMS_EQUAL
    assert tensor_difference({"w": "x"}, {"w": "y"}, {"w": "0x1p+0"}, {"w": "nan"}) == NOT_FINITE
    assert tensor_difference({"w": "x"}, {"w": "y"}, {"w": "0x0p+0"}, {"w": "0x1p-3"}) == 0.125
    assert tensor_difference({"w": "x"}, {"w": "x"}, None, None) == IDENTICAL
    assert tensor_difference(None, {"w": "x"}) is None


def test_a_diverged_run_is_annotated_and_its_non_finite_steps_are_marked():
    losses = [5.5, math.nan, math.nan]
    runs = {"a": _rec(losses), "b": _rec(losses), "c": _rec([5.5, math.inf, math.nan])}
    diverged = {"step": 1, "run": "a", "loss": "nan"}
    data = plot_data(runs, stop_at=1, verdict="DIVERGED at step 1", diverged=diverged, lr=1e30)
    b, c = data["pairs"]
    assert b["loss"] == [IDENTICAL] * 3  # nan and nan: the same bits
    assert c["loss"] == [IDENTICAL, NOT_FINITE, IDENTICAL]
    assert data["nonfinite"] == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}
    assert data["annotation"] == ("DIVERGED: the training loss of run a is nan from step 1 (--lr 1e+30): a diverged "
                                  "run proves nothing about reproducibility")
    assert data["title"] == "ordered-ssd check: DIVERGED at step 1" and data["ok"] is False
    fig = figure(data)
    try:
        texts = [t.get_text().replace("\n", " ") for t in fig.texts]
        assert data["annotation"] in texts
        axes = _axes(fig)
        assert list(axes) == ["map", "curves"]  # a category is no size: no colour bar, no magnitude panel
        curves = axes["curves"]
        assert any(t.get_text() == "x: loss not finite (run a, b, c) from step 1" for t in curves.texts)
        finite = [line for line in curves.lines if line.get_label() in ("a (ordered)", "b (ordered)")]
        assert [list(line.get_xdata()) for line in finite] == [[0], [0]]  # the finite step still drawn
        cells = _cells(axes["map"])
        assert cells[3] == [GREEN, BLACK, GREEN]  # c's loss at step 1: inf against nan
        # steps 1 and 2 of both pairs hatched: the loss of the run or its reference is not finite
        hatched = sorted((p.get_x(), p.get_y()) for p in axes["map"].patches if p.get_hatch())
        assert hatched == [(0.5, -0.5), (0.5, 2.5), (1.5, -0.5), (1.5, 2.5)]
        legend = [t.get_text() for t in axes["map"].get_legend().get_texts()]
        assert legend == ["identical bits", "not finite", "not recorded",
                          "the loss of the run or its reference is not finite",
                          "resumed from a checkpoint (before step 1)"]
    finally:
        _close(fig)


def test_the_native_control_is_compared_with_its_own_first_run(tmp_path):
    runs = {"a": _rec(LOSSES), "b": _rec(LOSSES), "c": _rec(LOSSES),
            "native-1": _rec([5.5, 5.3, 5.1, 4.9], mixer="native"),
            "native-2": _rec([5.5, 5.3, 5.1 + 2 ** -18, 4.9], grads={1: {"u": "!"}}, mixer="native")}
    assert plot_pairs(runs) == [("b", "a"), ("c", "a"), ("native-2", "native-1")]
    data = plot_data(runs, stop_at=2, verdict="REPRODUCIBLE")
    native = data["pairs"][2]
    assert native["label"] == "native-2 vs native-1"
    assert native["loss"] == [IDENTICAL, IDENTICAL, pytest.approx(2 ** -18, rel=1e-12), IDENTICAL]
    assert native["grads"] == [IDENTICAL, 1, IDENTICAL, IDENTICAL]
    fig = figure(data)
    try:
        # the pairs' names, then the count of native-2's differing gradients (no norms recorded) in its cell
        assert [t.get_text() for t in _axes(fig)["map"].texts] == ["b vs a", "c vs a",
                                                                  "native-2\nvs native-1\n(control)", "1"]
    finally:
        _close(fig)
    assert plot(str(tmp_path / "loss.png"), data) is None
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
