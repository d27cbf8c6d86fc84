"""``python experiments/compare.py <sweep dir> [--out <dir>]``: ``attnlab-compare`` (attnlab/compare.py) in a clone."""

from attnlab.compare import main

if __name__ == "__main__":
    main()
