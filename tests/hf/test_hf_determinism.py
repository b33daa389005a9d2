"""Reproducibility of training a converted model on the CPU: the same gradients (SHA-256) in one process and in a
fresh one, transformers.Trainer runs and PEFT LoRA runs that end in the same bits."""
import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ordered_ssd import convert_to_ordered  # noqa: E402
from ordered_ssd.digest import tensor_sha256  # noqa: E402
from ordered_ssd.hf import OrderedHFMamba2Mixer  # noqa: E402
from tests.helpers import bits_equal  # noqa: E402
from tests.hf.models import VOCAB, build, ids, ordered_mixers  # noqa: E402

transformers.logging.set_verbosity_error()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def two_step_digests(threads: int) -> dict:
    """SHA-256 of every gradient of two AdamW steps of a converted Bamba model (seeded), and of the final weights."""
    torch.set_num_threads(threads)
    model = convert_to_ordered(build("bamba", "g2_bias", seed=11)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = {}
    for step in range(2):
        x = ids(2, 37, seed=20 + step)
        opt.zero_grad(set_to_none=True)
        loss = model(x, labels=x).loss
        loss.backward()
        out[f"loss{step}"] = tensor_sha256(loss.detach())
        for n, p in model.named_parameters():
            out[f"grad{step}:{n}"] = tensor_sha256(p.grad)
        opt.step()
    for n, p in model.named_parameters():
        out[f"weight:{n}"] = tensor_sha256(p)
    return out


def test_two_training_steps_give_the_same_gradient_digests_in_process_and_in_a_fresh_process():
    threads = torch.get_num_threads()
    first = two_step_digests(threads)
    assert two_step_digests(threads) == first
    n_params = len(list(build("bamba", "g2_bias").parameters()))
    assert len(first) == 2 + 3 * n_params
    code = ("import json, sys; from tests.hf.test_hf_determinism import two_step_digests; "
            f"print(json.dumps(two_step_digests({threads})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fresh = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fresh == first
    # the digests see a change: another batch gives other gradients
    assert first["grad0:model.embed_tokens.weight"] != first["grad1:model.embed_tokens.weight"]


# ------------------------------------------------------------------------------------------- Trainer
class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=12, length=24):
        g = torch.Generator().manual_seed(123)
        self.x = torch.randint(3, VOCAB, (n, length), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _trainer_run(tmp_path, tag):
    model = convert_to_ordered(build("bamba", "g2_bias", seed=5))
    init = {k: v.clone() for k, v in model.state_dict().items()}
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / tag), use_cpu=True, report_to=[], max_steps=3, per_device_train_batch_size=4,
        learning_rate=1e-2, seed=7, save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens())
    result = trainer.train()
    assert result.global_step == 3
    assert all(type(m) is OrderedHFMamba2Mixer for _, m in ordered_mixers(model)) and ordered_mixers(model)
    return init, {k: v.detach().clone() for k, v in model.state_dict().items()}, result.training_loss


def test_trainer_runs_twice_to_bitwise_equal_weights(tmp_path):
    init, a, loss_a = _trainer_run(tmp_path, "a")
    _, b, loss_b = _trainer_run(tmp_path, "b")
    assert list(a) == list(b)
    for k in a:
        assert bits_equal(a[k], b[k]), k
    assert loss_a == loss_b
    changed = [k for k in a if not torch.equal(a[k], init[k])]
    assert any(".mamba.in_proj" in k for k in changed) and any(".mamba.A_log" in k for k in changed)


# ------------------------------------------------------------------------------------------- PEFT LoRA
def _lora_run(order):
    peft = pytest.importorskip("peft")
    # (peft refuses out_proj on the model types it knows as Mamba: mamba2, nemotron_h, falcon_h1; not on zamba2)
    base = build("zamba2", seed=9)
    torch.manual_seed(3)  # LoRA's init draws from the global generator; a conversion draws nothing
    cfg = peft.LoraConfig(target_modules=["in_proj", "out_proj"], r=4, lora_alpha=8)
    if order == "convert_then_peft":
        model = peft.get_peft_model(convert_to_ordered(base), cfg)
    else:
        model = convert_to_ordered(peft.get_peft_model(base, cfg))
    mixers = ordered_mixers(model)
    assert len(mixers) == 2
    for _, m in mixers:
        assert type(m.in_proj).__module__.startswith("peft.") and type(m.out_proj).__module__.startswith("peft.")
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    mixer_names = tuple(f"{n}." for n, _ in mixers)
    assert all(n.startswith(mixer_names) for n in lora)
    assert len(lora) == 2 * 2 * 2 and all(p.requires_grad for p in lora.values())  # 2 mixers x 2 proj x A, B
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    init = {n: p.detach().clone() for n, p in lora.items()}
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(2):
        x = ids(2, 37, seed=30 + step)
        opt.zero_grad(set_to_none=True)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
    return init, {n: p.detach().clone() for n, p in lora.items()}


def test_lora_on_a_converted_model_trains_to_bitwise_equal_weights_in_either_order():
    init, a = _lora_run("convert_then_peft")
    _, b = _lora_run("convert_then_peft")
    _, c = _lora_run("peft_then_convert")  # converting a PEFT-wrapped model: the same bits
    assert list(a) == list(b) == list(c)
    for n in a:
        assert bits_equal(a[n], b[n]) and bits_equal(a[n], c[n]), n
        assert not torch.equal(a[n], init[n]), n  # every LoRA weight was trained
