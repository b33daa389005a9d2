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
