"""The ``<!-- run: gpu -->`` code blocks of docs/convert.md run on the GPU (with mamba-ssm)."""
import pytest

from tests.test_docs_convert import blocks


@pytest.mark.parametrize("index", range(len(blocks("gpu"))))
def test_gpu_block_runs(index):
    from mamba_ssm.modules.mamba2 import Mamba2

    namespace = {}
    exec(compile(blocks("gpu")[index], f"docs/convert.md[gpu block {index}]", "exec"), namespace)
    model = namespace["model"]
    assert [type(layer.mixer) for layer in model.backbone.layers] == [Mamba2] * 2
    assert all(p.grad is not None for p in model.parameters())
