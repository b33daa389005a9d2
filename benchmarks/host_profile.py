#!/usr/bin/env python
"""Where the host time of one layer step goes: a thin wrapper around :mod:`ordered_ssd.apps.bench.host_profile`
(the same as ``python -m ordered_ssd.apps.bench.host_profile``; see it for the method)::

    python benchmarks/host_profile.py --shape S5 --modes ordered,native --steps 20 --out prof/
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from ordered_ssd.apps.bench.host_profile import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
