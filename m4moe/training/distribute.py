"""Choosing the tf.distribute strategy: one device, Mirrored, or TPU.

* Default: the default (single-device) strategy.
* Several local GPUs, or several logical CPU devices (``num_cpu_devices``,
  useful for testing data parallelism on one machine): MirroredStrategy; the
  global batch is split evenly across replicas and gradients are summed.
* ``tpu="NAME"`` (a TPU VM's name, or ``"local"`` on the VM itself): connects
  a TPUClusterResolver, initialises the TPU system and returns a TPUStrategy.
  Not testable here (no TPU); on a TPU VM install ``tensorflow-tpu`` of the
  same version instead of ``tensorflow-cpu``.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging


def configure_cpu_devices(num_devices: int) -> None:
  """Splits the physical CPU into ``num_devices`` logical devices.

  Must run before TensorFlow initialises its devices (before any op).
  """
  if num_devices <= 1:
    return
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


def make_strategy(*, tpu: str | None = None,
                  mesh_size: int | None = None) -> tf.distribute.Strategy:
  """The strategy for the visible devices (see the module docstring).

  Args:
    tpu: TPU name, "local" on a TPU VM, or None.
    mesh_size: with ``tpu``, the device count of ``--mesh``: one replica
      spanning that many cores, compiled with XLA SPMD partitioning (the
      graph's sharding annotations split it); it must equal the slice's
      core count. Untested here (no TPU).
  """
  if tpu:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu="" if tpu == "local" else tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    if mesh_size:
      cores = topology.num_tasks * topology.num_tpus_per_task
      if cores != mesh_size:
        raise ValueError(f"--mesh has {mesh_size} devices but the TPU has "
                         f"{cores} cores; make the mesh use all {cores}")
      assignment = tf.tpu.experimental.DeviceAssignment.build(
          topology, computation_shape=topology.mesh_shape, num_replicas=1)
      strategy = tf.distribute.TPUStrategy(
          resolver, experimental_device_assignment=assignment,
          experimental_spmd_xla_partitioning=True)
    else:
      strategy = tf.distribute.TPUStrategy(resolver)
  else:
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if len(gpus) > 1:
      strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
    elif not gpus and len(cpus) > 1:
      strategy = tf.distribute.MirroredStrategy([d.name for d in cpus])
    else:
      strategy = tf.distribute.get_strategy()
  logging.info("Strategy %s with %d replica(s)", type(strategy).__name__,
               strategy.num_replicas_in_sync)
  return strategy


def device_kind(strategy: tf.distribute.Strategy) -> str:
  """``TPU``, ``GPU`` or ``CPU`` (for the metrics log)."""
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return "TPU"
  return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
