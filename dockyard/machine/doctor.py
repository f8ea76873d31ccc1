"""`invoke doctor`: is this host ready to build and train? Each check passes, warns or fails, with its fix.

Checks are plain functions from facts (`docker info`, NVML readings, a probe container's output, the image's
saved ds_report) to a Check; `run()` gathers the facts once and calls them. A host without GPUs passes:
it trains with the cpu variant.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path

from dockyard import engine, gpus
from dockyard.common.errors import DockyardError
from dockyard.common.units import GIB
from dockyard.gpus import Gpu, Host, Link
from dockyard.images import build, variants
from dockyard.machine import container
from dockyard.machine.check import FAIL, PASS, WARN, Check
from dockyard.settings import Settings
from dockyard.transport.inventory import engine_store


def diagnose(settings: Settings, gpu_source: gpus.Recorded | None = None) -> list[Check]:
    """Every check, in the order a user reads them. `gpus`: a source with host() and links() (default NVML)."""
    checks: list[Check] = []
    try:
        info = engine.engine_info(settings)
    except DockyardError as e:
        info = None
        checks.append(check_engine_down(e))
    if info is not None:
        checks += [check_engine(info), check_buildkit(settings, info)]
    host, links = _gpu_facts(gpu_source)
    checks.append(check_gpus(host))
    visible = check_visible(host)
    if visible:
        checks.append(visible)
    if info is not None:
        checks.append(check_runtime(host, info, cdi_specs(info)))
    topo = check_topology(host, links)
    if topo:
        checks.append(topo)
    all_variants = variants.all_variants(settings)
    images = {name: engine.image_inspect(settings, variants.tag(settings, v)) if info is not None else None
              for name, v in all_variants.items()}
    labels = {name: ((img or {}).get("Config") or {}).get("Labels") or {} for name, img in images.items()}
    label = variants.image_label
    checks += check_variants(all_variants, host, {n: label(ln, "dockyard.cuda") for n, ln in labels.items()},
                             {n: label(ln, variants.ARCHS_LABEL) for n, ln in labels.items()}, images)
    if info is None:
        return checks
    try:
        auto, _ = variants.pick_auto(all_variants, host)
    except DockyardError:
        auto = all_variants["cpu"]
    # the image auto picks; else any variant's that is here (an air-gapped node holds the one it was shipped); else
    # the base image
    probe = auto if images.get(auto.name) else next((v for n, v in all_variants.items() if images.get(n)), None)
    image = variants.tag(settings, probe or auto)
    probe_image = image if probe else settings.base_image_cpu
    if not engine.image_inspect(settings, probe_image):
        tags = ", ".join(variants.tag(settings, v) for v in all_variants.values())
        checks.append(Check("run container", WARN, f"no dockyard image ({tags}) nor {settings.base_image_cpu} is here "
                            "to test with",
                            "load one (sh load.sh, or invoke load --file=ARCHIVE), or where there is a network: "
                            "invoke setup, then invoke build"))
        disk = container.disk_here(info, variants.tag(settings, auto))
        return checks + ([disk] if disk else [])
    try:
        facts, refused = container.probe_container(settings, probe_image)
    except DockyardError as e:
        checks.append(Check("run container", FAIL, str(e), "see the engine's log; `invoke run` would fail the same way"))
        return checks
    if host.gpus:
        argv = container.probe_argv(settings, probe_image, f"dockyard-doctor-gpu-{os.getpid()}", ["nvidia-smi", "-L"], gpus=True)
        proc = engine.run(argv, capture=True, check=False, quiet=True)
        checks.append(check_gpu_container(host, proc.returncode, proc.stdout + proc.stderr))
    checks += [container.check_shm(facts["shm_bytes"]),
               refused or container.check_ulimits(facts["memlock"], facts["stack"], bool(host.gpus)),
               container.check_disk(facts["disk_free_bytes"], info.get("DockerRootDir", "?"), variants.tag(settings, auto),
                                    (images.get(auto.name) or {}).get("Size"))]
    if probe:
        checks.append(container.check_ds_report(facts["ds_report"], probe, image))
        if probe is not auto:  # probed with another variant's image: the one runs pick is still missing
            cuda = variants.image_label(labels[probe.name], "dockyard.cuda") or probe.cuda
            archs = variants.image_label(labels[probe.name], variants.ARCHS_LABEL) or variants.cuda_archs(probe)
            # the image here as the way out only where this host's driver and GPUs run it (`invoke run` refuses it
            # otherwise): a CUDA 12 node sent the cu132 archive was told to run with --variant=cu132
            runs = not host.gpus or not probe.is_cuda or (variants.driver_runs(cuda, host) is not False
                                                          and not variants.gpus_without_code(archs, host))
            checks.append(Check("auto image", WARN, f"{variants.tag(settings, auto)} (what auto picks here) is not "
                                f"here; the checks above ran in {image}",
                                f"invoke build (builds {auto.name}), or load its archive (sh load.sh)" + (
                                    f", or run with --variant={probe.name}" if runs else
                                    f": {probe.name}, the image here, does not run on this host (variant "
                                    f"{probe.name} above says why)")))
    else:
        checks.append(Check("deepspeed ops", WARN, f"no dockyard image here: {image}",
                            f"invoke build (builds {auto.name}), or load its archive (sh load.sh), then run doctor "
                            "again"))
    return checks


def check_engine(info: dict) -> Check:
    version = info.get("ServerVersion", "?")
    store = engine_store(info)
    detail = (f"Docker {version}, storage {info.get('Driver', '?')}, {store} image store, "
              f"data root {info.get('DockerRootDir', '?')}")
    try:
        major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    except ValueError:
        major, minor = 0, 0
    if (major, minor) < (19, 3):
        return Check("engine", FAIL, detail, "Docker 19.03 or newer is needed for --gpus: upgrade the engine")
    if store == "containerd":
        detail += " (docker save/load can fail silently there; dockyard verifies both)"
    mapping = engine.user_mapping(info)  # engine.host_sharing_flags decides the flags from it
    if mapping == "rootless":
        detail += (f"; rootless: containers run as their root, which is you on this host, with a {engine.ROOTLESS_SHM} "
                   "/dev/shm of their own (the host's cannot be shared)")
    elif mapping == "userns":
        detail += "; userns-remap: dockyard's containers leave the remapping (--userns=host) and run as you"
    return Check("engine", PASS, detail)


def check_engine_down(error: DockyardError) -> Check:
    lines = str(error).splitlines()
    return Check("engine", FAIL, "not reachable" + (f": {lines[-1].strip(' ()')}" if len(lines) > 1 else ""),
                 lines[0])


def check_buildkit(settings: Settings, info: dict | None = None) -> Check:
    """BuildKit: the buildx plugin, or a pre-23 client where DOCKER_BUILDKIT=1 turns it on; and an engine whose
    BuildKit reads the Dockerfile (`info`: its `docker info`)."""
    too_old = build.engine_cannot_build(info or {})
    if too_old:  # the engine's own frontend parses the Dockerfile, whichever client asks: a WARN, as runs still work
        return Check("buildkit", WARN, too_old, "upgrade the engine to 20.10 or newer to build here; runs work as "
                     "they are, in an image built elsewhere (`invoke save` there, `sh load.sh` here)")
    client = engine.docker_binary(settings.docker)
    buildx = engine.run(engine.docker(settings, "buildx", "version"), capture=True, check=False, quiet=True)
    if buildx.returncode == 0:  # "github.com/docker/buildx v0.17.1 <commit>"
        return Check("buildkit", PASS, f"{client}: buildx {' '.join(buildx.stdout.split()[1:2])}".strip())
    v = engine.run(engine.docker(settings, "version", "--format", "{{.Client.Version}}"),
                   capture=True, check=False, quiet=True).stdout.strip()
    nums = [int(x) for x in re.findall(r"\d+", v)[:2]]
    if len(nums) == 2 and (18, 9) <= tuple(nums) < (23, 0):
        return Check("buildkit", PASS, f"{client} {v}: built in (DOCKER_BUILDKIT=1)")
    return Check("buildkit", FAIL, f"{client} {v or '?'} has no buildx plugin",
                 "install the buildx plugin (apt-get install docker-buildx), or set `docker:` in invoke.yaml "
                 "to a client that has it")


def _gpu_words(g: Gpu) -> str:
    """A GPU as doctor names it: its model, compute capability and brand where NVML said them (the brand is what
    NVIDIA_REQUIRE_CUDA's brand= is held against: a --devel image refused on a GeForce, variants.require_unmet)."""
    said = [words for words in (g.capability and f"compute {g.capability}", g.brand and f"brand {g.brand}") if words]
    return g.name + (f" ({', '.join(said)})" if said else "")


def check_gpus(host: Host) -> Check:
    if not host.gpus and host.driver_fault:
        return Check("gpus", FAIL, host.error, gpus.DRIVER_FAULT_FIX)
    if not host.gpus:
        return Check("gpus", PASS, f"no NVIDIA GPU ({host.error or 'NVML sees none'}): the cpu variant will be used")
    names = sorted({_gpu_words(g) for g in host.gpus})
    mem = min(g.memory_bytes for g in host.gpus) / GIB
    detail = f"{host.count} × {', '.join(names)} ({mem:.1f} GiB each), {variants.driver_says(host)}"
    if not host.cuda:
        by_driver = ", ".join(f"CUDA {major} from driver {least} on" for major, least in variants.MIN_DRIVER.items())
        return Check("gpus", WARN, detail, (f"auto picks by the driver version ({by_driver}); " if host.driver else "")
                     + "check the driver with nvidia-smi, or name the variant (--variant=NAME)")
    mig, advice = gpus.mig_advice(host)
    if mig:
        return Check("gpus", WARN, f"{detail}; {mig}", advice)
    return Check("gpus", PASS, detail)


def check_visible(host: Host) -> Check | None:
    """The GPUs this shell's CUDA_VISIBLE_DEVICES leaves to invoke run and plan (doctor checks them all)."""
    try:
        hidden = gpus.hidden_by_environment(host, gpus.select(host))
    except DockyardError as e:
        return Check("visible gpus", FAIL, str(e), "unset CUDA_VISIBLE_DEVICES, or name GPUs of this host in it")
    if not hidden:
        return None
    return Check("visible gpus", WARN, f"{hidden} to invoke run and invoke plan",
                 "unset CUDA_VISIBLE_DEVICES for every GPU (or pick per run with --gpus=LIST)")


def check_runtime(host: Host, info: dict, cdi_specs: list[str]) -> Check:
    """`--gpus all` needs the NVIDIA runtime, a CDI spec, or the toolkit's prestart hook."""
    if not host.gpus:
        return Check("nvidia runtime", PASS, "not needed: no GPU")
    if "nvidia" in (info.get("Runtimes") or {}):
        return Check("nvidia runtime", PASS, "the engine lists the nvidia runtime")
    if cdi_specs:
        return Check("nvidia runtime", PASS, f"CDI: {', '.join(cdi_specs)}")
    if engine.which("nvidia-container-runtime-hook"):
        return Check("nvidia runtime", PASS, "nvidia-container-runtime-hook found (--gpus uses it)")
    return Check("nvidia runtime", FAIL, "GPUs found, but the engine has no NVIDIA runtime or CDI spec",
                 "install the NVIDIA Container Toolkit, `sudo nvidia-ctk runtime configure --runtime=docker`, "
                 "restart the engine")


def cdi_specs(info: dict) -> list[str]:
    dirs = info.get("CDISpecDirs") or ["/etc/cdi", "/var/run/cdi"]
    return [str(p) for d in dirs for p in sorted(Path(d).glob("nvidia*.y*ml")) if p.is_file()]


DOCKER_LOG_LINE = re.compile(r'time="[^"]*" level=\w+ msg=')


def check_gpu_container(host: Host, returncode: int, output: str) -> Check:
    """`nvidia-smi -L` in a container started exactly as a GPU run (--gpus all and the run's ulimits): the
    toolkit injects nvidia-smi, and every GPU must show."""
    seen = sum(1 for line in output.splitlines() if line.startswith("GPU "))
    if returncode == 0 and seen == host.count:
        return Check("gpus in a container", PASS, f"a GPU run's container sees {seen} GPU(s)")
    # the docker CLI's own log lines (`time="..." level=error msg="error waiting for container: context canceled"`)
    # can come after the engine's error: the error is the last line that is not one of them
    said = [line for line in output.strip().splitlines() if not DOCKER_LOG_LINE.match(line)] or output.strip().splitlines()
    last = said[-1][-200:] if said else f"exit {returncode}"
    if variants.require_refused(output):
        fix = variants.REQUIRE_FIX
    elif "device driver" in output or "nvidia-container-cli" in output:
        fix = ("install and configure the NVIDIA Container Toolkit: `sudo nvidia-ctk runtime configure "
               "--runtime=docker`, restart the engine")
    elif "rlimit" in output:
        fix = "the engine may not raise memlock/stack: start dockerd with `ulimit -l unlimited` (systemd: LimitMEMLOCK=infinity)"
    else:
        fix = "see the error: `invoke run` starts its containers the same way"
    return Check("gpus in a container", FAIL, f"{seen} of {host.count} GPU(s) visible: {last}", fix)


def check_topology(host: Host, links: list[Link]) -> Check | None:
    if host.count < 2:
        return None
    kinds: dict[str, list[str]] = {}
    for link in links:
        kinds.setdefault(link.path + ("" if link.p2p else ", no P2P"), []).append(f"{link.a}-{link.b}")
    detail = "; ".join(f"{kind}: {' '.join(pairs)}" for kind, pairs in kinds.items()) or "NVML gave no topology"
    no_p2p = [link for link in links if not link.p2p]
    if no_p2p:
        return Check("gpu topology", WARN, detail,
                     f"no peer-to-peer between {' '.join(f'{link.a}-{link.b}' for link in no_p2p)}: NCCL goes "
                     f"through host memory (slower all-reduce); {_p2p_way_out(host, no_p2p)}")
    return Check("gpu topology", PASS, detail)


def _p2p_way_out(host: Host, no_p2p: list[Link]) -> str:
    """What may give the pairs P2P: BIOS or VM settings only where the hardware has it. NVIDIA's driver gives GeForce
    cards none over PCIe, and PCIe has none between CPU sockets: there the IOMMU/ACS advice sent users into their
    BIOS for nothing."""
    geforce = {g.index for g in host.gpus if g.brand == "geforce" or (not g.brand and "GeForce" in g.name)}
    if all(link.a in geforce or link.b in geforce for link in no_p2p):
        return ("GeForce cards have none over PCIe (NVIDIA's driver leaves it off; an NVLink bridge gives a pair "
                "of RTX 3090s P2P), so there is nothing to set")
    if all(link.path == gpus.ACROSS_SOCKETS for link in no_p2p):
        return ("PCIe has none between CPU sockets, so there is nothing to set; GPUs of one socket (`invoke run "
                "--gpus=LIST`) have it where their bridge does")
    return "on bare metal check IOMMU/ACS settings, in a VM ask for P2P passthrough"


def _min_driver(cuda: str) -> str:
    major = variants.cuda_version(cuda)[0]
    return f" to {variants.MIN_DRIVER[major]} or newer" if major in variants.MIN_DRIVER else ""


def check_variants(all_variants: dict, host: Host, image_cuda: dict[str, str | None],
                   image_archs: dict[str, str | None] | None = None,
                   images: dict[str, dict | None] | None = None) -> list[Check]:
    """Which variants the driver runs and have code for the GPUs (the image's dockyard.cuda and dockyard.cuda_archs
    labels when built, else variants.yaml), whether the NVIDIA toolkit starts the image here (its
    NVIDIA_REQUIRE_CUDA, from `images`, their inspects), and what auto picks."""
    out = []
    if host.gpus:
        for name, v in all_variants.items():
            if not v.is_cuda:
                continue
            label = image_cuda.get(name)
            cuda, where = (label, "its image's label") if label else (v.cuda, "variants.yaml, as its image is not here")
            archs = (image_archs or {}).get(name) or variants.cuda_archs(v)
            lacking = variants.gpus_without_code(archs, host)
            if lacking:
                out.append(Check(f"variant {name}", WARN, f"its torch has no code for {', '.join(lacking)} "
                                 f"(it holds {archs})", f"auto skips {name} on this host; {_instead(all_variants, host, name)}"))
            elif (runs := variants.driver_runs(cuda, host)) is None:
                out.append(Check(f"variant {name}", WARN, f"cannot tell whether {name} (CUDA {cuda}, {where}) runs "
                                 f"on {variants.driver_says(host)}", f"--variant={name} runs it anyway"))
            elif runs and (unmet := variants.require_unmet(v, (images or {}).get(name), host))[0]:
                out.append(Check(f"variant {name}", WARN, f"{name} needs CUDA {cuda} ({where}), which this driver "
                                 f"runs, but its image {unmet[0]}", f"invoke run {unmet[1]}"))
            elif runs:
                driver = f"driver {host.driver}" if host.driver else "the driver"
                older = host.cuda and variants.cuda_version(host.cuda) < variants.cuda_version(cuda)
                compat = f", as a CUDA {host.cuda} driver runs any CUDA {host.cuda.split('.')[0]} build" if older else ""
                out.append(Check(f"variant {name}", PASS, f"{name} needs CUDA {cuda} ({where}): {driver} runs it{compat}"))
            else:
                out.append(Check(f"variant {name}", WARN,
                                 f"{name} needs CUDA {cuda} ({where}) but {variants.short_of(cuda, host)}",
                                 f"upgrade the driver{_min_driver(cuda)} to use {name}; {_instead(all_variants, host, name)}"))
    try:
        _, why = variants.pick_auto(all_variants, host)
        out.append(Check("auto variant", PASS, why))
    except DockyardError as e:
        out.append(Check("auto variant", FAIL, "auto picks no variant on this host",
                         variants.with_cpu_way_out(str(e), "train on CPU with `invoke run --cpu`")))
    return out


def _instead(all_variants: dict, host: Host, name: str) -> str:
    """The variant that trains here in place of `name`, whose image does not, as auto picks it (`use cu128 (invoke run
    --variant=cu128, or leave --variant out: auto picks it)`); where auto picks none, the `auto variant` check says
    why. Auto reads variants.yaml, the check the image's labels: where auto picks `name` itself, its image was built
    to another CUDA or other GPUs than variants.yaml now says, and a build makes it anew."""
    try:
        pick, _ = variants.pick_auto(all_variants, host)
    except DockyardError:
        return "auto picks no variant here either (see `auto variant`)"
    if not pick.is_cuda:
        return "auto picks cpu here (see `auto variant`)"
    if pick.name == name:
        return (f"its image was built otherwise than variants.yaml now says {name} is, which runs here: build it "
                f"again (invoke build --variant={name})")
    return f"use {pick.name} (invoke run --variant={pick.name}, or leave --variant out: auto picks it)"


def _gpu_facts(source: gpus.Recorded | None) -> tuple[Host, list[Link]]:
    if source is not None:
        return source.host(), source.links()
    return gpus.facts()


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL]


def to_json(checks: list[Check]) -> str:
    return json.dumps({"ok": not failures(checks), "checks": [asdict(c) for c in checks]}, indent=2)


def print_table(checks: list[Check]) -> None:
    """One row a check: its name and verdict, never wrapped, then what was found with its fix on a line of its own
    below: in 80 columns a fourth column for the fix (empty where a check passed) left each text column 22 wide, a
    ulimits row 16 lines tall and DOCKYARD_MEMLOCK=8388608 broken in two."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_lines=False)
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("what was found, and the fix", overflow="fold")  # fold: a path longer than the column stays whole
    style = {PASS: "green", WARN: "yellow", FAIL: "bold red"}
    for c in checks:
        # a GPU's name, a driver's error: what a host (or a recording) says, shown as text, never read as [tags]
        found = escape(c.detail) + (f"\n[bold]fix:[/] {escape(c.fix)}" if c.fix else "")
        table.add_row(escape(c.name), f"[{style[c.status]}]{c.status}[/]", found)
    Console().print(table)
