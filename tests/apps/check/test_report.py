"""The comparison of run records (:mod:`ordered_ssd.apps.check.report`)."""
from ordered_ssd.apps.check.report import compare_runs


def test_compare_runs_finds_the_first_difference():
    def rec(losses, grads, final):
        return {"steps": [{"step": i, "loss": l, "grads": g} for i, (l, g) in enumerate(zip(losses, grads))],
                "final": final, "val_loss": "0x1p+0"}
    a = rec(["0x1p+0", "0x1p+1", "0x1p+2"], [{"w": "x"}, {"w": "y"}, {"w": "z"}], {"w": "f"})
    b = rec(["0x1p+0", "0x1p+1", "0x1.8p+2"], [{"w": "x"}, {"w": "Y"}, {"w": "z"}], {"w": "g"})
    c = compare_runs(a, b)
    assert c["identical"] is False and c["first_loss_diff"] == 2 and c["loss_equal_steps"] == 2
    assert c["first_grad_diff"] == {"step": 1, "params": ["w"], "count": 1} and c["final_equal"] is False
    assert compare_runs(a, a)["identical"] is True
