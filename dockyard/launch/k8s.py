"""`invoke k8s`: the manifests that train a recipe on several Kubernetes nodes, written as data (yaml.safe_dump).

Two forms, one file each:
- job.yaml, no operator needed: a headless Service and an Indexed Job, one pod per node. Pod 0 is reachable as
  <name>-0.<name> (the Service gives each pod a DNS name, before it is ready) and hosts torchrun's c10d store;
  every pod advertises its pod IP (a container's hostname can resolve to loopback).
- trainjob.yaml, for clusters with Kubeflow Trainer v2: a TrainJob (trainer.kubeflow.org/v1alpha1) on the
  `torch-distributed` runtime, which numbers the nodes and names node 0 in torchrun's PET_* variables; each pod
  starts the same c10d rendezvous from them (bounded join, --max-restarts, pod IP advertised).
Both mount the run folder from a ReadWriteMany PersistentVolumeClaim (every node writes its DeepSpeed shards
into the same folder) and a memory-backed /dev/shm (Kubernetes has no --ipc=host).
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dockyard import engine
from dockyard.common import envvars, locks, runfolder
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import RECIPES, load_recipe
from dockyard.images import variants
from dockyard.launch import caches, inputs, node, preflight, scriptwords
from dockyard.settings import Settings

RUNTIME = "torch-distributed"  # Kubeflow Trainer's ClusterTrainingRuntime for torchrun
NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a DNS-1123 label: it names the Job, Service and pods
NAME_MAX = 40  # pods are named <name>-<index>-<suffix>, hostnames <name>-<index>: both must stay within 63
# a Kubernetes quantity the API server takes: bytes (at most 19 digits), or up to 999999 of a unit
QUANTITY = re.compile(r"[0-9]{1,19}|[0-9]{1,6}(\.[0-9]{1,3})?(Ki|Mi|Gi|Ti|k|M|G|T)")
SHM_LEAST = 256 << 20  # bytes: Docker's 64 MB default /dev/shm is what fails NCCL (nccl#342; docs/multinode.md)
# bytes: more memory than any node holds (the largest single machines hold about 48 TB); a memory-backed /dev/shm
# counts against the pod's memory, and --shm=999999Ti was written into the manifests, to fail only on the nodes
SHM_MOST = 64 << 40
UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30,
         "Ti": 1 << 40}


def _bytes(quantity: str) -> float:
    """A QUANTITY's bytes."""
    number = quantity.rstrip("".join(UNITS))
    return float(number) * UNITS[quantity[len(number):]]


HEADER = {
    "job": """\
# Written by `invoke k8s` (operator-free form): a headless Service and an Indexed Job, one pod per node.
#   kubectl apply -f {path}
# Before applying:
# - the PersistentVolumeClaim `{claim}` must exist, ReadWriteMany (NFS, CephFS, Lustre...): every pod writes its
#   DeepSpeed shards into the same run folder, and the trainer refuses to start when the pods do not share it;
# - the image {image} must be in a registry the cluster pulls from, or loaded on every node (`invoke load`).
# A lost pod fails the Job (backoffLimit 0): delete it (`kubectl delete -f {path}`), write the files again with
# the same --run-id and --resume, apply: training continues from the last complete checkpoint.
""",
    "trainjob": """\
# Written by `invoke k8s` (Kubeflow Trainer v2 form): a TrainJob on the `{runtime}` ClusterTrainingRuntime.
#   kubectl apply -f {path}
# Needs Kubeflow Trainer (v2) installed with its `{runtime}` runtime, the ReadWriteMany PersistentVolumeClaim
# `{claim}`, and the image {image} pullable or loaded on every node (`invoke load`).
""",
}


WRITTEN_BY = b"# Written by `invoke k8s`"  # how each file this writes starts (HEADER)


@dataclass
class Spec:
    """What both forms are made from (plain data; `spec()` checks it)."""

    recipe: str
    nodes: int
    gpus: int
    nproc: int
    image: str
    run_id: str
    claim: str = "dockyard-runs"
    shm: str = "16Gi"
    overrides: list[str] = field(default_factory=list)
    max_restarts: int = 0
    resume: bool = False
    join_timeout: int = node.JOIN_TIMEOUT
    compile_cache: bool = True  # on the claim (node.COMPILE_IN_RUNS); the compile_cache setting "" turns it off

    @property
    def name(self) -> str:
        return f"dockyard-{self.run_id}"

    @property
    def run_dir(self) -> str:
        return node.run_dir_inside(self.run_id)

    def entry(self) -> str:
        return node.entry_shell(self.recipe, self.run_dir, self.overrides, self.resume)


def spec(settings: Settings, *, recipe: str, nodes: int, gpus_per_node: int, variant: str = "auto",
         run_id: str = "", image: str = "", runs_claim: str = "dockyard-runs", shm: str = "16Gi",
         overrides: list[str] | None = None, max_restarts: int = 0, resume: bool = False,
         join_timeout: int = node.JOIN_TIMEOUT) -> Spec:
    scriptwords.one_line(recipe, "--recipe")
    scriptwords.argv_words(list(overrides or []), "trainer overrides")
    if image:
        engine.image_name(image, "--image")  # the kubelet pulls it; also in the header comments: one line
    loaded = load_recipe(recipe)
    # the pods look --recipe up in the image's recipes/: a path, or a name that is a folder here (./myrec), is not there
    if "/" in recipe or recipe.startswith(".") or loaded.folder != (RECIPES / recipe).resolve():
        raise DockyardError(f"--recipe {recipe!r} is the folder {loaded.folder} on this host: on Kubernetes the pods "
                            "run the image's recipes; give a recipe name (`invoke recipes`), or build the image with "
                            "your recipe folder in recipes/")
    node.check_nodes(nodes, gpus_per_node)
    # what the trainer would refuse on every node, the batch split over all their processes included
    preflight.check_overrides(loaded, overrides or [], nodes * (gpus_per_node or node.CPU_NPROC),
                              liger_absent=preflight.liger_absent(gpus_per_node > 0))
    preflight.check_on_gpus(loaded, gpus_per_node > 0, "give --gpus-per-node (the nodes' GPUs)")
    node.check_restarts(max_restarts, join_timeout)
    overrides = [*(overrides or []), *_inputs_from_settings(settings, overrides or [], runs_claim)]
    if resume and not run_id:
        raise DockyardError("--resume needs --run-id: the run to continue (the --run-id its manifests were written "
                            f"with; its folder is on the claim {runs_claim})")
    run_id = run_id or default_run_id(recipe)
    if not (NAME.fullmatch(run_id) and len(run_id) <= NAME_MAX):
        raise DockyardError(f"--run-id {run_id!r}: on Kubernetes it names the Job and its pods: use at most "
                            f"{NAME_MAX} lowercase letters, digits and '-', starting and ending with a letter or digit")
    if not (NAME.fullmatch(runs_claim) and len(runs_claim) <= 63):
        raise DockyardError(f"--runs-claim {runs_claim!r}: a PersistentVolumeClaim name (lowercase letters, digits, '-')")
    if not QUANTITY.fullmatch(shm):
        raise DockyardError(f"--shm {shm!r}: a Kubernetes quantity such as 16Gi or 512Mi")
    if gpus_per_node and _bytes(shm) < SHM_LEAST:  # `--shm=16`, meant as 16Gi, is 16 bytes
        raise DockyardError(f"--shm {shm!r} is {_bytes(shm):,.0f} bytes: the GPU pods' /dev/shm, where NCCL keeps the "
                            f"buffers of the GPUs of a node, needs {SHM_LEAST >> 20}Mi at the least (Docker's default "
                            "of 64 MB already fails it: a bus error, or posix_fallocate failed); a number without a unit "
                            "is bytes: give 16Gi or so")
    if _bytes(shm) > SHM_MOST:
        least = f"{SHM_LEAST >> 20}Mi to " if gpus_per_node else "at most "
        raise DockyardError(f"--shm {shm!r} is {_bytes(shm):,.0f} bytes, more memory than any node holds (the /dev/shm "
                            f"is memory-backed: it counts against the pod's memory): give {least}{SHM_MOST >> 40}Ti, "
                            "e.g. 16Gi")
    if not image:
        image = variants.tag(settings, node.cluster_variant(settings, variant, gpus_per_node))
    return Spec(recipe=recipe, nodes=nodes, gpus=gpus_per_node, nproc=gpus_per_node or node.CPU_NPROC, image=image,
                run_id=run_id, claim=runs_claim, shm=shm, overrides=list(overrides or []), max_restarts=max_restarts,
                resume=resume, join_timeout=join_timeout, compile_cache=bool(settings.compile_cache.strip()))


def default_run_id(recipe: str) -> str:
    """<recipe>-<time> as a Kubernetes name (NAME, NAME_MAX): a recipe named with capitals, '_' or '.' (or a long name)
    made a default refused as if the user had given it as --run-id."""
    when = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    stem = re.sub(r"[^a-z0-9]+", "-", recipe.lower()).strip("-")[:NAME_MAX - len(when) - 1].strip("-")
    return f"{stem or 'run'}-{when}"


# Where the pods find a model or data of the user's: on the claim, or in the image. `invoke run` mounts a host path
# (a flag, an override, the data/model settings) read-only into its container; nothing of this host reaches a pod.
POD_INPUTS = (node.RUNS_INSIDE + "/", node.WORKDIR + "/")


def _inputs_from_settings(settings: Settings, overrides: list[str], claim: str) -> list[str]:
    """The data/model settings (invoke.yaml, INVOKE_DOCKYARD_*) as the trainer overrides the pods are given: left out,
    the pods trained on the recipe's sample. Every input must be a path the pods see: a host path, or a hub id (the
    pods are offline with an empty Hugging Face cache), would be missing in every pod once it was scheduled."""
    given = inputs.override_values(overrides)
    added: list[str] = []
    for key, value, where in inputs.resolved(settings, overrides):
        if not posixpath.normpath(value).startswith(POD_INPUTS):
            raise DockyardError(f"{where} {value}: the pods see neither this host's files nor its Hugging Face cache, "
                                f"only the image and the claim {claim} (mounted at {node.RUNS_INSIDE}): copy it onto "
                                f"the claim and give -- --{key} {node.RUNS_INSIDE}/PATH_ON_THE_CLAIM")
        if key not in given:
            added += [f"--{key}", posixpath.normpath(value)]
    scriptwords.argv_words(added, "the data/model settings")
    return added


def _volumes(s: Spec) -> tuple[list[dict], list[dict]]:
    volumes = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": s.shm}},
               {"name": "runs", "persistentVolumeClaim": {"claimName": s.claim}},
               {"name": "cache", "emptyDir": {}}]  # datasets and Hugging Face write their caches (HF_HOME) here
    mounts = [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "runs", "mountPath": node.RUNS_INSIDE},
              {"name": "cache", "mountPath": f"{node.WORKSPACE}/.cache"}]
    return volumes, mounts


def _resources(s: Spec) -> dict:
    return {"limits": {"nvidia.com/gpu": s.gpus}} if s.gpus else {}


SECURITY = {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}  # the image's `dockyard` user


# What a pod advertises to the others: its own address (the reason --local-addr is given at all: a container's
# hostname can resolve to loopback, and gloo then connects there).
POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _env(s: Spec) -> list[dict]:
    env = {**node.container_env(), envvars.IMAGE_REF: s.image}
    if s.compile_cache:  # on the claim, for the next Job: a new pod's /tmp starts empty
        env |= node.compile_in_runs_env()
    if not s.gpus:
        env["DS_ACCELERATOR"] = "cpu"  # CPU pods, whatever the image: a CUDA image's trainer would look for a GPU
    return [*({"name": k, "value": v} for k, v in env.items()), POD_IP]


def _command(s: Spec, *, index: str, nnodes: str | int, nproc: str | int, endpoint: str) -> str:
    return node.node_command(index=index, nnodes=nnodes, nproc=nproc, endpoint=endpoint, run_id=s.run_id,
                             local_addr="$POD_IP", entry=s.entry(), max_restarts=s.max_restarts,
                             join_timeout=s.join_timeout)


def job_manifests(s: Spec) -> list[dict]:
    """The operator-free form: [headless Service, Indexed Job]."""
    command = _command(s, index="$JOB_COMPLETION_INDEX", nnodes=s.nodes, nproc=s.nproc,
                       endpoint=f"{s.name}-0.{s.name}:{node.PORT}")
    volumes, mounts = _volumes(s)
    labels = {"app.kubernetes.io/name": "dockyard", "dockyard/run-id": s.run_id}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": s.name, "labels": dict(labels)},
        "spec": {"clusterIP": "None",  # headless: one DNS name per pod, no load balancing
                 "publishNotReadyAddresses": True,  # pod 0's name resolves as soon as it exists
                 "selector": {"job-name": s.name},
                 "ports": [{"name": "rendezvous", "port": node.PORT}]},
    }
    container = {
        "name": "train", "image": s.image, "imagePullPolicy": "IfNotPresent", "workingDir": node.WORKDIR,
        "command": ["bash", "-c"], "args": [command],
        "env": _env(s),
        "ports": [{"name": "rendezvous", "containerPort": node.PORT}],
        "volumeMounts": mounts,
    }
    if s.gpus:
        container["resources"] = _resources(s)
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": s.name, "labels": dict(labels)},
        "spec": {"completionMode": "Indexed", "completions": s.nodes, "parallelism": s.nodes,
                 "backoffLimit": 0,  # a lost pod fails the job: resume from the last checkpoint
                 "template": {"metadata": {"labels": dict(labels)},
                              "spec": {"subdomain": s.name, "restartPolicy": "Never", "securityContext": SECURITY,
                                       "containers": [container], "volumes": volumes}}},
    }
    return [service, job]


def trainjob_manifest(s: Spec) -> dict:
    """The Kubeflow Trainer v2 form: the runtime numbers the nodes and names node 0 (PET_NODE_RANK,
    PET_MASTER_ADDR, PET_MASTER_PORT...). Left to those alone torchrun would use its static rendezvous, with no
    bound on the wait for a lost node: so each pod starts the c10d rendezvous of the Indexed Job from them, and
    explicit flags win over torchrun's PET_* defaults."""
    volumes, mounts = _volumes(s)
    command = _command(s, index="$PET_NODE_RANK", nnodes="$PET_NNODES", nproc="$PET_NPROC_PER_NODE",
                       endpoint="$PET_MASTER_ADDR:$PET_MASTER_PORT")
    trainer = {
        "image": s.image, "numNodes": s.nodes, "numProcPerNode": s.nproc,
        "command": ["bash", "-c", command],
        "env": _env(s),
    }
    if s.gpus:
        trainer["resourcesPerNode"] = _resources(s)
    node_pod = {"spec": {"template": {"spec": {
        "securityContext": SECURITY, "volumes": volumes, "containers": [{"name": "node", "volumeMounts": mounts}]}}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": s.name, "labels": {"app.kubernetes.io/name": "dockyard", "dockyard/run-id": s.run_id}},
        "spec": {"runtimeRef": {"name": RUNTIME}, "trainer": trainer,
                 "runtimePatches": [{"manager": "dockyard/invoke-k8s", "trainingRuntimeSpec": {"template": {"spec": {
                     "replicatedJobs": [{"name": "node", "template": node_pod}]}}}}]},
    }


RUN_LABEL = re.compile(r"^\s*dockyard/run-id: ['\"]?([a-z0-9-]+)['\"]?\s*$", re.M)


def _written_for(job: Path) -> str | None:
    """The run id an earlier `invoke k8s` wrote job.yaml for (its pods' label), or None (no such file, or not ours)."""
    try:  # a link or a fifo there is not read through
        fd = os.open(job, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        found = RUN_LABEL.search(f.read(1 << 20).decode(errors="replace"))
    return found.group(1) if found else None


def write(settings: Settings, *, out: str = "", **kw) -> dict[str, Path]:
    """Write job.yaml and trainjob.yaml (default folder: <jobs>/k8s/<run-id>/) and say how to apply them. Never in
    the runs folder: its containers could change the manifests before kubectl applies them."""
    s = spec(settings, **kw)
    # expanduser: the shell leaves a ~ after `=` (`--out=~/x`) as it is
    folder = (runfolder.users_folder(Path(out), caches.container_writable(settings)) if out
              else settings.path(settings.jobs_dir) / "k8s" / s.run_id)
    # named in the header comments: a newline would end the comment
    scriptwords.one_line(str(folder), "--out" if out else "the jobs_dir setting")
    caches.check_out_of_reach(settings, folder, "--out" if out else "the jobs_dir setting's folder",
                              "give --out=FOLDER outside it" if out else "set the jobs_dir setting to a folder outside "
                              "it (INVOKE_DOCKYARD_JOBS_DIR=~/jobs), or give --out=FOLDER")
    paths = {"job": folder / "job.yaml", "trainjob": folder / "trainjob.yaml"}
    docs = {"job": job_manifests(s), "trainjob": [trainjob_manifest(s)]}
    # A manifest of the user's own there is neither an earlier run's nor replaced by --resume, nor is a link to one or
    # an empty file.
    for path in paths.values():
        if locks.not_written_by(path, WRITTEN_BY) or (path.is_dir() and not path.is_symlink()):
            raise DockyardError(f"{'--out ' if out else ''}{folder} holds {path.name}, which `invoke k8s` did not write "
                                "(it writes job.yaml and trainjob.yaml there): give another --out, or move that file away")
    if s.resume and (other := _written_for(paths["job"])) not in (None, s.run_id):
        raise DockyardError(f"{folder} holds the manifests of run {other}, not of {s.run_id}: --resume would replace "
                            f"them; give --run-id={other} to continue that run, or another --out for {s.run_id}")
    if not s.resume and any(p.exists() or p.is_symlink() for p in paths.values()):
        written = " ".join(shlex.quote(str(p)) for p in paths.values())
        raise DockyardError(f"{folder} already holds the files of an earlier `invoke k8s` (job.yaml, trainjob.yaml), "
                            f"and its pods may have trained: to continue that run, add --resume; for a new run, give "
                            f"{'another --out' if out else 'another --run-id'}; if they were never applied, remove "
                            f"them first (rm {written})")
    if folder.exists() and not folder.is_dir():  # --out=job.yaml: mkdir's "File exists" said nothing of that
        raise DockyardError(f"--out {folder} is a file: give a folder, into which job.yaml and trainjob.yaml are "
                            "written")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        texts = {}
        for kind, path in paths.items():
            header = HEADER[kind].format(path=shlex.quote(str(path)), claim=s.claim, image=s.image, runtime=RUNTIME)
            texts[path.name] = header + yaml.safe_dump_all(docs[kind], sort_keys=False, width=1 << 16)
        # both or neither: a job.yaml alone (the disk filled on the second) was then "the files of an earlier invoke k8s"
        runfolder.write_all(folder, texts)  # replaces a link, never writes through one
    except OSError as e:
        raise DockyardError(f"cannot write the manifests into {folder}: {e.strerror}; "
                            f"{'' if out else runfolder.JOBS_FIX + ', or '}give --out=FOLDER") from None
    cpu = "" if s.gpus else " (CPU nodes: --gpus-per-node=G for nodes of G GPUs each)"
    print(f"run {s.run_id}: {s.nodes} node(s) × {s.nproc} process(es), image {s.image}{cpu}")
    print(f"  without an operator:   kubectl apply -f {shlex.quote(str(paths['job']))}")
    print(f"  with Kubeflow Trainer: kubectl apply -f {shlex.quote(str(paths['trainjob']))}")
    return paths
