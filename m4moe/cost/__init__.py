"""Analytic cost model: parameters, FLOPs, memory and communication.

* ``model``: parameter, FLOP and memory counts from a config.
* ``tables``: GShard Table 1's per-device analysis over the zoo.
* ``unfused``: the tensors a kernel-by-kernel gradient tape keeps, per
  sub-layer (the ``unfused`` execution of ``model``).
"""
