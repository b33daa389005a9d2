"""Which gradients of a compiled model have the eager bits? (the table of docs/compile.md, "A whole compiled model")

One training step of ``Embedding -> OrderedMamba2 -> LayerNorm -> Linear`` with a cross-entropy loss on the CPU,
each variant in a fresh process: eager; the whole model compiled (inductor), twice, with and without
``torch.use_deterministic_algorithms(True)``; only the layer compiled. Then, in one process, ``Linear`` and
``LayerNorm -> Linear`` alone, compiled against eager. Prints one line per comparison: the gradients whose bits
differ. ``python benchmarks/compile_model_probe.py`` (about a minute on 2 CPU cores, most of it compiling).
"""
import copy
import json
import subprocess
import sys

import torch


def _model():
    from ordered_ssd import OrderedMamba2

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 64)
            self.mix = OrderedMamba2(d_model=64, d_state=16, headdim=16, chunk_size=16)
            self.norm = torch.nn.LayerNorm(64)
            self.head = torch.nn.Linear(64, 256)

        def forward(self, ids):
            return self.head(self.norm(self.mix(self.emb(ids))))
    return Model


def _digests(model, fn, ids, target):
    from ordered_ssd.digest import tensor_sha256

    loss = torch.nn.functional.cross_entropy(fn(ids).flatten(0, 1), target.flatten())
    loss.backward()
    return {"loss": tensor_sha256(loss.detach()),
            **{n.replace("_orig_mod.", ""): tensor_sha256(p.grad) for n, p in model.named_parameters()}}


def child(mode: str, deterministic: bool) -> dict:
    """One step in this process: ``mode`` is ``eager``, ``compiled`` (the whole model) or ``layer`` (only it)."""
    torch.use_deterministic_algorithms(deterministic)
    torch.manual_seed(0)
    model = _model()()
    ids = torch.randint(0, 256, (4, 64))
    fn = model
    if mode == "compiled":
        fn = torch.compile(model, fullgraph=True)
    elif mode == "layer":
        model.mix = torch.compile(model.mix, fullgraph=True)
    return _digests(model, fn, ids, ids)


def parts() -> dict:
    """``{name: [gradients that differ]}`` of small models without the layer, compiled against eager."""
    torch.use_deterministic_algorithms(True)
    x = torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(2))
    out = {}
    for name, build in (("Linear", lambda: torch.nn.Linear(64, 256)),
                        ("LayerNorm -> Linear",
                         lambda: torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256)))):
        torch.manual_seed(0)
        eager = build()
        other = copy.deepcopy(eager)
        a = _digests(eager, eager, x, target)
        b = _digests(other, torch.compile(other, fullgraph=True), x, target)
        out[name] = sorted(k for k in a if a[k] != b[k])
    return out


def _run(mode: str, deterministic: bool) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(int(deterministic))],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU {torch.backends.cpu.get_cpu_capability()}")
    eager = _run("eager", False)

    def differ(a, b):
        return sorted(k for k in a if a[k] != b[k]) or "none"
    for deterministic in (False, True):
        first, second = _run("compiled", deterministic), _run("compiled", deterministic)
        flag = "with" if deterministic else "without"
        print(f"whole model compiled ({flag} use_deterministic_algorithms) against eager: {differ(eager, first)}")
        print(f"whole model compiled ({flag} use_deterministic_algorithms), two fresh processes: "
              f"{differ(first, second)}")
    print(f"only the layer compiled against eager: {differ(eager, _run('layer', False))}")
    for name, names in parts().items():
        print(f"{name} alone compiled against eager: {names or 'none'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], bool(int(sys.argv[3])))))
        raise SystemExit(0)
    raise SystemExit(main())
