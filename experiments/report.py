"""``make report`` / ``python experiments/report.py [--out DIR]``: ``attnlab-report`` (attnlab/report.py) in a clone."""

from attnlab.report import main

if __name__ == "__main__":
    main()
