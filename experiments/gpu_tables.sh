#!/usr/bin/env bash
# The from-scratch tables on one GPU (an H100, no network): tables at their `gpu` scale, cells side by side, results
# to $OUT.
# Installs .whl/ (experiments/device_wheels.sh) into /tmp/site where the machine lacks Hydra and the rest; the
# data travel under .cache/attnlab (the device tool's carry: ".whl", ".cache/attnlab/corpus/registry_text-v3.jsonl.zst"
# and ".cache/attnlab/tokenizers"; the gpu scale trains on registry_text, see below).
# Each table runs under its own time limit (LIMIT); a table cut there has its finished cells evaluated (EVAL_LIMIT)
# and written as a partial table, so they come back as records (a cell's checkpoint does not come back).
# $OUT gets a log per table, the tables' results (experiments/results/<table>/<scale>/) and every cell's logged
# metrics and evaluation as one archive, ready to unpack over a checkout and commit.
#
# Usage: OUT=/dir TABLES="outliers gating" LIMIT=270 bash experiments/gpu_tables.sh
#   (the device tool gives one command 600 s: keep LIMIT x tables under it, or make one call per table; while the
#   machine stays warm, the cells a call finished are cached and the next call with the same tables continues)
#   registry_text: `zstd -12 .cache/attnlab/corpus/registry_text-v3.jsonl` here and carry the .zst (25 MB) with the
#   tokenizers trained on it here (.cache/attnlab/tokenizers, 1 MB): the first cell packs the corpus there, the
#   evaluations read its held-out documents. Cells another table committed at the scale (experiments/results/
#   <table>/<scale>/: runs.csv and cells.jsonl, part of the checkout) are taken from those records, not trained again;
#   cells run there but not committed yet travel as their records (carry outputs/runs/<cell>: its results.json, eval/
#   and csv/, ~0.3 MB, no checkpoints): the engine skips a cell with a results.json and reads its cached evaluation.
#   SCALE (default gpu), ARGS (train.py overrides for every cell), JOBS (cells at once, default 9), LIMIT (seconds per
#   table, default 480), EVAL_LIMIT (seconds for a cut table's partial render, default 90; 0: none), PYTHON.
# The variants table where the outliers live, one H100: 12 of its 30 cells are the outliers and gating
#   tables' committed gpu cells (vanilla, clipped_softmax, gated, gated_sdpa), taken from their records, so 18 train:
#   OUT=/dir TABLES=variants JOBS=9 LIMIT=460 EVAL_LIMIT=80 bash experiments/gpu_tables.sh   in two calls, each
#   within the device tool's 600 s and one session's 15 minutes of device time. A call trains 9 cells side by side
#   (the outliers run's 9 made ~45k tokens/s each: 16.4M tokens in ~6.1 min, ~7 min with packing and start-up),
#   LIMIT cuts the 9 that follow, and the 9 finished are evaluated and come back as a partial table: commit it, and
#   the next call (a fresh machine) takes them from its records and trains the other 9. Estimated, not yet measured:
#   18 cells x 16.4M tokens = 295M tokens at ~400k tokens/s together, ~12.5 min of training in all. 16 at once would
#   finish none within one call (~25k tokens/s each: ~11 min a cell), and a cut cell's checkpoint stays on the
#   machine. To fit one call, bf16-mixed or compile: check vanilla's kurtosis and W8A8 gap against the fp32 cells
#   first.
# Or a train.py sweep instead of tables, its runs in outputs/sweep/ (resumed there while the machine stays warm), cut
# at LIMIT (each run keeps its last periodic checkpoint), its curves archived every 30 s, e.g. the sink search (README,
# "Weight decay and the sink"): SWEEP="experiment=emergence trainer=gpu trainer.devices=1 trainer.precision=32-true
#   data=registry_text data.tokenizer_vocab_size=4096 optim.lr=2e-3 optim.weight_decay=0.5,1.0 trainer.max_steps=16000"
#   JOBS=2 LIMIT=540 OUT=/dir bash experiments/gpu_tables.sh; then experiments/emergence.py on the unpacked runs.
# Measured on one H100 (2026-11-26), the gpu scale's earlier form (9 cells of 21M parameters x 16M tokens on the
# embedded corpus + evaluations): 311 s. The current form (4.3M parameters x 16.4M tokens on registry_text), on one
# H100 (2026-11-27): ~10 min for the outliers table (BPE 30 s + packing 80 s, training 6 min, analyses ~30 s), so
# LIMIT=530 cut the first call during the analyses and a second call finished them in 55 s. The gating table
# (2026-11-27, JOBS=6, vanilla's 3 cells carried from the outliers run): 453 s in one call (wheels 40 s, packing 81 s
# with the carried tokenizer reused, training 4.7 min at ~58k tokens/s a cell, analyses).
set -uo pipefail
: "${OUT:?set OUT to the directory the results go to}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
# the first cell packs the corpus while the others wait on its lock: its tokenizer may use every core (tokenizing is
# nearly all of packing: 4.8 of 5.0 s for a tenth of registry_text on one core here, 2026-11-29); registry_text's
# cells read their data in the training process (num_workers 0), and a data loader that forks workers after it gets
# tokenizers' warning and serial tokenizing in them, nothing worse
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
PYTHON=${PYTHON:-python3}
TABLES=${TABLES:-outliers}
SCALE=${SCALE:-gpu}
ARGS=${ARGS:-}
JOBS=${JOBS:-9}
LIMIT=${LIMIT:-480}
EVAL_LIMIT=${EVAL_LIMIT:-90}
status=0
results=()
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
    date -u +%Y-%m-%dT%H:%M:%SZ
} | tee "$OUT/device.txt"
if ! "$PYTHON" -c "import hydra, attnlab.tables.engine" 2>/dev/null; then
    [[ -d .whl ]] || { echo "gpu_tables: no Hydra here and no .whl/ (bash experiments/device_wheels.sh)"; exit 1; }
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PYTHON" -c "import torch, lightning, attnlab; print('torch', torch.__version__, 'lightning', lightning.__version__)" \
    | tee -a "$OUT/device.txt"
# a corpus carried compressed (registry_text: `zstd -12` makes its 98 MB 25 MB) is unpacked where the data reads it
for packed in .cache/attnlab/corpus/*.jsonl.zst; do
    [[ -e "$packed" && ! -e "${packed%.zst}" ]] || continue
    "$PYTHON" -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), \
open(sys.argv[2], 'wb'))" "$packed" "${packed%.zst}.tmp" && mv "${packed%.zst}.tmp" "${packed%.zst}" || exit 1
done
archive() {  # what has finished so far (after every table, every 30 s of a sweep): a call cut off later keeps it
    local runs=$1
    shift  # then more paths to keep as they are
    local cells=("$runs"/*/csv/metrics.csv "$runs"/*/results.json "$runs"/*/eval/*/results.json
        "$runs"/*/eval/*/analysis/*.csv "$runs"/*/eval/*/analysis/analysis.json  # the pruning table reads them
        "$runs"/*/.hydra/config.yaml "$runs"/*/.hydra/overrides.yaml "$@")
    local present=()
    for path in "${results[@]}" "${cells[@]}"; do [[ -e "$path" ]] && present+=("$path"); done
    ((${#present[@]})) || return 0
    tar czf "$OUT/results.tgz.tmp" "${present[@]}" && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz" || status=1
}
if [[ -n "${SWEEP:-}" ]]; then  # a train.py sweep instead of tables; its runs' curves come back while it trains
    start=$SECONDS
    # shellcheck disable=SC2086  # SWEEP is a list of overrides, split on spaces
    timeout -s INT -k 60 "$LIMIT" "$PYTHON" -m attnlab.cli.train -m $SWEEP hydra.sweep.dir=outputs/sweep \
        'hydra.sweep.subdir=${cell_dir:}' 'ckpt_path=${resume_ckpt:}' hydra/launcher=joblib \
        "hydra.launcher.n_jobs=$JOBS" >"$OUT/sweep.log" 2>&1 &
    sweep=$!
    while kill -0 "$sweep" 2>/dev/null; do sleep 30; archive outputs/sweep; done
    wait "$sweep"
    rc=$?
    stopped="124: stopped at LIMIT, runs kept their last periodic checkpoint"
    echo "sweep: exit $rc after $((SECONDS - start)) s ($stopped)" | tee -a "$OUT/summary.txt"
    archive outputs/sweep
    ls -la "$OUT"
    exit $((rc == 0 || rc == 124 ? status : 1))
fi
for table in $TABLES; do
    start=$SECONDS
    table_command=("$PYTHON" -m attnlab.cli.table "table=$table" "scale=$SCALE" "args='$ARGS'")
    timeout -k 30 "$LIMIT" "${table_command[@]}" "launcher='hydra/launcher=joblib hydra.launcher.n_jobs=$JOBS'" \
        >"$OUT/$table.log" 2>&1
    rc=$?
    echo "$table at $SCALE: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    if ((rc == 124 || rc == 137)) && ((EVAL_LIMIT > 0)); then
        # cut at LIMIT: the cells that finished are evaluated now, while their checkpoints are on this machine (the
        # archive holds none), and written as a partial table, so they come back as records a later call reuses
        start=$SECONDS
        timeout -k 10 "$EVAL_LIMIT" "${table_command[@]}" partial=true >>"$OUT/$table.log" 2>&1
        echo "$table at $SCALE: cut at LIMIT; its finished cells as a partial table: exit $? after" \
            "$((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    fi
    ((rc == 0)) || { status=1; tail -20 "$OUT/$table.log"; }
    results+=("experiments/results/$table/$SCALE")
    archive outputs/runs outputs/tables
done
ls -la "$OUT"
exit $status
