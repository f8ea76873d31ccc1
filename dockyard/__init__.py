"""dockyard: a containerised, reproducible training stack for large language models."""

from pathlib import Path

__version__ = "0.1.0"
# The project root: the folder that holds invoke.yaml, recipes/ and data/ (/opt/dockyard in the image).
ROOT = Path(__file__).resolve().parent.parent
# The environment override of a setting: INVOKE_DOCKYARD_<KEY>=value (read by dockyard.settings, held by dockyard.cli).
ENV_PREFIX = "INVOKE_DOCKYARD_"
