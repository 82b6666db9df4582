#!/usr/bin/env bash
# One H200: train the recall models (Mamba-2 and all-GDN on MQAR + passkey, lengths 256..2048
# curriculum), then task_eval accuracy vs length (512..8K) under every state scheme of study.py.
# Usage (repository root): bash experiments/recall/gpu_run.sh OUT [all|train|study]
#   (two calls, train then study, keep each under a 10-minute command limit)
# Writes OUT/train/{mamba2,gdn}/ + OUT/train/accuracy.json, OUT/study/{results.csv,table.md,
# accuracy_vs_length.png,run_info.json,runs/}, OUT/train_log.txt, OUT/study_log.txt.
set -euo pipefail
OUT=${1:?usage: gpu_run.sh OUT [all|train|study]}
PHASE=${2:-all}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" || true
if [[ $PHASE == all || $PHASE == train ]]; then
  start=$(date +%s)
  python experiments/recall/train_recall.py --gpu --seed 0 --eval-during --out "$OUT/train" \
      2>&1 | grep -v "falling back" | tee "$OUT/train_log.txt"
  echo "train: $(( $(date +%s) - start )) s" | tee -a "$OUT/train_log.txt"
  python experiments/recall/memory.py "$OUT/train/mamba2" "$OUT/train/gdn" --length 2048 \
      --json "$OUT/train/memory.json" 2>&1 | grep -v "Loading\|falling back" \
      | tee -a "$OUT/train_log.txt"
fi
if [[ $PHASE == all || $PHASE == study ]]; then
  start=$(date +%s)
  python experiments/recall/study.py --device cuda --lengths 512,1024,2048,4096,8192 \
      --items 100 --batch-tokens 1048576 --out "$OUT/study" "$OUT/train/mamba2" \
      "$OUT/train/gdn" 2>&1 | tee "$OUT/study_log.txt"
  echo "study: $(( $(date +%s) - start )) s" | tee -a "$OUT/study_log.txt"
fi
