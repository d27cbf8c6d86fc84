"""The console scripts: ``attnlab-train``, ``attnlab-eval`` and ``attnlab-table``, which the repository's
``train.py``, ``evaluate.py`` and ``experiments/reproduce_table.py`` call with their own config directories."""
