"""Probe: the six matmuls of a fine-grained expert layer against a dense FFN's.

Its output is quoted in sparse-step-cost.md, beside this file.

The fine-grained MoE of study v3 (64 experts of width H = 64 at M = 128,
top-8 of 4096 tokens: 512 rows per expert) does exactly the dense FFN's
FLOPs (4096 rows x hidden 512), but in 64 small products per matmul role.
This times, in one process, interleaved (median of 15 calls, CPU seconds of
the process, one intra-op thread), each role's products three ways: the
dense FFN's one matmul, the 64 experts as one batched matmul over [E, R, .]
buffers, and as 64 separate 2-D matmuls (what the ``sorted`` dispatch runs);
in float32 and bfloat16. Each line prints the role, the form, the time and
the GFLOP/s; the ratio of the experts' rate to the dense rate is the floor
of what the layer's expert part can cost.

  taskset -c 1 python3 results/benchmarks/expert_gemm_rates_probe.py
"""

import json
import statistics
import time

import numpy as np
import tensorflow as tf

E, R, M, H, K = 64, 512, 128, 64, 8
N = E * R // K  # tokens
# role: (A shape per expert, B shape per expert, transpose_a, transpose_b)
ROLES = {
    "x@wi": ((R, M), (M, H), False, False),
    "h@wo": ((R, H), (H, M), False, False),
    "dy@wo^T": ((R, M), (H, M), False, True),
    "dpre@wi^T": ((R, H), (M, H), False, True),
    "x^T@dpre (d wi)": ((R, M), (R, H), True, False),
    "h^T@dy (d wo)": ((R, H), (R, M), True, False),
}


def _dense_shapes(a, b, ta, tb):
  """The same role for the dense FFN: N rows, hidden K*H."""
  def widen(shape):
    return tuple(N if d == R else K * H if d == H else d for d in shape)
  return widen(a), widen(b), ta, tb


def _median_cpu(fn, reps=15):
  fn()
  fn()
  times = []
  for _ in range(reps):
    start = time.process_time()
    fn()
    times.append(time.process_time() - start)
  return statistics.median(times)


def _cases(dtype):
  rng = np.random.default_rng(0)
  def const(shape):
    return tf.cast(tf.constant(rng.standard_normal(shape), tf.float32), dtype)
  out = {}
  for role, (a, b, ta, tb) in ROLES.items():
    xa, xb = const((E,) + a), const((E,) + b)
    da, db, _, _ = _dense_shapes(a, b, ta, tb)
    ya, yb = const(da), const(db)
    batched = tf.function(lambda x=xa, y=xb, ta=ta, tb=tb: tf.matmul(
        x, y, transpose_a=ta, transpose_b=tb))
    loop = tf.function(lambda x=xa, y=xb, ta=ta, tb=tb: [
        tf.matmul(x[e], y[e], transpose_a=ta, transpose_b=tb)
        for e in range(E)])
    dense = tf.function(lambda x=ya, y=yb, ta=ta, tb=tb: tf.matmul(
        x, y, transpose_a=ta, transpose_b=tb))
    out[role] = {"dense": dense, "batched": batched, "per_expert": loop}
  return out


def main():
  tf.config.threading.set_inter_op_parallelism_threads(1)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  flops = 2.0 * E * R * M * H
  for dtype in (tf.float32, tf.bfloat16):
    for role, forms in _cases(dtype).items():
      seconds = {form: _median_cpu(lambda f=fn: tf.nest.map_structure(
          lambda t: t.numpy(), f())) for form, fn in forms.items()}
      print(json.dumps({
          "probe": "expert_gemm_rates", "dtype": dtype.name, "role": role,
          "ms": {k: round(v * 1e3, 3) for k, v in seconds.items()},
          "gflops_per_sec": {k: round(flops / v / 1e9, 1)
                             for k, v in seconds.items()},
          "per_expert_vs_dense": round(seconds["dense"] /
                                       seconds["per_expert"], 3),
          "batched_vs_dense": round(seconds["dense"] / seconds["batched"],
                                    3)}))


if __name__ == "__main__":
  main()
