"""Per-layer rematerialisation (``tf.recompute_grad``) as a layer option.

A layer whose ``__call__`` carries the :func:`rematerializable` decorator
has a ``remat`` option (a constructor argument of the Transformer's encoder
and decoder layers, ``Transformer(..., remat=True)``): with it on, the call
runs under ``tf.recompute_grad``, so the forward pass keeps only the layer's
inputs and outputs and the backward pass recomputes the activations inside
the layer. Variables and the checkpoint layout do not change, and since all
randomness is stateless (seed arguments), the recomputation repeats dropout
and routing exactly. :func:`apply_remat` turns the option on for every layer
of a built model (the trainer's ``--remat``, which gets its model from a
``model_fn``).

``tf.recompute_grad`` differentiates only positional tensor arguments and
returns nests of tensors, so :func:`remat_call` passes the float tensor
keyword arguments (e.g. the decoder's cross-attention keys/values)
positionally, flattens dataclass outputs (MoeOutput, RouterStats) to dicts
of float tensors, and rebuilds them afterwards.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, TypeVar

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


_Call = TypeVar("_Call", bound=Callable[..., Any])


def rematerializable(call: _Call) -> _Call:
  """Decorates a layer's ``__call__(self, x, **kwargs)`` with the remat option.

  The decorated call runs as :func:`remat_call` when ``self.remat`` is true
  and as itself otherwise; the layer sets ``self.remat`` in its constructor.
  """
  @functools.wraps(call)
  def wrapper(self, x, **kwargs):
    if not self.remat:
      return call(self, x, **kwargs)
    return remat_call(functools.partial(call, self), x, **kwargs)
  wrapper.rematerializable = True
  return wrapper  # type: ignore[return-value]


def supports_remat(layer: Any) -> bool:
  """True if ``layer``'s ``__call__`` honours a ``remat`` option."""
  return getattr(type(layer).__call__, "rematerializable", False)


def apply_remat(model: tf.Module) -> int:
  """Turns the remat option on for every layer of a Transformer; #layers.

  Raises:
    ValueError: the model has no ``encoder_layers``/``decoder_layers``, or a
      layer in them has no remat option.
  """
  count = 0
  for attr in _LAYER_LISTS:
    for layer in getattr(model, attr, ()):
      if not supports_remat(layer):
        raise ValueError(
            f"--remat: {type(layer).__name__} in {type(model).__name__}."
            f"{attr} has no remat option; decorate its __call__ with "
            "m4moe.training.remat.rematerializable and set self.remat")
      layer.remat = True
      count += 1
  if not count:
    raise ValueError(
        f"--remat needs a model with {' / '.join(_LAYER_LISTS)} lists of "
        f"layers; {type(model).__name__} has none")
  return count
