"""Typed settings: the `dockyard:` subtree of invoke.yaml, validated in one place.

Relative paths are relative to the project root (the folder that holds invoke.yaml), so tasks work
from any working directory inside the checkout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dockyard import ROOT
from dockyard.common.errors import DockyardError, problems


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image_name: str = "dockyard"
    variants_file: Path = Path("images/variants.yaml")
    runs_dir: Path = Path("runs")
    wheelhouse_dir: Path = Path("images/wheelhouse")
    dist_dir: Path = Path("images/dist")
    docker: str = ""
    compose: str = "docker compose"
    hf_cache: Path = Path("~/.cache/huggingface")
    data: str = ""
    model: str = ""
    ca_bundle: str = ""
    index_url: str = ""
    extra_index_url: str = ""
    find_links: str = ""
    base_image_cpu: str = "dockyard-base:bookworm"
    ssh: str = "ssh"
    allowed_signers: str = ""
    layer_cache: Path = Path("~/.cache/dockyard/layers")
    layer_cache_gb: float = Field(20, allow_inf_nan=False)  # int(inf) would be a traceback in every save

    def path(self, p: Path | str) -> Path:
        """A setting's path made absolute against the project root (with ~ expanded)."""
        p = Path(p).expanduser()
        return p if p.is_absolute() else ROOT / p

    @property
    def pip_ca_bundle(self) -> str:
        return self.ca_bundle or os.environ.get("PIP_CERT", "")


def load(config: Mapping[str, Any] | None) -> Settings:
    """Settings from Invoke's config subtree (a DataProxy or a plain dict)."""
    raw = dict(config or {})
    try:
        return Settings(**raw)
    except ValidationError as e:
        raise DockyardError(f"invalid setting in invoke.yaml (dockyard:): {problems(e)}") from None
