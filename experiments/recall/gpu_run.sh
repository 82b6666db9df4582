#!/usr/bin/env bash
# One H200: train the recall models (Mamba-2 and all-GDN on MQAR + passkey, lengths 256..2048
# curriculum), then task_eval accuracy vs length (512..8K) under every state scheme of study.py.
# Usage (repository root): bash experiments/recall/gpu_run.sh OUT    (OUT: e.g. $OUT on the device)
# Writes OUT/train/{mamba2,gdn}/ + OUT/train/accuracy.json, OUT/study/{results.csv,table.md,
# accuracy_vs_length.png,run_info.json}, OUT/train_log.txt, OUT/study_log.txt.
set -euo pipefail
OUT=${1:?usage: gpu_run.sh OUT}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" || true
start=$(date +%s)
python experiments/recall/train_recall.py --gpu --seed 0 --eval-during --out "$OUT/train" \
    2>&1 | grep -v "falling back" | tee "$OUT/train_log.txt"
echo "train: $(( $(date +%s) - start )) s" | tee -a "$OUT/train_log.txt"
start=$(date +%s)
python experiments/recall/study.py --device cuda --lengths 512,1024,2048,4096,8192 --items 100 \
    --out "$OUT/study" "$OUT/train/mamba2" "$OUT/train/gdn" 2>&1 | tee "$OUT/study_log.txt"
echo "study: $(( $(date +%s) - start )) s" | tee -a "$OUT/study_log.txt"
