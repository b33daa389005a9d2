"""Swap the Mamba-2 (and mamba-ssm's Mamba-3) layers of a model for ordered ones in place, and back.

mamba-ssm's ``Mamba2`` becomes :class:`~ordered_ssd.OrderedMamba2`, its ``Mamba3`` an
:class:`~ordered_ssd.modules.mamba3.OrderedMamba3`; the Mamba-2 mixers of Hugging Face
``transformers`` models (``Mamba2ForCausalLM``, Bamba, NemotronH, GraniteMoeHybrid, FalconH1, Zamba2) become
:class:`~ordered_ssd.hf.OrderedHFMamba2Mixer` (:mod:`ordered_ssd.hf`).

The new layer takes over the old layer's parameter objects (the same ``nn.Parameter`` instances: their storage,
dtype, device, ``requires_grad``, gradient and attributes such as ``_no_weight_decay``; an optimizer built on the
model keeps working), its constructor arguments (``layer_idx`` included), the norm's ``eps`` and ``group_size``,
and its train/eval mode. The new layer is built on the ``meta`` device first, so a conversion allocates nothing
and draws no random numbers. Hooks registered on the old layer or its submodules are not carried over.
"""
from __future__ import annotations

from typing import Callable

import torch.nn as nn

from .hf.mixer import OrderedHFMamba2Mixer, hf_from_ordered, hf_mixer_family, ordered_from_hf
from .modules import NATIVE_LAYERS
from .modules.mamba2 import OrderedMamba2
from .modules.invariant import InvariantLinear, InvariantRMSNorm
from .modules.mamba3 import OrderedMamba3

__all__ = ["convert_to_ordered", "convert_to_mamba2", "convert_to_hf"]

#: The constructor arguments both classes take and store under the same attribute name.
_STORED_ARGS = ("d_model", "d_state", "d_conv", "conv_init", "expand", "headdim", "d_ssm", "ngroups", "D_has_hdim",
                "rmsnorm", "norm_before_gate", "dt_limit", "chunk_size", "use_mem_eff_path", "layer_idx",
                "process_group", "sequence_parallel")


def _is_mamba2(module: nn.Module) -> bool:
    """mamba-ssm's ``Mamba2`` itself (not a subclass), recognised without importing mamba-ssm."""
    return _is_native(module, "mamba2")


def _is_mamba3(module: nn.Module) -> bool:
    """mamba-ssm's ``Mamba3`` itself (not a subclass), recognised without importing mamba-ssm."""
    return _is_native(module, "mamba3")


def _is_native(module: nn.Module, kind: str) -> bool:
    cls = type(module)
    return (cls.__module__, cls.__name__) == NATIVE_LAYERS[kind]


#: the attributes of mamba-ssm 2.3.2.post1's ``Mamba3`` that give its constructor arguments
_MAMBA3_ATTRS = ("d_model", "d_state", "expand", "headdim", "num_bc_heads", "rotary_dim_divisor", "A_floor",
                 "is_outproj_norm", "is_mimo", "chunk_size", "layer_idx")


def _ordered3_from(layer: nn.Module) -> OrderedMamba3:
    missing = [a for a in _MAMBA3_ATTRS if not hasattr(layer, a)]
    if missing:
        raise TypeError(f"{type(layer).__module__}.{type(layer).__name__}: expected the attributes of mamba-ssm "
                        f"2.3.2.post1's Mamba3, missing {missing}")
    if layer.is_mimo:
        raise ValueError(f"Mamba3(layer_idx={layer.layer_idx}): is_mimo: expected False (the multi-input "
                         "multi-output path has no ordered implementation), got True")
    new = OrderedMamba3(d_model=layer.d_model, d_state=layer.d_state, expand=layer.expand, headdim=layer.headdim,
                        ngroups=layer.num_bc_heads, rope_fraction=2 / layer.rotary_dim_divisor, A_floor=layer.A_floor,
                        is_outproj_norm=layer.is_outproj_norm, chunk_size=layer.chunk_size,
                        layer_idx=layer.layer_idx, device="meta")
    _take_over(new, layer)
    for name in ("B_norm", "C_norm") + (("norm",) if layer.is_outproj_norm else ()):
        getattr(new, name).eps = getattr(layer, name).eps
    return new


def _constructor_args(layer: nn.Module) -> dict:
    missing = [a for a in _STORED_ARGS if not hasattr(layer, a)]
    if missing:
        raise TypeError(f"{type(layer).__module__}.{type(layer).__name__}: expected the attributes of mamba-ssm "
                        f"2.3.2.post1's Mamba2, missing {missing}")
    if layer.process_group is not None:
        raise ValueError(f"{type(layer).__name__}(layer_idx={layer.layer_idx}): process_group: expected None "
                         "(tensor parallelism is not supported by OrderedMamba2), got a process group")
    args = {a: getattr(layer, a) for a in _STORED_ARGS}
    args["bias"] = layer.in_proj.bias is not None
    args["conv_bias"] = layer.conv1d.bias is not None
    return args


def _take_over(new: nn.Module, old: nn.Module) -> nn.Module:
    """Give ``new`` (on meta) ``old``'s parameter objects, name by name; both must have the same names and shapes."""
    new_names = dict(new.named_parameters())
    old_params = dict(old.named_parameters())
    if set(new_names) != set(old_params):
        raise ValueError(f"{type(old).__name__}: expected the parameters {sorted(new_names)}, "
                         f"got {sorted(old_params)}")
    for name, param in new_names.items():
        source = old_params[name]
        if source.shape != param.shape:
            raise ValueError(f"{type(old).__name__}.{name}: expected shape {tuple(param.shape)}, "
                             f"got {tuple(source.shape)}")
        owner_name, _, leaf = name.rpartition(".")
        owner = new.get_submodule(owner_name) if owner_name else new
        owner._parameters[leaf] = source
    left = [n for n, t in [*new.named_parameters(), *new.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{type(old).__name__}: no source for {left}")
    new.train(old.training)
    return new


def _swap(model: nn.Module, matches: Callable[[nn.Module], bool], build: Callable[[nn.Module], nn.Module],
          what: str) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if matches(model):
        return build(model)
    # every registration, duplicates included: a layer registered under two names is replaced under both, by one
    # new layer (built once per layer object)
    targets = [(name, module) for name, module in model.named_modules(remove_duplicate=False)
               if name and matches(module)]
    if not targets:
        raise ValueError(f"model: expected at least one {what} module, found none")
    new_of = {}
    for _, module in targets:  # every layer checked and built before any is replaced
        if id(module) not in new_of:
            new_of[id(module)] = build(module)
    for name, module in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, new_of[id(module)])
    return model


def _ordered_from(layer: nn.Module) -> OrderedMamba2:
    new = OrderedMamba2(**_constructor_args(layer), device="meta")
    _take_over(new, layer)
    if layer.rmsnorm:
        new.norm.eps, new.norm.group_size = layer.norm.eps, layer.norm.group_size
    return new


def _to_ordered(layer: nn.Module) -> nn.Module:
    if _is_mamba3(layer):
        return _ordered3_from(layer)
    return _ordered_from(layer) if _is_mamba2(layer) else ordered_from_hf(layer)


def convert_to_ordered(model: nn.Module, *, invariant_linears: bool = False) -> nn.Module:
    """Replace every mamba-ssm ``Mamba2`` and ``Mamba3`` and every Hugging Face Mamba-2 mixer in ``model`` (the
    classes themselves, not subclasses) with an ordered layer, in place.

    mamba-ssm's ``Mamba2`` becomes an :class:`OrderedMamba2`, its ``Mamba3`` (single-input single-output) an
    :class:`~ordered_ssd.modules.mamba3.OrderedMamba3`; a ``transformers`` mixer (``Mamba2Mixer``,
    ``BambaMixer``, ``NemotronHMamba2Mixer``, ``GraniteMoeHybridMambaLayer``, ``FalconH1Mixer``,
    ``Zamba2MambaMixer``, in the ``transformers`` versions of :data:`ordered_ssd.hf.SUPPORTED_TRANSFORMERS`) becomes
    an :class:`~ordered_ssd.hf.OrderedHFMamba2Mixer` with the mixer's forward signature and semantics (padding
    mask, packed sequences, the model's cache, ``docs/convert.md``). Either way the new layer holds the old one's
    parameter objects (``state_dict`` keys, shapes, dtypes and values unchanged; an optimizer built before keeps
    working). Works without mamba-ssm's kernels (a model on the CPU converts and runs the pure-PyTorch reference).
    After it, the Mamba layers compute with ordered gradients on CUDA (bitwise reproducible;
    ``docs/guarantees.md``); the rest of the model must be deterministic too (``docs/convert.md``).

    Args:
        model: an ``nn.Module`` holding such layers (e.g. ``MambaLMHeadModel`` with ``ssm_cfg={"layer":
            "Mamba2"}``, ``Mamba2ForCausalLM``, ``BambaForCausalLM``, a PEFT-wrapped model), or one layer itself.
        invariant_linears: also replace every ``nn.Linear`` outside the ordered layers (e.g. the ``lm_head``) with
            an :class:`~ordered_ssd.modules.invariant.InvariantLinear` holding the same parameter objects, so that
            a token's logits do not depend on how many rows come with it (``docs/guarantees.md``, "A sequence's
            bits are its own"), and set ``sequence_invariant = True`` on every ordered Mamba-2 layer (the CUDA
            path's projections by the row-invariant GEMM, packed sequences each as its own row). A model whose
            Mamba layers are ordered already (built from ``OrderedMamba2``, or converted before) then only has its
            linears swapped and its layers set.

    Returns:
        ``model`` (converted in place), or the new layer when ``model`` itself is such a layer.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``; a layer lacks the attributes of the supported version.
        ValueError: no such layer in ``model``; a ``Mamba2`` with a ``process_group`` (tensor parallelism); a
            ``Mamba3`` with ``is_mimo=True``; a mixer whose norm or activation the ordered path does not implement
            (named in the message).
        RuntimeError: a ``transformers`` version outside the supported range. Every layer is checked and built
            before any is replaced, so on an error the model is unchanged (never a partial conversion).
        TypeError: ``invariant_linears`` not a bool.
    """
    if not isinstance(invariant_linears, bool):
        raise TypeError(f"invariant_linears: expected a bool, got {type(invariant_linears).__name__}")
    convertible = lambda m: _is_mamba2(m) or _is_mamba3(m) or hf_mixer_family(m) is not None  # noqa: E731
    ordered = (OrderedMamba2, OrderedMamba3, OrderedHFMamba2Mixer)
    if (invariant_linears and isinstance(model, nn.Module) and not any(convertible(m) for m in model.modules())
            and any(isinstance(m, ordered) for m in model.modules())):
        result = model  # its layers are ordered already (built so, or converted before): only the linears to swap
    else:
        result = _swap(model, convertible, _to_ordered, "mamba_ssm Mamba2 or Mamba3, or transformers Mamba-2 mixer")
    if invariant_linears:
        _invariant_linears(result)
    return result


def _invariant_linears(model: nn.Module) -> None:
    """Replace every ``nn.Linear`` (the class itself) outside the ordered layers with an ``InvariantLinear``, and every
    ``nn.RMSNorm`` / ``Mamba2RMSNorm`` with an ``InvariantRMSNorm``, holding its parameters (one new module per
    module object, under every name it is registered by); set ``sequence_invariant`` on the ordered layers."""
    ordered = (OrderedMamba2, OrderedMamba3, OrderedHFMamba2Mixer)
    for m in model.modules():
        if isinstance(m, (OrderedMamba2, OrderedHFMamba2Mixer)):
            m.sequence_invariant = True
    inside = [name for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, ordered)]
    new_of = {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not name or any(name.startswith(p + ".") for p in inside):
            continue
        if type(module) is nn.Linear:
            new = new_of.setdefault(id(module), InvariantLinear.from_linear(module))
        elif InvariantRMSNorm.swappable(module):
            new = new_of.setdefault(id(module), InvariantRMSNorm.from_module(module))
        else:
            continue
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, new)


def convert_to_hf(model: nn.Module) -> nn.Module:
    """Put the original ``transformers`` mixers back in place of every :class:`~ordered_ssd.hf.OrderedHFMamba2Mixer`
    in ``model`` (the reverse of :func:`convert_to_ordered` for Hugging Face models). Each original mixer gets the
    ordered mixer's current parameters, buffers, submodules and train/eval mode (what was trained or loaded since
    the conversion is kept).

    Returns:
        ``model``, or the original mixer when ``model`` itself is an ``OrderedHFMamba2Mixer``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``. ValueError: no ``OrderedHFMamba2Mixer`` in ``model``.
    """
    return _swap(model, lambda m: type(m) is OrderedHFMamba2Mixer, hf_from_ordered, "OrderedHFMamba2Mixer")


def convert_to_mamba2(model: nn.Module) -> nn.Module:
    """Replace every :class:`OrderedMamba2` in ``model`` with mamba-ssm's ``Mamba2``, in place (the reverse of
    :func:`convert_to_ordered`).

    Returns:
        ``model``, or the new layer when ``model`` itself is an ``OrderedMamba2``.

    Raises:
        ImportError: mamba-ssm is not installed (the message gives the install command).
        RuntimeError: another mamba-ssm version than the supported one.
        TypeError / ValueError: as :func:`convert_to_ordered`.
    """
    def build(layer):
        import csrc_bindings

        mamba2_cls = csrc_bindings.mamba2_class()
        new = mamba2_cls(**_constructor_args(layer), device="meta")
        _take_over(new, layer)
        if layer.rmsnorm:
            new.norm.eps, new.norm.group_size = layer.norm.eps, layer.norm.group_size
        return new

    return _swap(model, lambda m: type(m) is OrderedMamba2, build, "OrderedMamba2")
