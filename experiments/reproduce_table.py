"""Reproduce a paper table: ``python experiments/reproduce_table.py table=table3 scale=cpu``.

The same job as the installed ``attnlab-table`` (``attnlab/cli/table.py``); the tables are configs in conf/table/."""

from pathlib import Path

from attnlab.cli.table import main

if __name__ == "__main__":
    main(str(Path(__file__).resolve().parent / "conf"))
