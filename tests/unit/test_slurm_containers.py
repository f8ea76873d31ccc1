"""`invoke slurm --runtime=pyxis|apptainer`: the scripts for nodes without Docker.

Neither pyxis/enroot nor Apptainer can be installed on these machines, and pyxis is a plugin of a real
cluster's srun. So the written script runs under bash with stand-ins that record what they were given:
`scontrol` (the allocation's hosts and their NodeAddr), `srun` (its options; then the command once per node with
that node's SLURM_NODEID, as Slurm does), `apptainer` (its options; then the command after the .sif) and
`torchrun` (its arguments and the environment the trainer reads). The docker runtime runs on a real Slurm in
tests/integration/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dockyard.common.errors import DockyardError
from dockyard.launch import slurm
from tests.support.data import a_step_of

SCONTROL = """#!/bin/sh
case "$2" in
  hostnames) printf 'gpu-a\\ngpu-b\\n' ;;
  node) echo "NodeName=$3 Arch=x86_64 NodeAddr=10.9.0.$([ "$3" = gpu-a ] && echo 1 || echo 2) NodeHostName=$3" ;;
esac
"""
SRUN = """#!/bin/bash
export=ALL
while [[ $1 == --* ]]; do echo "$1" >> "$LOG/srun"; [[ $1 == --export=* ]] && export=${1#--export=}; shift; done
# --export=NAMES: the task gets Slurm's SLURM_* and the named variables alone (LOG: the stand-ins')
passed=()
if [[ $export != ALL ]]; then
  IFS=, read -ra names <<< "$export"
  for v in "${names[@]}" ${!SLURM_@}; do [[ -v $v ]] && passed+=("$v=${!v}"); done
fi
for i in 0 1; do
  if [[ $export == ALL ]]; then SLURM_NODEID=$i SLURM_NNODES=2 "$@" || exit $?
  else env -i LOG="$LOG" "${passed[@]}" SLURM_NODEID=$i SLURM_NNODES=2 "$@" || exit $?; fi
done
"""
APPTAINER = """#!/bin/bash
echo "$@" >> "$LOG/apptainer"
shift  # exec
clean=""
while [[ $1 == --* ]]; do
  case $1 in --nv|--no-home) shift ;; --cleanenv) clean=1; shift ;; *) shift 2 ;; esac
done
shift  # the .sif
[[ -z $clean ]] && exec "$@"
# --cleanenv: the APPTAINERENV_ variables alone, without their prefix (PATH: the image's; LOG: the stand-ins')
passed=()
while IFS= read -r -d '' kv; do passed+=("${kv#APPTAINERENV_}"); done < <(env -0 | grep -z '^APPTAINERENV_')
exec env -i PATH="$PATH" LOG="$LOG" "${passed[@]}" "$@"
"""
TORCHRUN = """#!/bin/bash
python3 -c 'import json, os, sys; print(json.dumps({"argv": sys.argv[1:], "rank": os.environ.get("DOCKYARD_NODE_RANK"),
  "rdzv": json.loads(os.environ["DOCKYARD_RENDEZVOUS"]), "image": os.environ.get("DOCKYARD_IMAGE_REF"),
  "hf_offline": os.environ.get("HF_HUB_OFFLINE"), "host_paths": os.environ.get("DOCKYARD_HOST_PATHS"),
  "compile": [os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")],
  "accelerator": os.environ.get("DS_ACCELERATOR"), "pythonpath": os.environ.get("PYTHONPATH"),
  "fabric": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "FI_", "UCX_"))},
  "others": sorted(k for k in os.environ if k in ("LD_PRELOAD", "TORCH_NCCL_BLOCKING_WAIT", "MY_NCCL_X", "NCCL")),
  "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
  "enroot": {k: v for k, v in os.environ.items() if k in ("MELLANOX_VISIBLE_DEVICES", "XDG_RUNTIME_DIR", "TMPDIR")}}))' \
  "$@" \
  >> "$LOG/torchrun"
"""


def _run(settings, tmp_path: Path, runtime: str, image_file: str, *after: str, recipe: str = "zero2",
         overrides: tuple[str, ...] = ("--max_steps", "5", "--learning_rate", "1e-4"), stand_ins: dict | None = None,
         check: bool = True, env: dict | None = None, gpus: int = 4, **script_kw) -> dict:
    text = slurm.script(settings, recipe=recipe, nodes=2, gpus_per_node=gpus, runtime=runtime, image_file=image_file,
                        overrides=list(overrides), **script_kw)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bin_, log = tmp_path / "bin", tmp_path / "log"
    bin_.mkdir()
    log.mkdir()
    bodies = {"scontrol": SCONTROL, "srun": SRUN, "apptainer": APPTAINER, "torchrun": TORCHRUN, **(stand_ins or {})}
    for name, body in bodies.items():
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    # (inductor, imported by an earlier test of this process, sets TORCHINDUCTOR_CACHE_DIR in it)
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("DOCKYARD_RUN_ID", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env = {**inherited, "PATH": f"{bin_}:{os.environ['PATH']}",
           "LOG": str(log), "SLURM_JOB_ID": "77",
           "SLURM_JOB_NODELIST": "gpu-[a-b]", **(env or {})}
    p = subprocess.run(["bash", str(script), *after], env=env, capture_output=True, text=True, timeout=60)
    if not check:
        return {"returncode": p.returncode, "stderr": p.stderr}
    assert p.returncode == 0, p.stderr
    read = {f.name: f.read_text() for f in log.iterdir()}
    read["torchrun"] = [json.loads(line) for line in read.get("torchrun", "").splitlines()]
    # every node started (its torchrun in the container, or invoke run): the tests' loops over the nodes check something
    started = len(read["torchrun"]) if runtime != "docker" else len(read.get("invoke", "").splitlines())
    assert started == 2, f"{started} of the 2 nodes started: {read}"
    return read


def _mounts(got: dict, runtime: str) -> list[str]:
    """The container's mount list, as srun (pyxis) or apptainer (its --bind) was given it."""
    spec = next(a for a in got["srun"].split() if a.startswith("--container-mounts=")) if runtime == "pyxis" \
        else got["apptainer"].split()[3]
    return spec.removeprefix("--container-mounts=").split(",")


# A cluster whose slurm.conf sets no NodeAddr (Slurm then uses the node name) on Debian nodes, whose /etc/hosts
# maps a node's own name to 127.0.1.1: on node 0, where the batch script runs, gpu-a resolves to loopback.
NAMES_ONLY = """#!/bin/sh
case "$2" in
  hostnames) printf 'gpu-a\\ngpu-b\\n' ;;
  node) echo "NodeName=$3 Arch=x86_64 NodeAddr=$3 NodeHostName=$3" ;;
esac
"""
GETENT = """#!/bin/sh
case "$2" in
  gpu-a) echo "127.0.1.1       STREAM gpu-a" ;;
  gpu-b) echo "10.9.0.2        STREAM gpu-b" ;;
  *) exit 2 ;;
esac
"""
IP_ROUTE = """#!/bin/sh
[ "$*" = "-o route get 10.9.0.2" ] && echo "10.9.0.2 dev ens5 src 10.9.0.1 uid 1000 \\    cache " || exit 1
"""
INVOKE = """#!/bin/bash
shift 2  # -m invoke
printf '%s\\n' "$*" >> "$LOG/invoke"
"""


@pytest.mark.parametrize("runtime", ["docker", "pyxis"])
def test_node_names_that_resolve_to_loopback_on_node_0_still_give_every_node_its_address(settings, tmp_path,
                                                                                         monkeypatch, runtime):
    """With Slurm's default NodeAddr (the node name) the script passed node 0's name as --master-addr and
    --local-addr: on a node whose name resolves to 127.0.1.1 on itself, `invoke run` on node 0 refused it
    ("--master-addr gpu-a is a loopback address") and a container node 0 advertised a name gloo took as loopback."""
    invoke = tmp_path / "invoke-stand-in"
    invoke.write_text(INVOKE)
    invoke.chmod(0o755)
    monkeypatch.setattr(slurm, "INVOKE", [str(invoke), "-m", "invoke"])
    image = tmp_path / "dockyard.sqsh"
    image.write_text("")
    got = _run(settings, tmp_path, runtime, str(image) if runtime == "pyxis" else "",
               stand_ins={"scontrol": NAMES_ONLY, "getent": GETENT, "ip": IP_ROUTE})
    if runtime == "docker":
        nodes = got["invoke"].splitlines()
        assert len(nodes) == 2 and all("--master-addr=10.9.0.1 " in n for n in nodes), nodes
    else:
        for i, n in enumerate(got["torchrun"]):
            assert "--rdzv-endpoint=10.9.0.1:29500" in n["argv"] and f"--local-addr=10.9.0.{i + 1}" in n["argv"]
            assert n["rdzv"]["local_addr"] == f"10.9.0.{i + 1}"


def test_a_resume_names_the_run_it_continues_as_a_new_job_has_a_new_default_run_id(settings, tmp_path, monkeypatch):
    """`sbatch FILE --resume` (as the docs and the script said) resumed `zero2-slurm-<this new job>`: every node
    refused "--resume: no run folder .../zero2-slurm-77 to resume" after the job waited in the queue."""
    invoke = tmp_path / "invoke-stand-in"
    invoke.write_text(INVOKE)
    invoke.chmod(0o755)
    monkeypatch.setattr(slurm, "INVOKE", [str(invoke), "-m", "invoke"])
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    (tmp_path / "runs" / "zero2-slurm-40").mkdir(parents=True)
    got = _run(s, tmp_path, "docker", "", "--resume", check=False)
    assert got["returncode"] == 2 and "invoke" not in os.listdir(tmp_path / "log"), "no node started"
    assert "not this job's new zero2-slurm-77: name it, e.g. DOCKYARD_RUN_ID=zero2-slurm-40 sbatch FILE --resume" \
        in got["stderr"]
    shutil.rmtree(tmp_path / "bin")
    shutil.rmtree(tmp_path / "log")
    nodes = _run(s, tmp_path, "docker", "", "--resume", env={"DOCKYARD_RUN_ID": "zero2-slurm-40"})["invoke"].splitlines()
    assert len(nodes) == 2 and all("--run-id=zero2-slurm-40 --resume" in n for n in nodes), nodes


def test_node_0_that_finds_no_address_of_its_own_stops_the_job_saying_what_to_set(settings, tmp_path):
    image = tmp_path / "dockyard.sqsh"
    image.write_text("")
    got = _run(settings, tmp_path, "pyxis", str(image), check=False,
               stand_ins={"scontrol": NAMES_ONLY, "getent": GETENT, "ip": "#!/bin/sh\nexit 1\n"})
    assert got["returncode"] == 2 and "resolves its own name to loopback" in got["stderr"]
    assert "NodeAddr in slurm.conf" in got["stderr"]


@pytest.mark.parametrize("runtime,image_name", [("pyxis", "dockyard.sqsh"), ("apptainer", "dy.sif")])
def test_each_node_starts_torchrun_in_the_container_with_the_rendezvous_from_slurm(settings, tmp_path, runtime,
                                                                                    image_name):
    image_file = str(tmp_path / image_name)  # on the storage every node sees, as the login node sees it
    Path(image_file).write_text("")
    got = _run(settings, tmp_path, runtime, image_file, "--resume", env={"DOCKYARD_RUN_ID": "zero2-slurm-77"})
    nodes = got["torchrun"]
    assert [n["rank"] for n in nodes] == ["0", "1"]
    for i, n in enumerate(nodes):
        argv = n["argv"]
        assert "--nproc-per-node=4" in argv and "--nnodes=2" in argv
        assert "--rdzv-endpoint=10.9.0.1:29500" in argv, "node 0's NodeAddr, not its name"
        assert f"--rdzv-conf=is_host={int(i == 0)},join_timeout=120" in argv
        assert f"--local-addr=10.9.0.{i + 1}" in argv, "each node advertises its own NodeAddr"
        assert "--rdzv-id=zero2-slurm-77" in argv
        assert argv[argv.index("-m"):] == ["-m", "dockyard.train", "--recipe", "zero2", "--run-dir",
                                           "/workspace/runs/zero2-slurm-77", "--resume",
                                           "--", "--max_steps", "5", "--learning_rate", "1e-4"]
        assert n["rdzv"] == {"backend": "c10d", "endpoint": "10.9.0.1:29500", "id": "zero2-slurm-77",
                             "join_timeout": 120, "local_addr": f"10.9.0.{i + 1}"}
        assert n["image"].endswith("-cu132") and n["hf_offline"] == "1"
    runs, recipes = settings.path(settings.runs_dir), slurm.ROOT / "recipes"
    mounts = f"{runs}:/workspace/runs,"
    if runtime == "pyxis":
        srun = got["srun"].split()
        assert f"--container-image={image_file}" in srun and "--container-workdir=/opt/dockyard" in srun
        spec = next(a for a in srun if a.startswith("--container-mounts="))
        assert mounts in spec and f"{recipes}:/opt/dockyard/recipes:ro" in spec
        assert "apptainer" not in got
    else:
        calls = got["apptainer"].splitlines()
        assert len(calls) == 2 and all(c.startswith("exec --nv --bind ") and image_file in c for c in calls)
        assert mounts in calls[0] and f"{recipes}:/opt/dockyard/recipes:ro" in calls[0]
        assert "--container-image" not in got["srun"]


def test_restarts_of_the_workers_reach_every_node_in_the_container_and_through_invoke_run(settings, tmp_path):
    """invoke run and invoke k8s take --max-restarts (torchrun restarts a node's workers after a failure, from the
    last checkpoint); invoke slurm had no such flag, so a job's one failed worker ended the job. Given, it reaches
    every node's torchrun (pyxis) and every node's invoke run (docker); a negative count is refused before the
    script is written."""
    image = tmp_path / "dockyard.sqsh"
    image.write_text("")
    got = _run(settings, tmp_path, "pyxis", str(image), max_restarts=3)
    assert len(got["torchrun"]) == 2
    for n in got["torchrun"]:
        assert "--max-restarts=3" in n["argv"], n["argv"]
    assert "--max-restarts=3" in slurm.script(settings, recipe="zero2", nodes=2, gpus_per_node=4, overrides=[],
                                              max_restarts=3)
    assert "--max-restarts" not in slurm.script(settings, recipe="zero2", nodes=2, gpus_per_node=4, overrides=[])
    with pytest.raises(DockyardError, match=r"--max-restarts must be 0 or more \(got -1\)"):
        slurm.script(settings, recipe="zero2", nodes=2, gpus_per_node=4, overrides=[], max_restarts=-1)


def test_the_apptainer_container_gets_neither_the_hosts_environment_nor_its_home_but_what_the_trainer_needs(
        settings, tmp_path):
    """`apptainer exec` passes the host's whole environment and mounts the user's home: a PYTHONPATH, an LD_PRELOAD or
    anything else set where sbatch ran reached the trainer (works on my box, breaks on the cluster), and the home folder
    (~/.bashrc, ~/.ssh) was the container's to write. With --cleanenv and --no-home the trainer gets what the docker
    form gives it with -e, the job's rendezvous, the GPUs Slurm bound to the task, the interface the user named for
    NCCL and gloo (docs/multinode.md) and the fabric's settings (the next test), and nothing else."""
    image = tmp_path / "dy.sif"
    image.write_text("")
    host = {"PYTHONPATH": str(Path.home() / ".local" / "lib"), "LD_PRELOAD": "/home/u/libhack.so",
            "NCCL_SOCKET_IFNAME": "ib0", "CUDA_VISIBLE_DEVICES": "2,3", "DOCKYARD_RUN_ID": "zero2-slurm-77"}
    got = _run(settings, tmp_path, "apptainer", str(image), env=host)
    calls = got["apptainer"].splitlines()
    assert len(calls) == 2 and all("--cleanenv" in c.split() and "--no-home" in c.split() for c in calls), calls
    for i, n in enumerate(got["torchrun"]):
        assert n["pythonpath"] is None and n["others"] == [], n  # the host's, left out
        assert n["fabric"] == {"NCCL_SOCKET_IFNAME": "ib0"}, n  # the interface the user named
        assert n["rank"] == str(i) and n["rdzv"]["id"] == "zero2-slurm-77" and n["rdzv"]["local_addr"] == f"10.9.0.{i + 1}"
        assert n["image"].endswith("-cu132") and n["hf_offline"] == "1" and n["gpus"] == "2,3"
        assert n["compile"] == ["/workspace/.cache/compile/inductor", "/workspace/.cache/compile/triton"]


# The fabric's settings a user sets for an InfiniBand or EFA job (values as NCCL reads them: '=' for exact names,
# ':' for ports, ','; and a blank, quotes, $ and a newline, which must reach it as they are), and what is no such setting
FABRIC = {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_IB_GID_INDEX": "3",
          "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0", "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1",
          "UCX_TLS": "rc,sm 'x' $HOME \"y\"\nz"}
NOT_FABRIC = {"LD_PRELOAD": "/home/u/libhack.so", "TORCH_NCCL_BLOCKING_WAIT": "1", "MY_NCCL_X": "1", "NCCL": "1"}


@pytest.mark.parametrize("runtime", ["docker", "pyxis", "apptainer"])
def test_the_fabrics_settings_of_the_job_reach_the_trainer_in_every_form_and_no_other_variable(
        settings, tmp_path, monkeypatch, runtime):
    """A cluster's users set the fabric's settings in the job's environment (NCCL_IB_HCA, NCCL_NET_GDR_LEVEL,
    NCCL_IB_GID_INDEX, NCCL_DEBUG; FI_PROVIDER and FI_EFA_* on AWS EFA; UCX_* on some InfiniBand stacks). The
    Apptainer form (--cleanenv) and the docker form (each node's `invoke run`, whose docker run got -e for its own
    variables alone) left them out: a job that used InfiniBand fell back to sockets, or hung. Now every form gives
    the trainer each NCCL_*, FI_* and UCX_* variable set on the node, as it is, and no other of the host's (pyxis
    gave its container the job's whole environment, a host PYTHONPATH and LD_PRELOAD included; srun --export now
    names what crosses, as Slurm's stand-in here honours it); the user's NCCL_SOCKET_IFNAME wins over the interface
    found towards node 0, as the trainer leaves a user's own, and --iface (a flag of the command) over both; so does
    GLOO_SOCKET_IFNAME, which the containers of pyxis and Apptainer saw and the docker form's invoke run replaced. A
    one-node run's container, on a network of its own, gets none (as before)."""
    job = {**FABRIC, **NOT_FABRIC, "DOCKYARD_RUN_ID": "zero2-slurm-77"}
    for name in [k for k in os.environ if k.startswith(("NCCL_", "FI_", "UCX_"))]:  # this machine's own, if any
        monkeypatch.delenv(name)
    if runtime != "docker":
        image = tmp_path / f"dy{slurm.RUNTIMES[runtime]}"
        image.write_text("")
        # what pyxis hands enroot and its default hooks of the job's environment (pyxis: the task's, after --export):
        # 99-mellanox.sh mounts no InfiniBand device without MELLANOX_VISIBLE_DEVICES, enroot's runtime folder is
        # XDG_RUNTIME_DIR's, its temporary one TMPDIR's (the trainer's tempfile skips a folder it cannot write)
        enroot = {"MELLANOX_VISIBLE_DEVICES": "all", "XDG_RUNTIME_DIR": "/run/user/1000", "TMPDIR": "/scratch/tmp"}
        got = _run(settings, tmp_path, runtime, str(image), env={**job, **enroot, "PYTHONPATH": "/home/u/lib"})
        for n in got["torchrun"]:
            assert n["fabric"] == FABRIC and n["others"] == [] and n["pythonpath"] is None, n
            if runtime == "pyxis":
                assert n["enroot"] == enroot, n
        return
    # the docker form: each node runs `invoke run --nodes ...` in the job's environment (the script's own line, above)
    from dockyard import engine
    from dockyard.launch import multinode
    from dockyard.launch import run as launch_run
    from tests.support.cli import invoke_here
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="": {"iface": "ens5", "addr": "10.9.0.2"})
    monkeypatch.setattr(launch_run, "_image_if_there", lambda *a, **kw: {})  # no engine asked
    shown: list[tuple[list[str], dict]] = []
    monkeypatch.setattr(engine, "echo", lambda argv, env=None: shown.append((list(argv), dict(env or {}))))

    def container_env(*flags: str, env: dict) -> dict[str, str]:
        """The trainer's environment that `invoke run --dry FLAGS` shows: its docker run's -e (--native: what it adds
        to this host's)."""
        shown.clear()
        r = invoke_here("run", "--dry", "--variant=cpu", "--run-id=zero2-slurm-77", *flags,
                        env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), **env})
        assert r.returncode == 0 and len(shown) == 1, r.stderr
        argv, added = shown[0]
        return added if "--native" in flags else dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e")

    node1 = ("--nodes=2", "--node-rank=1", "--master-addr=10.9.0.1")
    got = container_env(*node1, env={**job, "NCCL_IB-HCA": "typo"})
    assert {k: v for k, v in got.items() if k.startswith(("NCCL_", "FI_", "UCX_"))} == FABRIC, got
    assert not set(got) & {*NOT_FABRIC, "NCCL_IB-HCA"} and got["GLOO_SOCKET_IFNAME"] == "ens5"
    assert container_env(*node1, "--iface=ens5", env=job)["NCCL_SOCKET_IFNAME"] == "ens5", "the flag given wins"
    assert container_env(*node1, env={**job, "GLOO_SOCKET_IFNAME": "ib0"})["GLOO_SOCKET_IFNAME"] == "ib0", "gloo's too"
    assert container_env(*node1, "--iface=ens5", env={"GLOO_SOCKET_IFNAME": "ib0"})["GLOO_SOCKET_IFNAME"] == "ens5"
    assert container_env(*node1, "--native", "--cpu", env=job)["NCCL_SOCKET_IFNAME"] == "ib0", "--native: the same"
    assert "NCCL_DEBUG" not in container_env(*node1, env={}), "nothing set, nothing passed"
    # one node: its container has its own network and none of the InfiniBand devices, which the host's names (an
    # NCCL_SOCKET_IFNAME of ib0, a cluster's login shell sets it for every job) would send NCCL looking for
    # NCCL's settings of its own transport and log, which that container is given: NCCL_P2P_DISABLE=1 is the way out
    # of a hang on GPUs whose P2P is claimed and broken (it reached no one-node run's container)
    local = {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_SHM_DISABLE": "1"}
    assert {k: v for k, v in container_env(env={**job, **local}).items()
            if k.startswith(("NCCL_", "FI_", "UCX_"))} == local


@pytest.mark.parametrize("name", ["NCCL_TOPO_FILE", "NCCL_GRAPH_FILE"])
@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_the_nccl_topology_file_of_the_job_is_mounted_where_it_names_or_the_job_stops(settings, tmp_path, runtime,
                                                                                    name):
    """NCCL_TOPO_FILE set in the job's environment reached the containers, and the file did not: NCCL warned that it
    could not open it and went on without it; NCCL_GRAPH_FILE the same, where NCCL failed as it started. The container
    runtime mounts it read-only at that path (pyxis's --container-mounts, Apptainer's --bind); one that is no file there
    stops the job in one line, no node started."""
    image = tmp_path / f"dy{slurm.RUNTIMES[runtime]}"
    image.write_text("")
    topo = tmp_path / "ndv5-topo.xml"
    topo.write_text("<system version='1'></system>\n")
    got = _run(settings, tmp_path, runtime, str(image), env={name: str(topo)})
    for n in got["torchrun"]:
        assert n["fabric"][name] == str(topo), n
    if runtime == "pyxis":
        assert f"{topo}:{topo}:ro" in _mounts(got, runtime), got["srun"]
    else:
        calls = got["apptainer"].splitlines()
        assert len(calls) == 2 and all(c.split()[:3] == ["exec", "--bind", f"{topo}:{topo}:ro"] for c in calls), calls
    for given, why in ((str(tmp_path / "missing.xml"), "no such file on "), (str(tmp_path), "no such file on "),
                       ("topo.xml", "not an absolute path,"), (f"{topo},x", "a path holding , or :")):
        shutil.rmtree(tmp_path / "bin")
        shutil.rmtree(tmp_path / "log")
        failed = _run(settings, tmp_path, runtime, str(image), env={name: given}, check=False)
        said = failed["stderr"].strip().splitlines()
        assert failed["returncode"] == 2 and len(said) == 1, failed
        assert said[0].startswith(f"dockyard: {name}={given}: {why}") and f"unset {name}" in said[0], said
        assert not (tmp_path / "log" / "torchrun").exists()
    # set but empty: NCCL opens "", which fails it for the graph file (the job stops), and is warned of for the
    # topology file (the job runs, as before)
    shutil.rmtree(tmp_path / "bin")
    shutil.rmtree(tmp_path / "log")
    if name == "NCCL_GRAPH_FILE":
        empty = _run(settings, tmp_path, runtime, str(image), env={name: ""}, check=False)
        said = empty["stderr"].strip().splitlines()
        assert empty["returncode"] == 2 and said[0].startswith(f"dockyard: {name}=: set but empty, "), empty
        assert not (tmp_path / "log" / "torchrun").exists()
    else:
        empty = _run(settings, tmp_path, runtime, str(image), env={name: ""})
        assert all(n["fabric"][name] == "" for n in empty["torchrun"]), empty


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_cpu_nodes_run_the_container_with_two_processes_each_and_deepspeed_on_the_cpu(settings, tmp_path, runtime):
    """--runtime=pyxis/apptainer without --gpus-per-node was refused: CPU nodes that run containers (and the cpu
    image on them) had only --runtime=docker."""
    image = tmp_path / f"dy{slurm.RUNTIMES[runtime]}"
    image.write_text("")
    got = _run(settings, tmp_path, runtime, str(image), gpus=0, variant="cpu")
    assert [n["rank"] for n in got["torchrun"]] == ["0", "1"]
    for n in got["torchrun"]:
        assert "--nproc-per-node=2" in n["argv"] and n["accelerator"] == "cpu" and n["image"].endswith("-cpu")
    assert "#SBATCH --gpus" not in (tmp_path / "job.sbatch").read_text(), "no GPU asked of Slurm"
    if runtime == "apptainer":
        assert all(c.startswith("exec --bind ") for c in got["apptainer"].splitlines()), "no --nv without GPUs"


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_a_recipe_folder_and_host_data_are_mounted_into_the_container_as_invoke_run_mounts_them(
        settings, tmp_path, monkeypatch, runtime):
    mine = tmp_path / "work" / "myrec"
    shutil.copytree(slurm.ROOT / "recipes" / "ddp", mine)
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "x"}\n')
    monkeypatch.chdir(mine.parent)  # `--recipe myrec`: a folder named relative to where `invoke slurm` ran
    image = tmp_path / f"dy{slurm.RUNTIMES[runtime]}"
    image.write_text("")
    got = _run(settings, tmp_path, runtime, str(image), recipe="myrec", overrides=("--data", str(data)))
    for n in got["torchrun"]:
        assert n["argv"][n["argv"].index("-m"):] == [
            "-m", "dockyard.train", "--recipe", "/workspace/recipes/myrec", "--run-dir", "/workspace/runs/myrec-slurm-77",
            "--", "--data", "/workspace/inputs/data/data.jsonl"]
        assert json.loads(n["host_paths"]) == {"/workspace/recipes/myrec": str(mine),
                                               "/workspace/inputs/data/data.jsonl": str(data)}
    mounts = _mounts(got, runtime)
    assert f"{mine}:/workspace/recipes/myrec:ro" in mounts and f"{data}:/workspace/inputs/data/data.jsonl:ro" in mounts


@pytest.mark.parametrize("kw,message", [
    ({"runtime": "pyxis", "image_file": "x.sif"}, "needs --image-file=FILE.sqsh.*enroot import"),
    ({"runtime": "apptainer", "image_file": ""}, "needs --image-file=FILE.sif.*apptainer build"),
    ({"runtime": "apptainer", "image_file": "x.sif", "archive": "a.tar.zst"}, "--archive is for --runtime=docker"),
    ({"runtime": "docker", "image_file": "x.sif"}, "--image-file is for"),
    ({"runtime": "podman"}, "use one of docker, pyxis, apptainer"),
    ({"runtime": "pyxis", "image_file": "/missing/x.sqsh"}, "--image-file /missing/x.sqsh: no such file.*enroot import"),
    ({"runtime": "apptainer", "image_file": "~/missing.sif"}, "--image-file /.*/missing.sif: no such file"),
])
def test_bad_runtime_choices_are_refused_with_what_to_give(settings, kw, message):
    kw = {"gpus_per_node": 2, **kw}
    with pytest.raises(DockyardError, match=message):
        slurm.script(settings, recipe="zero2", nodes=2, overrides=[], **kw)


@pytest.mark.parametrize("runtime,flag,name", [("docker", "archive", "x.tar.zst"), ("pyxis", "image_file", "x.sqsh"),
                                               ("apptainer", "image_file", "x.sif")])
def test_a_path_given_with_a_tilde_is_the_home_folders_in_the_check_and_in_the_script(settings, tmp_path, monkeypatch,
                                                                                      runtime, flag, name):
    """`--archive='~/x.tar.zst'` (quoted: the shell left the ~) passed the check, which expanded it, but the script
    was given <cwd>/~/x.tar.zst; `--out='~/x'` made a folder named ~ where `invoke slurm` ran."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    (home / name).write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    path = slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=2, overrides=[], runtime=runtime,
                       out="~/jobs/x.sbatch", **{flag: f"~/{name}"})
    assert path == home / "jobs" / "x.sbatch" and path.is_file() and not (cwd / "~").exists()
    text = path.read_text()
    assert {"archive": f"--file={home / name}", "image_file": f"{home / name}"}[flag] in text and "~" not in text


def test_an_archive_of_another_image_than_the_script_runs_is_refused_before_the_job_waits_in_the_queue(tmp_path):
    """A cu128 archive, the script's variant left to pick cu132 (cpu here): every node loaded the archive, found no
    image the script runs, and failed, once the job had waited its turn in the queue."""
    from tests.support.archive_sets import make_set
    from tests.support.cli import invoke_here, short_error

    job = ["slurm", "--recipe=zero2", "--nodes=2", "--variant=cpu", f"--out={tmp_path}/job.sbatch"]
    other = make_set(tmp_path, name="dockyard_0.1.0-cu128.tar.zst", tag="dockyard:0.1.0-cu128")
    short_error(invoke_here(*job, f"--archive={other.archive}"), "holds dockyard:0.1.0-cu128, not dockyard:0.1.0-cpu")
    assert not (tmp_path / "job.sbatch").exists()
    own = make_set(tmp_path, name="dockyard_0.1.0-cpu.tar.zst", tag="dockyard:0.1.0-cpu")
    r = invoke_here(*job, f"--archive={own.archive}")
    assert r.returncode == 0, r.stderr
    assert f"load --file={own.archive}" in (tmp_path / "job.sbatch").read_text()

def test_a_global_batch_that_does_not_split_over_the_jobs_processes_is_refused_before_the_script(settings):
    """2 nodes × 4 GPUs are 8 processes: a global batch of 12 does not split over them (every node's trainer would
    refuse it after the job waited in the queue)."""
    with pytest.raises(DockyardError, match="global_batch 12"):
        slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=4, overrides=["--global_batch", "12"])
    assert "--global_batch" in slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=4,
                                            overrides=["--global_batch", "16"])
    # CPU nodes run invoke run's CPU processes (2 each): 4 in all, which a global batch of 3 does not split over
    with pytest.raises(DockyardError, match="global_batch 3"):
        slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu", overrides=["--global_batch", "3"])


def test_the_join_bound_reaches_every_node_in_the_container_and_through_invoke_run(settings, tmp_path):
    """pyxis unpacks the squashfs on each node before torchrun starts: nodes minutes apart need a longer bound than
    the fixed 120 s the script had."""
    image = tmp_path / "dockyard.sqsh"
    image.write_text("")
    got = _run(settings, tmp_path, "pyxis", str(image), join_timeout=900)
    assert len(got["torchrun"]) == 2
    for n in got["torchrun"]:
        assert any(a.endswith(",join_timeout=900") for a in n["argv"]) and n["rdzv"]["join_timeout"] == 900
    assert "--join-timeout=900" in slurm.script(settings, recipe="zero2", nodes=2, gpus_per_node=4, overrides=[],
                                                join_timeout=900)


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_the_containers_keep_compiled_kernels_in_the_users_compile_cache_as_invoke_run_does(settings, tmp_path,
                                                                                          runtime):
    """A job that compiles leaves its kernels in the compile cache for the next job (a requeued or resumed one),
    mounted where `invoke run` mounts it and named to inductor and Triton; `compile_cache: ""` mounts nothing."""
    image = tmp_path / f"dy{slurm.RUNTIMES[runtime]}"
    image.write_text("")
    for cache in (tmp_path / "cc", ""):
        s = settings.model_copy(update={"compile_cache": str(cache)})
        job = tmp_path / ("with" if cache else "without")
        job.mkdir()
        got = _run(s, job, runtime, str(image))
        mounts = _mounts(got, runtime)
        inside = "/workspace/.cache/compile"
        assert [m for m in mounts if inside in m] == ([f"{cache}:{inside}"] if cache else [])
        assert f"{s.path(s.hf_cache)}:/workspace/.cache/huggingface" in mounts
        for n in got["torchrun"]:
            assert n["compile"] == ([f"{inside}/inductor", f"{inside}/triton"] if cache else [None, None])


def test_the_script_for_containers_is_written_only_once_their_caches_are_the_users_own(settings, tmp_path):
    """The nodes mount the caches as they are on the storage they share with the login node: `invoke slurm` makes
    them as the user (a missing folder would otherwise be made by the runtime, or refused), the compile cache 0700,
    and refuses one others can write before it writes the script (the jobs would execute what is compiled in it)."""
    image = tmp_path / "dy.sqsh"
    image.write_text("")
    cc, hf = tmp_path / "cc", tmp_path / "hf"
    s = settings.model_copy(update={"compile_cache": str(cc), "hf_cache": str(hf), "runs_dir": str(tmp_path / "runs")})
    kw = {"recipe": "zero2", "nodes": 2, "gpus_per_node": 2, "overrides": [], "runtime": "pyxis",
          "image_file": str(image), "out": str(tmp_path / "job.sbatch")}
    assert slurm.write(s, **kw).is_file()
    assert hf.is_dir() and cc.stat().st_mode & 0o777 == 0o700
    (tmp_path / "job.sbatch").unlink()
    cc.chmod(0o775)
    with pytest.raises(DockyardError, match=f"the compile cache {cc} can be written by others.*chmod go-w"):
        slurm.write(s, **kw)
    assert not (tmp_path / "job.sbatch").exists()


def test_an_input_given_after_the_dashes_is_the_file_it_names_where_invoke_slurm_ran(settings, tmp_path, monkeypatch):
    """`invoke slurm -- --data data/x.jsonl` kept the path as typed, and the script runs from the checkout: every
    node trained on the checkout's data/ (its sample, for data/sample.jsonl), not the user's file; a path that names
    nothing was written into the script, to fail on every node once the job had waited in the queue."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sample.jsonl").write_text(a_step_of('{"text": "mine"}'))
    monkeypatch.chdir(tmp_path)
    text = slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu",
                        overrides=["--data=data/sample.jsonl", "--max_steps", "5"])
    assert f"-- --max_steps 5 --data {tmp_path / 'data' / 'sample.jsonl'} \"${{@:n+2}}\"" in text, text
    with pytest.raises(DockyardError, match="-- --eval_data"):
        slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu",
                     overrides=["--eval_data", "nowhere/x.jsonl"])


def test_cpu_nodes_that_would_hold_gpus_a_long_recipe_name_and_a_replaced_script_are_said(settings, tmp_path, capsys):
    """--variant=cpu --gpus-per-node=4 held four GPUs a node and trained on the CPUs; a recipe folder of a 120-letter
    name made a default run id past 128 letters, refused by the script once the job had waited in the queue; a second
    recipe folder of the same name replaced the first's script without a word."""
    with pytest.raises(DockyardError, match="--variant=cpu has no CUDA.*holds 4 GPU.*leave out --gpus-per-node"):
        slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=4, overrides=[], variant="cpu")
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    long = tmp_path / "a" / ("x" * 120)
    long.mkdir(parents=True)
    (long / "recipe.yaml").write_text("# invoke run --recipe=x\nwhen: mine\nstrategy: ddp\n")
    path = slurm.write(s, recipe=str(long), nodes=2, gpus_per_node=0, overrides=[])
    run_id = next(line for line in path.read_text().splitlines() if line.startswith("export RUN_ID="))
    default = run_id.split(":-", 1)[1].split("}", 1)[0].replace("$SLURM_JOB_ID", "9" * 10)
    assert default == "x" * 64 + "-slurm-" + "9" * 10 and len(default) <= 128
    capsys.readouterr()
    same = tmp_path / "b" / ("x" * 120)
    same.mkdir(parents=True)
    (same / "recipe.yaml").write_text("# invoke run --recipe=x\nwhen: another\nstrategy: ddp\n")
    assert slurm.write(s, recipe=str(same), nodes=2, gpus_per_node=0, overrides=[]) == path
    assert f"# {path} held another script, now replaced by this one: give --out=FILE to keep both" \
        in capsys.readouterr().err
    slurm.write(s, recipe=str(same), nodes=2, gpus_per_node=0, overrides=[])
    assert "replaced" not in capsys.readouterr().err, "the same script written again replaces nothing"


def test_an_out_under_a_linked_folder_of_ones_own_is_written_through_it(settings, tmp_path):
    """`--out=~/jobs/x.sbatch` with ~/jobs -> /scratch/jobs was refused as a link planted in the runs folder."""
    (tmp_path / "scratch" / "jobs").mkdir(parents=True)
    (tmp_path / "jobs").symlink_to(tmp_path / "scratch" / "jobs")
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    path = slurm.write(s, recipe="ddp", nodes=2, gpus_per_node=0, overrides=[], out=str(tmp_path / "jobs" / "x.sbatch"))
    assert path == tmp_path / "scratch" / "jobs" / "x.sbatch" and path.is_file()


def test_the_data_and_model_settings_are_checked_and_written_into_the_script_for_every_runtime(settings, tmp_path):
    """INVOKE_DOCKYARD_DATA in the shell that ran `invoke slurm` reached the pyxis script's mounts, but the docker
    runtime's script named it nowhere: its nodes read the setting from the job's environment, where it may not be
    (they trained on the sample), and a setting naming nothing was written into the script, to fail on every node."""
    data = tmp_path / "mine.jsonl"
    data.write_text(a_step_of('{"text": "mine"}'))
    with_data = settings.model_copy(update={"data": str(data)})
    text = slurm.script(with_data, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu", overrides=["--max_steps", "5"])
    assert f"-- --max_steps 5 --data {data} \"${{@:n+2}}\"" in text, text
    # an override still wins over the setting, as in `invoke run`
    other = tmp_path / "other.jsonl"
    other.write_text(a_step_of('{"text": "other"}'))
    text = slurm.script(with_data, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu", overrides=["--data", str(other)])
    assert f"-- --data {other} \"${{@:n+2}}\"" in text and str(data) not in text
    with pytest.raises(DockyardError, match=f"setting data {tmp_path}/nowhere.jsonl: no such file or folder"):
        slurm.script(settings.model_copy(update={"data": str(tmp_path / "nowhere.jsonl")}), recipe="ddp", nodes=2,
                     gpus_per_node=0, variant="cpu", overrides=[])


@pytest.mark.parametrize("make,override,message", [
    (lambda p: p.write_text("%PDF"), ["--data", "{p}"], "unknown data file type .pdf"),
    (lambda p: p.write_text(""), ["--data", "{p}"], "holds no examples"),
    (lambda p: p.mkdir(), ["--model", "{p}"], r"not a model folder \(no config.json in it\)"),
    (None, ["--data="], "data: given no value"),
])
def test_inputs_invoke_run_refuses_are_refused_before_the_script_waits_in_the_queue(settings, tmp_path, make, override,
                                                                                   message):
    """`-- --data=` mounted the folder `invoke slurm` ran in as the data (Path("") is "."); a .pdf, an empty file or a
    folder without config.json passed, to fail on every node after the queue."""
    p = tmp_path / ("x.pdf" if "pdf" in message else "x.jsonl" if "examples" in message else "m")
    if make:
        make(p)
    with pytest.raises(DockyardError, match=message):
        slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu",
                     overrides=[w.replace("{p}", str(p)) for w in override])


def test_a_cuda_variant_for_nodes_given_no_gpus_and_a_file_not_ours_as_out_are_refused(settings, tmp_path):
    """--variant=cu128 without --gpus-per-node: the job held no GPU, and each node's `invoke run` of the CUDA image
    failed, or took the node's GPUs anyway. --out=notes.txt replaced the user's file with the script, executable."""
    with pytest.raises(DockyardError, match="--variant=cu128 runs on GPUs, and the job asks Slurm for none: give "
                                            "--gpus-per-node"):
        slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=0, overrides=[], variant="cu128")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    with pytest.raises(DockyardError, match="holds a file that is not a script `invoke slurm` wrote: give another name"):
        slurm.write(s, recipe="ddp", nodes=2, gpus_per_node=0, overrides=[], out=str(notes))
    assert notes.read_text() == "my notes\n" and notes.stat().st_mode & 0o111 == 0
    empty = tmp_path / "job.sbatch"
    empty.touch()  # an empty file made for the script is written
    assert slurm.write(s, recipe="ddp", nodes=2, gpus_per_node=0, overrides=[], out=str(empty)) == empty
    assert empty.read_text().startswith("#!/bin/bash\n# Written by `invoke slurm")


def test_a_recipe_folder_given_with_a_tilde_is_the_home_folders_as_for_invoke_run(tmp_path):
    """`invoke slurm --recipe='~/myrec'` was "unknown recipe '~/myrec'", where `invoke run` found the folder."""
    from tests.support.cli import invoke_here

    (tmp_path / "myrec").mkdir()
    (tmp_path / "myrec" / "recipe.yaml").write_text((slurm.ROOT / "recipes" / "ddp" / "recipe.yaml").read_text())
    r = invoke_here("slurm", "--recipe=~/myrec", "--nodes=2", f"--out={tmp_path}/x.sbatch",
                    env={"HOME": str(tmp_path), "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stderr
    assert f"run --recipe={tmp_path}/myrec " in (tmp_path / "x.sbatch").read_text()


def test_auto_says_the_cuda_variant_it_picks_for_the_nodes_and_the_driver_it_needs(settings, capsys):
    """The newcomer audit: `invoke slurm --gpus-per-node=8` wrote `--variant=cu132` into the script without a word,
    whatever the cluster's drivers: on nodes with CUDA 12 drivers every node refused only after the job had waited
    in the queue. auto says its pick, the driver each CUDA variant needs (variants.MIN_DRIVER), and the other one."""
    from dockyard.images import variants

    newest, oldest = variants.newest_cuda(settings), variants.oldest_cuda(settings)
    since = {v.name: variants.MIN_DRIVER[variants.cuda_version(v.cuda)[0]] for v in (newest, oldest)}
    text = slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=8, overrides=[])
    assert f"--variant={newest.name}" in text
    said = capsys.readouterr().err
    assert (f"auto → {newest.name} (CUDA {newest.cuda}) for the nodes' GPUs: every node needs an NVIDIA driver from "
            f"{since[newest.name]} on; --variant={oldest.name} (CUDA {oldest.cuda}) needs an NVIDIA driver from "
            f"{since[oldest.name]} on") in said
    slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=8, overrides=[], variant=oldest.name)
    slurm.script(settings, recipe="ddp", nodes=2, gpus_per_node=0, overrides=[])
    assert "auto →" not in capsys.readouterr().err, "a variant named, or CPU nodes: nothing to say"
