"""The example problems of csrc_bindings/_examples.py (built on the CPU, no kernel run)."""
import torch


def test_problem_for_key_sizes_the_sequence_in_chunks_of_the_key():
    """The tuner's problems: ``seqlen_chunks`` chunks of the key's chunk size (256 when the key has none); an
    explicit ``seqlen`` wins; a key's own ``nheads`` wins over the argument (built on the CPU, no kernel run)."""
    from csrc_bindings._examples import problem_for_key

    p = problem_for_key("chunk_state_fwd", {"chunk_size": 64, "hdim": 16, "dstate": 8}, torch.float32, "cpu",
                        batch=2, seqlen_chunks=3, nheads=4, ngroups=2)
    assert (p["seqlen"], p["nchunks"], p["batch"], p["nheads"], p["ngroups"]) == (192, 3, 2, 4, 2)
    assert tuple(p["x"].shape) == (2, 192, 4, 16) and tuple(p["Bm"].shape) == (2, 192, 2, 8)
    p = problem_for_key("bmm_chunk_fwd", {"K": 8}, torch.float32, "cpu", batch=1, seqlen_chunks=1, nheads=2)
    assert (p["chunk_size"], p["seqlen"]) == (256, 256)
    p = problem_for_key("chunk_cumsum_fwd", {"chunk_size": 32, "nheads": 6}, torch.float32, "cpu", batch=1,
                        seqlen=40, seqlen_chunks=5, nheads=2)
    assert (p["seqlen"], p["nchunks"], p["nheads"]) == (40, 2, 6)


def test_problem_values_come_from_a_seeded_cpu_generator_unless_on_device(monkeypatch):
    """The default values are those of a CPU generator seeded with ``seed`` (the recorded launches and the GPU
    tests rely on them); ``on_device`` draws from the device's generator, the same stream on the CPU."""
    from csrc_bindings._examples import make_problem

    kw = dict(chunk_size=16, headdim=8, dstate=4, nheads=2, ngroups=1, batch=2, seqlen=40)
    p = make_problem(**kw, seed=3)
    expect = torch.randn(2, 40, 2, generator=torch.Generator().manual_seed(3)) * 0.5 - 1.0
    assert torch.equal(p["dt_raw"], expect)
    q = make_problem(**kw, seed=3, on_device=True)
    assert all(torch.equal(p[k], q[k]) for k in p if isinstance(p[k], torch.Tensor))
    import csrc_bindings._examples as ex

    devices = []

    real = torch.Generator

    def spy(device="cpu"):  # records the device each problem's generator is made on (then draws on the CPU)
        devices.append(str(device))
        return real("cpu")

    monkeypatch.setattr(ex.torch, "Generator", spy)
    make_problem(**kw, device="meta", on_device=False)
    make_problem(**kw, device="meta", on_device=True)
    assert devices == ["cpu", "meta"]
    assert not torch.equal(make_problem(**kw, seed=4)["x"], p["x"])
