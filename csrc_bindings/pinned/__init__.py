"""The pinned launch-configuration table (:mod:`.table`, pure data) and the tuner that writes it (:mod:`.tune`).

Retune on a GPU with ``python -m csrc_bindings.pinned.tune`` (see ``docs/bindings.md``); a new table changes the
table hash in :func:`csrc_bindings.fingerprint`. Importing this package imports nothing (the tuner imports torch and,
when it runs, the native kernels).
"""
