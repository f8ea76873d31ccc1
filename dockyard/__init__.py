"""dockyard: a containerised, reproducible training stack for large language models."""

__version__ = "0.1.0"
