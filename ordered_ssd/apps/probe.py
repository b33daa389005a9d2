"""What the applications ask the library about this machine: the one place they import the probe of
OrderedMamba2's native path (``(available, why not)``), so that its rename is a one-line change."""
from ..mamba2 import native_path_available

__all__ = ["native_path_available"]
