"""``attnlab-eval`` / ``python -m attnlab.eval``: lm-eval's own command line, with the ``attnlab`` model registered.

lm-eval 0.4.13 finds models only in its registry (no plugin entry points), so a model outside its tree has to be
imported before its CLI parses ``--model``; this does that and adds attnlab's task directory (passkey,
attnlab_heldout) unless ``--include_path`` is given. Every lm-eval argument works as with ``lm_eval``.
"""

from __future__ import annotations

import sys
from pathlib import Path

TASKS_DIR = Path(__file__).parent / "tasks"


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    import attnlab.eval.lm  # noqa: F401  (registers the "attnlab" model)

    if len(sys.argv) > 1 and "--include_path" not in sys.argv and not {"-h", "--help"} & set(sys.argv):
        sys.argv += ["--include_path", str(TASKS_DIR)]
    cli_evaluate()


if __name__ == "__main__":
    main()
