"""The applications of ordered-ssd, resting on the library and not on each other.

* :mod:`ordered_ssd.apps.cli`: the ``ordered-ssd`` command (``check``, ``env``, ``bench``, ``_train``);
* :mod:`ordered_ssd.apps.check`: ``ordered-ssd check``, train a byte-level LM and prove the run reproducible;
* :mod:`ordered_ssd.apps.bench`: ``ordered-ssd bench``, the cost of reproducibility for one layer;
* :mod:`ordered_ssd.apps.lm`: the byte-level language model and its data;
* :mod:`ordered_ssd.apps.files` / :mod:`ordered_ssd.apps.errors`: what the applications share (atomic writes,
  the output directory, argparse types; the one-line user-facing error and its exit status).

From the library they use only public names: :class:`ordered_ssd.OrderedMamba2`,
:class:`ordered_ssd.modules.mamba3.OrderedMamba3` (``check --layer mamba3``), :mod:`ordered_ssd.digest`,
:mod:`ordered_ssd.fingerprint`, :mod:`ordered_ssd.distributed`, :func:`ordered_ssd.modules.cuda_path_available`
and ``csrc_bindings``.
"""
