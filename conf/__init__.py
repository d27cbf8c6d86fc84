"""train.py's and evaluate.py's Hydra configs; a package so that an installed attnlab finds them (pkg://attnlab.conf)."""
