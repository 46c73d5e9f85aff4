#!/usr/bin/env bash
# Regenerates results/zoo/: the parameter, expert and FLOP counts of every
# zoo entry (info.jsonl, one `m4moe-info --json` object per line) and
# GShard §5's per-device memory table at 2048 tokens per device (table1.txt)
# and at each row's own group size (table1_group_size.txt).
# Deterministic: computed from the configs, no model is built.
#
#   results/zoo/regenerate.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: > "$here/info.jsonl"
for config in tiny/dense tiny/moe tiny/moe_fine gshard/moe_128e_12l \
    gshard/moe_128e_36l \
    gshard/moe_512e_12l gshard/moe_512e_36l gshard/moe_2048e_12l \
    gshard/moe_2048e_36l gshard/moe_2048e_60l; do
  m4moe-info --config="$config" --json | python3 -c \
    'import json, sys; d = json.load(sys.stdin); d["config"] = sys.argv[1]; print(json.dumps(d, sort_keys=True))' \
    "$config" >> "$here/info.jsonl"
done
m4moe-info --table1 --tokens_per_device=2048 > "$here/table1.txt"
m4moe-info --table1 > "$here/table1_group_size.txt"  # each row's own group size
