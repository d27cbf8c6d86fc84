"""SSA / vanilla of the seed-mean CE - H(P*) along a finished Table 1 run, from its ``trajectory.csv``:
``python experiments/trajectory_ratio.py experiments/results/table1/converged`` writes ``ratio.csv`` beside it, as
the table writes it for a new run (the 400k-step runs' checkpoints are not kept, so they are not re-run for it)."""

import sys
from pathlib import Path

import pandas as pd

from attnlab.synthetic.tables import kl_ratio

if __name__ == "__main__":
    for directory in map(Path, sys.argv[1:]):
        kl_ratio(pd.read_csv(directory / "trajectory.csv")).to_csv(directory / "ratio.csv", index=False)
        print(f"{directory / 'ratio.csv'} written")
