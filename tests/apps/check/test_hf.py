"""``ordered-ssd check --hf-config``: a Hugging Face Mamba-2 model checked end to end on the CPU, the per-module
report of a run that is not reproducible, the usage errors; per-module digests of the byte-level LM."""
import json
import sys

import pytest
import torch

from ordered_ssd.apps.check.errors import CheckError
from ordered_ssd.apps.check.modules import TEST_GRAD_NOISE_ENV, module_digests, module_names, module_of
from ordered_ssd.apps.cli import main
from tests.apps.helpers import cli_env, run_cli

transformers = pytest.importorskip("transformers")

#: steps, stop, sequence and batch of a check that trains in seconds
HF_TINY = ["--device", "cpu", "--steps", "2", "--stop-at", "1", "--seq-len", "24", "--batch", "2", "--quiet"]


def _bamba(vocab=256):
    return transformers.BambaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=8, mamba_expand=2, mamba_chunk_size=16)


def _configs():
    """A tiny config of every family convert_to_ordered converts (vocabulary 256)."""
    T = transformers
    common = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2)
    mamba = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_expand=2, mamba_chunk_size=16)
    return {
        "mamba2": T.Mamba2Config(vocab_size=256, hidden_size=32, num_hidden_layers=2, state_size=8, num_heads=4,
                                 head_dim=16, n_groups=1, expand=2, chunk_size=16, conv_kernel=4),
        "bamba": _bamba(),
        "nemotron_h": T.NemotronHConfig(vocab_size=256, hidden_size=32, hybrid_override_pattern="M*-",
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        intermediate_size=48, mamba_num_heads=4, mamba_head_dim=16, n_groups=1,
                                        ssm_state_size=8, chunk_size=16),
        "granitemoehybrid": T.GraniteMoeHybridConfig(**common, intermediate_size=48, num_attention_heads=2,
                                                     num_key_value_heads=1, layer_types=["mamba", "attention"],
                                                     mamba_n_groups=1, num_local_experts=0,
                                                     shared_intermediate_size=48, **mamba),
        "falcon_h1": T.FalconH1Config(**common, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                                      head_dim=16, mamba_n_groups=1, mamba_rms_norm=True, mamba_d_ssm=64,
                                      ssm_in_multiplier=0.5, ssm_multipliers=[1.5, 0.5, 2.0, 0.7, 1.2],
                                      mamba_norm_before_gate=False, embedding_multiplier=2.0, **mamba),
        "zamba2": T.Zamba2Config(**common, num_attention_heads=2, num_key_value_heads=2, attention_head_dim=16,
                                 mamba_headdim=16, n_mamba_heads=4, mamba_ngroups=1, mamba_d_state=8,
                                 mamba_expand=2, chunk_size=16, layers_block_type=["mamba", "hybrid"],
                                 num_mem_blocks=1, use_mem_rope=False),
    }


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    _bamba().to_json_file(str(root / "tiny_bamba_config.json"))
    (root / "corpus.txt").write_text("The quick brown fox jumps over the lazy dog. 0123456789\n" * 200)
    return root


@pytest.fixture(scope="module")
def hf_check(hf_files):
    out = hf_files / "out"
    res = run_cli("check", "--hf-config", str(hf_files / "tiny_bamba_config.json"), "--data",
                  str(hf_files / "corpus.txt"), *HF_TINY, "--out", str(out))
    return res, out


def test_hf_check_is_reproducible_and_names_the_model(hf_check, hf_files):
    res, out = hf_check
    assert res.returncode == 0, res.stderr + res.stdout
    assert "Hugging Face model bamba (BambaForCausalLM, built from " in res.stdout
    assert "verdict: REPRODUCIBLE: bamba (BambaForCausalLM), 2 steps" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is True and report["first_module_diff"] is None
    model = report["model"]
    assert model["kind"] == "hf" and model["model_type"] == "bamba" and model["architecture"] == "BambaForCausalLM"
    assert model["source"] == "config" and model["attn_implementation"] == "eager" and len(model["config_sha256"]) == 64
    assert report["module_names"] == ["model.embed_tokens", "model.layers.0", "model.layers.1",
                                      "model.final_layernorm", "lm_head"]
    assert all(sorted(s["modules"]) == sorted(report["module_names"]) for s in report["per_step"])
    for key in ("b_vs_a", "c_vs_a"):
        assert report["comparisons"][key]["identical"] and report["comparisons"][key]["first_module_diff"] is None
    ckpt = torch.load(out / "runs" / "checkpoint-step1.pt", weights_only=True)
    assert json.loads(ckpt["spec"])["hf"]["model_type"] == "bamba"
    assert "model.embed_tokens.weight" in ckpt["model"]  # the state dict keeps the model's own names


def test_resume_refuses_a_checkpoint_of_another_model(hf_check, tmp_path):
    _, out = hf_check
    spec = json.loads((out / "runs" / "spec.json").read_text())
    spec["hf"] = dict(spec["hf"], config_sha256="0" * 64)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    res = run_cli("_train", "--spec", str(tmp_path / "spec.json"), "--record", str(tmp_path / "r.json"), "--label",
                  "x", "--resume", str(out / "runs" / "checkpoint-step1.pt"), "--quiet")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "changed since the check started" in res.stderr  # the config file is not the one of this spec
    from ordered_ssd.apps.check.train import _check_same_model

    ckpt = torch.load(out / "runs" / "checkpoint-step1.pt", weights_only=True)
    with pytest.raises(CheckError, match=r"got one written for another model \(bamba config sha256 "):
        _check_same_model(ckpt, "ck.pt", spec)


def test_a_nondeterministic_module_is_named(hf_files):
    """Noise from an unseeded generator on the gradient of block 1 (the attention block): run b differs from a,
    and the report names model.layers.1 as the first module whose gradient differs, at step 0."""
    out = hf_files / "noisy"
    res = run_cli("check", "--hf-config", str(hf_files / "tiny_bamba_config.json"), "--data",
                  str(hf_files / "corpus.txt"), *HF_TINY, "--out", str(out),
                  env=cli_env(**{TEST_GRAD_NOISE_ENV: "model.layers.1"}))
    assert res.returncode == 1, res.stderr + res.stdout
    assert "verdict: NOT REPRODUCIBLE: bamba (BambaForCausalLM)" in res.stdout
    assert ("first module whose gradient differs: model.layers.1 (step 0; 1 of 5 modules differ: model.layers.1; "
            "the losses of step 0 are equal)") in res.stdout
    report = json.loads((out / "report.json").read_text())
    first = report["first_module_diff"]
    assert first["step"] == 0 and first["module"] == "model.layers.1" and first["loss_equal"] is True
    assert first["run"] in ("b", "c") and first["count"] == 1
    # the noise is added in the backward: every forward output agreed, and the last differing module is named
    assert first["output_module"] is None and first["last_module"] == "model.layers.1"
    assert "the backward differs, in the modules listed (each in its own weight-gradient sums, or the last, model.layers.1," in res.stdout
    assert report["comparisons"]["b_vs_a"]["first_module_diff"]["module"] == "model.layers.1"


@pytest.mark.parametrize("family", sorted(_configs()))
def test_every_family_trains_the_same_bits_twice(family, hf_files, tmp_path):
    """In this process: every family converts (its mixers) and two runs give the same bits."""
    from ordered_ssd.apps.check.hf import build_hf_model, hf_spec
    from ordered_ssd.apps.check.train import train_run
    from ordered_ssd.apps.lm import ByteData, load_corpus

    path = tmp_path / "config.json"
    _configs()[family].to_json_file(str(path))
    corpus = str(hf_files / "corpus.txt")
    spec = {"device": "cpu", "mixer": "ordered", "model": None, "hf": hf_spec(str(path)), "seed": 0, "steps": 2,
            "batch": 2, "seq_len": 24, "lr": 3e-3, "weight_decay": 0.1, "clip": 1.0, "data": corpus,
            "data_bytes": 60000}
    spec["data_sha256"] = ByteData(load_corpus(corpus, 60000)[0], 24).sha256
    assert spec["hf"]["model_type"] == family
    model = build_hf_model(spec, torch.device("cpu"))
    assert type(model.get_input_embeddings()) is torch.nn.Embedding  # the model's own, trained as built
    assert any(type(m).__name__ == "OrderedHFMamba2Mixer" for m in model.modules())
    one = train_run(spec, str(tmp_path / "1.json"), label="1", progress=False)
    two = train_run(spec, str(tmp_path / "2.json"), label="2", progress=False)
    assert one["steps"] == two["steps"] and one["final"] == two["final"]
    assert list(one["steps"][0]["modules"]) == one["module_names"]  # model order


def _usage_error(capsys, *argv) -> str:
    code = main(["check", *argv])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_vocabulary_smaller_than_256_is_a_usage_error(capsys, tmp_path):
    _bamba(vocab=64).to_json_file(str(tmp_path / "small.json"))
    line = _usage_error(capsys, "--hf-config", str(tmp_path / "small.json"), "--out", str(tmp_path / "o"), *HF_TINY)
    assert "expected vocab_size >= 256, got 64 (bamba" in line
    assert not (tmp_path / "o").exists()


def test_missing_paths_and_other_misuse_are_usage_errors(capsys, tmp_path, hf_files):
    line = _usage_error(capsys, "--hf-config", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o"), *HF_TINY)
    assert line.endswith(f"--hf-config: expected a config.json file or a model folder, got {tmp_path}/nope.json "
                         f"(no such file or directory)")
    (tmp_path / "empty").mkdir()
    line = _usage_error(capsys, "--hf-config", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), *HF_TINY)
    assert "without config.json" in line
    (tmp_path / "bad.json").write_text("{not json")
    assert "does not read as one" in _usage_error(capsys, "--hf-config", str(tmp_path / "bad.json"), *HF_TINY)
    config = str(hf_files / "tiny_bamba_config.json")
    assert _usage_error(capsys, "--hf-config", config, "--d-model", "64", *HF_TINY).endswith(
        "--d-model: not with --hf-config (the config gives the model)")
    assert "not with --hf-config" in _usage_error(capsys, "--hf-config", config, "--split-invariance", *HF_TINY)
    llama = transformers.LlamaConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=48)
    llama.to_json_file(str(tmp_path / "llama.json"))
    assert "without one" in _usage_error(capsys, "--hf-config", str(tmp_path / "llama.json"), *HF_TINY)
    assert not (tmp_path / "o").exists()


def test_missing_transformers_is_a_usage_error(capsys, monkeypatch, hf_files, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    line = _usage_error(capsys, "--hf-config", str(hf_files / "tiny_bamba_config.json"), "--out",
                        str(tmp_path / "o"), *HF_TINY)
    assert "--hf-config needs transformers (" in line and "pip install 'ordered-ssd[hf]'" in line
    assert not (tmp_path / "o").exists()


def test_a_cpu_pass_of_a_model_with_cuda_only_nondeterminism_says_so(hf_files, tmp_path, hf_check):
    """A CPU pass is not a CUDA promise: a mixture-of-experts model (index_add_, atomics on CUDA) passes on the CPU,
    and the verdict line names what audit_model finds not deterministic on CUDA; a model without such pieces has
    no such words."""
    cfg = transformers.GraniteMoeHybridConfig(
        vocab_size=256, hidden_size=32, num_hidden_layers=2, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
        mamba_n_groups=1, mamba_d_state=8, mamba_expand=2, mamba_chunk_size=16, num_local_experts=4,
        num_experts_per_tok=2, shared_intermediate_size=48)
    cfg.to_json_file(str(tmp_path / "moe.json"))
    out = tmp_path / "out"
    res = run_cli("check", "--hf-config", str(tmp_path / "moe.json"), "--data", str(hf_files / "corpus.txt"),
                  *HF_TINY, "--out", str(out))
    assert res.returncode == 0, res.stderr + res.stdout
    verdict = next(line for line in res.stdout.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: REPRODUCIBLE: granitemoehybrid (GraniteMoeHybridForCausalLM)")
    assert verdict.endswith("; on the CPU only: on CUDA, audit_model finds 2 pieces not deterministic there "
                            "(model.layers.0.block_sparse_moe (experts), model.layers.1.block_sparse_moe (experts))")
    report = json.loads((out / "report.json").read_text())
    assert report["spec"]["hf"]["not_deterministic_on_cuda"] == ["model.layers.0.block_sparse_moe (experts)",
                                                                 "model.layers.1.block_sparse_moe (experts)"]
    res, _ = hf_check  # the tiny Bamba: eager attention, no experts
    verdict = next(line for line in res.stdout.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: REPRODUCIBLE: bamba") and "on CUDA" not in verdict


def test_a_model_folder_is_loaded_without_hub_kernels(tmp_path):
    """A folder with weights is loaded with from_pretrained(use_kernels=False) (5.25 would put hub kernels in by
    default where the kernels package is installed): the loaded weights, converted, no kernelization, and the
    spec says so."""
    from ordered_ssd.apps.check.hf import build_hf_model, hf_spec

    torch.manual_seed(3)
    saved = transformers.BambaForCausalLM(_bamba())
    saved.save_pretrained(str(tmp_path / "ckpt"))
    hf = hf_spec(str(tmp_path / "ckpt"))
    assert hf["source"] == "pretrained" and hf["hub_kernels"] is False and hf["weights_sha256"]
    model = build_hf_model({"hf": hf, "seed": 0, "mixer": "ordered"}, torch.device("cpu"))
    assert getattr(model, "use_kernels", False) is False
    assert any(type(m).__name__ == "OrderedHFMamba2Mixer" for m in model.modules())
    want = saved.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())


def _tree(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", ["newer_transformers", "gelu_mixer", "unknown_norm"])
def test_a_refused_model_is_refused_before_the_header_the_corpus_and_out(case, capsys, monkeypatch, tmp_path,
                                                                         hf_files, request):
    """One line and exit 2, before the header is printed, the corpus read or --out touched (no lock, no spec, the
    previous run left where it is): an unsupported transformers version, and models convert_to_ordered refuses."""
    config = hf_files / "tiny_bamba_config.json"
    if case == "newer_transformers":
        monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.26.0")
        want = ("--hf-config: transformers 5.26.0 is newer than 5.25, the newest version ordered-ssd is tested with",
                "pip install 'transformers>=5.17,<5.26'")
    elif case == "gelu_mixer":
        config = tmp_path / "gelu.json"
        transformers.Mamba2Config(vocab_size=256, hidden_size=32, num_hidden_layers=1, state_size=8, num_heads=4,
                                  head_dim=16, expand=2, chunk_size=16, hidden_act="gelu").to_json_file(str(config))
        want = ("--hf-config: convert_to_ordered refuses Mamba2ForCausalLM (mamba2, ",
                "activation: expected 'silu' (the only activation of the native conv kernels), got 'gelu'")
    else:
        norm_cls = type(transformers.BambaForCausalLM(_bamba()).model.layers[0].mamba.norm)
        name = norm_cls.__name__
        norm_cls.__name__ = "BambaRMSNormGatedV2"  # a renamed class the mixer does not know
        request.addfinalizer(lambda: setattr(norm_cls, "__name__", name))
        want = ("--hf-config: convert_to_ordered refuses BambaForCausalLM (bamba, ",
                "expected one of the gated norms")
    out = tmp_path / "out"
    (out / "previous").mkdir(parents=True)
    (out / "report.json").write_text('{"verdict": "REPRODUCIBLE"}')
    (out / "previous" / "report.json").write_text("{}")
    before = _tree(out)

    def no_read(*a, **k):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr("ordered_ssd.apps.check.run.load_corpus", no_read)
    assert main(["check", "--hf-config", str(config), "--data", str(hf_files / "corpus.txt"), "--out", str(out),
                 *HF_TINY[:-1]]) == 2
    captured = capsys.readouterr()
    assert captured.out == "", captured.out  # no header
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in want), captured.err
    assert _tree(out) == before


# ----------------------------------------------------------------------------------------------- module digests
def test_parameters_group_into_modules():
    assert module_of("model.layers.3.mamba.in_proj.weight") == "model.layers.3"
    assert module_of("model.layers.3.block_sparse_moe.experts.0.w1") == "model.layers.3"
    assert module_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert module_of("lm_head.weight") == "lm_head"
    assert module_of("mixers.0.in_proj.weight") == "mixers.0" and module_of("embedding") == "embedding"
    names = ["embedding", "norms.0.weight", "mixers.0.A_log", "mixers.0.D", "norm_f.weight"]
    assert module_names(names) == ["embedding", "norms.0", "mixers.0", "norm_f"]
    grads = {n: "x" for n in names}
    digests = module_digests(grads, names)
    assert list(digests) == module_names(names)
    assert module_digests(dict(grads, **{"mixers.0.D": "y"}), names)["mixers.0"] != digests["mixers.0"]
    assert module_digests(dict(grads, **{"mixers.0.D": "y"}), names)["norms.0"] == digests["norms.0"]


def test_the_byte_lm_check_records_module_digests(check_run):
    res, out = check_run
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["module_names"] == ["embedding", "norms.0", "mixers.0", "norm_f"]
    assert report["model"]["kind"] == "byte-lm" and report["first_module_diff"] is None
    assert sorted(report["per_step"][0]["modules"]) == sorted(report["module_names"])
