"""``python -m ordered_ssd.apps.bench``: the suite (also how the bench starts its child processes)."""
import sys

from . import main

sys.exit(main())
