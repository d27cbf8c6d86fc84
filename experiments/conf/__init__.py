"""The table engine's Hydra configs; a package so that an installed attnlab finds them (pkg://attnlab.tables.conf)."""
