"""Variants: what each image holds, its tag and labels, and which one `auto` means on this host.

This is the one place that derives an image tag; build, run, commit, save and load all ask it.
"""

from __future__ import annotations

import hashlib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, field_validator

from dockyard import __version__
from dockyard.common.archs import arch_runs
from dockyard.common.errors import DockyardError, MiB, problems, read_bounded, short, yaml_problem
from dockyard.common.recipes import YAML_ERRORS, read_yaml
from dockyard.engine import familiar
from dockyard.gpus import DRIVER_FAULT_FIX, Gpu, Host
from dockyard.settings import IMAGE_NAME, ROOT, Settings

PINNED = ("torch", "triton", "deepspeed", "bitsandbytes", "transformers", "peft", "accelerate", "nvidia-ml-py",
          "datasets")


def a_base_image(v: str, empty: bool) -> str:
    """A base image's name as a registry takes it ("" for the base_image_cpu setting where `empty`)."""
    if (v or not empty) and (not IMAGE_NAME.fullmatch(v) or len(v) > 255):
        raise ValueError("an image name" + (' or "" (the base_image_cpu setting)' if empty else "")
                         + ": [registry[:port]/]name[:tag], e.g. nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04")
    return v


class DevelBase(BaseModel):
    """A variant's option to build FROM a registry CUDA devel image (nvcc inside) instead of the Debian base."""

    model_config = ConfigDict(extra="forbid")

    base: str
    os_packages: list[Package]
    ds_ops: list[str]

    @field_validator("base")
    @classmethod
    def _an_image(cls, v: str) -> str:
        return a_base_image(v, empty=False)


def form(pattern: str, takes: str) -> AfterValidator:
    """Text that must match `pattern` (whole), refused in words (`takes`): a regular expression is no answer to a
    user's "what does this field take?"."""
    shape = re.compile(pattern)

    def check(v: str) -> str:
        if not shape.fullmatch(v):
            raise ValueError(f"takes {takes}")  # the value is the formatter's to quote (errors.problems), once
        return v

    return AfterValidator(check)


ARCHS_FORM = r"\d{1,3}\.\d{1,3}(\+PTX)?([;\s]+\d{1,3}\.\d{1,3}(\+PTX)?)*"  # "7.5;8.0;9.0+PTX"
ARCHS = form(f"({ARCHS_FORM})?", 'compute capabilities separated by ";", e.g. "7.5;8.0;9.0+PTX" (or "" for none)')
# a Debian package (name, =version, :arch): `apt-get install ${OS_PACKAGES}` reads anything else as an option
# (-oAPT::Update::Pre-Invoke::=...), splits it at blanks or expands it as a glob
Package = Annotated[str, form(r"[a-z0-9][a-z0-9+.:=~_-]*", "a Debian package's name (with =version or :arch if "
                                                          "need be), e.g. python3-dev")]


# one exact version, as uv reads a requirement line: `0.21.2\n--index-url X` was an option of its own, `>=0.1` a
# comparison of none (said as pins.<name> '<it>': the formatter quotes the entry, not the whole mapping)
PinVersion = Annotated[str, form(r"([0-9][0-9A-Za-z.+!-]*)?", 'one exact version (2.1.0, 2.13.0+cpu), or "" for none')]


class Variant(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # a name is a file name (images/locks/NAME.txt) and a tag's part (dockyard:0.1.0-NAME): a word
    name: Annotated[str, form(r"[a-z0-9][a-z0-9._-]{0,63}", "a word of lowercase letters, digits, '.', '_' and '-' "
                                                        "(at most 64), as in cu132")] = ""
    description: str
    base: str
    cuda: Annotated[str, form(r"(\d{1,3}\.\d{1,3})?", 'a CUDA version, e.g. "13.2", or "" for cpu')]
    python: Annotated[str, form(r"3\.\d{1,2}", 'a Python 3 version, e.g. "3.11"')]
    os_packages: list[Package]
    # what DeepSpeed's ops are compiled for (TORCH_CUDA_ARCH_LIST): a mistake here surfaced minutes into the build
    torch_cuda_arch_list: Annotated[str, ARCHS]
    # the archs torch's libraries hold code for, as TORCH_CUDA_ARCH_LIST writes them: "7.5;8.0;9.0+PTX"
    torch_archs: Annotated[str, ARCHS] = ""
    ds_ops: list[str]
    devel: DevelBase | None = None
    pins: dict[str, PinVersion]

    @field_validator("base")
    @classmethod
    def _an_image(cls, v: str) -> str:
        return a_base_image(v, empty=True)

    @field_validator("pins")
    @classmethod
    def _names(cls, pins: dict[str, str]) -> dict[str, str]:
        """Each pin a package name (uv reads them as requirement lines); its version is PinVersion's to check."""
        for name in pins:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                raise ValueError(f"{short(name)} is not a package name: name each pin as pip does (torch, deepspeed)")
        return pins

    @field_validator("ds_ops")
    @classmethod
    def _ops(cls, ops: list[str]) -> list[str]:
        unknown = [op for op in ops if op not in OP_NAMES]
        if unknown:  # found only by the image check, after the whole DeepSpeed compile
            raise ValueError(f"unknown DeepSpeed op(s) {', '.join(unknown)}: use {', '.join(OP_NAMES)}")
        return ops

    @property
    def is_cuda(self) -> bool:
        return bool(self.cuda)

    @property
    def toolkit(self) -> str:
        """Where a CUDA variant's nvcc comes from: "wheels" (pinned in the lock), "base" (a registry devel image),
        or "" (none: cpu, or a CUDA image whose ops all build with the host compiler)."""
        if not self.is_cuda:
            return ""
        if self.base:
            return "base"
        return "wheels" if any(p.startswith("nvidia-cuda-nvcc") for p in self.pins) else ""

    def on_devel_base(self) -> Variant:
        """This variant built FROM its registry devel base: same pins and lock, the base's nvcc for its ops."""
        if self.devel is None:
            raise DockyardError(f"variant {self.name} has no devel base (images/variants.yaml): build it without "
                                "--devel, or add a `devel:` entry naming a registry CUDA devel image")
        return self.model_copy(update={"base": self.devel.base, "os_packages": self.devel.os_packages,
                                       "ds_ops": self.devel.ds_ops, "devel": None})

    @property
    def lock_file(self) -> Path:
        return ROOT / "images" / "locks" / f"{self.name}.txt"

    @property
    def requirements_in(self) -> str:
        """What the lock is resolved from: the pins plus build tools DeepSpeed's sdist needs."""
        lines = [f"{k}=={v}" for k, v in self.pins.items() if v]
        return "\n".join(lines + ["setuptools", "wheel", "ninja", "psutil", "pyyaml"]) + "\n"


# where the setting is set: one exported in a shell long ago was looked for in invoke.yaml alone
VARIANTS_FILE_SET = "invoke.yaml (or INVOKE_DOCKYARD_VARIANTS_FILE)"


@lru_cache(maxsize=8)
def _load(path: Path) -> dict[str, Variant]:
    try:
        raw = read_yaml(read_bounded(path, 4 * MiB, "variants file").decode(), path)  # a key set twice refused
    except FileNotFoundError:
        raise DockyardError(f"variants file {path} not found: set `variants_file` in {VARIANTS_FILE_SET}") from None
    except OSError as e:  # a folder, a file this user may not read
        raise DockyardError(f"cannot read the variants file {path} ({e.strerror}): set `variants_file` in "
                            f"{VARIANTS_FILE_SET} to a readable file") from None
    except UnicodeDecodeError as e:
        raise DockyardError(f"the variants file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except YAML_ERRORS as e:
        raise DockyardError(f"the variants file {path} is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("variants"), dict):
        raise DockyardError(f"invalid variants file {path}: expected a `variants:` mapping of names to variants")
    odd = next((name for name, spec in raw["variants"].items() if not isinstance(spec, dict)), None)
    if odd is not None:
        raise DockyardError(f"invalid variants file {path}: variant {odd!r} must be a mapping of its fields (it is "
                            f"{type(raw['variants'][odd]).__name__})")
    out = {}
    for name, spec in raw["variants"].items():
        if name in RESERVED or "name" in spec:
            raise DockyardError(f"invalid variants file {path}: variant {name!r}: " + (
                RESERVED[name] if name in RESERVED else "its name is the key above its fields: remove its `name:` "
                "field"))
        try:
            out[name] = Variant(name=name, **spec)
        except (ValidationError, TypeError) as e:
            raise DockyardError(f"invalid variants file {path}: variant {name!r}: "
                                f"{problems(e, known=sorted(set(Variant.model_fields) - {'name'}))}") from None
    if "cpu" not in out:  # the variant of every host without GPUs, and auto's fallback
        raise DockyardError(f"invalid variants file {path}: it defines no `cpu` variant (hosts without GPUs use it)")
    for v in out.values():
        missing = [p for p in PINNED if p not in v.pins]
        if missing:
            raise DockyardError(f"variant {v.name} in {path} lacks pins for: {', '.join(missing)}")
        if not v.pins["torch"]:  # every image is built around its torch (its label, the build's check)
            raise DockyardError(f"variant {v.name} in {path} pins no torch version: give one (\"2.13.0+cpu\")")
    return out


def all_variants(settings: Settings) -> dict[str, Variant]:
    return _load(settings.path(settings.variants_file))


def cuda_version(text: str) -> tuple[int, ...]:
    """"12.8" → (12, 8): CUDA versions compare as numbers ("12.10" is newer than "12.9")."""
    return tuple(int(x) for x in text.split("."))


# CUDA's minor-version compatibility: what is built with CUDA X.y runs on every driver of major X or newer
# (12.x from driver 525.60.13 on, 13.x from 580 on: NVIDIA's release notes' table of minimum drivers; 525.60.11
# reports CUDA 12.0 and is below it); only PTX JIT for an arch not compiled in needs X.y itself.
MIN_DRIVER = {12: "525.60.13", 13: "580"}


def driver_runs(image_cuda: str, host: Host) -> bool | None:
    """Whether the host's driver runs an image built for `image_cuda`: by the CUDA version NVML reports and, where it
    is read too, the driver version (MIN_DRIVER); None where NVML could read neither."""
    if re.fullmatch(r"\d+\.\d+", host.cuda):
        return cuda_version(image_cuda)[0] <= cuda_version(host.cuda)[0] and not below_minimum(image_cuda, host)
    least = MIN_DRIVER.get(cuda_version(image_cuda)[0])
    if least is None or not re.fullmatch(r"\d+(\.\d+)*", host.driver):
        return None
    return cuda_version(host.driver) >= cuda_version(least)


def below_minimum(image_cuda: str, host: Host) -> str:
    """The driver CUDA `image_cuda` builds need (MIN_DRIVER) where this host's is older, else "" (or unread)."""
    least = MIN_DRIVER.get(cuda_version(image_cuda)[0], "")
    older = least and re.fullmatch(r"\d+(\.\d+)*", host.driver) and cuda_version(host.driver) < cuda_version(least)
    return least if older else ""


def short_of(image_cuda: str, host: Host) -> str:
    """Why the driver does not run CUDA `image_cuda` builds, in words (driver_runs said False)."""
    least = below_minimum(image_cuda, host)
    if not least or (host.cuda and cuda_version(image_cuda)[0] > cuda_version(host.cuda)[0]):
        return driver_says(host)
    if host.cuda:
        return (f"driver {host.driver} (CUDA {host.cuda}) is older than {least}, the first that runs CUDA "
                f"{cuda_version(image_cuda)[0]} builds")
    return f"driver {host.driver} is older than {least} (NVML could not read its CUDA version)"


def driver_says(host: Host) -> str:
    """The host's driver in words: "driver 570.133.20 supports CUDA 12.8", or that NVML could not read it."""
    driver = f"driver {host.driver}" if host.driver else "the driver (NVML could not read its version)"
    return f"{driver} supports CUDA {host.cuda}" if host.cuda else f"{driver}, whose CUDA version NVML could not read"


def require_refused(said: str) -> bool:
    """Whether docker's words are the NVIDIA toolkit refusing the driver for the image's NVIDIA_REQUIRE_CUDA (an
    nvidia/cuda base's, as a --devel build has): "requirement error: unsatisfied condition: cuda>=12.8"."""
    return "requirement error" in said or "unsatisfied condition" in said


# What to do about it: its check is by minor version (cuda>=12.8), dockyard's by major (CUDA's minor-version
# compatibility: a 12.4 driver runs a 12.8 build)
REQUIRE_FIX = ("the image's NVIDIA_REQUIRE_CUDA (set by an nvidia/cuda base: a --devel build) refused this driver, "
               "though the toolkit is fine: `invoke run --disable-require` starts it (dockyard checks the driver "
               "against the image's CUDA itself), or use a variant this driver runs")


def require_of(image: dict | None) -> str:
    """The NVIDIA_REQUIRE_CUDA an image sets, from its `docker image inspect` ("" for none: the Debian-based builds)."""
    for item in ((image or {}).get("Config") or {}).get("Env") or []:
        name, _, value = str(item).partition("=")
        if name == "NVIDIA_REQUIRE_CUDA":
            return value
    return ""


def require_refuses(require: str, host: Host) -> str:
    """The condition of an NVIDIA_REQUIRE_CUDA by which the NVIDIA toolkit refuses this driver ("cuda>=12.8"), or ""
    where it admits it or may. The toolkit reads alternatives apart by spaces, each a comma-separated list of
    conditions that must all hold, for each GPU the container is given: nvidia/cuda's "brand=tesla,driver>=535,
    driver<536" admits a 535 driver on a Tesla, not on a GeForce. A GPU whose brand NVML did not say (a recording
    made before it was read) may hold any brand=."""
    alternatives = _alternatives(require)
    if all(_admits(alternatives, host, brand) for brand in {g.brand for g in host.gpus} or {""}):
        return ""
    return next((alt for alt in alternatives if alt.startswith("cuda")), alternatives[0])


def _alternatives(require: str) -> list[str]:
    """NVIDIA_REQUIRE_CUDA's alternatives, apart by ASCII blanks as run.sh's awk reads them: str.split() also took
    \\x1c-\\x1f and \\x85 for blanks, refusing what run.sh (and the toolkit, which splits at spaces) read as one
    condition it cannot tell."""
    return [alt for alt in re.split(r"[ \t\n\r\f\v]+", require) if alt]


def refused_for_brand(require: str, host: Host) -> list[Gpu]:
    """The GPUs the toolkit refuses for their brand alone: it admits this driver on other brands, not on theirs."""
    alternatives = _alternatives(require)
    return [g for g in host.gpus if g.brand and _admits(alternatives, host, "") and
            not _admits(alternatives, host, g.brand)]


# The brands libnvidia-container's requirement check calls by name (its driver.c: nvmlDeviceGetBrand); it calls every
# other brand (NVIDIA, NVIDIA RTX, Quadro RTX, the vGPU ones) "Unknown", which nvidia/cuda's brand=unknown admits. A
# brand= is held against that name and against NVML's own (brand=nvidia), case aside, as the toolkit compares them.
TOOLKIT_NAMED_BRANDS = {"quadro", "tesla", "nvs", "grid", "geforce", "titan"}


def _admits(alternatives: list[str], host: Host, brand: str) -> bool:
    """Whether one alternative holds, or may, on a GPU of `brand` ("" for unread) on this driver."""
    return not alternatives or any(_conditions_hold(alt, host, brand) is not False for alt in alternatives)


def _conditions_hold(alternative: str, host: Host, brand: str) -> bool | None:
    """Whether every condition of one alternative holds: None where one turns on what NVML did not say."""
    held: list[bool | None] = []
    for condition in alternative.split(","):
        if (said := re.fullmatch(r"brand(!?=)([A-Za-z0-9_]+)", condition)) and brand:
            names = {brand, brand if brand in TOOLKIT_NAMED_BRANDS else "unknown"}
            held.append((said.group(2).lower() in names) == (said.group(1) == "="))
            continue
        # a version of ASCII digits, each number of 9 at most: one of 5000 digits was past int()'s limit, a traceback
        m = re.fullmatch(r"(cuda|driver)(>=|<=|==|!=|=|<|>)([0-9]{1,9}(?:\.[0-9]{1,9})*)", condition)
        have = (host.cuda if m.group(1) == "cuda" else host.driver) if m else ""
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", have):  # arch=, an unread brand or version
            held.append(None)
            continue
        a, b = cuda_version(have), cuda_version(m.group(3))
        held.append({">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, "=": a == b, "<": a < b,
                     ">": a > b}[m.group(2)])
    return False if False in held else None if None in held else True


def require_unmet(variant: Variant, image: dict | None, host: Host) -> tuple[str, str]:
    """Why the NVIDIA toolkit would refuse to start `image` (its inspect) on this driver, said of the image ("sets
    NVIDIA_REQUIRE_CUDA ..."), and the way out; ("", "") where its NVIDIA_REQUIRE_CUDA admits the driver, or may."""
    refused = require_refuses(require_of(image), host)
    if not refused:
        return "", ""
    major = cuda_version(variant.cuda)[0] if variant.is_cuda else 0
    why = f" (a CUDA {major} driver runs any CUDA {major} build: docs/images.md)" if major and driver_runs(
        variant.cuda, host) else ""
    base = (((image or {}).get("Config") or {}).get("Labels") or {}).get("dockyard.base")
    plain = (f"the plain image (`invoke build --variant={variant.name}`, without --devel)"
             if variant.devel and base == variant.devel.base else "an image built without such a base")
    branded = refused_for_brand(require_of(image), host)
    brands = "; it admits this driver on other brands of GPU only, not on " + ", ".join(
        f"GPU {g.index} ({g.name}, brand={g.brand})" for g in branded) if branded else ""
    return (f"sets NVIDIA_REQUIRE_CUDA {refused} (from its base image), and {driver_says(host)}{brands}: the NVIDIA "
            "toolkit would refuse to start it", f"--disable-require starts it{why}, or use {plain}")


def gpus_without_code(archs: str, host: Host) -> list[str]:
    """The host's GPUs a build for `archs` has no code for, each as "GPU 0 (Tesla P100, 6.0)"."""
    return [f"GPU {g.index} ({g.name}, {g.capability})" for g in host.gpus if not arch_runs(archs, g.capability)]


def newest_cuda(settings: Settings) -> Variant:
    """The CUDA variant with the newest CUDA: what CI builds and checks for real."""
    return max(_cuda_variants(settings), key=lambda v: cuda_version(v.cuda))


def oldest_cuda(settings: Settings) -> Variant:
    """The CUDA variant with the oldest CUDA (the one for older drivers): CI builds and checks it too."""
    return min(_cuda_variants(settings), key=lambda v: cuda_version(v.cuda))


def _cuda_variants(settings: Settings) -> list[Variant]:
    cuda = [v for v in all_variants(settings).values() if v.is_cuda]
    if not cuda:  # a variants file of cpu alone: max() of nothing was a traceback in slurm and k8s
        raise DockyardError(f"{settings.path(settings.variants_file)} defines no CUDA variant, and GPU nodes need one: "
                            "add one (images/variants.yaml has two), or plan CPU nodes (no --gpus-per-node)")
    return cuda


def pick_auto(variants: dict[str, Variant], host: Host) -> tuple[Variant, str]:
    """The newest CUDA variant the host driver supports, else cpu; with the reason in words."""
    if not host.gpus and host.driver_fault:  # a GPU host whose driver fails: never trained on CPU unsaid
        raise DockyardError(f"auto cannot pick a variant: {host.error}; {DRIVER_FAULT_FIX}")
    if not host.gpus:
        why = host.error or "NVML sees no GPU"
        return variants["cpu"], f"auto → cpu: {why}"
    cuda = [v for v in variants.values() if v.is_cuda]
    if not cuda:  # a variants file of cpu alone, on a GPU host: said as a driver "older than every CUDA variant: "
        return variants["cpu"], "auto → cpu: the variants file defines no CUDA variant"
    fits = [v for v in cuda if driver_runs(v.cuda, host)]
    if not fits and any(driver_runs(v.cuda, host) is None for v in cuda):
        old = min(cuda, key=lambda v: cuda_version(v.cuda))
        since = MIN_DRIVER.get(cuda_version(old.cuda)[0])
        raise DockyardError(
            f"auto cannot pick a variant: {driver_says(host)}, so which CUDA it runs is unknown. Name one, as in "
            f"--variant={old.name} (CUDA {old.cuda}{f', for drivers from {since} on' if since else ''}), and check "
            "the driver with nvidia-smi")
    if not fits:
        have = ", ".join(f"{v.name} (CUDA {v.cuda})" for v in cuda)
        least = below_minimum(min(cuda, key=lambda v: cuda_version(v.cuda)).cuda, host)
        raise DockyardError(
            f"{driver_says(host)}, older than every CUDA variant: {have}"
            f"{f' (its CUDA needs driver {least} or newer)' if least else ''}. "
            "Upgrade the driver, or add a variant for an older CUDA to the variants file (images/variants.yaml)."
        )
    with_code = [v for v in fits if not gpus_without_code(cuda_archs(v), host)]
    if not with_code:
        have = ", ".join(f"{v.name} ({cuda_archs(v)})" for v in fits)
        raise DockyardError(
            f"no variant this driver runs has GPU code for {', '.join(gpus_without_code(cuda_archs(fits[0]), host))}: "
            f"{have}. Use --gpus to leave that GPU out, or add a variant whose torch covers it to images/variants.yaml.")
    fits = with_code
    best = max(fits, key=lambda v: cuda_version(v.cuda))
    return best, f"auto → {best.name}: {host.count} GPU(s), {driver_says(host)}" + ("" if host.cuda else
                                                                                     " (picked by the driver version)")


_SAID: set[str] = set()


def say(why: str, *, err: bool = False) -> None:
    """Print how the variant was chosen, once per command line: `invoke build run` chooses it in each task, and the
    same line twice reads as two choices."""
    if why not in _SAID:
        _SAID.add(why)
        print(why, file=sys.stderr if err else sys.stdout)


def runs_instead(settings: Settings, host: Host) -> Variant | None:
    """The CUDA variant `auto` picks on this host (its driver runs it, its torch has code for every GPU), or None
    where none does: what to name when another variant was asked for and this driver cannot run it."""
    try:
        best, _ = pick_auto(all_variants(settings), host)
    except DockyardError:
        return None
    return best if best.is_cuda else None


RESERVED = {"auto": "`auto` is --variant's word for picking one, never a variant's name",
            "all": "`all` is `invoke lock`'s word for every variant, never a variant's name"}


def resolve(settings: Settings, name: str = "auto", host: Host | None = None) -> tuple[Variant, str]:
    """A variant by name (or `auto`), and a line that says how it was chosen."""
    variants = all_variants(settings)
    if name == "auto":
        if host is None:
            from dockyard.gpus import read_host

            host = read_host()
        return pick_auto(variants, host)
    if name not in variants:
        raise DockyardError(f"unknown variant {short(name)}; valid: auto, {', '.join(variants)}")
    return variants[name], f"variant {name}"


def resolve_with_cpu(settings: Settings, name: str, host: Host, *, cpu: bool, on_cpu: str) -> tuple[Variant, str]:
    """resolve, for a task with a --cpu flag (run, shell): `auto` on a GPU host where no CUDA variant runs (a CUDA 11
    driver, GPUs no variant has code for) takes the cpu image with --cpu, which leaves the GPUs alone; without it the
    refusal ends with that way out (`on_cpu`: what --cpu does, in words), as run.sh's does on a node."""
    try:
        return resolve(settings, name, host)
    except DockyardError as e:
        if name != "auto":
            raise
        if cpu:
            return all_variants(settings)["cpu"], f"auto → cpu: --cpu, and {str(e).split('. ')[0]}"
        raise DockyardError(with_cpu_way_out(str(e), f"{on_cpu} with --cpu")) from None


def with_cpu_way_out(refusal: str, way_out: str) -> str:
    """auto's refusal on a GPU host (a CUDA 11 driver) ending with the way to train until it is fixed: said by
    invoke run and shell (`--cpu`) and by doctor (`invoke run --cpu`), unless the refusal names CPU already."""
    said = refusal.rstrip(".")
    return said if "on CPU" in said else f"{said}; or {way_out}"


def tag(settings: Settings, variant: Variant) -> str:
    """The image reference: <image_name>:<project version>-<variant>."""
    return f"{settings.image_name}:{__version__}-{variant.name}"


def of_tag(settings: Settings, ref: str) -> Variant | None:
    """The variant whose build tags its image `ref` (tag() read backwards, docker.io/library/ or not), or None."""
    return next((v for v in all_variants(settings).values() if familiar(tag(settings, v)) == familiar(ref)), None)


def lock_hash(variant: Variant) -> str:
    if not variant.lock_file.exists():
        raise DockyardError(f"no lock file for {variant.name}: run `invoke lock --variant={variant.name}`")
    return hashlib.sha256(variant.lock_file.read_bytes()).hexdigest()


def canonical_name(name: str) -> str:
    """A package name as PEP 503 normalises it: lowercase, each run of -, _ and . one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock_pins(text: str) -> dict[str, str]:
    """Canonical name → version of every `name==version` line of a (hash-pinned) lock file."""
    pins = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if m:
            pins[canonical_name(m.group(1))] = m.group(2)
    return pins


def parse_lock_hashes(text: str) -> dict[str, set[str]]:
    """Canonical name → the sha256 hashes its `--hash=sha256:...` lines allow, for every package of a lock file."""
    hashes: dict[str, set[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if m:
            name = canonical_name(m.group(1))
            hashes[name] = set()
        elif not line[:1].isspace():  # a comment or option line ends the package's hashes
            name = None
        if name is not None:
            hashes[name] |= set(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return hashes


CODE_LABEL = "dockyard.code"
OPS_LABEL = "dockyard.ds_ops"
ARCHS_LABEL = "dockyard.cuda_archs"
TOOLKIT_LABEL = "dockyard.nvcc"  # where the image's nvcc comes from (wheels, base), empty when it has none
LABEL_FORMS = {"dockyard.cuda": r"\d{1,3}\.\d{1,3}", ARCHS_LABEL: ARCHS_FORM}


def image_label(labels: dict, key: str) -> str | None:
    """An image's dockyard.cuda or cuda_archs label as the build writes it, else None (unknown): an image loaded from
    an archive carries whatever labels it was given (a set's manifest carries them too), and `dockyard.cuda=13.x` or
    `cuda_archs=sm_90` was a ValueError traceback in invoke doctor, load and ship."""
    value = labels.get(key)
    return value if isinstance(value, str) and re.fullmatch(LABEL_FORMS[key], value) else None

# DeepSpeed's name of each op a ds_ops entry builds (DS_BUILD_<entry>=1).
OP_NAMES = {"CPU_ADAM": "cpu_adam", "FUSED_ADAM": "fused_adam", "AIO": "async_io", "SHM_COMM": "deepspeed_shm_comm",
            "CPU_LION": "cpu_lion", "CPU_ADAGRAD": "cpu_adagrad"}


def cuda_ops_the_image_can_load(variant: Variant, image_labels: dict | None) -> set[str] | None:
    """The DeepSpeed ops a CUDA image can load on GPUs: its prebuilt ones when it has no nvcc to compile others,
    None when it can compile (or is cpu). From the image's labels when it is built (a --devel build has nvcc)."""
    labels = image_labels or {}
    if OPS_LABEL in labels:
        return None if labels.get(TOOLKIT_LABEL) else set(filter(None, labels[OPS_LABEL].split(",")))
    if not variant.is_cuda or variant.toolkit:
        return None
    return set(ds_ops(variant).split(","))


def cuda_archs(variant: Variant) -> str:
    """The GPU architectures the variant's torch holds code for ("7.5;8.0;...;12.0+PTX"), checked by the build."""
    return variant.torch_archs if variant.is_cuda else ""


def ds_ops(variant: Variant) -> str:
    """DeepSpeed's names of the ops prebuilt in the image, comma-separated (the label)."""
    return ",".join(OP_NAMES.get(op, op.lower()) for op in variant.ds_ops)


def labels(variant: Variant, *, revision: str, created: str, source: str = "", code: str = "",
           base: str = "") -> dict[str, str]:
    """Every label the image carries: what is inside, and what it was built from (`source` only when there is
    a repository URL to give: a local checkout path would mean nothing on another host; `code`: the hash of the
    dockyard/ package copied in, which `invoke run` compares with the checkout's)."""
    return {
        "dockyard.variant": variant.name,
        "dockyard.cuda": variant.cuda,
        "dockyard.python": variant.python,
        "dockyard.torch": variant.pins["torch"],
        "dockyard.triton": variant.pins["triton"],
        "dockyard.deepspeed": variant.pins["deepspeed"],
        "dockyard.bitsandbytes": variant.pins["bitsandbytes"],
        "dockyard.transformers": variant.pins["transformers"],
        "dockyard.lock": lock_hash(variant),
        OPS_LABEL: ds_ops(variant),
        TOOLKIT_LABEL: variant.toolkit,
        ARCHS_LABEL: cuda_archs(variant),
        **({"dockyard.base": base} if base else {}),
        **({CODE_LABEL: code} if code else {}),
        "org.opencontainers.image.title": "dockyard",
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.created": created,
        **({"org.opencontainers.image.source": source} if source else {}),
    }
