"""A real Slurm (Debian's slurmctld, slurmd, munge) with two nodes: this host, and the air-gapped test node whose
slurmd runs in its own network namespace with its own dockerd (tests/support/slurm.py). The script is the one
`invoke slurm` writes, submitted with `sbatch` as a user would; the test node starts without the image and gets
it from the archive the script names (`invoke load` on the nodes that lack it).
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import time

import pytest

from tests.support import slurm
from tests.support.cli import invoke

pytestmark = pytest.mark.engine

STEPS = ["--max_steps", "6", "--save_steps", "3", "--per_device_train_batch_size", "4", "--max_seq_length", "64",
         "--logging_steps", "1", "--learning_rate", "3e-3", "--lr_scheduler_type", "constant"]


@pytest.fixture(scope="module")
def cluster(node, tmp_path_factory):
    assert not slurm.missing(), f"Slurm is not installed ({slurm.missing()}): .ci/run installs slurmctld slurmd munge"
    c = slurm.start(node, tmp_path_factory.mktemp("slurm") / "cluster")
    try:
        yield c
    finally:
        slurm.stop(c)


@pytest.fixture(scope="module")
def cpu_archive(cpu_image, tmp_path_factory):
    out = tmp_path_factory.mktemp("archive")
    r = invoke("save", f"--image={cpu_image}", f"--out={out}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (archive,) = out.glob("*.tar.zst")
    return archive


def test_sbatch_of_the_written_script_trains_zero2_across_both_nodes(cluster, node, cpu_image, cpu_archive, tmp_path):
    assert node.image_id(cpu_image) is None, "the test node starts without the image"
    runs = tmp_path / "runs"
    script = tmp_path / "zero2.sbatch"
    port = random.randrange(20000, 29000)  # the script's default (29500) may be taken on a busy host
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(runs), "SLURM_CONF": str(cluster.conf), "MASTER_PORT": str(port)}
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard != resource.RLIM_INFINITY:  # the test node's dockerd runs under this process's limit: say it
        env["DOCKYARD_MEMLOCK"] = str(hard)
    r = invoke("slurm", "--recipe=zero2", "--nodes=2", "--variant=cpu", f"--archive={cpu_archive}",
               f"--out={script}", "--", *STEPS, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == script.read_text(), "the script is printed as written"

    started = time.monotonic()
    sub = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], capture_output=True, text=True,
                         env={**cluster.env, **env}, timeout=900)
    job = sub.stdout.strip().split(";")[0]
    out = (runs / f"slurm-{job}.out").read_text() if job and (runs / f"slurm-{job}.out").exists() else ""
    assert sub.returncode == 0, f"sbatch: {sub.stderr}\n--- job output\n{out[-5000:]}\n{cluster.logs()}"
    print(f"sbatch --nodes=2, zero2, 6 steps, image loaded on node 2 from the archive: "
          f"{time.monotonic() - started:.1f} s")

    assert node.image_id(cpu_image), "the script loaded the image on the node that lacked it"
    run_dir = runs / f"zero2-slurm-{job}"
    m0 = json.loads((run_dir / "manifest.json").read_text())
    m1 = json.loads((run_dir / "manifest-node1.json").read_text())
    for m, rank in ((m0, 0), (m1, 1)):
        assert m["status"] == "completed" and m["node_rank"] == rank and m["nodes"] == 2 and m["world_size"] == 4
        assert m["rendezvous"]["endpoint"] == f"{node.host_addr}:{port}", "node 0's address as Slurm reaches it"
        assert m["rendezvous"]["id"] == f"zero2-slurm-{job}"
        assert m["strategy"]["in_effect"]["engine"] == "deepspeed" and m["strategy"]["in_effect"]["zero_stage"] == 2
    assert m1["rendezvous"]["local_addr"] == node.addr, "node 2 advertised its own address"
    assert m0["metrics"]["steps"] == m1["metrics"]["steps"] == 6
    assert m0["metrics"]["loss_first"] == m1["metrics"]["loss_first"]
    assert m0["metrics"]["loss_last"] < m0["metrics"]["loss_first"], "the loss fell"


# Apptainer cannot be installed here. This stand-in does what `apptainer exec` does for the script, with the
# node's Docker engine: the host's network and /etc/hosts (where this machine's name resolves to no address of
# the test network), the --bind folders, --pwd, the job's environment (with --cleanenv: the APPTAINERENV_ variables
# alone, without their prefix), the image named in the .sif file (here: a text file holding the image reference).
# It records its own arguments.
APPTAINER = r"""#!/bin/bash
echo "$*" >> "$APPTAINER_LOG"
[ "$1" = exec ] && shift
binds=()
pass='^(SLURM_|DOCKYARD_|MASTER_|RUN_ID=|NODE_ADDRS=|HF_|TORCHINDUCTOR_|TRITON_)'
while [[ $1 == --* ]]; do
  case $1 in
    --nv|--no-home) shift ;;
    --cleanenv) pass='^APPTAINERENV_'; shift ;;
    --bind) IFS=, read -ra list <<< "$2"; for b in "${list[@]}"; do binds+=(-v "$b"); done; shift 2 ;;
    --pwd) pwd=$2; shift 2 ;;
    *) echo "apptainer stand-in: unknown option $1" >&2; exit 2 ;;
  esac
done
image=$(cat "$1"); shift
envs=()
while IFS= read -r -d '' kv; do envs+=(-e "${kv#APPTAINERENV_}"); done < <(env -0 | grep -zE "$pass")
exec /usr/bin/docker run --rm --network host --ipc=host --user "$(id -u):$(id -g)" "${binds[@]}" -w "$pwd" \
  "${envs[@]}" "$image" "$@"
"""


def test_the_apptainer_script_trains_across_both_nodes(cluster, node, cpu_image, tmp_path):
    if node.image_id(cpu_image) is None:  # the test above loads it from the archive; alone, this one copies it
        save = subprocess.Popen(["/usr/bin/docker", "save", cpu_image], stdout=subprocess.PIPE)
        subprocess.run(["/usr/bin/docker", "load"], stdin=save.stdout, env=node.env, check=True, capture_output=True)
        save.stdout.close()
        save.wait()
    sif = tmp_path / "dockyard.sif"
    sif.write_text(cpu_image)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "apptainer").write_text(APPTAINER)
    (bin_ / "apptainer").chmod(0o755)
    runs, script = tmp_path / "runs", tmp_path / "app.sbatch"
    port = random.randrange(20000, 29000)
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(runs), "MASTER_PORT": str(port), "APPTAINER_LOG": str(tmp_path / "app.log"),
           "PATH": f"{bin_}:{os.environ['PATH']}", "DOCKYARD_RUN_ID": "app1"}
    # CPU nodes (the test cluster has no GPUs): two processes each, the script run as written
    r = invoke("slurm", "--recipe=zero2", "--nodes=2", "--variant=cpu", "--runtime=apptainer",
               f"--image-file={sif}", f"--out={script}", "--", *STEPS, env=env)
    assert r.returncode == 0, r.stderr
    sub = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], capture_output=True, text=True,
                         env={**cluster.env, **env}, timeout=900)
    job = sub.stdout.strip().split(";")[0]
    out = (runs / f"slurm-{job}.out").read_text() if job and (runs / f"slurm-{job}.out").exists() else ""
    assert sub.returncode == 0, f"sbatch: {sub.stderr}\n--- job output\n{out[-5000:]}\n{cluster.logs()}"
    calls = (tmp_path / "app.log").read_text().splitlines()
    assert len(calls) == 2 and all(c.startswith("exec --bind ") and str(sif) in c for c in calls)  # no GPU: no --nv
    assert all("--cleanenv" in c.split() and "--no-home" in c.split() for c in calls), "no host environment, no home"
    assert f"{os.environ['INVOKE_DOCKYARD_COMPILE_CACHE']}:/workspace/.cache/compile" in calls[0]  # the suite's own
    m0 = json.loads((runs / "app1" / "manifest.json").read_text())
    m1 = json.loads((runs / "app1" / "manifest-node1.json").read_text())
    for m, rank in ((m0, 0), (m1, 1)):
        assert m["status"] == "completed" and m["node_rank"] == rank and m["world_size"] == 4
        assert m["rendezvous"]["endpoint"] == f"{node.host_addr}:{port}" and m["rendezvous"]["id"] == "app1"
    assert m0["metrics"]["loss_last"] < m0["metrics"]["loss_first"], "the loss fell"
