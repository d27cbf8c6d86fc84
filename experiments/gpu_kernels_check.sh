#!/usr/bin/env bash
# The kernels' checks on one GPU (an H100, torch >= 2.11, no network): the GPU-only tests of attention.backend=flex,
# then `python -m attnlab.bench --sections kernels` and the step section with and without model.padded_vocab_size and
# the fused loss (GPT-2 124M, bf16, compiled). Reports and logs go to $OUT; a stage that fails or runs out of its
# time limit is logged and the next one still runs; the exit status is non-zero if any stage failed.
#
# Needs on the GPU machine: torch (with its triton), numpy, and for stage (a) pytest (its wheels: pytest, pluggy,
# iniconfig, packaging). attnlab is used from this checkout (PYTHONPATH=src), not installed: the stages import
# torch and attnlab's models only. Optional: lightning (fills the MFU column; without it: TFLOP/s only, MFU =
# TFLOP/s / 989 on an H100), liger-kernel (the fused loss then runs Liger's kernel instead of compiled chunks).
#
# Usage: OUT=/some/dir bash experiments/gpu_kernels_check.sh
# Estimated H100 time, mostly compilation: (a) ~1.5 min, (b) ~2 min, (c) ~3 min. STAGES="a b" runs a subset.
set -uo pipefail
: "${OUT:?set OUT to the directory the reports go to}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}
STAGES=${STAGES:-a b c}
status=0

run() {  # run <stage> <seconds> <log> <command...>
    local stage=$1 limit=$2 log=$3
    shift 3
    [[ " $STAGES " == *" $stage "* ]] || return 0
    echo "== stage $stage: $* (limit ${limit}s)" | tee -a "$OUT/summary.txt"
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    echo "== stage $stage: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    ((rc == 0)) || status=1
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    date -u +%Y-%m-%dT%H:%M:%SZ
} >"$OUT/device.txt" 2>&1

# (a) compiled flex against the exact paths: values and gradients, memory linear in T, a whole model's step
run a 240 gpu-tests.log "$PYTHON" -m pytest -q --noconftest -rs tests/test_kernels_gpu.py

# (b) each variant's core and training step per backend beside vanilla on SDPA (T = 1,024-8,192; GPT-2 shape)
run b 300 gpu-kernels.log "$PYTHON" -m attnlab.bench --out "$OUT/gpu-kernels.md" --sections kernels \
    --kernel-variants vanilla clipped_softmax sink fox --kernel-lengths 1024 4096 8192 \
    --variants-shape gpt2 --batch 4 --rounds 5

# (c) GPT-2 124M step, bf16: eager, compiled, and compiled with the vocabulary padded, with and without the fused loss
run c 420 gpu-step.log "$PYTHON" -m attnlab.bench --out "$OUT/gpu-step.md" --sections step --shapes gpt2 \
    --peers attnlab --batch 16 --compile --padded-vocab --fused-adamw --rounds 5

exit $status
