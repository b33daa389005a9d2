"""Running ordered-ssd's own Triton kernels on the CPU under ``TRITON_INTERPRET=1`` (in a test's subprocess).

:func:`allow_runtime_loop_bounds` makes Triton 3.6's interpreter accept a loop bound that is a kernel argument
(``for k in range(0, K)``) with NumPy >= 2.4: the interpreter turns a scalar argument into a one-element 1-d array
and its ``__index__`` calls ``int()`` on it, which NumPy 2.4 refuses. The shim takes the element with ``.item()``
instead; it changes nothing else (loads, stores and arithmetic run as before). Call it in the subprocess, before the
first launch. :func:`run_python` runs such a script in a fresh process.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, interpret: bool) -> str:
    """Run ``code`` with this repository first on the path, with ``TRITON_INTERPRET=1`` (``interpret``) or without
    it (ahead-of-time compiles); return its stdout, or fail the test with the end of its output."""
    env = dict(os.environ)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def allow_runtime_loop_bounds() -> None:
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_ordered_ssd_shim", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0].item()))

    patched._ordered_ssd_shim = True
    interpreter._patch_lang_tensor = patched
