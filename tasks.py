"""dockyard tasks: flags → dockyard.<concern> → output. All logic lives in the package.

Modules are imported inside each task so `invoke --list` stays fast and the host never needs torch.
Every task docstring is its `invoke --help TASK` text.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from invoke import Exit

from dockyard.cli import explain_config_errors, explain_parse_errors, hold_setting_overrides, task, task_settings

hold_setting_overrides()  # until a task runs: Invoke's own cast of them is a traceback (dockyard/cli.py)
# a flag Invoke's parser refuses is one `error:` line, as every other refusal; so are trainer overrides after `--`
# given to a task that does not hand them to the trainer (`_remainder`)
explain_parse_errors(takes_overrides={"run", "slurm", "k8s"})
explain_config_errors()  # and invoke.yaml that Invoke cannot read

if TYPE_CHECKING:  # the flags' types, read when a task runs (dockyard/cli.py): pydantic is not imported for --list
    from dockyard.flags import Batch, Count, GiB, Level, Nodes, Place, Port, PortOrConfig, Rank, Restarts, Seconds, Tokens


def _settings(c):
    return task_settings(c)


# --- images ----------------------------------------------------------------------------------

@task(help={"variant": "cpu, cu128, cu132 ... or all (default: all)",
            "dry": "print the uv command and write nothing"})
def lock(c, variant="all", dry=False):
    """Resolve a variant's pins into its hash-pinned lock file, images/locks/<variant>.txt (uv, linux x86_64)."""
    from dockyard.images import build

    build.lock(_settings(c), variant, dry=dry)


@task(help={"variant": "auto (default), cpu, cu128, cu132 ...",
            "dry": "print the pip command and download nothing"})
def wheelhouse(c, variant="auto", dry=False):
    """Download every wheel (and DeepSpeed's source) of a variant's lock into images/wheelhouse/<variant>/.

    Nothing is downloaded where the wheelhouse there already matches the lock (every file at its size).

    The wheelhouse_dir setting moves that folder: with INVOKE_DOCKYARD_WHEELHOUSE_DIR=/big/disk/wheels (or
    wheelhouse_dir in invoke.yaml) the wheels go to /big/disk/wheels/<variant>/, and `invoke build` reads them from
    there. The build installs Python packages only from that folder (--no-index). Its base stage still runs
    apt-get: build where a Debian mirror answers, then carry the image (`invoke save`: README, "Air-gapped, step by
    step").
    """
    from dockyard.images import build

    build.wheelhouse(_settings(c), variant, dry=dry)


@task(help={"variant": "auto (default): the newest CUDA variant the driver supports, else cpu",
            "no_cache": "rebuild every layer",
            "devel": "build FROM the variant's registry CUDA devel image (nvcc inside: DeepSpeed's CUDA ops, "
                     "your own kernels) instead of the Debian base; needs that image pulled or loaded",
            "dry": "print the exact commands and build nothing"})
def build(c, variant="auto", no_cache=False, devel=False, dry=False):
    """Build the image of a variant, tagged dockyard:<version>-<variant>.

    Fetches the wheelhouse first when it is missing. DeepSpeed ops are compiled in the image and the build
    fails if one is missing, or if torch/triton/deepspeed differ from the pins. The image's labels list the
    ops it holds (dockyard.ds_ops) and the GPU architectures its torch has code for (dockyard.cuda_archs).
    """
    from dockyard.images import build as build_mod

    build_mod.build(_settings(c), variant, no_cache=no_cache, devel=devel, dry=dry)


@task(help={"mirror": "Debian mirror for the cpu base image, a URL (default: http://deb.debian.org/debian)",
            "dry": "print what would be done"})
def setup(c, mirror="http://deb.debian.org/debian", dry=False):
    """Prepare a fresh host for building and training.

    A Docker engine (installed and started as root on Debian/Ubuntu), the registry-free Debian base image
    (debootstrap), and the wheelhouse of the auto variant."""
    from dockyard.images import setup as setup_mod

    setup_mod.setup(_settings(c), mirror=mirror, dry=dry)


# --- training --------------------------------------------------------------------------------

DISABLE_REQUIRE = ("set NVIDIA_DISABLE_REQUIRE=1: start an image whose NVIDIA_REQUIRE_CUDA the driver misses (a --devel "
                   "build on an older CUDA 12 driver: docs/images.md)")


@task(help={"recipe": "which strategy (see `invoke recipes`); default zero2, or with --resume the run's own",
            "variant": "image variant; default auto",
            "nproc": "processes on this node: default (or 0) one per GPU, or 2 on a CPU-only host",
            "nodes": "number of nodes (torchrun's c10d rendezvous); default 1",
            "node_rank": "this node's rank, 0..nodes-1, required with --nodes > 1: node 0 hosts the rendezvous",
            "master_addr": "address of node 0 on the network the nodes share (required with --nodes > 1)",
            "master_port": "rendezvous port on node 0 (default 29500)",
            "iface": "network interface for NCCL/gloo (default: the one that routes to --master-addr)",
            "join_timeout": "seconds the nodes wait for each other, joining and later (default 120): raise it where "
                            "nodes start minutes apart",
            "max_restarts": "times torchrun restarts the workers after a failure (default 0)",
            "run_id": "name of the run folder (default: <recipe>-<timestamp>); an existing one is refused; "
                      "with --nodes > 1 required, the same on every node",
            "resume": "continue the run named by --run-id from its last checkpoint, with its recipe and settings (give "
                      "--data and --model again: a resume mounts only what its command names)",
            "disable_require": DISABLE_REQUIRE,
            "native": "train with this host's Python instead of in the image (it needs the training stack: pip "
                      "install -e '.[train]'); the run is resumed and exported with --native too",
            "cpu": "train on CPU even in a CUDA image (gloo, no GPU): tries an image's stack on a host without GPUs",
            "gpus": "which GPUs by index or UUID, e.g. 0,2 (not a count: --gpus=2 is GPU 2 alone), or all (default: "
                    "CUDA_VISIBLE_DEVICES, else all): one process each",
            "data": "your data: a file or folder on this host, mounted read-only, or a hub dataset org/name in the "
                    "hf_cache folder (default: the `data` setting, else the sample)",
            "model": "your model: a folder on this host (config.json + weights), mounted read-only, or a hub model "
                     "org/name in the hf_cache folder (default: the `model` setting, else a tiny model made from a "
                     "config)",
            "dry": "print the exact command and run nothing"})
def run(c, recipe: Place = "", variant="auto", nproc: Count = 0, nodes: Nodes = 1, node_rank: Rank = -1, master_addr="",
        master_port: Port = 29500, run_id="", resume=False, disable_require=False, native=False, cpu=False,
        dry=False, gpus="", data: Place = "", model: Place = "", iface="", join_timeout: Seconds = 120,
        max_restarts: Restarts = 0):
    """Train a recipe in the image, one process per GPU (torchrun).

    --recipe is a name (`invoke recipes`) or a folder of your own holding a recipe.yaml. The checkout's recipes/
    is mounted over the image's, so an edit applies to the next run without a build.
    Trainer overrides go after `--`, e.g. `invoke run --recipe=zero2 -- --max_steps 50 --learning_rate 1e-4`."""
    from dockyard.launch import run as launch_run

    request = launch_run.RunRequest(
        recipe=recipe, variant=variant, nproc=nproc, nodes=nodes, node_rank=node_rank, master_addr=master_addr,
        master_port=master_port, run_id=run_id, resume=resume, dry=dry, native=native, cpu=cpu,
        disable_require=disable_require, gpus=str(gpus), data=data, model=model, iface=iface,
        join_timeout=join_timeout, max_restarts=max_restarts, overrides=tuple(_remainder(c)))
    launch_run.run(_settings(c), request)


def _remainder(c) -> list[str]:
    """The trainer overrides as the shell gave them: Invoke's remainder joins them into one string, which loses
    the user's quoting (a value with a space) and cannot be split again safely."""
    return sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []


@task(help={"recipe": "which strategy (see `invoke recipes`); default zero2",
            "nodes": "number of nodes to allocate (one `invoke run` each); default 2",
            "gpus_per_node": "GPUs per node (default 0: CPU nodes, the cpu image)",
            "variant": "image variant; default auto: the newest CUDA variant with GPUs, else cpu",
            "archive": "an archive from `invoke save`: each node loads it first where it lacks the image",
            "runtime": "docker (default: `invoke run` on each node), pyxis (enroot .sqsh) or apptainer (.sif)",
            "image_file": "pyxis: the image as FILE.sqsh; apptainer: FILE.sif (on storage every node sees)",
            "join_timeout": "seconds the nodes wait for each other, joining and later (default 120): raise it where "
                            "nodes start minutes apart (pyxis unpacking a large squashfs)",
            "max_restarts": "torchrun restarts of a node's workers before the job fails (default 0), as for invoke run",
            "out": "the script file to write, or a folder to write it into (default: "
                   "<jobs>/slurm/<recipe>-<nodes>n.sbatch, the jobs_dir setting; never in the runs folder)"})
def slurm(c, recipe: Place = "zero2", nodes: Nodes = 2, gpus_per_node: Count = 0, variant="auto", archive: Place = "",
          runtime="docker", image_file: Place = "", out: Place = "", join_timeout: Seconds = 120,
          max_restarts: Restarts = 0):
    """Write (and print) an sbatch script that trains a recipe on several nodes under Slurm.

    One task per node runs `invoke run`; the first host of the allocation hosts the rendezvous and each node's
    rank is SLURM_NODEID. Trainer overrides go after `--`; arguments after the script's name in `sbatch FILE
    ...` go to `invoke run` (e.g. --resume). Each job is a run of its own, <recipe>-slurm-<job id>: name another
    with DOCKYARD_RUN_ID=ID at sbatch time, as a resume must (DOCKYARD_RUN_ID=ID sbatch FILE --resume)."""
    from dockyard.launch import slurm as slurm_mod
    from dockyard.transport import load

    settings = _settings(c)
    slurm_mod.write(settings, recipe=recipe, nodes=nodes, gpus_per_node=gpus_per_node, variant=variant,
                    archive=archive, runtime=runtime, image_file=image_file, out=out, join_timeout=join_timeout,
                    max_restarts=max_restarts, overrides=_remainder(c),
                    archive_tags=load.archived_tags(settings, archive) if runtime == "docker" else None)


@task(help={"recipe": "which strategy (see `invoke recipes`); default zero2",
            "nodes": "number of nodes (pods), one torchrun each; default 2",
            "gpus_per_node": "GPUs per node (default 0: CPU nodes, the cpu image)",
            "variant": "image variant; default auto: the newest CUDA variant with GPUs, else cpu",
            "image": "the image reference the cluster pulls (default: this project's tag of the variant)",
            "run_id": "names the Job, its pods, the rendezvous and the run folder (lowercase, digits, '-')",
            "runs_claim": "the ReadWriteMany PersistentVolumeClaim holding the runs folder (default dockyard-runs)",
            "shm": "size of the memory-backed /dev/shm (default 16Gi)",
            "max_restarts": "torchrun restarts of a node's workers before the node fails (default 0)",
            "join_timeout": "seconds the pods wait for each other, joining and later (default 120): raise it where "
                            "pods start minutes apart (a node pulling the image for the first time)",
            "resume": "continue the run --run-id from its last complete checkpoint",
            "out": "folder to write job.yaml and trainjob.yaml into (default: <jobs>/k8s/<run-id>/, the jobs_dir "
                   "setting; never in the runs folder)"})
def k8s(c, recipe: Place = "zero2", nodes: Nodes = 2, gpus_per_node: Count = 0, variant="auto", image="", run_id="",
        runs_claim="dockyard-runs",
        shm="16Gi", max_restarts: Restarts = 0, resume=False, out: Place = "", join_timeout: Seconds = 120):
    """Write Kubernetes manifests that train a recipe on several nodes.

    An Indexed Job + headless Service (no operator needed) and a Kubeflow Trainer v2 TrainJob. Trainer overrides go
    after `--`."""
    from dockyard.launch import k8s as k8s_mod

    k8s_mod.write(_settings(c), recipe=recipe, nodes=nodes, gpus_per_node=gpus_per_node, variant=variant, image=image,
                  run_id=run_id, runs_claim=runs_claim, shm=shm, max_restarts=max_restarts, resume=resume, out=out,
                  join_timeout=join_timeout, overrides=_remainder(c))


@task(help={"run": "the run id (its folder under the runs folder)",
            "merge": "LoRA/QLoRA: merge the adapters into the base (QLoRA: onto the 16-bit base) instead of the "
                     "adapter alone",
            "out": "folder to write, which must not exist (default: runs/<ID>/export, or runs/<ID>/merged)",
            "native": "the run was trained with --native: export it on this host, with its Python (else in the "
                      "run's image)",
            "dry": "print the command and run nothing"})
def export(c, run="", merge=False, out: Place = "", native=False, dry=False):
    """Write a run's trained model as a plain Hugging Face folder (for serving, or the hub).

    A full fine-tune: the model and tokenizer. LoRA/QLoRA: the adapter, or with --merge the base with the adapters
    merged in, loadable with transformers alone. Runs in the run's image, on CPU; the folder is reloaded and its
    logits compared with the run's own model on a few inputs (the difference and tolerance are printed)."""
    from dockyard.launch import export as export_mod

    export_mod.export(_settings(c), run=run, merge=merge, out=out, dry=dry, native=native)


@task
def runs(c):
    """List the runs in the runs folder, newest first: recipe, status, steps, loss, where each trained.

    A run that stopped (status failed: an error, or interrupted) continues from its last checkpoint with
    `invoke run --resume --run-id=ID`; a completed one is exported with `invoke export --run=ID`."""
    from dockyard.launch import runs as runs_mod

    runs_mod.list_runs(_settings(c))


@task
def recipes(c):
    """List the recipes, each with the one line that says when to pick it."""
    from dockyard.common import recipes as recipes_mod

    recipes_mod.print_table()


@task(help={"variant": "image variant; default auto", "dry": "print the command and run nothing",
            "cpu": "no GPU even in a CUDA image: work in its stack on a host without GPUs",
            "keep": "keep the container when you leave it, to `invoke commit` what you changed (it says the name)",
            "disable_require": DISABLE_REQUIRE})
def shell(c, variant="auto", dry=False, cpu=False, keep=False, disable_require=False):
    """An interactive shell in the image, with the same mounts, user and flags as `invoke run`.

    Commands piped into it run there (`echo ds_report | invoke shell`), and exit with their status. The container
    is removed when you leave it, with what you changed in it, unless --keep."""
    from dockyard.launch import run as launch_run

    launch_run.shell(_settings(c), variant=variant, dry=dry, cpu=cpu, keep=keep, disable_require=disable_require)


# --- moving images ---------------------------------------------------------------------------

@task(help={"container": "name or id of the container to commit (see `docker ps -a`)",
            "tag": "tag of the new image (default: <source tag>-commit-<time>)",
            "allow_secrets": "commit even if the container holds token, key or credential files"})
def commit(c, container="", tag="", allow_secrets=False):
    """Commit a container to an image, refusing if it holds secrets.

    Secrets: HF token, .netrc, ssh keys, .git-credentials, cloud credentials, env files. Labels record
    the source image, container, time, a summary of `docker diff`, and which Python packages were
    changed by hand against the image's lock file."""
    from dockyard.transport import commit as commit_mod

    commit_mod.commit(_settings(c), container, tag=tag, allow_secrets=allow_secrets)


@task(help={"image": "image(s) to save, comma-separated; they share common layers (default: the auto variant's)",
            "out": "folder for the archive (default: images/dist/)",
            "compress": "zstd (default, every core), gzip (pigz where installed), or none",
            "level": "compression level (default: zstd 2, gzip 6)",
            "thin_for": "INVENTORY.json or ssh://[user@]host[:port]: leave out the layers that node already holds",
            "sign": "ssh private key: sign the manifest (ssh-keygen -Y sign)",
            "variant": "save this variant's image (cpu, cu132, ...) instead of --image; needs no GPU on this host"})
def save(c, image="", out: Place = "", compress="zstd", level: Level = 0, thin_for="", sign: Place = "", variant=""):
    """Write an image archive: a compressed `docker save` tar with its sha256, manifest, load.sh (and run.sh).

    Files: <name>.tar.zst, <name>.sha256, <name>.manifest.json, load.sh (loads it with only sh, GNU tar,
    sha256sum, docker and zstd/gzip) and, for a dockyard image, run.sh (`invoke run` as shell, for a node with only
    sh and Docker). Checks free space first, writes .partial files and renames them when complete, and checks every
    layer against the image's diff ids. Saving again with another --compress replaces the earlier archive."""
    from dockyard.transport import save as save_mod

    save_mod.save(_settings(c), image=image, out=out, compress=compress, level=level, thin_for=thin_for,
                 sign=sign, variant=variant)


@task(help={"file": "the archive (<name>.tar.zst/.tar.gz/.tar), with its .sha256 and .manifest.json beside it",
            "any_driver": "load a CUDA image this host's driver or GPUs cannot run (to train with invoke run --cpu, or "
                          "to pass it on), which is otherwise refused before the archive is read"})
def load(c, file: Place = "", any_driver: bool = False):
    """Verify an archive, then load it; a damaged or tampered one is refused.

    Checks the sha256 of archive and manifest (and the signature when `allowed_signers` is set), then
    loads it and checks that every image is there with the right id. A damaged, truncated or tampered
    archive is refused and nothing is loaded. Where every image it holds is here already, with the ids its
    manifest names, the archive is not read at all ("nothing to do"): check a copy before carrying it with
    `sha256sum -c NAME.sha256` beside it. A CUDA image this host's driver or GPUs cannot run is refused before it
    is read, naming the variant that runs here, as load.sh refuses it."""
    from dockyard.common.errors import DockyardError
    from dockyard.transport import load as load_mod

    if not file:
        raise DockyardError("--file is required: the archive to load (e.g. images/dist/dockyard_0.1.0-cpu.tar.zst)")
    load_mod.load(_settings(c), file, any_driver)


@task(help={"out": "file to write, or a folder to hold inventory-<hostname>.json (default: images/dist/)"})
def inventory(c, out: Place = ""):
    """Write this node's image and layer inventory, for thin archives.

    Lists images, diff ids and chain ids. Copy it to where you save archives and pass it to
    `invoke save --thin-for=FILE` to ship only the layers this node lacks. On a node without the
    project, `sh load.sh --inventory > FILE` writes what --thin-for needs."""
    from dockyard.transport import inventory as inventory_mod

    inventory_mod.write_inventory(_settings(c), out)


@task(help={"file": "archive to copy (file mode); its .sha256, .manifest.json, load.sh and run.sh go with it",
            "image": "image(s) to stream instead, comma-separated (stream mode: no file on either side)",
            "to": "[user@]host:/dir (file mode) or [user@]host (stream mode); ~/.ssh/config applies",
            "port": "ssh port (default: the ssh config's)",
            "identity": "ssh private key (default: the ssh config's / agent's)",
            "load": "load it there after verifying (file mode; stream mode always loads)",
            "thin": "stream mode: leave out the layers the node already holds"})
def ship(c, file: Place = "", image="", to="", port: PortOrConfig = 0, identity: Place = "", load=False,
         thin=False):
    """Copy an archive to another node over SSH, resumably; verify it there; optionally load it.

    Resumes with rsync --append-verify, or ssh append where the node has no rsync. With --image
    instead of --file: streams save → zstd → ssh → docker load in one pipeline (fastest; not
    resumable; the images are checked there after loading)."""
    from dockyard.common.errors import DockyardError
    from dockyard.transport import ship as ship_mod

    if bool(file) == bool(image) or not to:
        raise DockyardError("give --to and one of --file (copy an archive) or --image (stream an image)")
    if file and thin:  # an archive's layers were chosen when it was saved
        raise DockyardError("--thin is for --image (a stream): an archive is made thin when it is saved, for the node "
                            "(invoke save --thin-for=ssh://[user@]host); ship that archive without --thin")
    if file:
        ship_mod.ship_file(_settings(c), file, to, port=port, identity=identity, load=load)
    else:
        ship_mod.ship_image(_settings(c), image, to, port=port, identity=identity, thin=thin)


# --- the machine -----------------------------------------------------------------------------

@task(help={"json": "print the checks as JSON instead of a table",
            "record": "also write what NVML reports (GPUs, capability, MIG, driver, links) to this JSON file; "
                      "DOCKYARD_NVML_REPLAY=FILE replays it in doctor, plan and run --dry",
            "peer": "[user@]host of another node, or ssh://[user@]host:PORT (node 0, from the others): route, "
                    "rendezvous port, InfiniBand, its /dev/shm and image, over the ssh setting",
            "port": "the rendezvous port --peer checks (default 29500)"})
def doctor(c, json=False, record: Place = "", peer="", port: Port = 29500):
    """Check this host for training, with a fix for each failure.

    Docker engine and BuildKit, NVIDIA runtime, GPUs and driver, which image variants the driver runs,
    /dev/shm and ulimits in a run container, the engine's free disk, the image's DeepSpeed ops; with --peer,
    whether this node can train with another. Exits non-zero when a check fails. A host without GPUs passes
    (cpu variant)."""
    from dockyard.common.errors import DockyardError
    from dockyard.machine import doctor as doctor_mod

    if record:
        from dockyard import gpus
        gpus.record(record)
        print(f"recorded this host's NVML readings in {record}", file=sys.stderr)  # stdout: --json's JSON alone
    if port != 29500 and not peer:  # said, as invoke run says multi-node flags given to one node
        print(f"warning: --port={port} is node 0's rendezvous port, checked with --peer=NODE0; without --peer "
              "nothing checks it", file=sys.stderr)
    checks = doctor_mod.diagnose(_settings(c))
    if peer:
        from dockyard.machine import peer as peer_mod

        checks += peer_mod.diagnose(_settings(c), peer, port)
    print(doctor_mod.to_json(checks)) if json else doctor_mod.print_table(checks)
    failed = doctor_mod.failures(checks)
    if failed:
        raise DockyardError(f"{len(failed)} check(s) failed: {', '.join(f.name for f in failed)}")


@task(help={"model": "a local model folder (config.json; no weights are read), a hub model org/name in the hf_cache "
                     "folder, or a parameter count: 8B, 1.5B, 350M (default: the `model` setting of invoke.yaml)",
            "gpus": "GPUs per node (default: what NVML sees)",
            "gpu_mem": "GiB per GPU, nvidia-smi's memory.total MiB / 1024: an L40S sold as 48 GB has 45, an H100 80GB "
                       "79.6 (default: what NVML sees)",
            "cpu_mem": "GiB of host memory per node (default: this host's)",
            "seq_len": "tokens per sequence: auto (or 0, the default) is 2048, or the model's context where shorter",
            "batch": "examples per micro-batch per GPU: auto (or 0, the default) sizes each recipe as a run with no "
                     "tuning flags; N as a run given `-- --per_device_train_batch_size N`",
            "json": "print the plan as JSON"})
def plan(c, model: Place = "", gpus: Count = 0, gpu_mem: GiB = 0.0, cpu_mem: GiB = 0.0, seq_len: Tokens = 0,
         batch: Batch = 0, json=False):
    """Estimate the memory of every recipe for a model, and recommend the fastest that fits.

    GPU memory per device and host memory per node: model states as DeepSpeed counts them, plus
    activations with and without gradient checkpointing, at the micro-batch and accumulation a run
    of the recipe would take."""
    from dockyard.images.variants import all_variants
    from dockyard.launch.inputs import setting_input
    from dockyard.machine import planner as plan_mod

    s = _settings(c)
    where = "--model" if model else "setting model"
    if not model and s.model:  # read as `invoke run` reads it
        model = setting_input(s, s.model)
    result = plan_mod.plan_model(model, gpus=gpus, gpu_mem_gib=gpu_mem, cpu_mem_gib=cpu_mem, seq_len=seq_len,
                                 batch=batch, hub_home=s.path(s.hf_cache), where=where,
                                 variants=lambda: all_variants(s))
    print(plan_mod.to_json(result)) if json else plan_mod.print_plan(result)


# --- project ---------------------------------------------------------------------------------

NO_TESTS_COLLECTED = 5  # pytest's exit code when -k leaves a session nothing to run


@task(help={"k": "only tests matching this pytest -k expression", "x": "stop at the first failure"})
def test(c, k="", x=False):
    """Run the linter and the test suite (what .ci/run calls).

    The unit tests first, one process per core (pytest-xdist, at most 8); then the integration and GPU tests, one
    at a time: they share one Docker engine, a second node and the machine's cores, and some time what they run.
    Tests that need a GPU skip, saying why, where there is none."""
    import shlex

    from dockyard.cli import check_test_tools

    check_test_tools()  # the README's host install has no ruff, pytest nor torch: said before anything runs
    c.run(shlex.join([sys.executable, "-m", "ruff", "check", "."]), pty=False)
    picked = (["-k", k] if k else []) + (["-x"] if x else [])
    sessions = (["-n", "auto", "--maxprocesses=8", "tests/unit"], ["tests/integration", "tests/gpu"])
    codes = []
    for where in sessions:
        r = c.run(shlex.join([sys.executable, "-m", "pytest", "-ra", "--durations=15", *picked, *where]), pty=False,
                  warn=True)
        codes.append(r.exited)
        if x and r.exited not in (0, NO_TESTS_COLLECTED):
            break
    failed = [code for code in codes if code not in (0, NO_TESTS_COLLECTED)]
    if failed:
        raise Exit(code=failed[0])
    if 0 not in codes:
        raise Exit(f"error: no test matches -k {k!r}", code=NO_TESTS_COLLECTED)
