"""attnlab's Hydra launcher plugin (Hydra loads launchers only from the ``hydra_plugins`` namespace).

conf/hydra/launcher/joblib.yaml names the same option as hydra-joblib-launcher's structured config on purpose, so
``hydra/launcher=joblib`` gets the resilient launcher with the plugin's settings checked against its schema. Hydra
warns about such schema matching at every composition: train.py (before its first) and each worker process (on
importing this package to run a job) silence that one warning.
"""

import warnings


def quiet_schema_matching() -> None:
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/joblib' is validated against ConfigStore schema")


quiet_schema_matching()
