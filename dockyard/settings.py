"""Typed settings: the `dockyard:` subtree of invoke.yaml, validated in one place.

Relative paths are relative to the project root (the folder that holds invoke.yaml), so tasks work
from any working directory inside the checkout. The same model reads invoke.yaml and the INVOKE_DOCKYARD_<KEY>
environment overrides, from the text the user typed (Invoke's own cast, by the type of the yaml value, is not
used): an unknown key or a bad value is a short error naming the known keys.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from dockyard import ENV_PREFIX, ROOT
from dockyard.common.errors import DockyardError, cut, problem_list, short, shown

# what a command setting can hold, for its refusal
COMMAND_EXAMPLES = {"ssh": "ssh -F ~/.ssh/cluster.conf -o 'ProxyJump gateway'", "compose": "docker compose"}


# An image name as registries and kubelets parse it (the grammar of distribution/reference): [host[:port]/]path
# [:tag][@digest], path components lowercase. A name the engine here would not care about is written into files
# a cluster reads later (k8s), where a bad one fails only once the pods start.
_HOST = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])(?:\.(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]))*"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH}(?:/{_PATH})*(?::[\w][\w.-]{{0,127}})?"
                        r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?", re.ASCII)


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image_name: str = "dockyard"
    variants_file: Path = Path("images/variants.yaml")
    runs_dir: Path = Path("runs")
    jobs_dir: Path = Path("jobs")  # out of every container's reach (dockyard.launch.caches.check_out_of_reach)
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
    layer_cache_gb: float = Field(20, ge=0, le=2**20, allow_inf_nan=False)  # GB; int(inf) would be a traceback
    compile_cache: str = "~/.cache/dockyard/compile"  # "" = none (dockyard/launch/caches.py)

    @field_validator("image_name")
    @classmethod
    def _a_repository(cls, v: str) -> str:
        # docker's own grammar (a..b and a___b were taken, then refused by docker, or written into k8s manifests)
        if not re.fullmatch(rf"{_PATH}(?:/{_PATH})*", v) or len(v) > 200:
            raise ValueError("a docker repository name: lowercase letters and digits, separated by one '.', one or "
                             "two '_', dashes, or '/' (e.g. dockyard, or registry.example.com/team/dockyard without "
                             "the port)")
        return v

    @field_validator("base_image_cpu")
    @classmethod
    def _an_image(cls, v: str) -> str:
        if not IMAGE_NAME.fullmatch(v) or len(v) > 255:  # else the name docker import refused after debootstrap
            raise ValueError("an image name: [registry[:port]/]name[:tag] with the name in lowercase letters, digits "
                             "and . _ - /, e.g. dockyard-base:bookworm")
        return v

    @field_validator("docker")
    @classmethod
    def _a_client(cls, v: str) -> str:
        # kept as checked: `~/bin/docker` is run as the path it names, not as a file named `~` (no shell expands it)
        client = os.path.expanduser(v)
        if v and not shutil.which(client):
            # the value is the formatter's to quote (load), once, as it quotes every setting's
            raise ValueError("is not an executable docker client; give its path, or \"\" for the first `docker` on "
                             "PATH that can use BuildKit")
        return client

    @field_validator("ssh", "compose")
    @classmethod
    def _a_command(cls, v: str, info: ValidationInfo) -> str:
        """A command and its options, split as a shell would (the tasks run it without one), with a `~` word expanded
        as a shell would (`ssh -F ~/.ssh/cluster.conf`: ssh itself does not expand -F)."""
        example = COMMAND_EXAMPLES[info.field_name]
        try:
            words = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"cannot be split into words as a shell would ({str(e).lower()}): check the quotes, "
                             f"as in {example}") from None
        if not words:
            raise ValueError(f"must name a command and its options, as in {example}")
        return shlex.join(os.path.expanduser(w) if w.startswith("~") else w for w in words)

    @field_validator("variants_file", "runs_dir", "jobs_dir", "wheelhouse_dir", "dist_dir", "hf_cache", "layer_cache",
                     "compile_cache", "data", "model", mode="before")
    @classmethod
    def _a_path(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str) and v != v.strip():  # " /scratch/runs" was a folder " " in the checkout
            raise ValueError("begins or ends with a space, which would be part of the path; remove it")
        if isinstance(v, str) and not v and info.field_name not in ("compile_cache", "data", "model"):  # "": none
            raise ValueError("must name a file or folder (an empty value would be the project root itself)")
        if isinstance(v, str) and "\0" in v:  # YAML's "\x00": os calls raise ValueError, shown as a traceback
            raise ValueError("a path cannot hold a NUL character")
        return v

    def path(self, p: Path | str) -> Path:
        """A setting's path made absolute against the project root (with ~ expanded)."""
        p = Path(os.path.expanduser(p))
        if str(p).startswith("~"):  # ~name of no user here: it was taken as a folder named so in the checkout
            # cut: a value of 5,000 characters (INVOKE_DOCKYARD_RUNS_DIR=~...) was said whole, twice
            raise DockyardError(f"{cut(str(p))}: no user {short(str(p)[1:].split('/')[0])} on this host: give the "
                                "folder's path")
        return p if p.is_absolute() else ROOT / p

    @property
    def pip_ca_bundle(self) -> str:
        return self.ca_bundle or os.environ.get("PIP_CERT", "")


def closest_key(key: str, known: list[str], variable: bool) -> str:
    """` (did you mean runs_dir?)` where an unknown setting is a known one misspelt (RUNSDIR, runs-dir, run_dir),
    named as it was given (`variable`: INVOKE_DOCKYARD_RUNS_DIR); else "": the list of every key left the user to
    find it."""
    def plain(k: str) -> str:
        return re.sub(r"[\W_]", "", k.lower())

    near = [k for k in known if plain(k) == plain(key)] or difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    if not near:
        return ""
    return f" (did you mean {ENV_PREFIX + near[0].upper() if variable else near[0]}?)"


def load(config: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None,
         files: Mapping[str, str] | None = None) -> Settings:
    """Settings from Invoke's config subtree (a DataProxy or a plain dict) and the INVOKE_DOCKYARD_* variables;
    `files`: the config file each setting came from where it is not invoke.yaml (~/.invoke.yaml), for the refusal."""
    environ = os.environ if environ is None else environ
    if config is not None and not callable(getattr(config, "keys", None)):
        raise DockyardError(f"`dockyard:` in invoke.yaml (or the config file given with -f) holds {config!r:.40}: it "
                            "must hold the settings as `key: value` lines (runs_dir: runs, ...), or be left out")
    raw = dict(config or {})
    env = {k[len(ENV_PREFIX):].lower(): v for k, v in environ.items() if k.startswith(ENV_PREFIX)}
    known = sorted(Settings.model_fields)
    for variables, keys in ((True, env), (False, raw)):
        unknown = sorted(set(keys) - set(known))
        if unknown:  # named where it came from: a key of ~/.invoke.yaml blamed on invoke.yaml sent users to the wrong file
            names = [(f"{ENV_PREFIX}{k.upper()}" if variables else k) + closest_key(k, known, variables) for k in unknown]
            where = (f"{ENV_PREFIX}*" if variables else
                     f"{', '.join(sorted({(files or {}).get(k, 'invoke.yaml') for k in unknown}))} (dockyard:)")
            raise DockyardError(f"unknown setting(s) in {where}: {', '.join(names)}; known: {', '.join(known)}")
    try:
        return Settings(**(raw | env))
    except ValidationError as e:
        said = []
        for key, value, words in problem_list(e, model=Settings):
            # named where it came from, with the text typed (the variable's, not the value as read)
            # (cut short as the formatter cuts it: a variable of 5,000 characters was said whole)
            # value is "" where the validator's words quote it (errors.short): the variable's is said as short
            where = (f"{ENV_PREFIX}{key.upper()}={value or shown(short(env[key]))}" if key in env
                     else f"{(files or {}).get(key, 'invoke.yaml')} dockyard.{key}{' ' + value if value else ''}")
            said.append(f"{where}: {words}")
        raise DockyardError(f"invalid setting: {'; '.join(said)}") from None
