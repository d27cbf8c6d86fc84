"""``attnlab-lm-eval`` / ``python -m attnlab.eval``: lm-eval's own command line, with the ``attnlab`` model registered.

lm-eval 0.4.13 finds models only in its registry (recent lm-eval main also reads the ``lm_eval.models`` entry
points, where pyproject declares ``attnlab``), so a model outside its tree has to be imported before its CLI parses
``--model``; this does that and adds attnlab's task directory (attnlab_passkey, attnlab_heldout, ...) unless
``--include_path`` is given. Every lm-eval argument works as with ``lm_eval``; a bad setting of ours (e.g. passkey
lengths that do not fit the model's window) is one ``error:`` line.
"""

from __future__ import annotations

import sys
from pathlib import Path

TASKS_DIR = Path(__file__).parent / "tasks"


def main() -> None:
    from attnlab.cli import reproducible_kernels

    reproducible_kernels()
    from lm_eval.__main__ import cli_evaluate

    import attnlab.eval.lm  # noqa: F401  (registers the "attnlab" model)
    from attnlab.errors import ConfigError

    if len(sys.argv) > 1 and "--include_path" not in sys.argv and not {"-h", "--help"} & set(sys.argv):
        sys.argv += ["--include_path", str(TASKS_DIR)]
    from attnlab.eval.harness import lm_eval_without_noise

    try:
        with lm_eval_without_noise():
            cli_evaluate()
    except ConfigError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
