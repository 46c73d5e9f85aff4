"""Two one-core training processes vs one two-core process (the demo's lanes).

Measures what ``m4moe-run``'s lanes rely on: on a 2-core machine, two
``m4moe-train`` processes pinned to one core each (one intra-op thread)
train more steps per second in total than one process given both cores.
Rounds alternate the two layouts (A B A B ...), so drift of the machine's
speed hits both alike; each round prints one JSON line and the last line is
the median ratio.

  python results/demo/lanes_benchmark.py --corpus_dir=runs/demo/corpus \
      --vocab_dir=runs/demo/vocab --work_dir=runs/lanes --rounds=2

Steps per second are taken between the first and the last logged training
step of each run (start-up, compilation and the first steps excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys


def _train(work_dir: pathlib.Path, name: str, args: argparse.Namespace,
           cpus: list[int]) -> subprocess.Popen:
  model_dir = work_dir / name
  shutil.rmtree(model_dir, ignore_errors=True)  # our own scratch run
  env = {**os.environ, "TF_NUM_INTRAOP_THREADS": str(len(cpus)),
         "OMP_NUM_THREADS": str(len(cpus))}
  command = [sys.executable, "-m", "m4moe.cli.train", f"--config={args.config}",
             f"--corpus_dir={args.corpus_dir}", f"--vocab_dir={args.vocab_dir}",
             f"--model_dir={model_dir}", "--languages=pt",
             f"--train_steps={args.steps}", "--batch_tokens=4096",
             "--sequence_length=64", "--num_encoder_layers=2",
             "--num_decoder_layers=2", f"--log_every={args.steps // 5}",
             f"--eval_every={args.steps}", f"--checkpoint_every={args.steps}"]
  return subprocess.Popen(
      ["taskset", "-c", ",".join(map(str, cpus)), *command], env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _steps_per_sec(model_dir: pathlib.Path) -> float:
  records = [json.loads(line) for line in
             (model_dir / "metrics.jsonl").read_text().splitlines() if line]
  train = [r for r in records if r.get("kind") == "train"]
  first, last = train[0], train[-1]
  return (last["step"] - first["step"]) / (last["elapsed_sec"] -
                                           first["elapsed_sec"])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--corpus_dir", required=True)
  parser.add_argument("--vocab_dir", required=True)
  parser.add_argument("--work_dir", required=True)
  parser.add_argument("--config", default="tiny/dense")
  parser.add_argument("--steps", type=int, default=250)
  parser.add_argument("--rounds", type=int, default=2)
  args = parser.parse_args()
  work_dir = pathlib.Path(args.work_dir)
  work_dir.mkdir(parents=True, exist_ok=True)
  cpus = sorted(os.sched_getaffinity(0))[:2]
  if len(cpus) < 2:
    raise SystemExit("needs 2 cores")
  ratios = []
  for round_ in range(args.rounds):
    alone = _train(work_dir, "alone", args, cpus)
    if alone.wait() != 0:
      raise SystemExit("m4moe-train failed (run it by hand to see why)")
    one = _steps_per_sec(work_dir / "alone")
    pair = [_train(work_dir, f"lane{i}", args, [cpu])
            for i, cpu in enumerate(cpus)]
    if any(p.wait() != 0 for p in pair):
      raise SystemExit("m4moe-train failed (run it by hand to see why)")
    lanes = [_steps_per_sec(work_dir / f"lane{i}") for i in range(2)]
    ratios.append(sum(lanes) / one)
    print(json.dumps({"benchmark": "lanes", "round": round_,
                      "config": args.config, "one_process_2_cores": one,
                      "lanes_1_core_each": lanes,
                      "total_ratio": sum(lanes) / one,
                      "loadavg_1m": os.getloadavg()[0]}), flush=True)
  print(json.dumps({"benchmark": "lanes", "median_total_ratio":
                    statistics.median(ratios), "rounds": len(ratios)}))


if __name__ == "__main__":
  main()
