"""ordered_ssd.fingerprint: what the bits depend on."""
import torch


def test_cuda_fingerprint_includes_the_pinned_configs_and_the_reduction(monkeypatch):
    """The CUDA branch of the determinism fingerprint, with the device queries faked (no GPU needed)."""
    import csrc_bindings
    from ordered_ssd.fingerprint import determinism_fingerprint
    from ordered_ssd.fold import reduction_fingerprint

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (9, 0))
    monkeypatch.setattr(csrc_bindings, "fingerprint", lambda speed=True: "csrc_bindings/fake" + " speed=x" * speed)
    limit = {"bytes": 232448}  # the H200's shared memory per program: every pinned fold configuration fits
    monkeypatch.setattr(csrc_bindings._resources, "shared_memory_limit", lambda device: limit["bytes"])
    info = determinism_fingerprint("cuda:0", cuda_path=True)
    # the pinned configurations without the speed choice (bit-neutral parameters): retuning that changes no bit
    assert info["reduction"] == reduction_fingerprint() and info["pinned_configs"] == "csrc_bindings/fake"
    assert "reduction" not in determinism_fingerprint("cuda:0", cuda_path=False)
    assert info["mamba3"].startswith("mamba3-v1 kernels=") and len(info["mamba3"].split("=")[1]) == 12
    limit["bytes"] = 101376  # sm_86/sm_89: bf16/fp16 fold at 3 stages, recorded in the reduction field
    small = determinism_fingerprint("cuda:0", cuda_path=True)
    assert small["reduction"] == reduction_fingerprint("cuda:0") != reduction_fingerprint()
    assert small["reduction"].startswith("v7 gemm=")


def test_cpu_fingerprint_names_the_threads_and_capability(monkeypatch):
    from ordered_ssd.fingerprint import determinism_fingerprint, fingerprint_diff, fingerprint_string

    info = determinism_fingerprint("cpu")
    assert info["device_type"] == "cpu" and info["threads"] == torch.get_num_threads()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and "pinned_configs" not in info
    monkeypatch.setattr(torch, "get_num_threads", lambda: info["threads"] + 1)
    other = determinism_fingerprint("cpu")
    assert fingerprint_diff(info, other) == {"threads": (info["threads"], info["threads"] + 1)}
    assert fingerprint_string(info) != fingerprint_string(other) and len(fingerprint_string(info)) == 16


def test_the_mamba3_field_changes_with_a_pinned_candidate(monkeypatch):
    """The ``mamba3`` field hashes the Mamba-3 kernels' candidate lists (from which their configuration is pinned)."""
    import dataclasses

    from csrc_bindings import mamba3
    from ordered_ssd.ops.mamba3_siso import mamba3_fingerprint

    before = mamba3_fingerprint()
    changed = dataclasses.replace(mamba3.MAMBA3_SPECS[1], candidates=mamba3.MAMBA3_SPECS[1].candidates[1:])
    monkeypatch.setattr(mamba3, "MAMBA3_SPECS", (mamba3.MAMBA3_SPECS[0], changed, *mamba3.MAMBA3_SPECS[2:]))
    assert mamba3_fingerprint() != before and before == "mamba3-v1 kernels=" + before.split("=")[1]


def test_the_mamba3_field_changes_with_the_pinned_table(monkeypatch):
    """The ``mamba3`` field hashes the Mamba-3 kernels' pinned table (``ORDER``), which decides their bits."""
    from csrc_bindings.pinned import mamba3_params
    from ordered_ssd.ops.mamba3_siso import mamba3_fingerprint

    before = mamba3_fingerprint()
    key = sorted(mamba3_params.ORDER)[0]
    changed = dict(mamba3_params.ORDER, **{key: dict(mamba3_params.ORDER[key], num_warps=8 if
                                                    mamba3_params.ORDER[key]["num_warps"] != 8 else 4)})
    monkeypatch.setattr(mamba3_params, "ORDER", changed)
    assert mamba3_fingerprint() != before
    monkeypatch.setattr(mamba3_params, "ORDER", {k: v for k, v in changed.items() if k != key})
    assert mamba3_fingerprint() not in (before, None)
