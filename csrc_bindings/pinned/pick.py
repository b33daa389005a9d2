"""The problems a pinned-table search times, and how it picks one entry per autotune key from their timings.

The table is keyed by the autotune key only, so one entry serves every batch and sequence length: a search times
each candidate on one problem (:func:`problem_sizes`) or several (:func:`problem_list`) and picks by
:func:`least_worst_ratio`; :func:`pick_entry` may keep the key's current entry when it is close enough
(``--keep-within``), so that a re-search changes the bits of a key only where it buys speed.
"""
from __future__ import annotations

import torch

#: the status of a candidate that hit the GPU's memory limit (the tuner's compile workers share the GPU): not a
#: property of the candidate, so its key is not written, as when the budget cuts a search short
OUT_OF_MEMORY = "skipped: out of memory"


def failure_status(exc) -> str:
    """What a search records for a candidate whose run raised ``exc``: :data:`OUT_OF_MEMORY`, or the error's type
    and message (the candidate is invalid)."""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
        return OUT_OF_MEMORY
    return f"{type(exc).__name__}: {str(exc)[:200]}"


#: how a search over several problems picks (:func:`least_worst_ratio`)
ROBUST_RULE = "least-worst-ratio-v1"


def problem_sizes(args):
    """The timed problem's sizes besides the autotune key (the key's own sizes win, e.g. chunk-cumsum's nheads)."""
    return {"batch": args.batch, "seqlen_chunks": args.seqlen_chunks, "nheads": args.problem_nheads,
            "ngroups": args.ngroups}


def problem_list(args):
    """The timed problems: :func:`problem_sizes`, then one per ``--also-problem BxCxHxG`` (batch, seqlen in chunks,
    nheads, ngroups). Raises ValueError on a malformed or non-positive one, or nheads not a multiple of ngroups."""
    out = [problem_sizes(args)]
    for text in getattr(args, "also_problem", None) or ():
        try:
            b, c, h, g = (int(v) for v in text.split("x"))
        except ValueError:
            b = c = h = g = 0
        if min(b, c, h, g) < 1 or h % g:
            raise ValueError(f"--also-problem: expected BxCxHxG (positive, H a multiple of G), got {text!r}")
        out.append({"batch": b, "seqlen_chunks": c, "nheads": h, "ngroups": g})
    return out


def describe_sizes(sizes):
    if isinstance(sizes, list):
        text = "; ".join(describe_sizes(s) for s in sizes)
        return text if len(sizes) == 1 else f"{text}; chosen: {ROBUST_RULE} (least worst ratio to each one's fastest)"
    return (f"batch {sizes['batch']}, seqlen {sizes['seqlen_chunks']} * chunk_size, nheads {sizes['nheads']} "
            f"(unless keyed), ngroups {sizes['ngroups']}")


def worst_ratios(rows):
    """Per row (``ms``, and ``ms_more`` for every further problem), its largest ratio to the fastest row of each
    problem (1.0: the fastest everywhere)."""
    times = [[r["ms"], *r.get("ms_more", ())] for r in rows]
    fastest = [max(min(t[j] for t in times), 1e-9) for j in range(len(times[0]))]
    return [max(t[j] / fastest[j] for j in range(len(fastest))) for t in times]


def least_worst_ratio(rows):
    """The row whose worst ratio to the fastest row of each problem is the smallest, the first in candidate order
    on a tie: one table entry per autotune key serves every batch and length, so it should lose least where it
    loses most. One problem: the fastest row."""
    worst = worst_ratios(rows)
    return rows[worst.index(min(worst))]


def pick_entry(rows, current=None, keep_within=None):
    """The row a search writes: the row whose ``candidate`` is ``current`` (the key's entry before the search) if
    ``keep_within`` is set and that row's worst ratio is at most ``keep_within`` (e.g. 1.10: it loses at most 10 %
    on every problem), else :func:`least_worst_ratio`. ``rows``: the valid rows, timed on every problem."""
    if keep_within is not None and current is not None:
        worst = worst_ratios(rows)
        for r, w in zip(rows, worst):
            if r["candidate"] == current and w <= keep_within:
                return r
    return least_worst_ratio(rows)
