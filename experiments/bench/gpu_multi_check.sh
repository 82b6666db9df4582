#!/usr/bin/env bash
# Multi-GPU check (run on a machine with >= 2 GPUs): CUDA formats = NumPy bit for bit, and a
# joblib sweep spreads its jobs over the GPUs, one job per GPU at a time.
#   bash experiments/bench/gpu_multi_check.sh OUTDIR
set -uo pipefail
out=${1:-/tmp/gpu_multi}
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$out/gpus.csv"
python3 -m pytest -q -p no:cacheprovider tests/formats/test_formats_cuda.py 2>&1 | tail -3 | tee "$out/formats_cuda.txt"
python3 -m precsim -m experiment=split_nvfp4 model=nemotron3_super run.steps=2048 run.seqs=1 \
    run.engine=torch run.device=cuda replay.buffer_len=4,8,16,32 hydra/launcher=joblib_gpus \
    hydra.sweep.dir="$out/sweep" > "$out/sweep.log" 2>&1
echo "sweep exit status: $?" | tee -a "$out/sweep.log"
grep -h "runs on cuda" "$out"/sweep/*/*.log "$out/sweep.log" 2>/dev/null | sort | uniq | tee "$out/placement.txt"
tail -3 "$out/sweep.log"
