"""`invoke slurm`: an sbatch script that starts one node of the run per node of the allocation; Slurm allocates,
torchrun's c10d rendezvous does the rest (dockyard schedules nothing itself).

Three ways to get the image on the nodes (--runtime):
- docker (default): each node runs `invoke run`, so the script needs this checkout and its Python on every node
  (a shared filesystem, so the runs folder is shared too) and a Docker engine there; with --archive, each node
  first loads the image from that archive where it lacks it;
- pyxis: `srun --container-image=FILE.sqsh` (enroot cannot import a docker archive: the squashfs comes from
  `enroot import dockerd://IMAGE` on a host that loaded it);
- apptainer: `apptainer exec FILE.sif` (`apptainer build FILE.sif docker-archive://ARCHIVE.tar`).
With the last two, torchrun runs in the container directly: no checkout, no engine on the nodes.
Node 0 is the first host of the allocation, reached at its NodeAddr as an address (_NODE_ADDRESSES); each node's
rank is SLURM_NODEID.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

from dockyard import ENV_PREFIX
from dockyard.common import envvars, locks, runfolder
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import load_recipe
from dockyard.images import variants
from dockyard.launch import caches, inputs, node, preflight, scriptwords
from dockyard.settings import ROOT, Settings

RUNTIMES = {"docker": "", "pyxis": ".sqsh", "apptainer": ".sif"}  # and the image file each one runs
INVOKE = [sys.executable, "-m", "invoke"]  # what each node runs with --runtime=docker (this checkout's Python)


RUNS_SETTING = "the runs_dir setting (INVOKE_DOCKYARD_RUNS_DIR)"


def script(settings: Settings, *, recipe: str, nodes: int, gpus_per_node: int, overrides: list[str],
           variant: str = "auto", archive: str = "", master_port: int = node.PORT, runtime: str = "docker",
           image_file: str = "", join_timeout: int = node.JOIN_TIMEOUT, archive_tags: list[str] | None = None,
           max_restarts: int = 0) -> str:
    """The sbatch script's text (pure). Every value in it is quoted for the shell(s) that read it, or refused.
    `archive_tags`: the images the archive holds (transport.load.archived_tags), one of which the script runs."""
    for flag, value in (("--recipe", recipe), ("--archive", archive), ("--image-file", image_file)):
        scriptwords.one_line(value, flag)
    scriptwords.argv_words(overrides, "trainer overrides")
    # a path the shell left as typed (`--archive='~/x.tar.zst'`) is the user's home's, as the checks below read it
    archive, image_file = os.path.expanduser(archive), os.path.expanduser(image_file)
    node.check_nodes(nodes, gpus_per_node)
    node.check_restarts(max_restarts, join_timeout)
    # what `invoke run` and the trainer would refuse on every node, once the job had waited in the queue: the
    # settings, the batch split over every node's processes, the data and model (a flag's, a setting's, the recipe's)
    loaded = load_recipe(recipe)
    preflight.check_run(settings, recipe=loaded, overrides=overrides, gpus_in_effect=gpus_per_node > 0,
                        processes=nodes * (gpus_per_node or node.CPU_NPROC),
                        liger_absent=preflight.liger_absent(gpus_per_node > 0),
                        gpus_fix="give --gpus-per-node (the nodes' GPUs)")
    overrides = _inputs_from_here(settings, overrides)
    _check_runtime(runtime, image_file, archive)
    chosen = node.cluster_variant(settings, variant, gpus_per_node)
    if runtime == "docker" and chosen.is_cuda and not gpus_per_node:
        # the job held no GPU; each node's `invoke run` of a CUDA image then failed, or took the node's GPUs anyway
        raise DockyardError(f"--variant={chosen.name} runs on GPUs, and the job asks Slurm for none: give "
                            "--gpus-per-node=G (the GPUs of each node), or leave out --variant for CPU nodes")
    image = variants.tag(settings, chosen)
    if runtime == "docker" and archive_tags is not None and image not in archive_tags:
        # a cu128 archive, the script's variant left at auto (cu132): every node failed, once the job had waited
        raise DockyardError(f"--archive {archive} holds {', '.join(archive_tags)[:300]}, not {image}, the image this "
                            f"script runs: give the archive of {chosen.name} (invoke save --variant={chosen.name}), or "
                            "the variant the archive holds (--variant=...)")
    runs = settings.path(settings.runs_dir)
    # named with its variable, as invoke run names it: one set in a shell long ago is not in invoke.yaml
    scriptwords.one_line(str(runs), RUNS_SETTING)
    if "\\" in str(runs):
        raise DockyardError(f"{RUNS_SETTING} {str(runs)!r}: Slurm reads a backslash in --output as "
                            "\"no %j here\": use a folder without one")
    # A recipe folder is named by its absolute path (the script runs from this checkout) and by its own name.
    recipe_arg = str(Path(recipe).resolve()) if (Path(recipe) / "recipe.yaml").is_file() else recipe
    name = runfolder.recipe_name(recipe)
    invoke = shlex.join(INVOKE)
    run = [shlex.quote(w) for w in ["run", f"--recipe={recipe_arg}", f"--variant={chosen.name}",
                                    *([f"--nproc={gpus_per_node}"] if gpus_per_node else [])]]
    if nodes > 1:
        run += ['--nodes="$SLURM_NNODES"', '--node-rank="$SLURM_NODEID"', '--master-addr="$MASTER_ADDR"',
                '--master-port="$MASTER_PORT"']
        if join_timeout != node.JOIN_TIMEOUT:
            run.append(f"--join-timeout={int(join_timeout)}")
    if max_restarts:
        run.append(f"--max-restarts={int(max_restarts)}")
    run += ['--run-id="$RUN_ID"', '"$@"']  # the script's own overrides are in "$@" by now (_overrides_first)
    lines = [
        "#!/bin/bash",
        f"# Written by `invoke slurm --recipe={recipe} --nodes={nodes} --gpus-per-node={gpus_per_node}"
        + (f" --runtime={runtime}`." if runtime != "docker" else "`."),
        "#   sbatch THIS_FILE              # arguments after the file go to "
        + ("`invoke run`" if runtime == "docker" else "the trainer"),
        f"#   DOCKYARD_RUN_ID={name}-slurm-JOBID sbatch THIS_FILE --resume   # continues that job's run",
        "# One task per node, each running " + ("`invoke run`" if runtime == "docker" else "torchrun in the container")
        + "; node 0 (the first host) hosts torchrun's rendezvous.",
        f"#SBATCH --job-name=dockyard-{name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
        "#SBATCH --exclusive",
        "#SBATCH --output=" + scriptwords.sbatch_word(str(runs).replace("%", "%%")) + "/slurm-%j.out",
        "set -euo pipefail",
        f"cd {shlex.quote(str(ROOT))}",
        *_NODE_ADDRESSES,
        f"export MASTER_ADDR NODE_ADDRS MASTER_PORT=${{MASTER_PORT:-{int(master_port)}}}",
        f'export RUN_ID="${{{envvars.RUN_ID}:-{name}-slurm-$SLURM_JOB_ID}}"',
        "# It names a folder and goes into the nodes' command lines: checked here, before any node starts.",
        'if [[ ${#RUN_ID} -gt 128 || $RUN_ID == [!A-Za-z0-9]* || $RUN_ID == *[!A-Za-z0-9_.-]* ]]; then',
        "  printf 'dockyard: run id %s: use at most 128 letters, digits, _ . -, starting with a letter or digit\\n' "
        '"$RUN_ID" >&2',
        "  exit 2",
        "fi",
        "# --resume continues an earlier job's run, whose id is not this job's default: it must be named.",
        'for a in "$@"; do',
        '  if [[ $a == --resume && -z ${DOCKYARD_RUN_ID:-} ]]; then',
        "    printf 'dockyard: --resume continues an earlier run, not this job'\\''s new %s: name it, e.g. "
        "DOCKYARD_RUN_ID=%s sbatch FILE --resume\\n' \"$RUN_ID\" \"$(ls -t "
        + shlex.quote(str(runs)) + f" 2>/dev/null | grep -m 1 '^{name}-slurm-[0-9]*$' || echo {name}-slurm-JOBID)\" >&2",
        "    exit 2",
        "  fi",
        "done",
    ]
    if runtime != "docker":
        return "\n".join(lines + _container_launch(settings, runtime, image_file, recipe, gpus_per_node, image,
                                                    overrides, join_timeout, max_restarts)) + "\n"
    # Each node's `invoke load` and `invoke run` read the settings this script was written with, not whatever the
    # sbatch environment says (--export=NONE, another shell): the job log and the run folder went to two places, the
    # archive was checked for one image while the nodes ran another, and loaded unsigned where its signature was checked.
    lines += ["# The settings `invoke slurm` was given (its runs folder is the job log's): every node reads them.",
              "export " + " ".join(f"{ENV_PREFIX}{key.upper()}={shlex.quote(value)}"
                                   for key, value in _node_settings(settings).items())]
    if archive:
        load = (f"docker image inspect {shlex.quote(image)} >/dev/null 2>&1 || "
                f"exec {invoke} load {shlex.quote('--file=' + str(Path(archive).resolve()))}")
        lines += ["# The image on every node, from the archive where a node lacks it (`invoke save` wrote it).",
                  f"srun --ntasks-per-node=1 bash -c {shlex.quote(load)}"]
    lines += _overrides_first(overrides)
    # Quoted twice: each word for the node's bash, the whole line for this one (SLURM_NODEID is each node's own).
    lines += ["srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "
              + shlex.quote(f"exec {invoke} {' '.join(run)}") + ' bash "$@"']
    return "\n".join(lines) + "\n"


def _node_settings(settings: Settings) -> dict[str, str]:
    """The settings each node's `invoke load` and `invoke run` read (docker runtime) that this host may have from its
    environment or its ~/.invoke.yaml: the image (its name, the variants file), the runs folder, the caches it mounts,
    and the signers an archive must be signed by."""
    values = {"image_name": settings.image_name, "variants_file": str(settings.path(settings.variants_file)),
              "runs_dir": str(settings.path(settings.runs_dir)), "hf_cache": str(settings.path(settings.hf_cache)),
              "compile_cache": str(caches.compile_folder(settings) or "")}
    if settings.allowed_signers:  # where it is set (an empty one would turn off a node's own): the archive's load
        values["allowed_signers"] = str(settings.path(settings.allowed_signers))
    return {key: scriptwords.one_line(value, f"the {key} setting") for key, value in values.items()}


# Every node's address, in SLURM_NODEID order (NODE_ADDRS, node 0's is MASTER_ADDR), as an IPv4 address: torchrun,
# gloo and `invoke run` need one. Slurm's NodeAddr is the node's name unless slurm.conf sets it, and a node's own
# name can resolve to loopback on it (Debian's 127.0.1.1 in /etc/hosts): node 0, where this script runs, would then
# advertise (and `invoke run` refuse) a loopback address. So names are resolved here, and node 0's own address,
# where its name resolves to loopback here, is the one it reaches node 1 from.
_NODE_ADDRESSES = [
    "ADDRS=()",
    'for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
    "  a=$(scontrol show node \"$n\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2) || true",
    "  a=${a:-$n}",
    "  ip4=$(getent ahostsv4 \"$a\" | awk '{print $1; exit}') || true",
    '  ADDRS+=("${ip4:-$a}")',
    "done",
    'if [[ ${#ADDRS[@]} -gt 1 && ${ADDRS[0]} == 127.* ]]; then',
    "  ADDRS[0]=$(ip -o route get \"${ADDRS[1]}\" 2>/dev/null | grep -o 'src [^ ]*' | cut -d' ' -f2) || true",
    "  if [[ -z ${ADDRS[0]} ]]; then",
    "    printf 'dockyard: node 0 (%s) resolves its own name to loopback and found no route to node 1 (%s): set "
    "its NodeAddr in slurm.conf to its address, or map its name to that address in /etc/hosts\\n' "
    '"$(hostname)" "${ADDRS[1]}" >&2',
    "    exit 2",
    "  fi",
    "fi",
    'MASTER_ADDR=${ADDRS[0]} NODE_ADDRS="${ADDRS[*]}"',
]


def _check_runtime(runtime: str, image_file: str, archive: str) -> None:
    if runtime not in RUNTIMES:
        raise DockyardError(f"--runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    if runtime == "docker":
        if archive and not Path(archive).is_file():
            raise DockyardError(f"--archive {archive}: no such file (give the .tar.zst, .tar.gz or .tar `invoke save` "
                                "wrote, on storage every node sees)")
        if image_file:
            raise DockyardError("--image-file is for --runtime=pyxis (.sqsh) or apptainer (.sif); with docker "
                                "give --archive (from `invoke save`)")
        return
    ext = RUNTIMES[runtime]
    how = {"pyxis": "make it on a host that loaded the image: enroot import -o dockyard.sqsh dockerd://IMAGE",
           "apptainer": "make it from an archive: zstd -d X.tar.zst && APPTAINER_TMPDIR=<a roomy disk> apptainer build "
                        "dockyard.sif docker-archive://X.tar (X.tar:IMAGE for an archive of several images)"}
    if not image_file.endswith(ext):
        raise DockyardError(f"--runtime={runtime} needs --image-file=FILE{ext} on storage every node sees; {how[runtime]}")
    if archive:
        raise DockyardError(f"--archive is for --runtime=docker; {runtime} runs the {ext} file itself")
    if not Path(image_file).is_file():  # the login node sees the storage every node sees, as for --archive
        raise DockyardError(f"--image-file {image_file}: no such file (give the {ext} file on storage every node "
                            f"sees; {how[runtime]})")


def _container_launch(settings: Settings, runtime: str, image_file: str, recipe: str, gpus: int, image: str,
                      overrides: list[str], join_timeout: int, max_restarts: int = 0) -> list[str]:
    """srun of torchrun inside the container, one per node: the same rendezvous, and the same mounts, `invoke run`
    gives a node (this checkout's recipes, a recipe folder of one's own, the user's data and model, read-only)."""
    seen = inputs.read_only_mounts(settings, recipe, overrides, separators=",:")
    # the runs folder, the Hugging Face cache, and the compile cache (write() makes it first): a later job loads the
    # kernels compiled
    mounts = [*caches.volumes(settings, True, separators=",:", runs=settings.path(settings.runs_dir)), *seen.volumes]
    spec = ",".join(f"{src}:{dst}" + (":ro" if ro else "") for src, dst, ro in mounts)
    image_file = str(Path(image_file).resolve())
    if runtime == "pyxis":
        # srun gives its task, and pyxis the container, the job's whole environment by default (a host PYTHONPATH,
        # LD_PRELOAD or HF_* changed what trained): --export names what crosses (_PYXIS_EXPORT), and Slurm's own
        # (shell words: the mounts end with the files the fabric's settings name, $files of _FABRIC_FILES)
        container = [shlex.quote(f"--container-image={image_file}"),
                     shlex.quote(f"--container-mounts={spec}") + '"$files"',
                     shlex.quote(f"--container-workdir={node.WORKDIR}"), "--no-container-mount-home"]
        wrap = []
    else:
        container = []
        # --cleanenv, --no-home: neither the host's environment nor its home folder reaches the container (a host
        # PYTHONPATH, LD_PRELOAD or HF_* changed what trained; the home folder was the container's to write, ~/.bashrc
        # and ~/.ssh included), as in the docker form; what the trainer needs, and the fabric's settings, are passed by
        # name (_APPTAINER_PASSES)
        wrap = ["bash", "-c", _APPTAINER_PASSES, "bash", "apptainer", "exec", *(["--nv"] if gpus else []),
                "--bind", spec, "--pwd", node.WORKDIR, "--cleanenv", "--no-home", image_file]
    entry = node.entry_shell(seen.recipe, node.run_dir_inside("$RUN_ID"), expand_run_dir=True, args='"$@"')
    # Each node advertises its own address (NODE_ADDRS: a hostname can resolve to 127.0.1.1 on the node, or not at all).
    inner = "ADDRS=($NODE_ADDRS); " + node.node_command(
        index="$SLURM_NODEID", nnodes="$SLURM_NNODES", nproc=gpus or node.CPU_NPROC, endpoint="$MASTER_ADDR:$MASTER_PORT",
        run_id="$RUN_ID", local_addr="${ADDRS[$SLURM_NODEID]}", entry=entry, join_timeout=join_timeout,
        max_restarts=max_restarts)
    # the trainer's environment, HOME left as the runtime sets it for the user
    trainer = {k: v for k, v in {envvars.IMAGE_REF: image, **node.container_env(), **caches.compile_env(settings),
                                 **seen.env, **({} if gpus else {"DS_ACCELERATOR": "cpu"})}.items() if k != "HOME"}
    env = ["# The containers see of the job's environment the variables the trainer needs (NODE_ADDRS, MASTER_ADDR, "
           "RUN_ID... exported above) and the fabric's (NCCL_*, FI_*, UCX_*) alone"
           + (" (and pyxis's, enroot's, the GPUs': ENROOT_*, PYXIS_*, NVIDIA_*)." if runtime == "pyxis" else "."),
           "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in trainer.items()),
           f"export {_PASSED}={shlex.quote(' '.join([*trainer, *JOB_VARIABLES]))}"]
    export = []
    if runtime == "pyxis":
        env += [_PYXIS_EXPORT, _FABRIC_FILES]
        export = ['--export="$passes"']
    what = {"pyxis": "pyxis/enroot runs the squashfs", "apptainer": "Apptainer runs the .sif"}[runtime]
    each = "one process per GPU" if gpus else f"{node.CPU_NPROC} processes on the CPUs (no GPU asked)"
    return [*env, *_resume_alone_before_overrides(), *_overrides_first(seen.overrides),
            f"# {what} on every node; torchrun starts there, {each}.",
            " ".join([shlex.join(["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]), *export,
                      *container, shlex.join([*wrap, "bash", "-c", inner]), 'bash "$@"'])]


# What crosses into an Apptainer container started with --cleanenv, or a pyxis one (srun --export): the job's
# variables the node's command reads (SLURM_NODEID is each node's own), the GPUs Slurm gave the job's task, the
# interface the user names for gloo (docs/multinode.md: exported before sbatch), the trainer's environment exported
# above, and the fabric's settings set on the node (NCCL_*, FI_*, UCX_*: node.fabric_env, as `invoke run` gives them
# with -e).
JOB_VARIABLES = ("NODE_ADDRS", "MASTER_ADDR", "MASTER_PORT", "RUN_ID", "SLURM_NODEID", "SLURM_NNODES",
                 "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME")
_PASSED = "DOCKYARD_CONTAINER_PASSES"  # the names, exported by the script; what is set of them crosses
# The files the fabric's settings name (node.FABRIC_FILES: NCCL_TOPO_FILE, NCCL_GRAPH_FILE), set in the job's
# environment, checked as node.fabric_files checks them for `invoke run` (on each node for Apptainer, on node 0 for
# pyxis, whose srun line is node 0's), and appended to $files as mounts of the runtime's list, ",SRC:DST:ro" each: the
# container sees each at the path the variable names, read-only, where NCCL opens it.
_FABRIC_FILES = "files=; " + "; ".join(  # (set but empty: a file NCCL fails without is refused as no file)
    f'if [[ {f"-v {n}" if fails else f"-n ${{{n}:-}}"} ]]; then why=; if [[ -z ${n} ]]; then why="set but empty"; '
    f'elif [[ ${n} != /* ]]; then why="not an absolute path"; '
    f'elif [[ ${n} == *[,:]* ]]; then why="a path holding , or : (the mount list splits on them)"; '
    f'elif [[ ! -f ${n} ]]; then why="no such file on $(hostname)"; fi; if [[ -n $why ]]; then '
    f"printf 'dockyard: {n}=%s: %s, and NCCL in the container {without}: give the {what} of the node by its absolute "
    f"path, or unset {n}\\n' "
    f'"${n}" "$why" >&2; exit 2; fi; files+=",${n}:${n}:ro"; fi'
    for n, (what, without, fails) in node.FABRIC_FILES.items())
_APPTAINER_PASSES = (f'for v in ${_PASSED}; do [[ -v $v ]] && export "APPTAINERENV_$v=${{!v}}"; done; '
                     # (${!P@}: the names of the node's variables that start with P, each a shell variable's, so the
                     # pattern is node.FABRIC_NAME; core bash, where compgen needs its completion built in)
                     f'for v in {" ".join(f"${{!{p}_@}}" for p in node.FABRIC_PREFIXES)}; do '
                     f'case $v in {"|".join(f"{p}_?*" for p in node.FABRIC_PREFIXES)}) '
                     'export "APPTAINERENV_$v=${!v}" ;; esac; done; '
                     + _FABRIC_FILES + '; if [[ -n $files ]]; then set -- "$1" "$2" --bind "${files#,}" "${@:3}"; fi; '
                     'exec "$@"')


# pyxis: srun's --export names the variables it gives each node's task (Slurm's SLURM_* go too, and what slurmstepd
# sets, CUDA_VISIBLE_DEVICES of the task's GPUs among them), and pyxis gives the container the task's environment (the
# image's own value of a variable winning). Named: PATH (where srun finds bash; the image's wins inside) and HOME, as
# pyxis gave them; what the trainer needs (_PASSED), where set; the fabric's settings set in the job's environment; and
# what pyxis, enroot and enroot's default hooks read of it (PYXIS_*, ENROOT_*, NVIDIA_*: the GPUs a container is given;
# MELLANOX_*: its InfiniBand devices, none without it; XDG_*: enroot's runtime and data folders).
PYXIS_OWN = ("PYXIS", "ENROOT", "NVIDIA", "MELLANOX", "XDG")
# and these, where set: enroot's temporary folder (TMPDIR), who runs it (getpass in the container: USER, LOGNAME), TERM
PYXIS_NAMES = ("TMPDIR", "USER", "LOGNAME", "TERM")
_PYXIS_EXPORT = (f'passes=PATH,HOME; for v in ${_PASSED} {" ".join(PYXIS_NAMES)}; do if [[ -v $v ]]; then passes+=",$v"; '
                 'fi; done; '
                 f'for v in {" ".join(f"${{!{p}_@}}" for p in (*node.FABRIC_PREFIXES, *PYXIS_OWN))}; do '
                 f'case $v in {"|".join(f"{p}_?*" for p in (*node.FABRIC_PREFIXES, *PYXIS_OWN))}) passes+=",$v" ;; '
                 'esac; done')


def _resume_alone_before_overrides() -> list[str]:
    """The lines that refuse, in a script whose nodes start the trainer itself (pyxis, Apptainer), an argument given
    at sbatch time before `--` other than --resume: the trainer took `sbatch FILE --max_steps 5` as settings that the
    script's own overrides, after its `--`, then outweighed without a word (the docker form hands them to invoke run,
    which refuses a flag it does not know)."""
    return ["# Before `--`, --resume alone: trainer settings go after it (and win over the script's own).",
            'for a in "$@"; do',
            "  [[ $a == -- ]] && break",
            "  if [[ $a != --resume ]]; then",
            "    printf 'dockyard: %s: give trainer settings after `--` (sbatch FILE -- --max_steps 50); before it this "
            "script takes --resume alone\\n' \"$a\" >&2",
            "    exit 2",
            "  fi",
            "done"]


def _overrides_first(overrides: list[str]) -> list[str]:
    """The lines that put the script's own trainer overrides into "$@" (the arguments sbatch passes after the file)
    just after its first `--`, or behind a `--` at its end: overrides given at sbatch time (`sbatch FILE -- --max_steps
    50`) then follow them, and win, as the last value given of a setting is the one taken. Written after the line
    that gives a second `--` to every node, which `invoke run` and the trainer refuse once the job has waited in the
    queue."""
    if not overrides:
        return []
    return ["# The script's own trainer overrides, before any given after `--` at sbatch time (the last value wins).",
            'n=0; for a in "$@"; do [[ $a == -- ]] && break; n=$((n + 1)); done',
            f'set -- "${{@:1:n}}" -- {shlex.join(overrides)} "${{@:n+2}}"']


def _inputs_from_here(settings: Settings, overrides: list[str]) -> list[str]:
    """The inputs (model, data, eval_data), given after `--` or as the invoke.yaml/INVOKE_DOCKYARD_* settings, as
    overrides naming the files they name here: the script runs from the checkout, where a relative path named another
    file (`data/sample.jsonl`: the checkout's sample); and a setting taken from this shell's environment reached the
    nodes only where the job's environment still held it (the docker runtime's nodes trained on the sample). A hub id
    stays as it is."""
    given = inputs.override_values(overrides)
    out = inputs.strip_keys(overrides, given)
    for key, value, where in inputs.resolved(settings, overrides):
        host = inputs.host_path(value, where, settings, key)
        out += [f"--{key}", str(host) if host is not None else value]
    scriptwords.argv_words(out, "trainer overrides")
    return out


def write(settings: Settings, *, out: str = "", **kw) -> Path:
    """Write the script (default: <jobs>/slurm/<recipe>-<nodes>n.sbatch; --out=FOLDER: that name in FOLDER), print
    it, and say how to submit it. Never in the runs folder: its containers could change the script before sbatch
    runs it."""
    text = script(settings, **kw)
    if kw.get("runtime", "docker") != "docker":  # (a docker node's `invoke run` makes them itself)
        caches.prepare(settings, compile_cache=True)  # the folders the containers mount, made as the user, checked
    runs = settings.path(settings.runs_dir)
    name = f"{runfolder.recipe_name(kw['recipe'])}-{kw['nodes']}n.sbatch"
    path = Path(os.path.expanduser(out)) if out else settings.path(settings.jobs_dir) / "slurm" / name
    if out and locks.names_a_folder(os.path.expanduser(out)):  # a folder the user named (never a link planted in the runs folder)
        path = path / name
    fix = "give --out=FILE in a folder you can write" if out else f"{runfolder.JOBS_FIX}, or give --out=FILE"
    if out:
        path = runfolder.users_folder(path.parent, caches.container_writable(settings)) / path.name
        locks.check_named_output(path, "--out")
    scriptwords.one_line(str(path), "--out" if out else "the jobs_dir setting")  # said in the lines it prints
    caches.check_out_of_reach(settings, path, "--out" if out else "the jobs_dir setting's script",
                              "give --out=FILE outside it" if out else "set the jobs_dir setting to a folder outside "
                              "it (INVOKE_DOCKYARD_JOBS_DIR=~/jobs), or give --out=FILE")
    runfolder.make_folders(runs, runfolder.RUNS_FIX)  # Slurm writes the job's output there
    runfolder.make_folders(path.parent, fix)
    replaced = _replaces(path, text)
    try:
        runfolder.write(path.parent, path.name, text, mode=0o755)  # replaces a link, never writes through one
    except OSError as e:  # a folder this user cannot write, a read-only file system: the temporary file is gone
        raise DockyardError(f"cannot write the script {path}: {e.strerror or e}; {fix}") from None
    print(text, end="")
    if replaced:  # sbatch keeps its own copy of a submitted script: a job already queued runs what it was given
        print(f"# {path} held another script, now replaced by this one: give --out=FILE to keep both",
              file=sys.stderr)
    print(f"# written to {path}: submit it with `sbatch {shlex.quote(str(path))}`", file=sys.stderr)
    if not kw.get("gpus_per_node"):
        print("# for CPU nodes, the cpu image: --gpus-per-node=G for nodes of G GPUs each", file=sys.stderr)
    return path


WRITTEN_BY = b"#!/bin/bash\n# Written by `invoke slurm"  # how every script this writes starts


def _replaces(path: Path, text: str) -> bool:
    """Whether the script about to be written over `path` replaces another (another recipe folder of the same name
    writes the same default file): a plain file only, read no further than the new script's length. A file that is
    no script of ours is refused (--out=notes.txt was replaced, and made executable)."""
    locks.check_ours(path, "--out", WRITTEN_BY, "a script `invoke slurm` wrote")
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False  # nothing there (or what runfolder.write refuses)
        with open(path, "rb") as f:
            return f.read(len(text.encode()) + 1) != text.encode()
    except OSError:
        return False
