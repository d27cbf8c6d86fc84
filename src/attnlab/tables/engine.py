"""The table engine: a table config (``experiments/conf/table/*.yaml``) -> training multiruns -> evaluations -> the
table.

Each grid cell is a training run in ``<runs_dir>/<cell name>`` (``attnlab.cells``). A stage's pending
cells go to ``python -m attnlab.cli.train -m`` (``train.py``'s job, installed or not) as Hydra multiruns, so any
Hydra launcher (``hydra/launcher=slurm``, ``joblib``) spreads them with no code change; finished cells
(``results.json`` present) are never relaunched, and an interrupted one resumes from its own
``checkpoints/last.ckpt``. Evaluations are cached per (cell, suite).
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.cells import cell_name, identity
from attnlab.configs import config_files, initialized
from attnlab.errors import ConfigError
from attnlab.run_directory import LAST_CHECKPOINT, RESULTS_FILE, run_directory_in_use
from attnlab.tables.definitions import load_table, stage_variants
from attnlab.tables.sizes import config_parameters, model_parts
from attnlab.validation import validate_train_config

log = logging.getLogger(__name__)

RESUME = "ckpt_path=${resume_ckpt:}"  # each job resumes from its own last.ckpt when one is there
TRAINING_METRICS = (
    "val_ppl",
    "unigram_ppl",
)  # from each cell's results.json: token perplexity and its unigram baseline
# from its final validation's monitored statistics (results.json's ``monitor``): record column <- logged name
MONITORED = {"temperature_token_spread": "temperatures/token_spread"}


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TableInterrupted(Exception):
    """The table stopped on a signal, to the engine or to one of its training sweeps: nothing more is launched."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number

    @property
    def exit_status(self) -> int:
        return 128 + self.signal_number


def cells_progress(done: int, starting: int, total: int, seconds: float) -> str:
    """``cells 5-8 of 20, about 1 h 10 min left``: where a long table is, and its time left at the pace of the cells
    trained so far in this run (none yet: no estimate; a cell another process trained counts as done)."""
    where = f"cells {done + 1}-{done + starting} of {total}" if starting > 1 else f"cell {done + 1} of {total}"
    if done == 0:
        return where
    minutes = round(seconds / done * (total - done) / 60)
    left = f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"
    return f"{where}, about {left} left"


def flattened(overrides: list[Any]) -> list[str]:
    """Overrides with the lists among them (at any depth) spliced in, in order."""
    return [o for item in overrides for o in (flattened(item) if isinstance(item, list) else [item])]


def wait_while_trained_elsewhere(cells: list[Cell], poll_seconds: float = 5.0) -> None:
    """Wait while another process trains one of ``cells`` (a second table that shares it holds its run directory's
    claim), so a cell is never trained by two processes at once; a cell it finished is then not launched again."""
    busy = [cell for cell in cells if run_directory_in_use(cell.directory)]
    if busy:
        names = ", ".join(cell.directory.name for cell in busy)
        log.info("Waiting for %s: another process is training it now", names)
    while any(run_directory_in_use(cell.directory) for cell in busy):
        time.sleep(poll_seconds)


def run_sweep(command: list[str], cwd: Path) -> None:
    """Run one training sweep to its end. The sweep gets its own process group, so a Ctrl-C at the terminal reaches
    the engine alone and is passed on once (a second SIGINT would cut short the cell's last checkpoint write); a
    SIGINT or SIGTERM to the engine is passed on the same way and waited for, so the cell saves its last.ckpt and no
    training outlives the table. A sweep that a signal stopped (exit status 128 + the signal) stops the table too.

    The handlers are set before the sweep starts, so a signal in between is passed on once it has started instead of
    stopping the engine alone (the sweep, in its own group, trained on), and the sweep starts with the default
    handling of both (exec resets a caught signal), not with the ignored SIGINT of an engine started as a script's
    background job (its sweeps then ignored a Ctrl-C until their training began)."""
    sweep: subprocess.Popen | None = None
    received: list[int] = []
    passed_on = False

    def forward(signal_number: int, _frame: object) -> None:
        nonlocal passed_on
        received.append(signal_number)
        if sweep is not None:
            passed_on = True
            sweep.send_signal(signal_number)

    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS} if in_main_thread else {}
    try:
        sweep = subprocess.Popen(command, cwd=cwd, process_group=0)
        if received and not passed_on:  # before it had started
            sweep.send_signal(received[0])
        status = sweep.wait()
    finally:
        for signal_number, handler in previous.items():
            signal.signal(signal_number, handler)
    stopped_by = received[:1] or [s for s in STOP_SIGNALS if status in (-s, 128 + s)]
    if stopped_by:
        raise TableInterrupted(stopped_by[0])


@dataclass(frozen=True)
class Cell:
    """One training run of a table: a stage, a paper row (``GPT2``) and its model, a variant and a seed."""

    stage: str
    row: str
    model: str
    attention: str
    seed: int
    directory: Path
    overrides: tuple[str, ...] = field(repr=False)
    cache_dir: str = field(repr=False)  # its data cache (corpus, tokenizer), which evaluation reuses
    wandb_project: str | None = None  # the W&B project its run logs to (``logger=wandb``), else None
    identity: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)  # what it digests

    @property
    def finished(self) -> bool:
        return (self.directory / RESULTS_FILE).is_file()

    @property
    def checkpoint(self) -> Path:
        return self.directory / LAST_CHECKPOINT


def other_seed(composed: DictConfig, seed: int, start: list[str]) -> DictConfig:
    """``composed`` (a cell's config) as another seed's cell of the same variant composes it: its ``seed`` and, in a
    fine-tune stage, its start ``model.init_from=<checkpoint>`` replaced; an explicit ``seed=...`` in the table's own
    overrides is overridden by the cell's, as on the command line."""
    cfg = copy.deepcopy(composed)
    with open_dict(cfg):
        cfg.seed = seed
        for override in start:
            key, _, value = override.partition("=")
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


@dataclass
class Engine:
    """Runs one table at one scale; ``root`` is the project its sweeps start in (the repository, or the directory
    an installed attnlab-table started from)."""

    table: dict[str, Any]
    scale: str
    root: Path
    runs_dir: Path
    force: bool = False
    args: Sequence[str] = ()  # extra train.py overrides for every cell
    launcher: Sequence[str] = ()  # e.g. hydra/launcher=slurm hydra.launcher.partition=gpu
    salt: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S"))

    def __post_init__(self) -> None:
        scales = self.table["scales"]
        if self.scale not in scales:
            raise ConfigError("scale", f"one of {', '.join(scales)} (got {self.scale})")
        self.settings: dict[str, Any] = scales[self.scale]
        rows = self.settings.get("rows") or {}
        stage_rows = self.settings.get("stage_rows") or {}
        pairs = [*rows.items(), *(pair for extra in stage_rows.values() for pair in extra.items())]
        names, models = [name for name, _ in pairs], [model for _, model in pairs]
        if not rows or len(set(names)) < len(names) or len(set(models)) < len(models):
            # a row inherited from a shared protocol beside the table's own would report the same cells twice
            raise ConfigError(
                f"table.scales.{self.scale}.rows",
                f"one model per paper row, each model once (got {dict(pairs) or 'none'})",
            )
        for variant, extra in (self.table.get("variant_overrides") or {}).items():
            if variant not in self.table["variants"] or not isinstance(extra, list):
                variants = ", ".join(self.table["variants"])
                raise ConfigError(
                    f"table.variant_overrides.{variant}", f"a list of train.py overrides for one of {variants}"
                )
        for stage, variants in (self.settings.get("stage_variants") or {}).items():
            stages, known = ", ".join(self.table["stages"]), ", ".join(self.table["variants"])
            if stage not in self.table["stages"] or not set(variants) <= set(self.table["variants"]):
                key = f"table.scales.{self.scale}.stage_variants.{stage}"
                raise ConfigError(key, f"a stage of {stages} with variants among {known}")
        extra = self.settings.get("extra_seeds") or {}
        for variant, seeds in extra.items():
            if (
                variant not in self.table["variants"]
                or not isinstance(seeds, list)
                or not all(isinstance(s, int) and s not in self.settings["seeds"] for s in seeds)
            ):
                raise ConfigError(
                    f"table.scales.{self.scale}.extra_seeds.{variant}",
                    f"a variant of the table with a list of seeds beyond the scale's {self.settings['seeds']}",
                )
        order = self.settings.get("train_order") or []
        if not isinstance(order, list) or len(set(order)) < len(order) or not set(order) <= set(self.table["variants"]):
            known = ", ".join(self.table["variants"])
            raise ConfigError(f"table.scales.{self.scale}.train_order", f"a list of distinct variants among {known}")
        from attnlab.tables.reports import CHECKS, REPORTS

        for report in self.table.get("reports") or []:
            if report not in REPORTS:
                raise ConfigError("table.reports", f"one of {', '.join(REPORTS)} (got {report})")
            if report in CHECKS:
                CHECKS[report](self)

    # ------------------------------------------------------------------------------------------ the grid
    def compose(self, overrides: list[str]) -> DictConfig:
        """``train.yaml`` with ``overrides``, as the job will see it (``hydra.runtime.cwd`` is the project)."""
        with initialized("conf", job_name="train"):
            cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.runtime.cwd = str(self.root)
        HydraConfig.instance().set_config(cfg)
        return cfg

    def stages(self) -> list[str]:
        """The table's stages that run at this scale (e.g. paper-scale fine-tuning starts from the hub)."""
        return list(self.settings.get("stages") or self.table["stages"])

    def variants(self, stage: str) -> list[str]:
        """The stage's variants at this scale (``definitions.stage_variants``)."""
        return stage_variants(self.table, self.scale, stage)

    def seeds(self, attention: str) -> list[int]:
        """The variant's seeds: the scale's, then its ``extra_seeds`` (more seeds where 3 leave a claim unresolved);
        the baseline trains every extra seed of any variant, so each extra cell has its pair."""
        extra = self.settings.get("extra_seeds") or {}
        if attention == self.table["baseline"]:
            more = sorted({seed for seeds in extra.values() for seed in seeds})
        else:
            more = extra.get(attention, [])
        return [*self.settings["seeds"], *more]

    def rows(self, stage: str) -> dict[str, str]:
        """Paper row -> model for the stage: the scale's rows, and ``stage_rows`` that only one stage has (the paper
        fine-tunes Llama checkpoints it never pretrained)."""
        return {**self.settings["rows"], **(self.settings.get("stage_rows") or {}).get(stage, {})}

    def stage_overrides(self, stage: str, model: str) -> list[str]:
        """The scale's train.py overrides for the stage; a list in them (a protocol's list interpolated into the
        scale's, table_protocol/cpu_long.yaml) is flattened in place."""
        common = flattened(
            [*self.settings.get("overrides", []), *self.settings.get("stage_overrides", {}).get(stage, [])]
        )
        salt = [f"+cell_salt={self.salt}"] if self.force else []
        return [o.format(model=model) for o in common] + salt + list(self.args)

    def variant_overrides(self, attention: str) -> list[str]:
        """More train.py overrides for one variant's cells (stick-breaking takes no position encoding): the
        table's ``variant_overrides``, which the variant's comparison with the baseline then includes."""
        return list((self.table.get("variant_overrides") or {}).get(attention, []))

    def row_sizes(self) -> dict[tuple[str, str], tuple[str, int]]:
        """``(stage, paper row) -> (our model, parameters)`` of the baseline at this scale: what stands in for each
        paper row, for figures that keep the paper's row names ("OPT-125m")."""
        found = {}
        for stage in self.stages():
            for row, model in self.rows(stage).items():
                overrides = [
                    *self.stage_overrides(stage, model),
                    f"model={model}",
                    f"attention={self.table['baseline']}",
                ]
                found[(stage, row)] = (model, config_parameters(*model_parts(self.compose(overrides))))
        return found

    def init_source(self, stage: str, cells: dict[tuple, Cell], row: str, seed: int) -> list[str]:
        """The fine-tune stage's start: the source stage's baseline cell of this model and seed (cpu/smoke)."""
        source = (self.table["stages"][stage] or {}).get("init_from")
        if not source or self.settings.get("init_from", "stage") != "stage":
            return []
        start = cells[(source, row, self.table["baseline"], seed)]
        return [f"model.init_from={start.checkpoint}"]

    def keys(self) -> list[tuple[str, str, str, int]]:
        """Every cell's (stage, paper row, variant, seed) in ``cells``' order, without composing a config: what a
        table rendered from its records needs to say which cells it lacks."""
        return [
            (stage, row, attention, seed)
            for stage in self.stages()
            for row in self.rows(stage)
            for attention in self.variants(stage)
            for seed in self.seeds(attention)
        ]

    def cells(self) -> list[Cell]:
        """Every cell of every stage, in stage order; composing them also validates the whole table's config."""
        return [cell for cell, _ in self.composed_cells()]

    def composed_cells(self) -> list[tuple[Cell, DictConfig]]:
        """``cells`` with the config each composes (what the report shows for a cell recorded without one).
        Composing is slow (~0.3 s), so a variant's seeds share one composition: the others differ from the first seed's
        config only in ``seed`` and in a fine-tune's start (``model.init_from``), values set in place."""
        cells: dict[tuple, Cell] = {}
        configs: list[DictConfig] = []
        for stage in self.stages():
            variants = self.variants(stage)
            for row, model in self.rows(stage).items():
                for attention in variants:
                    first = None
                    for seed in self.seeds(attention):
                        start = self.init_source(stage, cells, row, seed)
                        overrides = [
                            *self.stage_overrides(stage, model),
                            *start,
                            f"model={model}",
                            f"attention={attention}",
                            *self.variant_overrides(attention),
                            f"seed={seed}",
                        ]
                        if first is None:
                            cfg = first = self.compose(overrides)
                        else:
                            cfg = other_seed(first, seed, start)
                        # a bad value (ARGS included) stops the table before any launch; devices and start
                        # checkpoints are the launcher's and the earlier stage's to provide
                        validate_train_config(cfg, check_machine=False)
                        wandb = (cfg.get("logger") or {}).get("wandb")
                        cells[(stage, row, attention, seed)] = Cell(
                            stage,
                            row,
                            model,
                            attention,
                            seed,
                            self.runs_dir / cell_name(cfg),
                            tuple(overrides),
                            str(cfg.paths.cache_dir),
                            wandb.project if wandb else None,
                            identity(cfg),
                        )
                        configs.append(cfg)
        return list(zip(cells.values(), configs, strict=True))

    # ------------------------------------------------------------------------------------------ training
    def check_requirements(self) -> None:
        """Fail within seconds, with one message, when the scale needs GPUs or the hub and they are not there."""
        needs = self.settings.get("requires") or {}
        missing = []
        if needs.get("gpu"):
            import torch

            if not torch.cuda.is_available():
                missing.append("GPUs (torch sees none)")
        if needs.get("hub") and not hub_reachable():
            missing.append(
                "the Hugging Face hub (offline: HF_HUB_OFFLINE is set or huggingface.co is unreachable) for "
                "SlimPajama, the official checkpoints and the lm-eval datasets"
            )
        if missing:
            raise ConfigError(
                "scale",
                f"{self.scale} needs {' and '.join(missing)}; run it on "
                + ("a GPU machine with internet access (or a pre-populated HF cache)" if needs.get("hub") else "a GPU")
                + ", or use SCALE=cpu",
            )

    def launch_groups(self, pending: list[Cell]) -> list[list[Cell]]:
        """Pending cells as Hydra sweeps (attention x seed products): one per model (and per variant with overrides
        of its own; per seed too when the cells have different starting checkpoints), cut only where the next
        variant lacks other seeds (a half-trained table), so every sweep is a product and few sweeps leave a
        launcher's workers idle at their end. The scale's ``train_order`` variants come first, in its order, each
        variant's seeds in turn: a long table's partial renders judge the claims it names first; ``extra_seeds``
        come after every variant's scale seeds."""
        order = self.settings.get("train_order") or []

        def turn(cell: Cell) -> tuple[bool, int]:  # every variant's scale seeds before any extra seed
            rank = order.index(cell.attention) if cell.attention in order else len(order)
            return cell.seed not in self.settings["seeds"], rank

        groups: dict[tuple, dict[str, list[Cell]]] = {}
        for cell in sorted(pending, key=turn):
            key = (turn(cell)[0], cell.stage, cell.model, *self.variant_overrides(cell.attention))
            if any(o.startswith("model.init_from=") for o in cell.overrides):
                key = (*key, cell.seed)
            groups.setdefault(key, {}).setdefault(cell.attention, []).append(cell)
        sweeps: list[list[Cell]] = []
        for variants in groups.values():
            previous_seeds = None
            for cells in variants.values():
                seeds = [c.seed for c in cells]
                if seeds == previous_seeds:
                    sweeps[-1] += cells
                else:
                    sweeps.append(list(cells))
                previous_seeds = seeds
        return sweeps

    @property
    def wandb_group(self) -> str:
        """One W&B group per table and scale (``table3-cpu``): its training, evaluation and table runs."""
        return f"{self.table['name']}-{self.scale}"

    def wandb_tags(self) -> list[str]:
        return [self.table["name"], f"scale-{self.scale}"]

    def wandb_overrides(self, stage: str) -> list[str]:
        """The table's W&B group, the stage as job type and the table and scale as tags (``logger=wandb`` cells)."""
        tags = ",".join(self.wandb_tags())
        return [
            f"logger.wandb.group={self.wandb_group}",
            f"logger.wandb.job_type={stage}",
            f"logger.wandb.extra_tags=[{tags}]",
        ]

    def sweep_command(self, cells: list[Cell]) -> list[str]:
        first = cells[0]
        fixed = [o for o in first.overrides if not o.startswith(("attention=", "seed="))]
        attentions = ",".join(dict.fromkeys(c.attention for c in cells))
        seeds = ",".join(str(s) for s in dict.fromkeys(c.seed for c in cells))
        return [
            sys.executable,
            "-m",
            "attnlab.cli.train",  # train.py's job, from a checkout or installed
            "-m",
            *fixed,
            f"attention={attentions}",
            f"seed={seeds}",
            RESUME,
            "print_config=false",  # each cell's config is in its .hydra/config.yaml; the table's log stays readable
            f"experiment_name={self.table['name']}-{self.scale}-{first.stage}",
            *(self.wandb_overrides(first.stage) if first.wandb_project else []),
            f"hydra.sweep.dir={self.runs_dir}",
            "hydra.sweep.subdir=${cell_dir:}",
            *self.launcher,
        ]

    def train(self, cells: list[Cell]) -> None:
        """Run each stage's pending cells; a failed sweep stops the table with the cells it left unfinished, a signal
        (to the engine or to a sweep) stops it at once (``TableInterrupted``)."""
        to_train = [c for c in cells if not c.finished]
        if to_train:
            before = len(cells) - len(to_train)
            log.info("%d of %d cells to train (%d finished before)", len(to_train), len(cells), before)
        started = time.monotonic()
        for stage in self.stages():
            pending = [c for c in cells if c.stage == stage and not c.finished]
            for group in self.launch_groups(pending):
                wait_while_trained_elsewhere(group)
                for ready in self.launch_groups([c for c in group if not c.finished]):
                    command = self.sweep_command(ready)
                    done = sum(c.finished for c in to_train)
                    progress = cells_progress(done, len(ready), len(to_train), time.monotonic() - started)
                    log.info("%s: %d cell(s) (%s): %s", stage, len(ready), progress, " ".join(command[3:]))
                    run_sweep(command, self.root)
                wait_while_trained_elsewhere(
                    group
                )  # a cell another table claimed first, between the wait and the launch
            unfinished = [c.directory.name for c in cells if c.stage == stage and not c.finished]
            if unfinished:
                raise ConfigError("table", f"{stage} cells did not finish (re-run to resume): {', '.join(unfinished)}")

    # ------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, cells: list[Cell]) -> list[dict[str, Any]]:
        """Each cell's evaluation columns, computed once per (cell, suite) and cached in ``<cell>/eval/<suite>``."""
        import json

        spec = self.settings["eval"]
        suite = OmegaConf.to_container(OmegaConf.load(config_files("conf") / "eval" / f"{spec['suite']}.yaml"))
        suite.update(spec.get("suite_overrides") or {})
        records = []
        for cell in cells:
            out = self.eval_dir(cell)
            cached = out / "results.json"
            if not self.evaluated(cell):
                wandb_cfg = self.eval_wandb(cell)
                evaluate_cell(cell, suite, out, limit=spec.get("limit"), cache_dir=cell.cache_dir, wandb_cfg=wandb_cfg)
            result = json.loads(cached.read_text())
            analysis = (result.get("analysis") or {}).get("summary", {})  # eval suites with an `analysis` section
            summary = {k: v for k, v in analysis.items() if k not in ("eval_tokens", "map_tokens")} | result["summary"]
            trained = json.loads((cell.directory / RESULTS_FILE).read_text())
            records.append(
                {"stage": cell.stage, "row": cell.row, "model": cell.model, "attention": cell.attention}
                | {"seed": cell.seed, "run": self.shown(cell.directory)}
                | {k: v for k, v in summary.items() if isinstance(v, int | float) and k != "limit"}
                | {k: trained.get(k) for k in TRAINING_METRICS}
                | {k: (trained.get("monitor") or {}).get(logged) for k, logged in MONITORED.items()}
            )
        return records

    def as_run(self, cells: list[Cell]) -> list[dict[str, Any]]:
        """Each finished cell's as-run line (``attnlab.tables.as_run``), with what its ``results.json`` says."""
        import json

        return [self.as_run_line(c, json.loads((c.directory / RESULTS_FILE).read_text())) for c in cells]

    def as_run_line(self, cell: Cell, results: dict[str, Any], **how: str) -> dict[str, Any]:
        """The cell's as-run line; its start checkpoint shown as in runs.csv (relative to the project)."""
        from attnlab.tables.as_run import as_run

        start = "model.init_from="
        overrides = [
            start + self.shown(Path(o.removeprefix(start))) if o.startswith(start) else o for o in cell.overrides
        ]
        key = {"stage": cell.stage, "row": cell.row, "attention": cell.attention, "seed": cell.seed}
        return as_run(cell.directory.name, key, overrides, cell.identity, results, **how)

    def shown(self, path: Path) -> str:
        """``path`` relative to the repository when inside it (runs.csv is committed: no machine's checkout in it)."""
        return str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)

    def same_evaluation(self, table_name: str) -> bool:
        """Whether ``table_name`` evaluates its cells at this scale as this table does (suite, overrides, limit): its
        committed record of a cell the two share is then this table's record of it."""
        from hydra.errors import MissingConfigException

        try:
            other = load_table(table_name, root=self.root)
        except MissingConfigException:  # results of a table whose config is gone
            return False
        return (other["scales"].get(self.scale) or {}).get("eval") == self.settings["eval"]

    def evaluated(self, cell: Cell) -> bool:
        """Whether the cell's evaluation on this scale's suite is cached and current (not from before the headline
        metrics it must hold)."""
        import json

        cached = self.eval_dir(cell) / "results.json"
        return cached.is_file() and not predates_headlines(json.loads(cached.read_text()))

    def eval_dir(self, cell: Cell) -> Path:
        """Where the cell's evaluation on this scale's suite is cached (its ``results.json`` and analysis files)."""
        suite = self.settings["eval"]["suite"]
        return cell.directory / "eval" / suite

    def trajectories(self, cells: list[Cell]) -> pd.DataFrame:
        """The table's ``curves`` (metrics logged while training, e.g. ``outliers/max_inf_norm``) from each cell's
        ``csv/metrics.csv``: one row per (cell, step, metric); empty when the table names none."""
        metrics = self.table.get("curves") or []
        rows = []
        for cell in cells if metrics else []:
            path = cell.directory / "csv" / "metrics.csv"
            if not path.is_file():
                continue
            logged = pd.read_csv(path)
            for metric in (m for m in metrics if m in logged):
                points = logged[["step", metric]].dropna().drop_duplicates("step", keep="last")
                for step, value in points.itertuples(index=False):
                    rows.append(
                        {"stage": cell.stage, "row": cell.row, "attention": cell.attention, "seed": cell.seed}
                        | {"step": int(step), "metric": metric, "value": float(value)}
                    )
        return pd.DataFrame(rows, columns=["stage", "row", "attention", "seed", "step", "metric", "value"])

    def eval_wandb(self, cell: Cell) -> dict[str, Any] | None:
        """A ``logger=wandb`` cell's evaluation as a run (job type eval) in the table's group, named and tagged as
        its training run, with the evaluation's numbers as its summary."""
        if cell.wandb_project is None:
            return None
        return {
            "project": cell.wandb_project,
            "group": self.wandb_group,
            "name": f"{cell.model}-{cell.attention}-s{cell.seed}",
            "tags": [cell.attention, cell.model, f"seed-{cell.seed}", cell.stage, *self.wandb_tags()],
        }


def predates_headlines(result: dict[str, Any]) -> bool:
    """Whether a cached evaluation ran an analysis metric before it had all of today's headline numbers (the sinks
    metric's attention entropy): evaluated again, so a table that shares the cell does not lose that column."""
    from attnlab.eval.analysis.common import METRICS

    analysis = result.get("analysis") or {}
    summary = analysis.get("summary") or {}
    return any(name in analysis and not set(metric.headline) <= set(summary) for name, metric in METRICS.items())


def evaluate_cell(
    cell: Cell,
    suite: dict[str, Any],
    out: Path,
    *,
    limit: int | None,
    cache_dir: str,
    wandb_cfg: dict[str, Any] | None = None,
) -> None:
    """The eval API on the cell's last checkpoint; the held-out split is the one recorded inside it."""
    import torch

    from attnlab.eval.harness import evaluate_suite
    from attnlab.eval.lm import AttnlabLM

    lm = AttnlabLM(checkpoint=str(cell.checkpoint), device="cuda" if torch.cuda.is_available() else "cpu")
    evaluate_suite(lm, suite, out, limit=limit, seed=1234, cache_dir=cache_dir, wandb_cfg=wandb_cfg)


def hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
    except OSError:
        return False
    return True
