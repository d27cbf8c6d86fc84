"""Run a task set (``conf/eval/*.yaml``) through lm-eval and record it: a JSON per run, a CSV row, W&B.

Tasks go through ``lm_eval.simple_evaluate`` with a ``TaskManager`` that also indexes attnlab's own tasks
(``attnlab/eval/tasks``: passkey, held-out perplexity), so the hub tasks and ours share one code path.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import logging
import math
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from datasets import DatasetDict
from omegaconf import OmegaConf

from attnlab.console import announce
from attnlab.data.backcopy import SOURCE as BACKCOPY_SOURCE
from attnlab.data.tokenizer import joined_ids
from attnlab.defaults import EVAL_SEED
from attnlab.defaults import cache_dir as default_cache_dir
from attnlab.errors import ConfigError
from attnlab.eval.heldout import heldout_dataset, scores_own_corpus
from attnlab.eval.lm import AttnlabLM
from attnlab.eval.passkey import TASK as PASSKEY_TASK
from attnlab.eval.passkey import fitting_lengths, per_length_accuracy
from attnlab.files import write_atomic
from attnlab.hub import wandb_mode
from attnlab.runs import locked, output_dir, write_results

log = logging.getLogger(__name__)

TASKS_DIR = Path(__file__).parent / "tasks"  # attnlab's own lm-eval tasks
RUN_FIELDS = ("run_id", "time", "suite", "checkpoint", "pretrained", "model", "attention", "limit", "lm_eval")


def suite_passkey_lengths(suite: dict[str, Any], window: int) -> list[int] | None:
    """The suite's passkey lengths for a model of this window (null: follow the window), each leaving room for the
    answer, else a ``ConfigError``; None when the suite has no passkey task."""
    if PASSKEY_TASK not in suite.get("tasks", []):
        return None
    requested = (suite.get("passkey") or {}).get("context_lengths")
    return fitting_lengths(requested, window, "eval.passkey.context_lengths")


def task_metadata(lm: AttnlabLM, suite: dict[str, Any], out_dir: Path, cache_dir: str) -> dict:
    """What attnlab's generated tasks need: the tokenizer (``run_lm_eval`` saves it with the results), passkey and
    held-out settings."""
    data = lm.run_data
    tokenizer_file = out_dir / "tokenizer.json"
    passkey = dict(suite.get("passkey") or {})
    if (lengths := suite_passkey_lengths(suite, lm.max_length)) is not None:
        passkey["context_lengths"] = lengths
    if not scores_own_corpus(data) and "attnlab_heldout" in suite.get("tasks", []):
        log.warning("attnlab_heldout scores the wiki_sample split, but the model trained on %s", data["name"])
    return {
        "tokenizer": str(tokenizer_file),
        "max_length": lm.max_length,
        "context_lengths": list(passkey.get("context_lengths") or []) or None,
        "samples_per_length": passkey.get("samples_per_length", 10),
        "passkey_seed": passkey.get("seed", EVAL_SEED),
        "cache_dir": str(cache_dir),
        "data": data,  # the run's corpus: the held-out tasks and the analysis score its own held-out documents
    }


def task_manager(suite: dict[str, Any], metadata: dict[str, Any] | None = None) -> Any:
    """lm-eval's ``TaskManager`` over its registry and attnlab's tasks; a task name in neither is a ConfigError
    (``eval.after_train`` checks them before training, so a typo does not wait for the whole run)."""
    from lm_eval.tasks import TaskManager

    include = [str(TASKS_DIR), *(str(Path(p).resolve()) for p in suite.get("include_path") or [])]
    defaults = suite.get("include_defaults", True)
    manager = TaskManager(include_path=include, include_defaults=defaults, metadata=metadata)
    unknown = [task for task in suite["tasks"] if task not in manager.all_tasks and not Path(task).is_file()]
    if unknown and not defaults:  # a suite of attnlab's own tasks, given one of lm-eval's (eval.tasks=[...])
        manager = TaskManager(include_path=include, include_defaults=True, metadata=metadata)
        unknown = [task for task in unknown if task not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            "eval.tasks",
            f"{', '.join(map(repr, unknown))}: no such task in lm-eval's registry, {' or '.join(include)} "
            "(lm-eval task, group or tag names, or a task YAML file)",
        )
    return manager


def quiet_git_hash() -> str | None:
    """lm-eval's ``get_git_commit_hash`` (``git describe --always`` in the current directory) with git's stderr
    dropped: outside a git repository, the installed tool's usual place, git prints ``fatal: not a git repository``
    into every evaluation (EleutherAI/lm-evaluation-harness#1691, open in 0.4.13). None there, as lm-eval records."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return None
    return described.strip() or None


# lm-eval's warnings about our own tasks that say nothing to fix: every task with a ``custom_dataset`` (ours build
# their data from the run) is told it could take ``--metadata``, and the passkey's per-length accuracy
# (``acc_<length>``, lengths from the suite) is averaged with a warning that it is averaged
OUR_TASKS_EXPECTED = re.compile(
    r"attnlab_\w+: Custom kwargs can be passed to `--metadata`"
    r"|\[attnlab_passkey\] No aggregation function defined for metric acc_\d+\. Using mean\."
)


def not_expected(record: logging.LogRecord) -> bool:
    """The logging filter: keeps a record unless it is one of ``OUR_TASKS_EXPECTED``."""
    return not OUR_TASKS_EXPECTED.match(record.getMessage())


@contextmanager
def lm_eval_without_noise() -> Iterator[None]:
    """lm-eval's evaluator records the git hash with ``quiet_git_hash``, and its expected warnings about our tasks
    (``OUR_TASKS_EXPECTED``) are dropped, while this is open; every other warning of lm-eval is shown."""
    import lm_eval.evaluator

    loggers = [logging.getLogger(name) for name in ("lm_eval.api.task", "lm_eval.evaluator_utils")]
    for logger in loggers:
        logger.addFilter(not_expected)
    try:
        with mock.patch.object(lm_eval.evaluator, "get_git_commit_hash", quiet_git_hash):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(not_expected)


def run_lm_eval(
    lm: AttnlabLM,
    suite: dict[str, Any],
    out_dir: Path,
    *,
    limit: int | None,
    seed: int,
    cache_dir: str,
) -> dict[str, Any]:
    """``simple_evaluate`` over the suite's tasks; raises a ``ConfigError`` naming the hub when a dataset is missing."""
    import lm_eval

    metadata = task_metadata(lm, suite, out_dir, cache_dir)
    manager = task_manager(suite, metadata)
    lm.tokenizer.save(metadata["tokenizer"])
    try:
        with lm_eval_without_noise():
            return lm_eval.simple_evaluate(
                model=lm,
                tasks=list(suite["tasks"]),
                limit=limit,
                task_manager=manager,
                bootstrap_iters=int(suite.get("bootstrap_iters", 0)),
                log_samples=False,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
            )
    except Exception as exc:
        Path(metadata["tokenizer"]).unlink(missing_ok=True)  # the tasks' copy: a failed evaluation leaves no files
        if re.search(r"offline|connect|couldn't reach|hub", f"{type(exc).__name__} {exc}", re.IGNORECASE):
            raise ConfigError(
                "eval.tasks",
                f"{exc.__class__.__name__}: {exc}. These tasks download their datasets from the Hugging Face hub, "
                "which is unreachable here and not cached; run once with internet access or use eval=quick.",
            ) from exc
        raise


def metric_columns(results: dict[str, Any], suite: dict[str, Any]) -> dict[str, float | None]:
    """The suite's table columns (``{name, task, metric}``; ``metric: acc_*`` expands to one column per match)
    and ``avg``, the mean of the ``average`` columns (the paper's average accuracy)."""
    columns: dict[str, float | None] = {}
    for spec in suite.get("columns") or []:
        scores = results.get("results", {}).get(spec["task"], {})
        metric = spec["metric"]
        if "*" not in metric:
            value = scores.get(f"{metric},none")
            columns[spec["name"]] = float(value) if isinstance(value, int | float) else None
            continue
        prefix = metric.split("*")[0]
        names = [k.removesuffix(",none") for k in scores if k.endswith(",none") and "_stderr" not in k]
        natural = lambda n: [int(t) if t.isdigit() else t for t in n.split("_")]  # acc_64 before acc_128
        matched = sorted(fnmatch.filter(names, metric), key=natural)
        for name in matched:
            columns[f"{spec['name']}_{name[len(prefix) :]}"] = float(scores[f"{name},none"])
    averaged = [columns.get(name) for name in suite.get("average") or []]
    if averaged and all(v is not None for v in averaged):
        columns["avg"] = sum(averaged) / len(averaged)
    return columns


def append_csv(path: Path, row: dict[str, Any]) -> None:
    """Add ``row`` to ``path``; a new column rewrites the header, every earlier row is kept (the file is locked while
    it is read and written, so parallel evaluations take turns).

    A non-finite metric (NaN weights) is refused rather than tabled as a result; a last row cut before its newline
    (an interrupted writer, a hand edit) gets one, so the new row is never glued onto it.
    """
    non_finite = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if non_finite:
        model = row.get("checkpoint") or row.get("pretrained")
        raise ConfigError("checkpoint", f"{model} scores non-finite {', '.join(non_finite)}; not added to {path}")
    with locked(path) as fh:
        fh.seek(0)
        text = fh.read()
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        fields = list(dict.fromkeys([*(rows[0].keys() if rows else []), *row.keys()]))
        out = io.StringIO(newline="")
        writer = csv.DictWriter(out, fieldnames=fields)
        if rows and fields == list(rows[0].keys()):  # append-only: one write, undone if it fails (a full disk)
            if not text.endswith(("\n", "\r")):
                out.write("\r\n")  # the csv module's line terminator
            writer.writerow(row)
            size = fh.tell()
            try:
                fh.write(out.getvalue())
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as error:
                fh.truncate(size)
                raise ConfigError(
                    "results_csv", f"could not add a row to {path} ({error.strerror}); it is as it was"
                ) from None
            return
        # a new column: the whole table again, header first, replacing the file at once (never rewritten in place)
        writer.writeheader()
        writer.writerows([*rows, row])
        try:
            write_atomic(path, out.getvalue())
        except OSError as error:
            raise ConfigError("results_csv", f"could not rewrite {path} ({error.strerror}); it is as it was") from None


def log_wandb(row: dict[str, Any], record: dict[str, Any], out_dir: Path, wandb_cfg: dict[str, Any]) -> None:
    """Summary metrics and a one-row table, in a W&B run of its own (offline unless an API key is set)."""
    import wandb

    run = wandb.init(
        project=wandb_cfg.get("project", "attnlab"),
        group=wandb_cfg.get("group", "eval"),
        name=wandb_cfg.get("name") or f"eval-{row['suite']}-{row['attention']}",
        dir=str(out_dir),
        job_type="eval",
        tags=wandb_cfg.get("tags"),
        mode=wandb_mode(),
        config={"run": {k: row[k] for k in RUN_FIELDS}, "versions": record.get("versions")},
    )
    metrics = {k: v for k, v in row.items() if k not in RUN_FIELDS and isinstance(v, int | float)}
    run.summary.update(metrics)
    run.log({"eval/table": wandb.Table(columns=list(row), data=[[row[k] for k in row]])})
    run.finish()


def summary_text(row: dict[str, Any], lm_eval_results: dict[str, Any] | None) -> str:
    lines = [f"\nattnlab eval [{row['suite']}]: {row['model']} + attention={row['attention']}"]
    if lm_eval_results:
        from lm_eval.utils import make_table

        lines.append(make_table(lm_eval_results))
    lines += [f"  {k:>20s}  {v:.4f}" for k, v in row.items() if k not in RUN_FIELDS and isinstance(v, float)]
    return "\n".join(lines) + "\n"


def evaluate_suite(
    lm: AttnlabLM,
    suite: dict[str, Any],
    out_dir: Path,
    *,
    limit: int | None = None,
    seed: int = EVAL_SEED,
    cache_dir: str | None = None,
    results_csv: Path | None = None,
    run_id: str = "",
    wandb_cfg: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``lm`` on ``suite`` (lm-eval ``tasks`` and/or ``analysis``); write ``results.json``; return it."""
    import lm_eval

    cache_dir = cache_dir or default_cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = None
    if suite.get("tasks"):
        results = run_lm_eval(lm, suite, out_dir, limit=limit, seed=seed, cache_dir=cache_dir)
    info = lm.get_model_info()
    row: dict[str, Any] = {
        "run_id": run_id,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "suite": suite.get("name", "custom"),
        "checkpoint": lm.checkpoint,
        "pretrained": lm.pretrained,
        "model": info["attnlab_model"],
        "attention": info["attnlab_attention"],
        "limit": limit,
        "lm_eval": lm_eval.__version__,
    }
    record: dict[str, Any] = {"lm_eval_version": lm_eval.__version__, "model": info, "suite": suite}
    if results is not None:
        row.update(metric_columns(results, suite))
        record.update(
            results={k: results[k] for k in ("results", "groups", "versions", "n-samples", "configs") if k in results},
            versions=results["versions"],
        )
        if PASSKEY_TASK in results["results"]:
            passkey = results["results"][PASSKEY_TASK]
            record["passkey"] = {"per_length": per_length_accuracy(passkey), "overall": passkey["acc,none"]}
    if suite.get("analysis") is not None:
        analysis_cfg = dict(suite["analysis"])
        needs_texts = "texts" not in analysis_cfg and "eval_tokens" not in analysis_cfg
        needs_calibration = "calibration_tokens" not in analysis_cfg and bool(lm.run_data)
        if needs_texts or needs_calibration:
            documents = run_documents(lm.run_data, cache_dir)  # the corpus split once, for both
            if needs_texts and (lm.run_data or {}).get("source") == BACKCOPY_SOURCE:
                # one generated sequence a row, <s> first, as it trained (joined text would shift the rows)
                length = lm.model.config.block_size
                ids = [lm.tokenizer.encode(text).ids[:length] for text in documents["test"]["text"]]
                analysis_cfg["eval_tokens"] = torch.tensor(ids, dtype=torch.long)
            elif needs_texts:
                analysis_cfg["texts"] = list(documents["test"]["text"])
            if needs_calibration:  # W8A8 calibrates on training text, as the reference does
                analysis_cfg["calibration_tokens"] = joined_ids(lm.tokenizer, documents["train"]["text"], CALIBRATION)
        record["analysis"] = run_analysis_suite(lm, out_dir / "analysis", analysis_cfg)
    # the threads set the float summation order, which W8A8 amplifies: one checkpoint gave a W8A8 perplexity of
    # 66.763 on 1 thread and 66.816 on 2 (FP perplexity equal to 8 digits)
    record.update(summary=row, seconds=time.perf_counter() - started, torch_threads=torch.get_num_threads())
    from lm_eval.utils import handle_non_serializable

    plain_record = json.loads(json.dumps(record, default=handle_non_serializable))  # numpy values as Python's
    write_results(out_dir / "results.json", plain_record)
    if results_csv is not None:
        append_csv(Path(results_csv), row)
    if wandb_cfg is not None:
        log_wandb(row, record, out_dir, wandb_cfg)
    text = summary_text(row, results)
    if "analysis" in record:
        from attnlab.eval.analysis import format_summary

        text += format_summary(record["analysis"]) + "\n"
    text += f"  results: {out_dir / 'results.json'}\n"
    if results_csv is not None:
        text += f"  one row added to {results_csv}\n"
    announce(text)  # on the terminal and in evaluate.log
    return record


CALIBRATION = 65536  # W8A8 calibration tokens: enough for the reference's 4 batches of 8 x 512 tokens


def run_documents(data: dict[str, Any], cache_dir: str) -> DatasetDict:
    """The training run's documents, ``test`` (held out) and ``train``: its own corpus's where it is local, else the
    embedded corpus's (``heldout_dataset``)."""
    return heldout_dataset(data=data, cache_dir=cache_dir)


def heldout_texts(data: dict[str, Any], cache_dir: str) -> list[str]:
    """The documents the training run held out of the embedded corpus: the analysis' default evaluation text."""
    return list(run_documents(data, cache_dir)["test"]["text"])


def run_analysis_suite(lm: AttnlabLM, out_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """Delegate to ``attnlab.eval.analysis.run_analysis(model, tokenizer, out_dir, cfg)``."""
    try:
        from attnlab.eval.analysis import run_analysis
    except ImportError as exc:
        raise ConfigError("eval.analysis", f"analysis not available: {exc}") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_analysis(lm.model, lm.tokenizer, out_dir, cfg)


class AfterTraining:
    """train.py's ``eval.after_train``: ``check`` before training that the suite fits the model (a passkey length
    past its window once failed only after the whole run had trained); called with the run's best (else last)
    checkpoint, it evaluates it on ``cfg.eval`` under ``<run>/eval``."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def check(self, window: int) -> None:
        suite = OmegaConf.to_container(self.cfg.eval, resolve=True)
        suite_passkey_lengths(suite, window)
        if suite.get("tasks"):
            task_manager(suite)

    def __call__(self, checkpoint: str) -> dict[str, Any]:
        from attnlab.resolvers import run_id as current_run_id

        cfg = self.cfg
        suite = OmegaConf.to_container(cfg.eval, resolve=True)
        lm = AttnlabLM(checkpoint=checkpoint, device="cuda" if torch.cuda.is_available() else "cpu")
        record = evaluate_suite(
            lm,
            suite,
            output_dir(cfg) / "eval",
            limit=suite.get("limit"),
            seed=cfg.seed,
            cache_dir=cfg.paths.cache_dir,
            results_csv=Path(cfg.paths.log_dir) / "eval" / "results.csv",
            run_id=current_run_id(),
        )
        return record["summary"]
