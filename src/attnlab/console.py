"""What a run tells its user: the composed config as a tree when it starts (the lightning-hydra-template's
``print_config_tree``, drawn with rich), and summaries that go to the terminal and into the run's log file."""

from __future__ import annotations

import logging

from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf

log = logging.getLogger("attnlab")


def log_once() -> None:
    """Lightning's log lines once, through Hydra's handlers (the terminal and the run's ``<job>.log``).

    The ``lightning`` package gives its logger a console handler of its own on import (and ``lightning.pytorch`` /
    ``lightning.fabric`` do when imported before Hydra configures logging, as Hydra's callbacks import them), so
    under Hydra every Lightning line was printed twice, once as ``INFO: ...``. Call once logging is configured."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(no_advertising)
    if not logging.getLogger().handlers:  # not under Hydra: Lightning's handlers are the only ones
        return
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
            logger.removeHandler(handler)
        logger.propagate = True


def no_advertising(record: logging.LogRecord) -> bool:
    """Lightning's "Tip: try installing litlogger / litmodels" lines, printed by every run, are not the run's news."""
    return not str(record.msg).startswith("💡 Tip:")


def no_logging_tracebacks() -> None:
    """A run's log call that fails prints nothing instead of logging's ``--- Logging error ---`` traceback.

    Lightning logs "Received SIGTERM" from inside its signal handler; when the signal lands while the main thread is
    writing to the same stream, that write fails ("reentrant call") and logging would print a traceback between the
    run's last lines and its one-line stop message. Losing that one line is the lesser harm (Python's logging docs
    advise ``raiseExceptions = False`` for code that runs unattended)."""
    logging.raiseExceptions = False


def config_tree(cfg: DictConfig, title: str = "config"):
    """A ``rich.tree.Tree``: the top-level values first (one branch), then one branch per group, each as YAML."""
    from rich.tree import Tree

    tree = Tree(title, guide_style="dim")
    scalars = {key: cfg[key] for key in cfg if not isinstance(cfg[key], DictConfig | ListConfig)}
    if scalars:
        tree.add("[bold]run").add(_yaml(OmegaConf.create(scalars)))
    for key in cfg:
        if key not in scalars:
            tree.add(f"[bold]{key}").add(_yaml(cfg[key]))
    return tree


def _yaml(node: DictConfig | ListConfig):
    """``node`` as highlighted YAML, not wrapped (a long path stays on its line)."""
    from rich.syntax import Syntax

    code = OmegaConf.to_yaml(node, resolve=True)
    text = Syntax(code, "yaml", theme="ansi_dark", background_color="default").highlight(code)
    text.rstrip()
    text.no_wrap, text.overflow = True, "ignore"
    return text


@rank_zero_only
def print_config(cfg: DictConfig, title: str = "config") -> None:
    """Print the resolved config as a tree (once, on rank zero); ``.hydra/config.yaml`` keeps it in the run."""
    from rich.console import Console

    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    longest = max(map(len, OmegaConf.to_yaml(resolved).splitlines()), default=0)
    console = Console()
    console.width = max(console.width, longest + 8)  # the tree's guides: a long path is never cut
    console.print(config_tree(resolved, title))


def announce(text: str) -> None:
    """Print ``text`` and add it to the run's log file (Hydra's ``<job>.log``), which otherwise holds only the
    log records: the summary a user reads on the terminal is also in ``train.log`` / ``evaluate.log``."""
    print(text, flush=True)
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, text.strip("\n"), None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
