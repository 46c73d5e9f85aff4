"""Per-layer rematerialisation (``tf.recompute_grad``), model.py untouched.

:func:`apply_remat` switches every layer in ``model.encoder_layers`` and
``model.decoder_layers`` to a subclass whose ``__call__`` runs the original
one under ``tf.recompute_grad``: the forward pass keeps only each layer's
inputs and outputs, and the backward pass recomputes the activations inside
the layer. The objects, their variables and the checkpoint layout stay the
same (only ``__class__`` changes), and since all randomness is stateless
(seed arguments), the recomputation repeats dropout and routing exactly.

``tf.recompute_grad`` differentiates only positional tensor arguments and
returns nests of tensors, so the wrapper passes the float tensor keyword
arguments (e.g. the decoder's cross-attention keys/values) positionally,
flattens dataclass outputs (MoeOutput, RouterStats) to dicts of float
tensors, and rebuilds them afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf

_LAYER_LISTS = ("encoder_layers", "decoder_layers")


def _pack(value: Any) -> Any:
  """Dataclasses -> dicts, Nones dropped, tensors cast to float32."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
  if isinstance(value, dict):
    return {k: _pack(v) for k, v in value.items() if v is not None}
  if isinstance(value, (tuple, list)):
    return tuple(_pack(v) for v in value if v is not None)
  value = tf.convert_to_tensor(value)
  return value if value.dtype.is_floating else tf.cast(value, tf.float32)


def _unpack(template: Any, packed: Any) -> Any:
  """Inverse of :func:`_pack` given the original (forward) structure."""
  if template is None:
    return None
  if dataclasses.is_dataclass(template) and not isinstance(template, type):
    names = [f.name for f in dataclasses.fields(template) if f.init]
    return type(template)(**{
        n: _unpack(getattr(template, n), packed.get(n)) for n in names})
  if isinstance(template, dict):
    return {k: _unpack(v, packed.get(k)) for k, v in template.items()}
  if isinstance(template, (tuple, list)):
    it = iter(packed)
    return type(template)(None if t is None else _unpack(t, next(it))
                          for t in template)
  return tf.cast(packed, tf.convert_to_tensor(template).dtype)


def remat_call(call: Callable[..., Any], x: tf.Tensor, **kwargs: Any) -> Any:
  """``call(x, **kwargs)`` with activations recomputed in the backward pass."""
  names = [k for k, v in kwargs.items()
           if isinstance(v, tf.Tensor) and v.dtype.is_floating]
  fixed = {k: v for k, v in kwargs.items() if k not in names}
  template = []

  def packed_call(x, *tensors):
    result = call(x, **fixed, **dict(zip(names, tensors)))
    if not template:
      template.append(result)
    return _pack(result)

  packed = tf.recompute_grad(packed_call)(x, *[kwargs[k] for k in names])
  return _unpack(template[0], packed)


class _RematMixin:
  """Runs the layer's ``__call__`` under ``tf.recompute_grad``."""

  def __call__(self, x, **kwargs):
    return remat_call(super().__call__, x, **kwargs)


def apply_remat(model: tf.Module) -> int:
  """Enables per-layer remat on a Transformer in place; returns #layers.

  Raises:
    ValueError: the model has no ``encoder_layers``/``decoder_layers``.
  """
  count = 0
  for attr in _LAYER_LISTS:
    for layer in getattr(model, attr, ()):
      cls = type(layer)
      if issubclass(cls, _RematMixin):
        continue
      layer.__class__ = type(f"Remat{cls.__name__}", (_RematMixin, cls), {})
      count += 1
  if not count:
    raise ValueError(
        f"--remat needs a model with {' / '.join(_LAYER_LISTS)} lists of "
        f"layers; {type(model).__name__} has none")
  return count
