#!/usr/bin/env bash
# The user's GPU command in the device image's own environment (PYTHONDONTWRITEBYTECODE=1, torch
# without .pyc files: every process compiles the sources it imports), four processes on a fresh
# machine (the first compiles the Triton kernels). Prints process seconds, wall_s and phases, and
# appends what it printed as one record to OUT_DIR/gpu_image_env.jsonl (experiments/bench/record.py).
#   bash experiments/bench/gpu_image_env.sh OUT_DIR
set -euo pipefail
out=${1:-/tmp/image_env}
mkdir -p "$out"
here=$(dirname "$0")
{
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}"
echo "# for i in 0 1 2 3: python -m precsim experiment=seed_table model=nemotron3_super run.device=cuda run.out_dir=DIR"
for i in 0 1 2 3; do
  t0=$EPOCHREALTIME
  python3 -m precsim experiment=seed_table model=nemotron3_super run.device=cuda \
    run.progress=false run.out_dir="$out/run$i" > /dev/null
  t1=$EPOCHREALTIME
  python3 - "$out/run$i/summary.json" "$i" "$(awk "BEGIN{print $t1 - $t0}")" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
info = s.get("info", {})
print(sys.argv[2], "process", round(float(sys.argv[3]), 2), "wall", round(s["wall_s"], 4),
      info.get("phases_s"))
PY
done
} | tee "$out/printed.txt"
python3 -c 'import json, sys; print(json.dumps({"printed": open(sys.argv[1]).read().splitlines()}))' \
  "$out/printed.txt" | python3 "$here/record.py" "$out" gpu_image_env --command "bash $0 $out"
