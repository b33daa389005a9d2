"""``ordered-ssd check``: train a byte-level Mamba-2 LM on real text and prove the run is reproducible.

Runs (each a full training of the same spec):

* ``a``  in this process;
* ``b``  in a fresh process;
* ``c``  in a fresh process stopped after step ``k`` (checkpoint written atomically), then resumed from the
  checkpoint in another fresh process;
* with ``--native``: ``native-1`` and ``native-2``, the same model with mamba-ssm's ``Mamba2`` in two fresh
  processes (a control showing whether the native layer diverges).

Compared, bit for bit: the loss of every step, the SHA-256 of every parameter's gradient at every step, and
the SHA-256 of every final parameter. The verdict is ``REPRODUCIBLE`` only if ``a``, ``b`` and ``c`` agree on
all of them. With ``--nproc N`` every run is a data-parallel run of ``N`` processes under torchrun.

Files: :mod:`.spec` (the spec from the command line), :mod:`.train` (the one training loop),
:mod:`.world` (one process or one rank), :mod:`.launch` (fresh processes, torchrun), :mod:`.report`
(comparison, table, plot, ``report.json``), :mod:`.run` (:func:`run_check`).
"""
from .errors import CheckError
from .run import run_check
from .train import train_run

__all__ = ["CheckError", "run_check", "train_run"]
