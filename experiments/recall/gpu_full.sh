#!/usr/bin/env bash
# Issue 42 on one H200 in two device calls (each under 9 minutes; gpu_full.py's time guards stop
# and pack at --budget seconds, 510 by default):
#   call 1: bash experiments/recall/gpu_full.sh "$OUT" train   # 3 seeds x {Mamba-2, GDN}
#   here:   python experiments/recall/gpu_full.py unpack OUT1/recall_train_*.tar.gz
#           (a model paused at the budget: train again with --resume OUT1/recall_train_*.tar.gz,
#           or, the machine still warm, KEEP_WORK=1 and the same arguments)
#           (writes experiments/recall/checkpoints/full_{mamba2,gdn}_seed{0,1,2}/: commit them)
#   call 2: bash experiments/recall/gpu_full.sh "$OUT" study   # the headline study on them
#   here:   python experiments/recall/gpu_full.py unpack OUT2/recall_study.tar.gz --name full
# CPU smoke of the same path: bash experiments/recall/gpu_full.sh OUT train --tiny --device cpu
# Back in $OUT: gpu.txt, PHASE_log.txt, recall_train_TAG_{mamba2,gdn}_seedS.tar.gz | recall_study.tar.gz.
set -uo pipefail
OUT=${1:?usage: gpu_full.sh OUT train|study [gpu_full.py options]}
PHASE=${2:?usage: gpu_full.sh OUT train|study [gpu_full.py options]}
shift 2
mkdir -p "$OUT"
# a warm machine keeps /tmp: a fresh work folder, unless KEEP_WORK=1 continues the paused models
# of the previous call on the same machine from their resume.pt (their tarballs, 11 MB each, need
# not travel back: 2026-12-07, three GDN seeds paused at step ~1,850 and finished so)
[ "${KEEP_WORK:-0}" = 1 ] || rm -rf "/tmp/recall_work_$PHASE"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" \
  2>/dev/null || echo "no nvidia-smi" > "$OUT/gpu.txt"
"$PY" -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'triton', triton.__version__)" 2>&1 | tee "$OUT/${PHASE}_log.txt"
"$PY" -c "import fla; print('flash-linear-attention', fla.__version__)" 2>/dev/null \
  | tee -a "$OUT/${PHASE}_log.txt"
# the hard stop (HARD_STOP, 540 s by default); gpu_full.py packs before its own --budget (510 s)
timeout -k 5 "${HARD_STOP:-540}" "$PY" experiments/recall/gpu_full.py "$PHASE" --out "$OUT" \
  --work "/tmp/recall_work_$PHASE" "$@" 2>&1 | grep --line-buffered -v "falling back" \
  | tee -a "$OUT/${PHASE}_log.txt"
rc=${PIPESTATUS[0]}
ls -la "$OUT" | tee -a "$OUT/${PHASE}_log.txt"
exit "$rc"
