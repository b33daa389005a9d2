"""The code blocks of docs/convert.md run: those marked ``<!-- run: cpu -->`` here, those marked
``<!-- run: gpu -->`` in tests/gpu/test_docs_convert_gpu.py. Every python block carries one of the two marks."""
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "convert.md"
_BLOCK = re.compile(r"(?:<!-- run: (\w+) -->\n)?```python\n(.*?)```", re.S)


def blocks(where):
    return [code for mark, code in _BLOCK.findall(DOC.read_text()) if mark == where]


def test_every_python_block_is_marked_to_run():
    found = _BLOCK.findall(DOC.read_text())
    assert found, "docs/convert.md has no python block"
    assert [mark for mark, _ in found if mark not in ("cpu", "gpu")] == []


@pytest.mark.parametrize("index", range(len(blocks("cpu"))))
def test_cpu_block_runs(index, capsys):
    pytest.importorskip("transformers")
    printed = []
    for _ in range(2):  # twice: the digests it prints are the same, as the page says
        namespace = {}
        exec(compile(blocks("cpu")[index], f"docs/convert.md[cpu block {index}]", "exec"), namespace)
        printed.append(capsys.readouterr().out)
    from ordered_ssd.hf import OrderedHFMamba2Mixer

    model = namespace["model"]
    # the block ends with convert_to_hf: no ordered mixer is left, and the generation produced new tokens
    assert not any(type(m) is OrderedHFMamba2Mixer for m in model.modules())
    assert namespace["tokens"].shape == (2, 12)
    assert re.fullmatch(r"loss [0-9a-f]{16} gradients [0-9a-f]{16}\n", printed[0]), printed[0]
    assert printed[1] == printed[0]
