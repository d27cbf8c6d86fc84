"""Evaluate a model: ``python evaluate.py ckpt_path=outputs/<run>/checkpoints/last.ckpt eval=table3`` (Hydra).

The same job as the installed ``attnlab-eval`` (``attnlab/cli/evaluate.py``), on the conf/ beside this file."""

from pathlib import Path

from attnlab.cli.evaluate import main

if __name__ == "__main__":
    main(str(Path(__file__).resolve().parent / "conf"))
