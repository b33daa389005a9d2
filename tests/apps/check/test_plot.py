"""``loss.png`` (:mod:`ordered_ssd.apps.check.plot`): what is drawn per step is each run's difference from its
reference; identical bits on their own row; the restart, the verdict and a divergence in the figure."""
import math

import pytest

from ordered_ssd.apps.check.plot import (IDENTICAL, NORMS_EQUAL, NOT_FINITE, differences, figure, plot, plot_data,
                                         plot_pairs, tensor_difference)

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
        restart_lines = {tuple(line.get_xdata()) for ax in fig.axes for line in ax.lines
                         if line.get_linestyle() == "--" and len(line.get_xdata()) == 2}
        assert restart_lines == {(1.5, 1.5)}  # just before step 2, in every panel
        assert sum(1 for ax in fig.axes for line in ax.lines if tuple(line.get_xdata()) == (1.5, 1.5)) == 7
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert texts == ["loss: identical bits at every step compared",
                         "gradients: identical bits at every step compared",
                         "parameters: identical bits in the final parameters"]
        # nothing to draw on their axes: short panels, no axis label; the loss curves keep their size and label
        heights = [ax.get_position().height for ax in fig.axes]
        assert max(heights[:6:2]) < 0.5 * heights[6] and [ax.get_ylabel() for ax in fig.axes[:6:2]] == [""] * 3
        strips = [ax for ax in fig.axes if [t.get_text() for t in ax.get_yticklabels()] == [IDENTICAL]]
        assert len(strips) == 3
        # every pair has a marker on the identical row at every step of the loss strip
        xs = sorted(x for line in strips[0].lines if line.get_linestyle() == "None" for x in line.get_xdata())
        assert xs == [0, 0, 1, 1, 2, 2, 3, 3]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


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
    fig = figure(data)
    try:
        loss_ax = fig.axes[0]
        assert loss_ax.get_yscale() == "log"
        # every panel has differences to draw: full height, labelled
        heights = [ax.get_position().height for ax in fig.axes]
        assert min(heights[:6:2]) > heights[6] and all(ax.get_ylabel() for ax in fig.axes[:6:2])
        drawn = [line for line in loss_ax.lines if len(line.get_xdata()) == 4 and not math.isnan(line.get_ydata()[2])]
        assert len(drawn) == 1 and list(drawn[0].get_ydata()[2:]) == [2 ** -20, 2 ** -20]
        assert all(math.isnan(y) for y in drawn[0].get_ydata()[:2])  # identical: on the strip, not the log axis
        legend = [t.get_text() for t in loss_ax.get_legend().get_texts()]
        assert legend[:2] == ["2x2 vs 1x4", "replay vs 1x4"] and legend[2].startswith("restart from a checkpoint")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


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
        curves = fig.axes[-1]
        assert any(t.get_text() == "x: loss not finite (run a, b, c) from step 1" for t in curves.texts)
        finite = [line for line in curves.lines if line.get_label() in ("a (ordered)", "b (ordered)")]
        assert [list(line.get_xdata()) for line in finite] == [[0], [0]]  # the finite step still drawn
        strip = fig.axes[1]
        assert [t.get_text() for t in strip.get_yticklabels()] == [IDENTICAL, NOT_FINITE]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


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
    assert plot(str(tmp_path / "loss.png"), data) is None
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
