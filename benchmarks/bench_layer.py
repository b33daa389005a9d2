"""One Mamba-2 layer's training step: native Mamba2, upstream-det, OrderedMamba2 literal and ordered.

A thin wrapper around :mod:`ordered_ssd.apps.bench` (the same suite as ``ordered-ssd bench``); see
``docs/performance.md`` for the method. Needs a CUDA GPU and
``pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0``::

    python benchmarks/bench_layer.py --out bench-out                      # S1-S5, all four modes
    python benchmarks/bench_layer.py --shapes S2 --modes native,ordered --breakdown
    python benchmarks/bench_layer.py --shape 4,8192,2048,128,1            # any B,L,d_model,N,G[,headdim,chunk[,dtype]]
    python benchmarks/bench_layer.py --grid --modes native,upstream-det,ordered --no-native-child  # S1-S5 + G1-G13
    python benchmarks/bench_layer.py --help
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from ordered_ssd.apps.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="benchmarks/bench_layer.py"))
