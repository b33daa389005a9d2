"""The comparison of run records (:mod:`ordered_ssd.apps.check.report`)."""
from ordered_ssd.apps.check.report import compare_runs, describe_comparison


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


def test_describe_comparison_names_where_runs_first_differ_in_words():
    def rec(losses, grads, params=None):
        steps = [{"step": i, "loss": l, "grads": g} for i, (l, g) in enumerate(zip(losses, grads))]
        if params is not None:
            for s, p in zip(steps, params):
                s["params"] = p
        return {"steps": steps, "final": {"w": "f"}, "val_loss": "0x1p+0"}
    a = rec(["0x1p+0", "0x1p+1"], [{"w": "x", "v": "x"}, {"w": "y", "v": "y"}])
    b = rec(["0x1p+0", "0x1p+1"], [{"w": "x", "v": "x"}, {"w": "Y", "v": "Y"}])
    assert describe_comparison(compare_runs(a, a)) == "identical"
    assert describe_comparison(compare_runs(a, b)) == (
        "DIFFERENT (losses equal; gradients differ from step 1 in 2 tensors (v, w); final parameters equal: yes)")
    one = rec(["0x1p+0", "0x1p+1"], [{"w": "x", "v": "x"}, {"w": "Y", "v": "y"}])
    assert "gradients differ from step 1 in 1 tensor (w)" in describe_comparison(compare_runs(a, one))
    names = [f"p{i}" for i in range(10)]
    c = rec(["0x1p+0"], [{n: "x" for n in names}], [{n: "x" for n in names}])
    d = rec(["0x1p+1"], [{n: "y" for n in names}], [{n: "x" for n in names}])
    text = describe_comparison(compare_runs(c, d))
    assert text.startswith("DIFFERENT (losses differ from step 0; gradients differ from step 0 in 10 tensors (")
    assert text.endswith(", ...); parameters equal; final parameters equal: yes)") and "{" not in text


def test_describe_comparison_names_a_length_or_validation_loss_difference():
    def rec(n, val="0x1p+0"):
        return {"steps": [{"step": i, "loss": "0x1p+0", "grads": {"w": "x"}} for i in range(n)],
                "final": {"w": "f"}, "val_loss": val}
    assert describe_comparison(compare_runs(rec(2), rec(1))) == (
        "DIFFERENT (the runs have 2 and 1 steps (the first 1 compared); losses equal; gradients equal; final "
        "parameters equal: yes)")
    assert describe_comparison(compare_runs(rec(2), rec(2, val="0x1p+1"))) == (
        "DIFFERENT (losses equal; gradients equal; final parameters equal: yes; validation losses differ (1.0 vs "
        "2.0))")
    # one fp32 ulp apart: the values in full, so that they read differently
    close = float.fromhex("0x1.4953c6p+2")
    assert describe_comparison(compare_runs(rec(2, val=close.hex()), rec(2, val=(close + 2 ** -21).hex()))).endswith(
        "validation losses differ (5.145738124847412 vs 5.14573860168457))")


def test_the_module_diff_tells_a_forward_difference_from_a_backward_one():
    from ordered_ssd.apps.check.report import describe_module_diff, first_module_diff

    order = ["emb", "layers.0", "layers.1", "head"]

    def rec(grad_bad, out_bad):
        steps = []
        for step in range(2):
            modules = {m: "g" + ("!" if step == 1 and m in grad_bad else "") for m in order}
            outputs = {m: "o" + ("!" if step == 1 and m in out_bad else "") for m in order}
            steps.append({"step": step, "loss": "0x1p+0", "grads": {}, "modules": modules, "outputs": outputs})
        return {"module_names": order, "steps": steps}

    ref = rec((), ())
    # a forward that is not deterministic in layers.1: its output and everything after it, then every gradient
    fwd = first_module_diff(ref, rec(order, ("layers.1", "head")))
    assert fwd["step"] == 1 and fwd["module"] == "emb" and fwd["output_module"] == {"step": 1, "module": "layers.1"}
    assert "the forward differs first: the output of layers.1 at step 1" in describe_module_diff(fwd)
    # a backward that is not deterministic in layers.0: its gradient and those before it; every output equal
    bwd = first_module_diff(ref, rec(("emb", "layers.0"), ()))
    assert bwd["output_module"] is None and bwd["last_module"] == "layers.0"
    text = describe_module_diff(bwd)
    assert "the backward differs, in the modules listed" in text and "the last, layers.0," in text
    assert first_module_diff(ref, ref) is None



def test_output_digests_fold_every_output_on_its_device_and_name_none_for_other_outputs():
    import torch

    from ordered_ssd.apps.check.modules import OutputDigests, _fingerprint

    a = torch.randn(300, 7)
    b = a.clone()
    b[5, 3] = torch.nextafter(b[5, 3], torch.tensor(10.0))  # one ulp
    assert _fingerprint(a, 1 << 24).item() == _fingerprint(a.clone(), 64).item()  # any chunking, the same
    assert _fingerprint(a, 1 << 24).item() != _fingerprint(b, 1 << 24).item()
    model = torch.nn.ModuleDict({"scalar": torch.nn.Identity(), "pair": torch.nn.Identity()})
    outs = OutputDigests(model, ["scalar", "pair", "missing"])
    model["scalar"](torch.tensor(3.0))  # a 0-d output
    model["pair"]((None, a))  # the first tensor of a tuple
    first = outs.take()
    model["scalar"](torch.tensor(3.0))
    model["pair"]((None, b))
    second = outs.take()
    assert list(first) == ["scalar", "pair"] and first["scalar"] == second["scalar"]
    assert first["pair"] != second["pair"]
    model["scalar"](torch.tensor(3.0))
    model["pair"]((None, a))
    later = outs.take_deferred()  # read on the host when called; the next step starts now
    model["pair"]((None, b))
    assert outs.take() == {"pair": second["pair"]} and later() == first
    outs.remove()
    model["pair"]((None, a))
    assert outs.take() == {} and outs.take_deferred()() == {}


def test_output_fingerprint_is_the_weighted_word_sum_modulo_2_64(monkeypatch):
    """The fingerprint of an output equals its definition, ``sum w_i * (i * 2654435761 + 40503)`` modulo 2**64 over
    its bytes as 32-, 16- or 8-bit words (Python integers here), for any chunking (the later chunks' offset added
    as ``s * K * sum w``) and once the cached weights have grown or are reused."""
    import torch

    from ordered_ssd.apps.check import modules

    def definition(t):
        raw = t.contiguous().view(-1).view(torch.uint8)
        word = torch.int32 if raw.numel() % 4 == 0 else torch.int16 if raw.numel() % 2 == 0 else torch.uint8
        total = sum(int(w) * (i * 2654435761 + 40503) for i, w in enumerate(raw.view(word).tolist()))
        total %= 1 << 64
        return total - (1 << 64) if total >= 1 << 63 else total

    g = torch.Generator().manual_seed(3)
    cases = [torch.randn(37, 5, generator=g), torch.randn(33, generator=g).to(torch.bfloat16),
             torch.randint(0, 255, (29,), generator=g, dtype=torch.uint8), torch.randn(6, 7, generator=g).t(),
             torch.full((4,), -3.0e38)]
    for t in cases:
        want = definition(t)
        for chunk in (1 << 24, 16, 7, 1):
            assert modules._fingerprint(t, chunk).item() == want, (t.dtype, tuple(t.shape), chunk)
    monkeypatch.setattr(modules, "_WEIGHT_WORDS", 8)  # the cached weights capped: chunks of at most 8 words
    monkeypatch.setattr(modules, "_WEIGHTS", {})
    for t in cases:
        assert modules._fingerprint(t, 1 << 24).item() == definition(t), (t.dtype, tuple(t.shape))
    assert all(w.numel() <= 8 for w in modules._WEIGHTS.values())
    assert modules._fingerprint(torch.zeros(0), 8).item() == 0


def test_the_native_control_line_names_the_layer(tmp_path):
    """With ``--native`` the comparison line names the control's layer: ``Mamba3`` for a ``--layer mamba3`` run,
    ``Mamba2`` otherwise; a control whose runs differ says where."""
    from ordered_ssd.apps.check.report import report
    from tests.apps.check.test_plot import _rec

    def rec(mixer="ordered", **kw):
        r = _rec([5.5, 5.25, 5.0, 4.75], mixer=mixer, **kw)
        return dict(r, s_per_step=0.01, fingerprint="fp", fingerprint_info={})
    for layer, name in (("mamba3", "Mamba3"), ("mamba2", "Mamba2")):
        model = dict(d_model=32, n_layers=1, d_state=16, headdim=16, ngroups=1, chunk_size=16, expand=2)
        if layer == "mamba3":
            model["layer"] = layer
        spec = {"model": model, "steps": 4, "batch": 2, "seq_len": 24, "lr": 1e-3, "device": "cpu"}
        runs = {"a": rec(), "b": rec(), "c": rec(), "native-1": rec("native"),
                "native-2": rec("native", grads={1: {"w": "x"}})}
        lines = []
        out = tmp_path / layer
        out.mkdir()
        assert report(runs, spec, str(out), source="test", n_params=1, stop_at=2, wall=1.0, nproc=None,
                      print_fn=lines.append)
        native = [line for line in lines if line.startswith("native ")]
        assert len(native) == 1 and native[0].startswith(
            f"native {name} run 1 vs run 2 (control): diverged: first gradient difference at step 1,"), lines


def _steps(specs):
    """Step records from ``[(loss, grads, params), ...]`` (digest strings)."""
    return [{"step": i, "loss": loss, "grads": {"w": g}, "params": {"w": p}} for i, (loss, g, p) in enumerate(specs)]


def test_the_table_names_what_differs_in_each_step():
    """A step whose losses agree and whose gradients differ reads ``grads+params`` (never a bare ``DIFF`` beside
    the loss column); ``= bits`` only where the loss, gradient and parameter bits all agree."""
    from ordered_ssd.apps.check.report import _print_table, step_differences

    ref = {"steps": _steps([("0x1p+0", "g0", "p0"), ("0x1p+1", "g1", "p1"), ("0x1p+2", "g2", "p2")])}
    split = {"steps": _steps([("0x1p+0", "G0", "P0"), ("0x1p+1", "g1", "p1"), ("0x1.8p+2", "G2", "p2")])}
    replay = {"steps": _steps([("0x1p+0", "g0", "p0"), ("0x1p+1", "g1", "p1"), ("0x1p+2", "g2", "p2")])}
    assert step_differences(ref["steps"][0], split["steps"][0]) == ["grads", "params"]
    assert step_differences(ref["steps"][2], split["steps"][2]) == ["loss", "grads"]
    assert step_differences(ref["steps"][1], split["steps"][1]) == []
    lines = []
    _print_table({"1x4": ref, "2x2": split, "replay": replay}, 1, lines.append)
    assert lines == [
        "",
        "(per step: the loss of run 1x4; per run, '= bits' where the step's loss, gradient and parameter bits are "
        "1x4's, else which differ)",
        " step loss (1x4)           2x2    replay",
        "    0   1.000000  grads+params    = bits",
        "    1   2.000000        = bits    = bits",
        "    2   4.000000    loss+grads    = bits",
        ""]


def test_validation_losses_print_in_full_where_they_differ():
    from ordered_ssd.apps.check.report import val_loss_texts

    close = float.fromhex("0x1.4953c6p+2")
    same = {"a": {"val_loss": close.hex()}, "b": {"val_loss": close.hex()}}
    assert val_loss_texts(same) == {"a": "5.1457", "b": "5.1457"}
    apart = {"a": {"val_loss": close.hex()}, "b": {"val_loss": (close + 2 ** -21).hex()}}
    assert val_loss_texts(apart) == {"a": "5.145738124847412", "b": "5.14573860168457"}
