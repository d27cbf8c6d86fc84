"""Train a model: ``python train.py model=tiny attention=vanilla data=wiki_sample`` (Hydra overrides).

The same job as the installed ``attnlab-train`` (``attnlab/cli/train.py``), on the conf/ beside this file."""

from pathlib import Path

from attnlab.cli.train import main

if __name__ == "__main__":
    main(str(Path(__file__).resolve().parent / "conf"))
