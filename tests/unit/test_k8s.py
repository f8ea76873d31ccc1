"""`invoke k8s`: the Indexed Job + headless Service and the Kubeflow Trainer v2 TrainJob.

No cluster can run here (no kind/k3d without registry images). So the manifests are validated offline with
maintained packages: `kubernetes-validate` (the Kubernetes 1.37 JSON schemas, strict: unknown fields are errors)
for the Service and Job, and the `kubeflow-trainer-api` models for the TrainJob. Each pod's command is run
under bash with a stand-in `torchrun` that records its arguments and the environment the trainer reads.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

from dockyard.common.errors import DockyardError
from dockyard.launch import k8s
from tests.support.cli import invoke

K8S_VERSION = "1.37"
TORCHRUN = """#!/bin/bash
python3 -c 'import json, os, sys; print(json.dumps({"argv": sys.argv[1:], "rank": os.environ.get("DOCKYARD_NODE_RANK"),
  "rdzv": json.loads(os.environ.get("DOCKYARD_RENDEZVOUS", "null"))}))' "$@"
"""


def _spec(settings, **kw):
    args = {"recipe": "zero2", "nodes": 3, "gpus_per_node": 8, "run_id": "exp1",
            "overrides": ["--max_steps", "100", "--learning_rate", "1e-4"], **kw}
    return k8s.spec(settings, **args)


def _stand_in(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "torchrun").write_text(TORCHRUN)
    (tmp_path / "torchrun").chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def _pod(command: list[str], env: dict[str, str]) -> dict:
    p = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("gpus", [8, 0])
def test_the_job_and_service_validate_against_the_kubernetes_schema(settings, gpus):
    for doc in k8s.job_manifests(_spec(settings, gpus_per_node=gpus)):
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def test_the_schema_check_can_fail(settings):
    """The validator really reads the fields: a misspelt one is an error."""
    _, job = k8s.job_manifests(_spec(settings))
    job["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_each_pod_starts_torchrun_with_pod_0_hosting_the_rendezvous(settings, tmp_path):
    svc, job = k8s.job_manifests(_spec(settings))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert pod["subdomain"] == svc["metadata"]["name"] and svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    endpoint = f"{job['metadata']['name']}-0.{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    env = _stand_in(tmp_path)
    for index in range(3):
        got = _pod([*container["command"], *container["args"]],
                   {**env, "JOB_COMPLETION_INDEX": str(index), "POD_IP": f"10.1.0.{index + 5}"})
        argv = got["argv"]
        assert f"--rdzv-endpoint={endpoint}" in argv and "--rdzv-id=exp1" in argv and "--nnodes=3" in argv
        assert f"--rdzv-conf=is_host={int(index == 0)},join_timeout=120" in argv, "pod 0 hosts the store"
        assert f"--local-addr=10.1.0.{index + 5}" in argv, "each pod advertises its own IP, not loopback"
        assert "--nproc-per-node=8" in argv
        assert argv[argv.index("-m"):] == ["-m", "dockyard.train", "--recipe", "zero2", "--run-dir",
                                           "/workspace/runs/exp1", "--", "--max_steps", "100", "--learning_rate", "1e-4"]
        assert got["rank"] == str(index)
        assert got["rdzv"] == {"backend": "c10d", "endpoint": endpoint, "id": "exp1", "join_timeout": 120,
                               "local_addr": f"10.1.0.{index + 5}"}


def _mounts(pod_spec: dict, mounts: list[dict]) -> dict[str, dict]:
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in mounts}


def test_gpus_shm_and_the_shared_run_folder_are_in_the_pod(settings):
    _, job = k8s.job_manifests(_spec(settings, shm="32Gi", runs_claim="team-runs"))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    by_path = _mounts(pod, container["volumeMounts"])
    assert by_path["/dev/shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert by_path["/workspace/runs"]["persistentVolumeClaim"]["claimName"] == "team-runs"
    assert container["image"].endswith("-cu132"), "GPU nodes get the newest CUDA variant"
    _, cpu_job = k8s.job_manifests(_spec(settings, gpus_per_node=0))
    (cpu,) = cpu_job["spec"]["template"]["spec"]["containers"]
    assert "resources" not in cpu and cpu["image"].endswith("-cpu") and "--nproc-per-node=2" in cpu["args"][0]


def test_the_trainjob_is_a_valid_trainer_v2_object_and_loses_nothing(settings):
    doc = k8s.trainjob_manifest(_spec(settings))
    model = TrainerV1alpha1TrainJob.from_dict(doc)
    assert model.to_dict() == doc, "every field is one the TrainJob API knows (unknown ones would be dropped)"
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and model.spec.runtime_ref.name == "torch-distributed"
    t = model.spec.trainer
    assert t.num_nodes == 3 and t.num_proc_per_node == 8 and t.resources_per_node.limits["nvidia.com/gpu"].actual_instance == 8
    (patch,) = doc["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    by_path = _mounts(pod, pod["containers"][0]["volumeMounts"])
    assert by_path["/dev/shm"]["emptyDir"]["medium"] == "Memory"
    assert by_path["/workspace/runs"]["persistentVolumeClaim"]["claimName"] == "dockyard-runs"
    bad = json.loads(json.dumps(doc))
    bad["spec"]["trainer"]["numNodes"] = "three"
    with pytest.raises(ValueError):
        TrainerV1alpha1TrainJob.from_dict(bad)


def test_resume_reaches_the_trainer_not_its_overrides(settings, tmp_path):
    _, job = k8s.job_manifests(_spec(settings, resume=True))
    got = _pod(["bash", "-c", job["spec"]["template"]["spec"]["containers"][0]["args"][0]],
               {**_stand_in(tmp_path), "JOB_COMPLETION_INDEX": "1", "POD_IP": "10.1.0.6"})
    assert got["argv"][got["argv"].index("--run-dir") + 2:] == ["--resume", "--", "--max_steps", "100",
                                                                 "--learning_rate", "1e-4"]
    t = k8s.trainjob_manifest(_spec(settings, resume=True))["spec"]["trainer"]
    assert "--run-dir /workspace/runs/exp1 --resume --" in t["command"][2]


def test_resume_needs_the_run_id_it_continues(settings, tmp_path):
    """Once taken: manifests for a new timestamp id with --resume, whose pods then failed (no such run folder)."""
    with pytest.raises(DockyardError, match="--resume needs --run-id"):
        k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, resume=True, out=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists(), "nothing written"


def test_the_files_of_a_run_are_written_again_only_to_continue_it(settings, tmp_path):
    """The same --run-id again rewrote the files of a Job that may have trained, without a word; its pods then
    stopped on the run folder they found (the trainer continues a run only with --resume)."""
    out = str(tmp_path / "out")
    k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="exp1", out=out)
    first = (tmp_path / "out" / "job.yaml").read_text()
    with pytest.raises(DockyardError, match="already holds the files of an earlier `invoke k8s`.*add --resume; for a "
                                            "new run, give another --out; .*remove them first \\(rm .*/out/job.yaml "
                                            ".*/out/trainjob.yaml\\)"):
        k8s.write(settings, recipe="ddp", nodes=4, gpus_per_node=0, run_id="exp1", out=out)
    assert (tmp_path / "out" / "job.yaml").read_text() == first, "nothing rewritten"
    k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="exp1", out=out, resume=True)
    assert "--resume" in (tmp_path / "out" / "job.yaml").read_text()
    # --resume of another run into that folder replaced exp1's manifests
    resumed = (tmp_path / "out" / "job.yaml").read_text()
    with pytest.raises(DockyardError, match="holds the manifests of run exp1, not of exp2: --resume would replace them; "
                                            "give --run-id=exp1 to continue that run, or another --out for exp2"):
        k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="exp2", out=out, resume=True)
    assert (tmp_path / "out" / "job.yaml").read_text() == resumed, "nothing rewritten"


@pytest.mark.parametrize("resume", [False, True])
def test_a_disk_that_fills_while_the_manifests_are_written_leaves_the_folder_as_it_was(settings, tmp_path,
                                                                                      monkeypatch, resume):
    """The two files were written one after the other: where the disk filled on trainjob.yaml, job.yaml stayed
    alone (the next `invoke k8s` took it for an earlier run's files; with --resume, a job.yaml of the new settings
    beside the old trainjob.yaml). Now both are written aside first: a write that fails leaves the folder as it was."""
    out = tmp_path / "out"
    if resume:
        k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="exp1", out=str(out))
    before = {p.name: p.read_bytes() for p in out.iterdir()} if out.exists() else {}
    real_open = os.open

    def full_on_the_second(path, flags, *args, **kw):  # the disk fills as trainjob.yaml is written
        if "trainjob.yaml" in str(path) and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", full_on_the_second)
    with pytest.raises(DockyardError, match="cannot write the manifests into .*: No space left on device"):
        k8s.write(settings, recipe="ddp", nodes=4, gpus_per_node=0, run_id="exp1", out=str(out), resume=resume)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "the folder as it was, nothing aside left in it"


@pytest.mark.parametrize("name", ["job.yaml", "trainjob.yaml"])
def test_a_manifest_of_the_users_own_in_the_out_folder_is_never_taken_for_ours_nor_replaced(settings, tmp_path, name):
    """`invoke k8s --out=~/k8s`, a folder holding a job.yaml of the user's own: it was "the files of an earlier
    `invoke k8s` ... to continue that run, add --resume", and --resume then replaced the user's file with ours. A
    file there that `invoke k8s` did not write is refused, with or without --resume, and left as it was."""
    out = tmp_path / "k8s"
    out.mkdir()
    (out / name).write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: mine\n")
    for resume in (False, True):
        with pytest.raises(DockyardError, match=rf"^--out {out} holds {name}, which `invoke k8s` did not write \(it "
                                                r"writes job.yaml and trainjob.yaml there\): give another --out, or "
                                                r"move that file away$"):
            k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="exp1", out=str(out), resume=resume)
        assert [p.name for p in out.iterdir()] == [name]
        assert (out / name).read_text() == "apiVersion: v1\nkind: Pod\nmetadata:\n  name: mine\n"


@pytest.mark.parametrize("kind", ["link", "empty"])
def test_a_link_to_the_users_manifest_or_an_empty_one_in_the_out_folder_is_refused_not_replaced(settings, tmp_path,
                                                                                               kind):
    """`invoke k8s --out=~/proj/deploy`, whose job.yaml links to the user's own manifest (job.yaml -> ../k8s/job.yaml)
    or is an empty file: it was "the files of an earlier `invoke k8s` ... add --resume", and --resume replaced the link
    (or the file) with ours. `invoke k8s` writes neither a link nor an empty file: each is refused, with or without
    --resume, and left as it was."""
    out = tmp_path / "deploy"
    out.mkdir()
    mine = tmp_path / "mine.yaml"
    mine.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: mine\n")
    for name in ("job.yaml", "trainjob.yaml"):
        if kind == "link":
            (out / name).symlink_to(mine)
        else:
            (out / name).touch()
        for resume in (False, True):
            with pytest.raises(DockyardError, match=rf"^--out {out} holds {name}, which `invoke k8s` did not write"):
                k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="exp1", out=str(out), resume=resume)
            assert [p.name for p in out.iterdir()] == [name]
            assert (out / name).is_symlink() if kind == "link" else (out / name).stat().st_size == 0
        (out / name).unlink()
    assert mine.read_text() == "apiVersion: v1\nkind: Pod\nmetadata:\n  name: mine\n"


def test_a_recipe_whose_name_is_no_kubernetes_name_still_gets_a_default_run_id(settings, tmp_path, monkeypatch):
    """`invoke k8s --recipe=Zero2_Long_Context_Llama` (a recipe folder of one's own in recipes/: uppercase, '_', 25
    letters) was refused as "--run-id 'Zero2_Long_Context_Llama-20261207-112233': ... use at most 40 lowercase
    letters", a flag the user never gave, for the default id made of the recipe's name. The default is now made a
    Kubernetes name (lowercase, '-' for the rest, cut to fit with its time), and the pods still run that recipe."""
    from dockyard.common import recipes

    shutil.copytree(recipes.RECIPES / "zero2", tmp_path / "Zero2_Long_Context_Llama.v2")
    monkeypatch.setattr(recipes, "RECIPES", tmp_path)
    monkeypatch.setattr(k8s, "RECIPES", tmp_path)
    s = k8s.spec(settings, recipe="Zero2_Long_Context_Llama.v2", nodes=2, gpus_per_node=0)
    assert re.fullmatch(r"zero2-long-context-llama-\d{8}-\d{6}", s.run_id), s.run_id
    assert k8s.NAME.fullmatch(s.run_id) and len(s.run_id) <= k8s.NAME_MAX
    assert "--recipe Zero2_Long_Context_Llama.v2 " in s.entry()


def test_each_trainjob_node_starts_the_same_rendezvous_from_what_the_runtime_gives(settings, tmp_path):
    """Trainer v2's torch runtime numbers the nodes and names node 0 in PET_* variables (here set by hand, as
    the runtime would: no cluster): the flags given on top of them bound the join and host the store on node 0."""
    t = k8s.trainjob_manifest(_spec(settings, max_restarts=2))["spec"]["trainer"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in t["env"]
    runtime = {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": "dockyard-exp1-node-0-0.dockyard-exp1",
               "PET_MASTER_PORT": "29400"}
    env = {**_stand_in(tmp_path), **runtime}
    for rank in range(3):
        got = _pod(t["command"], {**env, "PET_NODE_RANK": str(rank), "POD_IP": f"10.2.0.{rank + 5}"})
        argv = got["argv"]
        assert got["rank"] == str(rank)
        assert f"--rdzv-conf=is_host={int(rank == 0)},join_timeout=120" in argv, "node 0 hosts the store"
        assert "--rdzv-endpoint=dockyard-exp1-node-0-0.dockyard-exp1:29400" in argv and "--rdzv-id=exp1" in argv
        assert {"--nnodes=3", "--nproc-per-node=8", "--max-restarts=2", f"--local-addr=10.2.0.{rank + 5}"} <= set(argv)
        assert argv[argv.index("-m"):] == ["-m", "dockyard.train", "--recipe", "zero2", "--run-dir",
                                           "/workspace/runs/exp1", "--", "--max_steps", "100", "--learning_rate", "1e-4"]
        assert got["rdzv"]["local_addr"] == f"10.2.0.{rank + 5}", "the manifest records it; a lost node is named by it"


@pytest.mark.parametrize("kw,message", [
    ({"nodes": 0}, "--nodes must be at least 1"),
    ({"gpus_per_node": -1}, "--gpus-per-node must be 0"),
    ({"run_id": "Exp_1"}, "--run-id 'Exp_1'.*lowercase"),
    ({"run_id": "x" * 41}, "at most 40"),
    ({"shm": "lots"}, "--shm 'lots'.*16Gi"),
    ({"shm": "99999999999999999999999Ei"}, "a Kubernetes quantity"),  # past what the API server takes
    # a number without a unit is bytes: a 16-byte /dev/shm for NCCL, on every GPU pod
    ({"shm": "16"}, "--shm '16' is 16 bytes: .* needs 256Mi at the least .* a number without a unit is bytes"),
    ({"shm": "64M"}, "--shm '64M' is 64,000,000 bytes"),
    ({"shm": "0.1Gi"}, "--shm '0.1Gi' is 107,374,182 bytes"),
    # a /dev/shm of more memory than any node holds was written into the manifests, to fail only on the nodes
    ({"shm": "999999Ti"}, f"--shm .999999Ti. is {999999 << 40:,} bytes, more memory than any node holds .* "
                          "give 256Mi to 64Ti"),
    ({"shm": "9999999999999999999"}, "more memory than any node holds .* give 256Mi to 64Ti"),
    ({"shm": "65Ti", "gpus_per_node": 0}, "--shm '65Ti' .* give at most 64Ti"),
    ({"image": "x;$(id)"}, r"--image 'x;\$\(id\)' is not an image name"),  # written, then failed in the kubelet
    ({"image": "Registry.Local/Dockyard:1"}, "is not an image name"),  # the path is lowercase
    ({"image": "dockyard:0.1.0-été"}, "is not an image name"),  # a tag is ASCII (docker's rule): \w took it
    ({"runs_claim": "My Claim"}, "--runs-claim"),
    ({"recipe": "zero9"}, "zero9"),
    ({"max_restarts": -1}, "--max-restarts"),
])
def test_bad_values_are_refused_with_what_to_give(settings, kw, message):
    with pytest.raises(DockyardError, match=message):
        _spec(settings, **kw)


def test_shm_takes_a_quantity_of_bytes_or_of_a_unit(settings):
    assert _spec(settings, shm="17179869184").shm == "17179869184" and _spec(settings, shm="1.5Gi").shm == "1.5Gi"
    assert _spec(settings, shm="256Mi").shm == "256Mi" and _spec(settings, shm="1G").shm == "1G"
    # CPU pods: gloo and DeepSpeed's CPU collectives trained here on a /dev/shm of 4 KiB
    assert _spec(settings, shm="16", gpus_per_node=0).shm == "16"
    assert _spec(settings, shm="64Ti").shm == "64Ti" and _spec(settings, shm="2Ti").shm == "2Ti"  # the largest nodes


@pytest.mark.parametrize("image", ["dockyard:0.1.0-cu132", "registry.local:5000/team/dockyard:0.1.0-cu132",
                                   "ghcr.io/org/dockyard@sha256:" + "a" * 64, "localhost/x_y.z--w:T.1-a"])
def test_image_names_registries_take_are_taken(settings, image):
    assert _spec(settings, image=image).image == image


def test_a_recipe_folder_of_this_host_is_refused_as_the_pods_would_not_find_it(settings, tmp_path, monkeypatch):
    """Once ./myrec (a folder here, not one of recipes/) was checked and written as `--recipe myrec`, which the
    image does not have: the pods failed."""
    mine = tmp_path / "myrec"
    mine.mkdir()
    (mine / "recipe.yaml").write_text((k8s.RECIPES / "ddp" / "recipe.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    for given in ("myrec", "./myrec", str(mine), str(k8s.RECIPES / "ddp")):
        with pytest.raises(DockyardError, match=f"--recipe '{given}' is the folder .* on this host: on Kubernetes the "
                                                "pods run the image's recipes; give a recipe name"):
            k8s.write(settings, recipe=given, nodes=2, gpus_per_node=0, run_id="mine", out=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists(), "nothing written"
    assert k8s.spec(settings, recipe="ddp", nodes=2, gpus_per_node=0).recipe == "ddp"


def test_out_under_the_home_folder_is_written_there(settings, tmp_path, monkeypatch):
    """`--out=~/x`: the shell does not expand a ~ after `=`; the files once went into a folder named `~` here."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    paths = k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="home", out="~/x")
    assert paths["job"] == tmp_path / "home" / "x" / "job.yaml" and paths["job"].is_file()
    assert not (tmp_path / "~").exists()


def test_out_under_a_linked_folder_of_ones_own_is_written_through_it(settings, tmp_path):
    """`--out=~/jobs/exp` with ~/jobs -> /scratch/jobs was refused as a link planted in the runs folder."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "jobs").symlink_to(tmp_path / "scratch")
    paths = k8s.write(settings, recipe="ddp", nodes=2, gpus_per_node=0, run_id="linked", out=str(tmp_path / "jobs/x"))
    assert paths["job"] == tmp_path / "scratch" / "x" / "job.yaml" and paths["job"].is_file()


def test_invoke_k8s_writes_both_files_and_refuses_bad_values_cleanly(tmp_path):
    r = invoke("k8s", "--recipe=lora", "--nodes=2", "--gpus-per-node=4", "--run-id=lora-a", f"--out={tmp_path}",
               "--", "--max_steps", "5")
    assert r.returncode == 0, r.stderr
    assert f"kubectl apply -f {tmp_path / 'job.yaml'}" in r.stdout
    svc, job = yaml.safe_load_all((tmp_path / "job.yaml").read_text())
    (trainjob,) = yaml.safe_load_all((tmp_path / "trainjob.yaml").read_text())
    assert job["metadata"]["name"] == trainjob["metadata"]["name"] == "dockyard-lora-a"
    assert "--recipe lora" in job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "must exist, ReadWriteMany" in (tmp_path / "job.yaml").read_text(), "the file says what to create first"
    bad = invoke("k8s", "--run-id=Bad_Id", f"--out={tmp_path / 'bad'}")
    assert bad.returncode != 0 and bad.stderr.startswith("error: --run-id") and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists(), "nothing written"
    # --out naming the file of an earlier run (mkdir's "File exists" said nothing of it being a file)
    file = invoke("k8s", "--run-id=f1", f"--out={tmp_path / 'job.yaml'}")
    assert file.returncode != 0 and "Traceback" not in file.stderr
    assert f"error: --out {tmp_path / 'job.yaml'} is a file: give a folder" in file.stderr, file.stderr


def test_a_global_batch_that_does_not_split_over_the_pods_processes_is_refused_before_any_file(settings):
    """2 pods × 4 GPUs are 8 processes: a global batch of 12 does not split over them (the trainer would refuse it
    in every pod, after the job was scheduled)."""
    with pytest.raises(DockyardError, match="global_batch 12"):
        k8s.spec(settings, recipe="ddp", nodes=2, gpus_per_node=4, overrides=["--global_batch", "12"])
    assert k8s.spec(settings, recipe="ddp", nodes=2, gpus_per_node=4, overrides=["--global_batch", "16"]).nproc == 4


def test_cpu_pods_run_deepspeed_on_cpu_whatever_the_image(settings):
    """--gpus-per-node=0 with a CUDA image: its trainer (DS_ACCELERATOR=cuda) would refuse to train without a GPU in
    every pod after scheduling; CPU pods are told to use the CPU, as `invoke run --cpu` does. GPU pods are not."""
    def env_of(**kw):
        job = k8s.job_manifests(k8s.spec(settings, recipe="ddp", nodes=2, variant="cu132", **kw))[1]
        return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert env_of(gpus_per_node=0)["DS_ACCELERATOR"] == "cpu"
    assert "DS_ACCELERATOR" not in env_of(gpus_per_node=4)


def test_the_users_data_and_model_reach_the_pods_only_from_the_claim_or_the_image(settings, tmp_path):
    """`invoke run` mounts a host path (override or the data/model settings) into its container; the pods get none.
    A host path was written into every pod's command (missing there once scheduled), and the `data` setting was
    silently left out: every pod trained on the sample in the image."""
    data = tmp_path / "mine.jsonl"
    data.write_text('{"text": "x"}\n')
    with pytest.raises(DockyardError, match=rf"-- --data {data}: the pods see neither this host's files .* copy it "
                                            r"onto the claim and give -- --data /workspace/runs/"):
        _spec(settings, overrides=["--data", str(data)])
    with_setting = settings.model_copy(update={"data": str(data)})
    with pytest.raises(DockyardError, match=rf"setting data {data}: the pods see neither"):
        _spec(with_setting, overrides=[])
    with pytest.raises(DockyardError, match="-- --model Qwen/Qwen3-0.6B: the pods see neither .* Hugging Face cache"):
        _spec(settings, overrides=["--model", "Qwen/Qwen3-0.6B"])
    with pytest.raises(DockyardError, match="the claim"):
        _spec(settings, overrides=["--data=/workspace/runs/../../etc/passwd"])
    # on the claim (the override wins over the setting), or in the image: what each pod's trainer is given
    _, job = k8s.job_manifests(_spec(with_setting, overrides=["--data", "/workspace/runs/data/mine.jsonl",
                                                              "--eval_data=/opt/dockyard/data/sample.jsonl"]))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    got = _pod([*container["command"], *container["args"]],
               {**_stand_in(tmp_path), "JOB_COMPLETION_INDEX": "1", "POD_IP": "10.1.0.6"})
    assert got["argv"][got["argv"].index("--"):] == ["--", "--data", "/workspace/runs/data/mine.jsonl",
                                                     "--eval_data=/opt/dockyard/data/sample.jsonl"]
    # the settings on the claim reach every pod as its trainer's --data/--model (they were left out, without a word:
    # the pods fine-tuned the recipe's own model on the sample)
    on_claim = settings.model_copy(update={"data": "/workspace/runs/data/mine.jsonl",
                                           "model": "/workspace/runs/models/base/"})
    _, job = k8s.job_manifests(_spec(on_claim, recipe="lora", overrides=["--max_steps", "5"]))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    got = _pod([*container["command"], *container["args"]],
               {**_stand_in(tmp_path), "JOB_COMPLETION_INDEX": "0", "POD_IP": "10.1.0.5"})
    assert got["argv"][got["argv"].index("--"):] == ["--", "--max_steps", "5", "--model", "/workspace/runs/models/base",
                                                     "--data", "/workspace/runs/data/mine.jsonl"]


def test_the_join_bound_can_be_raised_for_pods_that_start_minutes_apart(settings, tmp_path):
    """A node pulling a CUDA image for the first time starts its pod minutes after pod 0, which gave up after the
    fixed 120 s (`invoke k8s` had no --join-timeout): every pod of both forms now waits the bound given."""
    s = _spec(settings, join_timeout=900)
    (container,) = k8s.job_manifests(s)[1]["spec"]["template"]["spec"]["containers"]
    env = _stand_in(tmp_path)
    got = _pod([*container["command"], *container["args"]], {**env, "JOB_COMPLETION_INDEX": "0", "POD_IP": "10.1.0.5"})
    assert "--rdzv-conf=is_host=1,join_timeout=900" in got["argv"] and got["rdzv"]["join_timeout"] == 900
    trainer = k8s.trainjob_manifest(s)["spec"]["trainer"]
    got = _pod(trainer["command"], {**env, "PET_NODE_RANK": "1", "PET_NNODES": "3", "PET_NPROC_PER_NODE": "8",
                                    "PET_MASTER_ADDR": "node-0", "PET_MASTER_PORT": "29500", "POD_IP": "10.1.0.6"})
    assert "--rdzv-conf=is_host=0,join_timeout=900" in got["argv"] and got["rdzv"]["join_timeout"] == 900
    r = invoke("k8s", "--run-id=jt", "--join-timeout=900", f"--out={tmp_path / 'out'}")
    assert r.returncode == 0 and "join_timeout=900" in (tmp_path / "out" / "job.yaml").read_text(), r.stderr


def test_the_pods_keep_compiled_kernels_on_the_claim_for_the_next_job(settings):
    """A new pod's /tmp starts empty: without a cache every Job compiled anew. Both forms name folders on the runs
    claim (the trainer makes them, for the pods' user alone: test_train_environment.py); compile_cache "" names none."""
    def env_of(s):
        job, trainjob = k8s.job_manifests(s)[1], k8s.trainjob_manifest(s)
        envs = [job["spec"]["template"]["spec"]["containers"][0]["env"], trainjob["spec"]["trainer"]["env"]]
        assert envs[0] == envs[1]
        return {e["name"]: e.get("value") for e in envs[0]}

    env = env_of(_spec(settings))
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/workspace/runs/.cache/compile/inductor"
    assert env["TRITON_CACHE_DIR"] == "/workspace/runs/.cache/compile/triton"
    off = env_of(_spec(settings.model_copy(update={"compile_cache": ""})))
    assert not {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"} & set(off)


def test_a_job_for_cpu_nodes_says_so_and_how_to_ask_for_gpus(tmp_path):
    """`invoke slurm` and `invoke k8s` without --gpus-per-node (default 0) wrote a job for CPU nodes with the cpu
    image, without a word, even where the user meant GPU nodes; with it, nothing more is said."""
    from tests.support.cli import invoke_here

    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    for task in ("slurm", "k8s"):
        cpu = invoke_here(task, "--recipe=ddp", "--nodes=2", f"--out={tmp_path / task}", env=env)
        assert cpu.returncode == 0, cpu.stderr
        assert "--gpus-per-node=G for nodes of G GPUs each" in cpu.stdout + cpu.stderr
        gpu = invoke_here(task, "--recipe=ddp", "--nodes=2", "--gpus-per-node=8", f"--out={tmp_path / task}-gpu",
                          env=env)
        assert gpu.returncode == 0 and "--gpus-per-node=G" not in gpu.stdout + gpu.stderr, gpu.stderr
