"""run.sh: `invoke run` for a node with only sh and Docker, written beside load.sh in every archive set.

The docker command in it is `command.run_command`'s own, rendered with marks where a node's values go (its user, run
folder, Hugging Face and compile caches, process count, recipe, overrides) and each mark turned into a shell variable: the
flags, mounts, environment and torchrun line cannot drift from `invoke run`'s. What only a node can know (GPUs and
the NVIDIA runtime, the user's files) is found by the script itself (run.sh, the template).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import NamedTuple

from dockyard import engine
from dockyard.common import envvars
from dockyard.common.data_files import BUILDERS
from dockyard.common.locks import replace_file
from dockyard.gpus import Gpu, Host
from dockyard.images import variants
from dockyard.launch import node
from dockyard.launch import run as launch_run
from dockyard.launch.command import Topology, run_command
from dockyard.launch.inputs import IMAGE_ROOT, INPUTS, USER_RECIPES
from dockyard.settings import Settings

TEMPLATE = Path(__file__).parent / "run.sh"
MARK = b"# Trains a dockyard recipe in a loaded image"  # in every run.sh a save wrote (its second line)
# load.sh (transport.layout.LOADER_TEMPLATE), read for its engine() alone: a file, not an import (transport imports
# launch to write run.sh)
LOADER = Path(__file__).parents[1] / "transport" / "load.sh"
NPROC = 987654321                       # a process count no plan has: marks where run.sh's $NPROC goes
MARKS = {"/__RUNS__": "RUNS", "__RUN_ID__": "RUN_ID", "/__HF__": "HF", "/__COMPILE__": "COMPILE", "__IMAGE_ID__": "IMAGE_ID",
         "__RECIPE__": "RECIPE_IN", "__IMAGE__": "IMAGE", "__VARIANT__": "VARIANT", "__MEMLOCK__": "MEMLOCK",
         str(NPROC): "NPROC"}
OVERRIDES = "__OVERRIDES__"             # where the user's overrides and the rewritten input paths go
LOADER_FUNCTIONS = ("short", "engine", "runs", "least_driver", "driver_facts", "no_code")  # load.sh's, copied into run.sh


def render(settings: Settings, image: str, variant_name: str) -> str:
    """The text of run.sh for `image` built for `variant_name`: the image it trains in where no archive's manifest is
    beside it (else the loaded image those manifests name: the script finds it)."""
    engine.reference(image)  # it goes into a comment line too: no newline, no blank, no leading '-'
    variant = variants.resolve(settings, variant_name)[0]
    # A CUDA image plans for GPUs (run.sh drops --gpus and adds DS_ACCELERATOR=cpu on a node without them).
    host = Host(cuda=variant.cuda, gpus=[Gpu(0, "", 0)]) if variant.is_cuda else Host()
    s = settings.model_copy(update={"docker": "docker", "hf_cache": Path("/__HF__"), "compile_cache": "/__COMPILE__",
                                    "data": "", "model": ""})
    plan = run_command(s, recipe="ddp", variant=variant, host=host, engine_info={}, topo=Topology(nproc=NPROC),
                       run_dir=Path("/__RUNS__/__RUN_ID__"), overrides=[OVERRIDES], image_id="__IMAGE_ID__",
                       checkout_recipes=False, memlock="memlock=__MEMLOCK__", summarised=False)
    argv = plan.argv
    argv[argv.index("--recipe") + 1] = "__RECIPE__"
    named = next(i for i, w in enumerate(argv) if w.startswith(f"{envvars.HOST_PATHS}="))
    del argv[named - 1:named + 1]  # run.sh names the node's own mounts (on_host below)
    tag = variants.tag(s, variant)
    at = argv.index(tag)
    flags = [w.replace(tag, "__IMAGE__").replace(f"{envvars.VARIANT}={variant.name}", f"{envvars.VARIANT}=__VARIANT__")
             for w in argv[:at]]
    command = argv[at + 1:]
    if "--gpus" in flags:
        i = flags.index("--gpus")
        del flags[i:i + 2]
    # the node's engine decides how the container shares the host (run.sh's HOST_FLAGS: engine.host_sharing_flags)
    sharing = engine.host_sharing_flags({})
    at = next(i for i in range(len(flags)) if flags[i:i + len(sharing)] == sharing)
    # the node's folders the plan mounts (runs, caches), whose paths the trainer's lines say as the node's (on_host)
    mounted = {inside: host for inside, host in engine.mounts_of(flags).items() if any(m in host for m in MARKS)}
    lines = [*(f"on_host {word(inside)} {word(host)}" for inside, host in mounted.items()),
             "add " + " ".join(word(w) for w in flags[:at]),
             'cmd="$cmd $HOST_FLAGS"',
             "add " + " ".join(word(w) for w in flags[at + len(sharing):]),
             '[ -z "$GPUS" ] || add --gpus "$GPUS"',
             '[ -z "$CPU" ] || add -e DS_ACCELERATOR=cpu  # the image says cuda; DeepSpeed would look for a GPU',
             '[ -z "$DISABLE_REQUIRE" ] || add -e NVIDIA_DISABLE_REQUIRE=1  # as invoke run --disable-require',
             # NCCL's settings of the node's own transport and log set here (NCCL_P2P_DISABLE=1 sh run.sh), as
             # invoke run gives them (node.local_nccl_env): by name, docker takes the value from run.sh's environment
             "for v in $(env | sed -n 's/^\\(NCCL_[A-Z0-9_]*\\)=.*/\\1/p'); do case $v in "
             + "|".join(node.LOCAL_NCCL) + ') add -e "$v" ;; esac; done',
             f'[ -z "$HOST_PATHS" ] || add -e "{envvars.HOST_PATHS}={{$HOST_PATHS}}"',
             'cmd="$cmd$MOUNTS"',
             "add \"$IMAGE\" " + " ".join(word(w) for w in command[:command.index("--")]),
             '[ -z "$RESUME" ] || add --resume',
             "add " + " ".join(word(w) for w in command[command.index("--"):command.index(OVERRIDES)]),
             'add "$@"',
             'cmd="$cmd$EXTRA"']
    newest_first = cuda_newest_first(settings)
    text = TEMPLATE.read_text()
    for mark, value in {"@LOADER_FUNCTIONS@": loader_functions(),
                        "@MIN_DRIVER@": shlex.quote(least_drivers()),
                        "@CUDA_VARIANTS@": " ".join(shlex.quote(f"{v.name}={v.cuda}") for v in newest_first),
                        "@VARIANT_ARCHS@": " ".join(shlex.quote(f"{v.name}={v.cuda}={variants.cuda_archs(v)}")
                                                    for v in newest_first),
                        "@ARCHS_LABEL@": variants.ARCHS_LABEL,
                        "@IMAGE_DEFAULT_Q@": shlex.quote(image), "@IMAGE_DEFAULT@": image,
                        "@CPU_NPROC@": str(node.CPU_NPROC), "@ROOTLESS_SHM@": engine.ROOTLESS_SHM,
                        "@INPUTS@": INPUTS, "@USER_RECIPES@": USER_RECIPES, "@IMAGE_RECIPES@": f"{IMAGE_ROOT}/recipes",
                        "@DEFAULT_RECIPE@": launch_run.DEFAULT_RECIPE,
                        "@DATA_SUFFIXES@": " ".join(BUILDERS),
                        "@COMMAND@": "\n".join(lines)}.items():
        text = text.replace(mark, value)
    return text


def train_hint() -> str:
    """The run.sh command `invoke save` suggests: with the recipe run.sh takes when none is given."""
    return f"sh run.sh --recipe={launch_run.DEFAULT_RECIPE} --data=FILE --model=DIR -- --max_steps 100"


def loader_functions() -> str:
    """load.sh's functions run.sh shares: short() (a value as a message quotes it), engine() (whether docker reaches its
    engine, said in docker's own words with the usual fix) and the driver check (runs, least_driver, driver_facts:
    invoke run's rule in sh)."""
    text = LOADER.read_text()
    return "\n".join(re.search(rf"^{name}\(\) \{{(?:[^\n]*\}}|[^\n]*\n.*?^\}})$", text, re.M | re.S).group()
                     for name in LOADER_FUNCTIONS)


def least_drivers() -> str:
    """The least driver of each CUDA major, as load.sh's least_driver reads them: "12=525.60.13 13=580"."""
    return " ".join(f"{major}={least}" for major, least in variants.MIN_DRIVER.items())


def cuda_newest_first(settings: Settings) -> list[variants.Variant]:
    """The CUDA variants, newest CUDA first: the order in which a node is told the one its driver runs."""
    return sorted((v for v in variants.all_variants(settings).values() if v.is_cuda),
                  key=lambda v: variants.cuda_version(v.cuda), reverse=True)


class Unfit(NamedTuple):
    """Why a host cannot train in a set's CUDA image: the image, the reason in words, and the variant that runs there
    ("" where none does); `lacking` where its GPUs are why and no driver would change that (none has its code);
    `usable`: the GPUs that have its
    code where others lack it (the image loads: run.sh and invoke run train on those, given them alone; `instead`
    then trains on all of them)."""

    ref: str
    why: str
    instead: str
    lacking: bool
    usable: tuple[int, ...] = ()

    def fix(self, verb: str) -> str:
        """What to do where the host cannot train in it, as invoke load and invoke ship say it: `verb` ("load",
        "ship") the variant that runs there, else upgrade the driver, else that none has code for those GPUs."""
        if self.instead:
            return f"{verb} the {self.instead} archive instead (invoke save --variant={self.instead})"
        return "no variant has code for those GPUs" if self.lacking else "upgrade the driver"

    def or_instead(self) -> str:
        """The note's last words where another variant trains on every GPU of the host."""
        return (f"; or carry the {self.instead} archive (invoke save --variant={self.instead}), whose torch has code "
                "for every GPU here") if self.instead else ""

    def node_note(self, node: str) -> str:
        """The note for another node (invoke ship's, save --thin-for's) where some of its GPUs lack the image's code:
        load.sh there loads it, and run.sh trains on the others."""
        return (f"note: {self.ref} on {node}: {self.why}, which run.sh refuses to train on: give it the others there, "
                f"as in CUDA_VISIBLE_DEVICES={','.join(map(str, self.usable))} sh run.sh ...{self.or_instead()}")

    def refused_on(self, node: str) -> str:
        """Why load.sh on another node would refuse the set (invoke ship's words, save --thin-for's)."""
        return f"{self.ref} cannot train on {node}: {self.why}, so load.sh there would refuse it"


def unfit_on(settings: Settings, images: list[dict], host: Host | None) -> Unfit | None:
    """Where `host`'s driver or GPUs cannot run the set's CUDA image (invoke run's rules: variants.driver_runs and
    gpus_without_code, which load.sh and run.sh hold too), why, and the variant that runs there; None where they can,
    or where nothing is known (a cpu image, a set saved without the image's CUDA, a host without a readable driver).
    Where only some GPUs lack its code, `usable` names the others: a note, not a refusal. invoke ship asks it of the
    node before the copy, invoke load of this host before the load."""
    chosen = dockyard_variant(images)
    labels = next((i.get("labels") or {} for i in images if chosen and i["ref"] == chosen[0]), {})
    cuda, archs = variants.image_label(labels, "dockyard.cuda"), variants.image_label(labels, variants.ARCHS_LABEL) or ""
    if not chosen or not cuda or host is None or host.error:
        return None
    lacking = variants.gpus_without_code(archs, host) if archs else []
    if variants.driver_runs(cuda, host) is not False and not lacking:
        return None
    short = variants.driver_runs(cuda, host) is False
    no_code = f"its torch has no code for {', '.join(lacking)}" if lacking else ""
    # the driver first where it falls short too: an upgrade trains on the GPUs that have the code
    why = f"{variants.short_of(cuda, host)}{f', and {no_code}' if no_code else ''}" if short else no_code
    best = variants.runs_instead(settings, host)  # auto's pick: its driver runs it, its torch has every GPU's code
    instead = best.name if best is not None and best.name != chosen[1] else ""
    usable = tuple(g.index for g in host.gpus if archs and variants.arch_runs(archs, g.capability))
    if not short and usable:  # a V100 beside an H100: trained on the H100
        return Unfit(chosen[0], why, instead, True, usable)
    return Unfit(chosen[0], why, instead, bool(lacking) and not usable)  # lacking: no driver gives it those GPUs


def node_needs(settings: Settings, images: list[dict]) -> str:
    """What a node needs to train in the set's CUDA image, said by `invoke save` before gigabytes are carried: its
    driver and its GPUs, and the variant that serves the drivers and GPUs this one leaves out; "" for a cpu image."""
    chosen = dockyard_variant(images)
    v = variants.all_variants(settings).get(chosen[1]) if chosen else None
    if v is None or not v.is_cuda:
        return ""
    major = variants.cuda_version(v.cuda)[0]
    archs = variants.cuda_archs(v).replace("+PTX", "").split(";")
    line = (f"the node: {chosen[0]} needs an NVIDIA driver {variants.MIN_DRIVER.get(major, f'of CUDA {major}')} or "
            f"newer (CUDA {major}) and GPUs of compute capability {', '.join(archs)} (or a newer minor of one): there, "
            "`nvidia-smi --query-gpu=driver_version,compute_cap --format=csv` says both (load.sh refuses a driver or "
            "GPUs it cannot run)")
    for w in cuda_newest_first(settings):
        other = variants.cuda_version(w.cuda)[0]
        serves = [f"a CUDA {other} driver ({variants.MIN_DRIVER.get(other, 'any')} or newer)"] if other < major else []
        lacking = [a for a in variants.cuda_archs(w).replace("+PTX", "").split(";") if a not in archs]
        serves += [f"GPUs of {', '.join(lacking)}"] if lacking else []
        if serves:
            line += f"; {' or '.join(serves)} take {w.name} (invoke save --variant={w.name})"
    return line


def driver_fields(settings: Settings, images: list[dict]) -> dict[str, str]:
    """What load.sh holds against the node's driver and GPUs before it copies and loads the set (the manifest's load_sh
    block): the CUDA and GPU archs of the image run.sh trains in (its dockyard.cuda and cuda_archs labels; none for
    cpu), the least driver of each CUDA major, and the variants with their CUDA and archs, newest first, to name the
    one that runs there."""
    chosen = dockyard_variant(images)
    labels = next((i.get("labels") or {} for i in images if chosen and i["ref"] == chosen[0]), {})
    return {"cuda_image": chosen[0] if chosen else "",
            "needs_cuda": variants.image_label(labels, "dockyard.cuda") or "",
            "needs_archs": variants.image_label(labels, variants.ARCHS_LABEL) or "",
            "cuda_least": least_drivers(),
            "cuda_variants": " ".join(f"{v.name}={v.cuda}={variants.cuda_archs(v)}" for v in cuda_newest_first(settings))}


def word(w: str) -> str:
    """One argv word as sh: quoted as it is, or in double quotes with its marks as variables."""
    if not any(m in w for m in MARKS):
        return shlex.quote(w)
    out = w.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    for mark, var in MARKS.items():
        out = out.replace(mark, "${" + var + "}")
    return f'"{out}"'


def dockyard_variant(images: list[dict]) -> tuple[str, str] | None:
    """(ref, variant) of the first dockyard image of a set: the one run.sh trains in (others train nothing)."""
    for img in images:
        name = (img.get("labels") or {}).get("dockyard.variant")
        if name:
            return img["ref"], name
    return None


def write(settings: Settings, folder: Path, images: list[dict]) -> Path | None:
    """run.sh beside load.sh, written for the first dockyard image of the set, under a name of this process until
    whole. One run.sh serves every set in the folder: it trains in the one whose image is loaded."""
    chosen = dockyard_variant(images)
    if chosen is None:
        return None
    script = folder / "run.sh"
    replace_file(script, render(settings, *chosen), 0o755)
    return script
