"""What the launchers rely on about one native kernel: the :class:`KernelSpec`, and :func:`key_of`.

A spec is pure data about the upstream kernel (where it lives, its argument names, its autotuner's key and
candidate configurations, what its autotuner pre-hook zeroes). Each file that mirrors an upstream module
(``csrc_bindings/ssd_chunk_state.py`` for ``mamba_ssm/ops/triton/ssd_chunk_state.py``, ...) holds, for each of its
kernels in upstream's order: the launcher (``launch_*``), the example runner (``_example_*``, for the tuner and the
GPU tests) and the spec. A launcher builds its configuration key from the spec's ``autotune_key`` and its own launch
arguments (:func:`key_of`, through :func:`csrc_bindings._configs.launch_config`) and launches the JIT function
directly with the pinned (or given) configuration, never the autotuner; :mod:`csrc_bindings` states the contract
every launcher keeps. :mod:`csrc_bindings._registry` assembles the specs. Importing this module imports nothing
native.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping


@dataclasses.dataclass(frozen=True, eq=False)
class KernelSpec:
    """Facts about one native kernel (a Triton JIT function, or a C++ op when ``arity`` is set).

    Attributes:
        name: the kernel's name in the pinned table and in ``describe_launch`` (e.g. ``"chunk_scan_fwd"``).
        module, attr: where upstream defines it (``mamba_ssm.ops.triton.ssd_chunk_scan``,
            ``_chunk_scan_fwd_kernel``).
        arg_names: the JIT function's full argument list (given as one space-separated string), checked at first
            use; every launch passes every one of them by name.
        autotune_key: the upstream autotuner's ``key`` (None: no autotuner). The launcher's configuration key is
            ``key_of(spec, args)``: these names, looked up in the launch arguments.
        candidates: the upstream autotuner's configurations, ``(block kwargs, num_warps, num_stages)``, a copy so
            the ``mincost-v1`` rule never reads a (possibly filtered) live ``.configs``. None: no autotuner.
        pre_hook_zero: the arguments the upstream autotuner's pre-hook zeroes (the launcher zeroes them).
        layer_key_consts: key values that are constants of the Mamba-2 layer rather than sizes (``IS_CAUSAL``).
        layer_dtype: ``"model"`` (keyed on the activations' dtype) or ``"fp32"`` (the inter-chunk states).
        arity: for a C++ op, its number of arguments (read from the pybind signature at first use).
        config_error: ``config_error(block sizes dict) -> message or None``: a configuration the kernel computes
            wrongly (the launcher raises ``ValueError(message)`` before launching; the neutrality proof skips it).
        example: ``example(p, config=None)`` runs the launcher on an example problem (:mod:`._examples`) and returns
            its outputs; used by the tuner and the GPU tests.
        tile_bounds: ``{block size name: autotune-key name}``: a block size that tiles a dimension of the key's size
            (e.g. the head dim) and is not reduced over in a way that needs a wider tile: a candidate whose tile is
            wider than the narrowest candidate tile that covers the dimension only adds masked lanes
            (:func:`oversized_tiles`), and the tuner does not search it.
        timing_outputs: the pointer arguments the kernel writes, for a kernel that writes each of them with plain
            stores only (no atomics, no read-modify-write of an output), read from its code: upstream's autotuner
            may then run it repeatedly on a launch's own arguments (rule ``native-autotune-v1``,
            :mod:`csrc_bindings._configs`) when every output's storage is apart from every other argument's.
            Empty: never timed at run time.
        order_nearest: autotune-key names along which a key missing from the pinned table takes the order
            parameters of the nearest table entry with the same other key values (rule ``nearest-order-v1``,
            :func:`csrc_bindings._configs.nearest_order_key`); empty: such a key takes the ``mincost-v1`` rule.
            Only for a kernel each of whose candidates is valid at every value of these names (a block size
            that tiles them is masked), so the nearest entry's configuration computes the key correctly.
    """
    name: str
    module: str
    attr: str
    arg_names: tuple = ()
    autotune_key: tuple | None = None
    candidates: tuple | None = None
    pre_hook_zero: tuple = ()
    layer_key_consts: Mapping = dataclasses.field(default_factory=dict)
    layer_dtype: str = "model"
    arity: int | None = None
    example: Callable | None = None
    config_error: Callable | None = None
    tile_bounds: Mapping = dataclasses.field(default_factory=dict)
    timing_outputs: tuple = ()
    order_nearest: tuple = ()

    def __post_init__(self):
        if isinstance(self.arg_names, str):
            object.__setattr__(self, "arg_names", tuple(self.arg_names.split()))
        if not set(self.order_nearest) <= set(self.autotune_key or ()):
            raise ValueError(f"order_nearest: expected names of the autotune key {self.autotune_key} of {self.name}, "
                             f"got {self.order_nearest}")


#: ``KernelConfig.speed`` of a launch that is to time its key with upstream's autotuner (rule ``native-autotune-v1``,
#: :mod:`csrc_bindings._configs`; :func:`csrc_bindings._native.launch` acts on it).
TIMING_PENDING = "native-autotune-v1:pending"


def key_of(spec: KernelSpec, args: Mapping) -> dict:
    """The kernel's autotune-key values, ``{name: args[name]}`` for the names of ``spec.autotune_key``, taken from
    the launch arguments (upstream's autotuner reads its key from the same arguments)."""
    return {n: args[n] for n in spec.autotune_key}


def oversized_tiles(spec: KernelSpec, key: Mapping, block: Mapping) -> tuple:
    """The names of ``spec.tile_bounds`` whose block size in ``block`` is wider than the narrowest candidate tile
    that covers the key's size of its dimension: ``block[n] > min(v for v in candidate values of n if v >=
    key[dim])`` (the widest candidate value when none covers it). Such a tile computes the same dimension with more
    masked lanes. Empty for a kernel without ``tile_bounds`` or candidates.

    Example: ``chunk_scan_chunk_state_bwd_dx`` (``{"BLOCK_SIZE_N": "hdim"}``, candidate values 32..256) at
    ``hdim`` 32: a ``BLOCK_SIZE_N`` of 64 or more is oversized; at ``hdim`` 48, of 128 or more.
    """
    if not spec.tile_bounds or not spec.candidates:
        return ()
    out = []
    for name, dim in spec.tile_bounds.items():
        values = sorted({int(c[0][name]) for c in spec.candidates})
        size = int(key[dim])
        bound = next((v for v in values if v >= size), values[-1])
        if int(block[name]) > bound:
            out.append(name)
    return tuple(out)
