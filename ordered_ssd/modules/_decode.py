"""Decoding for :class:`~ordered_ssd.modules.mamba2.OrderedMamba2`: the cache, its checks, and the one-token step
(:func:`cached_states`, :func:`check_states` and :func:`check_inference_params` serve ``OrderedMamba3`` too).

What mamba-ssm 2.3.2.post1's ``Mamba2`` does in ``allocate_inference_cache``, ``_get_states_from_cache`` and ``step``,
with the same cache layout: ``conv_state`` [B, conv_dim, d_conv] (a transposed view of a contiguous
[B, d_conv, conv_dim] tensor, dtype of ``conv1d.weight``) and ``ssm_state`` [B, H, P, N] (dtype of
``in_proj.weight``), both updated in place. The step runs on the CUDA path (:mod:`ordered_ssd.ops.decode`: the
native ``causal_conv1d_update`` and ``selective_state_update``) or on the reference
(:func:`ordered_ssd.reference.reference_mamba2_step`), chosen as the forward's path is (``layer.backend_for``).
"""
from __future__ import annotations

import torch

from .. import _checks
from ..reference import reference_mamba2_step
from ._parity import ParityCache


def new_cache(layer, batch_size, device, conv_dtype, ssm_dtype):
    """Zeroed ``(conv_state, ssm_state)`` in ``Mamba2``'s layout."""
    conv_state = torch.zeros(batch_size, layer.d_conv, layer.conv1d.weight.shape[0], device=device,
                             dtype=conv_dtype).transpose(1, 2)
    ssm_state = torch.zeros(batch_size, layer.nheads, layer.headdim, layer.d_state, device=device, dtype=ssm_dtype)
    return conv_state, ssm_state


def check_inference_params(inference_params) -> int:
    """``inference_params`` must look like mamba-ssm's ``InferenceParams``: a dict ``key_value_memory_dict`` and an
    int ``seqlen_offset >= 0``. Returns ``seqlen_offset``."""
    memory = getattr(inference_params, "key_value_memory_dict", None)
    offset = getattr(inference_params, "seqlen_offset", None)
    if not isinstance(memory, dict) or isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError("inference_params: expected an object with a dict key_value_memory_dict and an int "
                        "seqlen_offset (mamba_ssm.utils.generation.InferenceParams), got "
                        f"{type(inference_params).__name__}")
    if offset < 0:
        raise ValueError(f"inference_params.seqlen_offset: expected an int >= 0, got {offset}")
    return offset


def check_states(states, shapes: dict, device) -> None:
    """Cached states: ``states[i]`` (named by the ``i``-th key of ``shapes``) a floating tensor of shape
    ``shapes[name]`` on ``device``."""
    for (name, shape), t in zip(shapes.items(), states):
        _checks.check_tensor(name, t)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating dtype, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name}: expected device {device}, got {t.device}")


def check_cache(layer, conv_state, ssm_state, batch: int, device) -> None:
    """The cache of ``batch`` examples: ``conv_state`` [B, conv_dim, d_conv] and ``ssm_state`` [B, H, P, N], floating
    tensors on ``device``."""
    check_states((conv_state, ssm_state), {"conv_state": (batch, layer.conv1d.weight.shape[0], layer.d_conv),
                                           "ssm_state": (batch, layer.nheads, layer.headdim, layer.d_state)}, device)


def states_from_cache(layer, inference_params, batch_size, initialize_states=False):
    """``Mamba2._get_states_from_cache``: this layer's ``(conv_state, ssm_state)`` in
    ``inference_params.key_value_memory_dict[layer.layer_idx]``, created (zeros, on the device and in the dtype of
    the parameters) on first use, zeroed when ``initialize_states``."""
    def check(states):
        if isinstance(states, ParityCache) or not isinstance(states, (tuple, list)) or len(states) != 2:
            raise TypeError(f"inference_params: layer {layer.layer_idx}'s cache entry is a {type(states).__name__}, "
                            "not the (conv_state, ssm_state) of decode_mode 'recurrent' (a cache made in another "
                            "decode_mode)")
        conv_state, ssm_state = states
        check_cache(layer, conv_state, ssm_state, batch_size, layer.in_proj.weight.device)

    conv_state, ssm_state = cached_states(
        layer, inference_params, batch_size, initialize_states, check=check,
        allocate=lambda: new_cache(layer, batch_size, layer.conv1d.weight.device, layer.conv1d.weight.dtype,
                                   layer.in_proj.weight.dtype))
    return conv_state, ssm_state


def cached_states(layer, inference_params, batch_size, initialize_states, *, allocate, check) -> tuple:
    """A layer's states in ``inference_params.key_value_memory_dict[layer.layer_idx]`` (``_get_states_from_cache``
    of mamba-ssm's layers): ``allocate()`` on first use, else ``check(states)`` and, with ``initialize_states``,
    zeroed in place.

    Raises:
        ValueError: ``layer.layer_idx`` is None (and what ``check`` raises). TypeError: ``inference_params`` without
        ``key_value_memory_dict`` / ``seqlen_offset``.
    """
    if layer.layer_idx is None:
        raise ValueError("layer_idx: expected an int (the key of this layer's cache in inference_params), got None")
    check_inference_params(inference_params)
    memory = inference_params.key_value_memory_dict
    if layer.layer_idx not in memory:
        memory[layer.layer_idx] = allocate()
    else:
        check(memory[layer.layer_idx])
        if initialize_states:
            for t in memory[layer.layer_idx]:
                t.zero_()
    return memory[layer.layer_idx]


def step(layer, u, conv_state, ssm_state):
    """One token: ``u`` [B, 1, d_model] -> [B, 1, d_model]; the cache is updated in place. Runs without autograd."""
    w = layer.in_proj.weight
    _checks.check_tensor("hidden_states", u)
    if u.dim() != 3 or u.shape[1] != 1:
        raise ValueError(f"hidden_states: expected [B, 1, d_model] (one token per example), got {tuple(u.shape)}")
    backend = layer.backend_for(u)
    _checks.check_layer_input(u, d_model=layer.d_model, dtype=w.dtype, device=w.device,
                              allowed_dtypes=layer._input_dtypes(backend), name="hidden_states",
                              backend=layer.backend)
    check_cache(layer, conv_state, ssm_state, u.shape[0], u.device)
    with torch.no_grad():
        if backend == "cuda":
            if conv_state.dtype != u.dtype:
                raise TypeError(f"conv_state: expected dtype {u.dtype} (causal-conv1d's update kernel), "
                                f"got {conv_state.dtype}")
            return _step_cuda(layer, u, conv_state, ssm_state)
        return reference_mamba2_step(u, layer._reference_params(u.dtype), layer.dims, conv_state, ssm_state)


def _step_cuda(layer, u, conv_state, ssm_state):
    from einops import rearrange

    from .. import ops

    H, P, G, N = layer.nheads, layer.headdim, layer.ngroups, layer.d_state
    d_mlp = layer.d_inner - layer.d_ssm
    zxbcdt = ops.ordered_linear(u, layer.in_proj.weight, layer.in_proj.bias)[:, 0]  # [B, d_in_proj]
    z0, x0, z, xBC, dt = torch.split(zxbcdt, [d_mlp, d_mlp, layer.d_ssm, layer.d_ssm + 2 * G * N, H], dim=-1)
    xBC = ops.ordered_causal_conv1d_update(xBC, conv_state, rearrange(layer.conv1d.weight, "d 1 w -> d w"),
                                           layer.conv1d.bias, layer.activation)
    x, B, C = torch.split(xBC, [layer.d_ssm, G * N, G * N], dim=-1)
    A = -torch.exp(layer.A_log.float())
    D = rearrange(layer.D, "(h p) -> h p", p=P) if layer.D_has_hdim else layer.D
    y = ops.ordered_selective_state_update(
        ssm_state, rearrange(x, "b (h p) -> b h p", p=P), dt, A, rearrange(B, "b (g n) -> b g n", g=G),
        rearrange(C, "b (g n) -> b g n", g=G), D=D,
        z=None if layer.rmsnorm else rearrange(z, "b (h p) -> b h p", p=P), dt_bias=layer.dt_bias, dt_softplus=True,
        dt_limit=tuple(layer.dt_limit))
    y = rearrange(y, "b h p -> b 1 (h p)")
    if layer.rmsnorm:
        y = ops.ordered_gated_rmsnorm(y, layer.norm.weight, z[:, None], eps=layer.norm.eps,
                                      group_size=layer.norm.group_size, norm_before_gate=layer.norm_before_gate,
                                      chunk_size=layer.chunk_size)
    if d_mlp > 0:
        y = torch.cat([torch.nn.functional.silu(z0[:, None]) * x0[:, None], y], dim=-1)
    return ops.ordered_linear(y, layer.out_proj.weight, layer.out_proj.bias)
