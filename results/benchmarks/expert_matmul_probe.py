"""Probe behind m4moe.moe.layer.TRANSPOSE_B_MIN_ROWS.

Its output is quoted in 2026-11-24-quiet-rerun.md, beside this file.

Times, in one process, interleaved per line (median of 15 calls, wall and
CPU seconds), the experts' matmuls of one MoE layer at M=512, H=2048 and
8192 rows (top-2 of 4096 tokens):

1. plain products: one [8192, K] x [K, N] matmul against E matmuls of
   8192/E rows each (are small matmuls less efficient per FLOP?);
2. the two input gradients of an expert, ``dy @ wo^T`` and ``d_pre @ wi^T``,
   as a ``transpose_b`` matmul (A), as ``(w @ a^T)^T`` (B), and with an
   explicit transpose of the weight (C, which grappler folds into A).

  python3 results/benchmarks/expert_matmul_probe.py
"""

import statistics
import time

import tensorflow as tf


def _median_seconds(fn, reps=15):
  fn()
  fn()
  wall, cpu = [], []
  for _ in range(reps):
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    wall.append(time.perf_counter() - w0)
    cpu.append(time.process_time() - c0)
  return statistics.median(wall), statistics.median(cpu)


def _products(m, k, n, count, transpose_a=False):
  # Distinct operands per matmul, so that no two products can be merged.
  a = tf.random.normal([count, k, m] if transpose_a else [count, m, k])
  b = tf.random.normal([count, k, n])

  @tf.function
  def f():
    outs = [tf.matmul(a[i], b[i], transpose_a=transpose_a)
            for i in range(count)]
    return tf.add_n([tf.reduce_sum(o[:1, :1]) for o in outs])
  return lambda: f().numpy()


def _times_transposed(rows, p, q, count, form):
  a = tf.random.normal([count, rows, q])
  w = tf.random.normal([count, p, q])

  @tf.function
  def f():
    outs = []
    for i in range(count):
      if form == "A":
        outs.append(tf.matmul(a[i], w[i], transpose_b=True))
      elif form == "B":
        outs.append(tf.transpose(tf.matmul(w[i], a[i], transpose_b=True)))
      else:
        outs.append(tf.matmul(a[i], tf.transpose(w[i])))
    return tf.add_n([tf.reduce_sum(o[:1, :1]) for o in outs])
  return lambda: f().numpy()


def main():
  for name, (m, k, n, ta, count) in {
      "1 x [8192, 512] x [512, 2048]": (8192, 512, 2048, False, 1),
      "8 x [1024, 512] x [512, 2048]": (1024, 512, 2048, False, 8),
      "32 x [256, 512] x [512, 2048]": (256, 512, 2048, False, 32),
      "128 x [64, 512] x [512, 2048]": (64, 512, 2048, False, 128),
      "1 x [8192, 512]^T [8192, 2048] (weight gradient)": (512, 8192, 2048,
                                                          True, 1),
      "8 x [1024, 512]^T [1024, 2048]": (512, 1024, 2048, True, 8),
  }.items():
    wall, cpu = _median_seconds(_products(m, k, n, count, ta))
    print(f"{name:50s} wall {wall * 1e3:7.1f} ms  cpu {cpu * 1e3:7.1f} ms",
          flush=True)
  for experts in (8, 32, 128):
    rows = 8192 // experts
    for p, q, what in ((2048, 512, "dy @ wo^T"), (512, 2048, "d_pre @ wi^T")):
      cells = []
      for form in "ABC":
        wall, cpu = _median_seconds(_times_transposed(rows, p, q, experts,
                                                      form))
        cells.append(f"{form} wall {wall * 1e3:6.1f} cpu {cpu * 1e3:6.1f}")
      print(f"E={experts:3d} rows={rows:4d} {what:13s} " + "  ".join(cells),
            flush=True)


if __name__ == "__main__":
  main()
