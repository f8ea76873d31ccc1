"""A run folder is written by containers (issue 27): links planted in it are never followed, by the host's monitor,
summary and export, or by the trainer; a folder is claimed by one run only; a failed run is told from its manifest.
Real files, real links, real processes; the GPU readings are recorded ones fed through the NVML interface."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dockyard.common import runfolder
from dockyard.common.errors import DockyardError
from dockyard.gpus import Recorded
from dockyard.launch import monitor
from dockyard.launch import run as launch_run
from dockyard.launch import summary as launch_summary
from dockyard.train import manifest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
PNG = b"\x89PNG\r\n\x1a\n"


def _outside(tmp_path: Path, name: str) -> Path:
    """A file a container cannot reach, such as ~/.bashrc: it must keep its bytes."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    f = home / name
    f.write_text(f"# {name}: the user's own\n")
    return f


def _watch(run: Path, samples: int = 5) -> None:
    with monitor.watch(run, interval=0.001, source=Recorded.from_file(FIXTURES / "balanced.json")) as mon:
        deadline = time.monotonic() + 30
        while mon is not None and len(mon.samples) < samples and mon._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)


def test_the_monitor_replaces_planted_links_instead_of_writing_through_them(tmp_path):
    """The red-team's attack: monitor.json -> ~/.bashrc, loss.png -> ~/.ssh/authorized_keys, gpu.png -> another."""
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    targets = {name: _outside(tmp_path, f"target-of-{name}") for name in ("monitor.json", "loss.png", "gpu.png")}
    for name, target in targets.items():
        (run / name).symlink_to(target)
    _watch(run)
    for name, target in targets.items():
        assert target.read_text() == f"# {target.name}: the user's own\n", f"{name} was written through its link"
        assert not (run / name).is_symlink(), name
    assert json.loads((run / "monitor.json").read_text())["plots"] == ["gpu.png", "loss.png"]
    assert (run / "gpu.png").read_bytes()[:8] == PNG and (run / "loss.png").read_bytes()[:8] == PNG
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")], "no temporary file left behind"


def test_the_monitor_appends_and_reads_through_no_link_and_the_run_goes_on(tmp_path, capfd):
    run = tmp_path / "r1"
    run.mkdir()
    samples, metrics = _outside(tmp_path, "samples-target"), _outside(tmp_path, "metrics-target")
    metrics.write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")  # readable data the run folder must not reach
    (run / "monitor.jsonl").symlink_to(samples)
    (run / "metrics.jsonl").symlink_to(metrics)
    _watch(run)
    err = capfd.readouterr().err
    assert "sampling stopped" in err and "monitor.jsonl is a symbolic link" in err and "no loss plot" in err
    assert samples.read_text() == "# samples-target: the user's own\n"
    v = json.loads((run / "monitor.json").read_text())
    assert v["samples"] == 0 and "loss.png" not in v["plots"] and not (run / "loss.png").exists()


def test_the_trainers_files_are_never_written_or_read_through_a_link(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    targets = {name: _outside(tmp_path, f"target-of-{name}") for name in ("manifest.json", "metrics.jsonl", "train.log")}
    for name, target in targets.items():
        (run / name).symlink_to(target)
    manifest.write(run, {"run_id": "r1", "status": "failed"})
    assert json.loads((run / "manifest.json").read_text())["status"] == "failed" and not (run / "manifest.json").is_symlink()
    with pytest.raises(DockyardError, match="metrics.jsonl is a symbolic link"):
        manifest.trim_metrics(run, 2)
    with pytest.raises(DockyardError, match="metrics.jsonl is a symbolic link"):
        manifest.logged(run)
    with pytest.raises(DockyardError, match="train.log is a symbolic link"):
        runfolder.append(run, "train.log")
    for name, target in targets.items():
        assert target.read_text() == f"# {target.name}: the user's own\n", name


def test_a_planted_temporary_name_is_not_written_through_either(tmp_path):
    """The old manifest writer wrote manifest.json.tmp by name first: a link there was followed."""
    run = tmp_path / "r1"
    run.mkdir()
    target = _outside(tmp_path, "bashrc")
    (run / "manifest.json.tmp").symlink_to(target)
    manifest.write(run, {"run_id": "r1", "status": "completed"})
    assert target.read_text() == "# bashrc: the user's own\n"


def test_a_file_made_only_where_none_is_never_replaces_one_nor_follows_a_link(tmp_path):
    """runfolder.create, as a node that lost node 0 makes the run's manifest.json: node 0's own record, another
    node's made a moment before, or a planted link (to a file outside, or to none) is left as it is."""
    run = tmp_path / "r1"
    run.mkdir()
    assert runfolder.create(run, "manifest.json", '{"status": "failed"}') is True
    assert runfolder.create(run, "manifest.json", '{"status": "other"}') is False
    assert (run / "manifest.json").read_text() == '{"status": "failed"}'
    target = _outside(tmp_path, "bashrc")
    (run / "a.json").symlink_to(target)
    (run / "b.json").symlink_to(tmp_path / "home" / "made-through-a-link")
    assert runfolder.create(run, "a.json", "x") is False and runfolder.create(run, "b.json", "x") is False
    assert target.read_text() == "# bashrc: the user's own\n" and not (tmp_path / "home" / "made-through-a-link").exists()
    assert (run / "a.json").is_symlink() and sorted(p.name for p in run.iterdir()) == ["a.json", "b.json", "manifest.json"]
    (tmp_path / "linked").symlink_to(run)
    with pytest.raises(DockyardError, match="is a symbolic link"):
        runfolder.create(tmp_path / "linked", "c.json", "x")


def _create_at_once(run: str, start: multiprocessing.Event, wins: multiprocessing.Queue) -> None:
    start.wait()
    wins.put(runfolder.create(Path(run), "manifest.json", json.dumps({"by": os.getpid()}) + " " * 100_000))


def test_of_several_nodes_making_the_same_file_at_once_one_does_and_its_file_is_whole(tmp_path):
    ctx = multiprocessing.get_context("fork")
    start, wins = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_create_at_once, args=(str(tmp_path), start, wins)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(30)
    made = sorted(wins.get(timeout=5) for _ in procs)
    assert made == [False, False, False, True]
    assert json.loads((tmp_path / "manifest.json").read_text())["by"] in [p.pid for p in procs]
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"], "no temporary file left"


def test_trimming_metrics_on_resume_keeps_the_steps_before_the_checkpoint_and_skips_damage(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2}\nnot json\n[1]\n{"step": 3, "loss": 1}\n')
    manifest.trim_metrics(tmp_path, 2)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.parametrize("plant", ["link-out", "link-in", "fifo", "folder-link"])
def test_a_run_folder_holding_a_link_or_a_fifo_anywhere_is_refused(tmp_path, plant):
    run = tmp_path / "r1"
    ckpt = run / "checkpoints" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    target = _outside(tmp_path, "token")
    if plant == "link-out":
        (ckpt / "optimizer.pt").symlink_to(target)
    elif plant == "link-in":
        (run / "model").symlink_to(ckpt)
    elif plant == "fifo":
        os.mkfifo(run / "manifest.json")
    else:
        (tmp_path / "r2").symlink_to(run)
        run = tmp_path / "r2"
    with pytest.raises(DockyardError, match="symbolic link|not a regular file"):
        runfolder.check(run)


def test_resume_refuses_a_run_folder_holding_a_link_before_anything_runs(settings, tmp_path):
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    bashrc = _outside(tmp_path, ".bashrc")
    (run / "monitor.json").symlink_to(bashrc)
    with pytest.raises(DockyardError, match=r"monitor.json is a symbolic link \(to .*\.bashrc\)"):
        launch_run.new_run_dir(s, "zero2", "r1", resume=True)
    (tmp_path / "runs" / "r2").symlink_to(tmp_path / "home")
    with pytest.raises(DockyardError, match="r2 is a symbolic link"):
        launch_run.new_run_dir(s, "zero2", "r2", resume=True)
    assert bashrc.read_text() == "# .bashrc: the user's own\n"


def _claim(folder: str, marker, start, out) -> None:
    start.wait()
    try:
        runfolder.claim(Path(folder), marker)
        out.put("won")
    except DockyardError as e:
        out.put(str(e))


@pytest.mark.parametrize("marker", [None, runfolder.CLAIM])
def test_of_runs_claiming_one_folder_at_once_exactly_one_gets_it(tmp_path, marker):
    """os.mkdir (or, where the other nodes made the folder first, an O_EXCL file) decides: no exists-then-create."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(8, timeout=60), ctx.Queue()
    folder = tmp_path / "runs" / "same-id"
    if marker:
        folder.mkdir(parents=True)
        (folder / "manifest-node1.json").write_text("{}")  # node 1 was there first: not a run
    procs = [ctx.Process(target=_claim, args=(str(folder), marker, start, out), daemon=True) for _ in range(8)]
    try:
        for p in procs:
            p.start()
        results = [out.get(timeout=90) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert results.count("won") == 1
    assert all("already holds a run" in r for r in results if r != "won")
    if marker:
        (folder / "manifest-node1.json").read_text()  # the losers deleted nothing


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder of another user's is made (chown) only as root")
def test_node_0_does_not_claim_a_run_folder_another_user_made(tmp_path, monkeypatch):
    """A shared runs folder (mode 1777): another user made runs/job7 (mode 0777) before a run of two nodes with that
    --run-id started, and node 0 claimed it and trained there, in a folder whose owner may replace every file the run
    writes (its checkpoints, which a resume loads). Refused now, leaving nothing there; the user's own folder (node 1
    made it first) is claimed as before."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o1777)
    theirs = runs / "job7"
    theirs.mkdir()
    theirs.chmod(0o777)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(DockyardError) as e:
        runfolder.claim(theirs, runfolder.CLAIM)
    assert str(e.value) == (f"run folder {theirs} was made by another user (uid 65534), who can replace what a run "
                            "writes in it (its checkpoints among them): pick another --run-id, or remove that folder "
                            "first where it is a leftover of yours")
    assert os.listdir(theirs) == []
    mine = runs / "job8"
    mine.mkdir()
    (mine / "manifest-node1.json").write_text("{}")
    runfolder.claim(mine, runfolder.CLAIM)
    assert (mine / runfolder.CLAIM).is_file()


def test_a_failed_run_is_reported_from_its_manifest_whatever_it_holds(tmp_path, capsys):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "run_id": "r1", "recipe": "ddp", "status": "failed", "world_size": 2, "nodes": 1,
        "strategy": {"requested": "ddp", "in_effect": None, "peft": None},
        "metrics": {"steps": 0, "loss_first": None, "loss_last": None}, "error": "unknown setting(s): nope"}))
    with pytest.raises(DockyardError, match=r"run r1 failed: unknown setting\(s\): nope"):
        launch_summary.summarise(run)
    assert "run r1: failed · recipe ddp" in capsys.readouterr().out
    for text, says in (("{", "is not valid JSON"), ("[]", "not a manifest the trainer writes"),
                       ('{"run_id": "r1", "status": "failed", "strategy": {"in_effect": 3}}', "strategy.in_effect"),
                       ('{"run_id": "r1", "status": "failed", "metrics": {"loss_first": "x"}}', "metrics.loss_first"),
                       ('{"run_id": "r1", "status": "failed", "metrics": {"compile_cache": {"hits": []}}}',
                        "metrics.compile_cache.hits")):
        (run / "manifest.json").write_text(text)
        with pytest.raises(DockyardError, match=says):
            launch_summary.summarise(run)


def test_a_fifo_planted_as_the_manifest_does_not_hang_the_host(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    os.mkfifo(run / "manifest.json")
    result = []
    t = threading.Thread(target=lambda: result.append(pytest.raises(DockyardError, launch_summary.summarise, run)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "summarise blocked on a fifo"
    assert "not a regular file" in str(result[0].value)


def test_a_recipe_file_linked_from_outside_its_folder_is_refused(tmp_path):
    from dockyard.common import recipes
    from dockyard.settings import ROOT

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "recipe.yaml").write_text((ROOT / "recipes" / "zero2" / "recipe.yaml").read_text())
    outside = tmp_path / "elsewhere.json"
    outside.write_text((ROOT / "recipes" / "zero2" / "ds_config.json").read_text())
    (folder / "ds_config.json").symlink_to(outside)
    with pytest.raises(DockyardError, match="ds_config.json is a link to .*elsewhere.json, outside the recipe folder"):
        recipes.load_recipe(folder)
    (folder / "ds_config.json").unlink()
    (folder / "ds_config.json").write_text(outside.read_text())
    (folder / "notes").symlink_to(tmp_path)  # any file of the recipe, not only the ones it names
    with pytest.raises(DockyardError, match="notes is a link to"):
        recipes.load_recipe(folder)
    (folder / "notes").unlink()
    (folder / "copy.json").symlink_to("ds_config.json")  # a link inside the folder stays inside it
    assert recipes.load_recipe(folder).deepspeed == "ds_config.json"


def test_the_slurm_script_and_the_kubernetes_files_are_written_where_no_runs_container_can_change_them(settings, tmp_path):
    """A run's container has the runs folder (and the caches) to write: the sbatch script and the manifests written
    there by default (runs/slurm, runs/k8s) could be rewritten by code in a container, and the user's next `sbatch`
    or `kubectl apply` ran what it left. By default they go to the jobs folder, out of every mount `invoke run` gives a
    container to write; an --out inside the runs folder is refused, nothing written; a link planted in the jobs
    folder is replaced, not written through."""
    from dockyard.launch import k8s, slurm
    from dockyard.launch import run as launch_run

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs", "jobs_dir": tmp_path / "jobs"})
    argv = launch_run.docker_run_argv(s, "img", gpus=False, run_dir=tmp_path / "runs" / "r1", name="n", env={},
                                      network_host=False, interactive="", command=[], mounts=[], engine_info={},
                                      memlock="memlock=-1", compile_cache=True)
    writable = [Path(v.split(":")[0]) for flag, v in zip(argv, argv[1:], strict=False)
                if flag == "-v" and not v.endswith(":ro")]
    assert tmp_path / "runs" in writable

    (tmp_path / "jobs" / "slurm").mkdir(parents=True)
    bashrc = _outside(tmp_path, ".bashrc")
    bashrc.chmod(0o600)
    (tmp_path / "jobs" / "slurm" / "zero2-2n.sbatch").symlink_to(bashrc)
    script = slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu")
    paths = k8s.write(s, recipe="zero2", nodes=2, gpus_per_node=0, variant="cpu", run_id="r1")
    for written in (script, *paths.values()):
        assert not any(written.is_relative_to(folder) for folder in writable), (written, writable)
    assert bashrc.read_text() == "# .bashrc: the user's own\n" and bashrc.stat().st_mode & 0o777 == 0o600
    assert not script.is_symlink() and script.stat().st_mode & 0o777 == 0o755 and "srun" in script.read_text()
    assert "kind: Job" in paths["job"].read_text()

    for out in (tmp_path / "runs" / "slurm" / "x.sbatch", tmp_path / "runs" / "k8s"):
        with pytest.raises(DockyardError, match="which every run's container can write"):
            if out.suffix:
                slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu", out=str(out))
            else:
                k8s.write(s, recipe="zero2", nodes=2, gpus_per_node=0, variant="cpu", run_id="r2", out=str(out))
        assert not out.exists()
    elsewhere = tmp_path / "elsewhere"  # a link a container planted in the runs folder: the path as typed is inside
    elsewhere.mkdir()
    (tmp_path / "runs" / "planted").symlink_to(elsewhere)
    for out in (tmp_path / "runs" / "planted" / "x.sbatch", tmp_path / "runs" / "planted"):
        with pytest.raises(DockyardError, match=f"{re.escape(str(out))} is inside .*which every run's container can write"):
            if out.suffix:
                slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu", out=str(out))
            else:
                k8s.write(s, recipe="zero2", nodes=2, gpus_per_node=0, variant="cpu", run_id="r2", out=str(out))
    assert not any(elsewhere.iterdir())
    newline = s.model_copy(update={"jobs_dir": tmp_path / "a\nb"})  # printed in the lines that say how to submit
    with pytest.raises(DockyardError, match="the jobs_dir setting .* holds the control character"):
        slurm.write(newline, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu")
    with pytest.raises(DockyardError, match="the jobs_dir setting .* holds the control character"):
        k8s.write(newline, recipe="zero2", nodes=2, gpus_per_node=0, variant="cpu", run_id="r3")
    assert not (tmp_path / "a\nb").exists()
    inside = s.model_copy(update={"jobs_dir": tmp_path / "runs" / "jobs"})
    with pytest.raises(DockyardError, match="the jobs_dir setting.s script .*INVOKE_DOCKYARD_JOBS_DIR"):
        slurm.write(inside, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu")


def test_a_jobs_folder_that_cannot_be_made_names_the_setting_that_named_it(settings, tmp_path):
    """INVOKE_DOCKYARD_JOBS_DIR naming a file (or a folder this user cannot write): invoke slurm and k8s, given no
    --out, said "give --out" alone, and not which setting put the script there. Nothing is written."""
    from dockyard.launch import k8s, slurm

    (tmp_path / "file").write_text("mine\n")
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs", "jobs_dir": tmp_path / "file"})
    said = r"Not a directory; set the jobs_dir setting \(INVOKE_DOCKYARD_JOBS_DIR\) to a folder you can write, or give --out"
    with pytest.raises(DockyardError, match=said):
        slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu")
    with pytest.raises(DockyardError, match=said):
        k8s.write(s, recipe="zero2", nodes=2, gpus_per_node=0, variant="cpu", run_id="r1")
    assert (tmp_path / "file").read_text() == "mine\n"


def test_every_folder_a_container_is_given_to_write_is_refused_for_a_file_the_host_runs_later(settings, tmp_path):
    """What check_out_of_reach refused was a list of its own (the runs folder, the caches), beside the mounts
    `docker run` and Slurm's containers are given: a folder mounted read-write and left off that list would take the
    sbatch script, the Kubernetes manifests or a save's load.sh, for code in a container to change before the host
    runs them. Both now read one list (caches.writable_folders): every folder mounted read-write, by `invoke run` and
    `invoke shell` (docker -v) as by a Slurm job's containers (pyxis), is refused as --out and as the jobs_dir and
    dist_dir settings' folders, and nothing is written there."""
    from dockyard.launch import k8s, slurm
    from dockyard.transport import save as save_mod

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs", "jobs_dir": tmp_path / "jobs",
                                    "hf_cache": tmp_path / "hf", "compile_cache": str(tmp_path / "compile")})
    argv = launch_run.docker_run_argv(s, "img", gpus=False, run_dir=tmp_path / "runs" / "r1", name="n", env={},
                                      network_host=False, interactive="", command=[], mounts=[], engine_info={},
                                      memlock="memlock=-1", compile_cache=True)
    writable = {Path(v.split(":")[0]) for flag, v in zip(argv, argv[1:], strict=False)
                if flag == "-v" and not v.endswith(":ro")}
    image_file = tmp_path / "dockyard.sqsh"
    image_file.write_bytes(b"")
    text = slurm.script(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu", runtime="pyxis",
                        image_file=str(image_file))
    spec = re.search(r"--container-mounts=([^'\"\s]+)", text).group(1)  # the word ends where "$files" (fabric) is added
    pyxis = {Path(m.split(":")[0]) for m in spec.split(",") if not m.endswith(":ro")}
    assert writable == pyxis and {tmp_path / "runs", tmp_path / "hf", tmp_path / "compile"} <= writable, (writable, pyxis)

    def writes_into(job: Path) -> list:  # each writer of a file the host runs later, given `job`
        return [
            lambda: slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu",
                                out=str(job / "x.sbatch")),
            lambda: k8s.write(s, recipe="zero2", nodes=2, gpus_per_node=0, variant="cpu", run_id="r2", out=str(job)),
            lambda: slurm.write(s.model_copy(update={"jobs_dir": job}), recipe="zero2", nodes=2, gpus_per_node=0,
                                overrides=[], variant="cpu"),
            lambda: k8s.write(s.model_copy(update={"jobs_dir": job}), recipe="zero2", nodes=2, gpus_per_node=0,
                              variant="cpu", run_id="r3"),
            lambda: save_mod.save(s, image="x:1", out=str(job)),
            lambda: save_mod.save(s.model_copy(update={"dist_dir": job}), image="x:1"),
        ]

    for folder in sorted(writable):
        for refused in writes_into(folder / "jobs"):
            with pytest.raises(DockyardError, match=f"is inside {re.escape(str(folder))} .*which every run's container "
                                                    "can write"):
                refused()
        assert not (folder / "jobs").exists(), folder


def _writers_to(s, out: Path) -> list:
    """Each command that writes a file the host hands on later, given --out `out`: invoke slurm, k8s and save."""
    from dockyard.launch import k8s, slurm
    from dockyard.transport import save as save_mod

    return [lambda: slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu",
                                out=str(out / "x.sbatch")),
            lambda: k8s.write(s, recipe="zero2", nodes=2, gpus_per_node=0, variant="cpu", run_id="r2", out=str(out)),
            lambda: save_mod.save(s, image="x:1", out=str(out))]


def test_an_out_through_a_link_planted_in_any_folder_a_container_writes_is_refused_not_followed(settings, tmp_path):
    """runfolder.users_folder follows the links on the way to an --out (the user's own: ~/jobs -> /scratch/jobs), but
    none inside the runs folder, where code in a container could have planted one: the path as typed is refused
    there (the branch the last stop judged dead: without it the link was followed and the script written where it
    led). The caches are mounted for containers to write as the runs folder is, and a link planted in the Hugging
    Face cache or the compile cache was followed: `invoke slurm --out=~/.cache/huggingface/x/job.sbatch` wrote the
    script wherever the container pointed x, and `invoke save --out` followed a link planted in the runs folder too.
    Now no link inside any folder a container writes is followed (one list, caches.writable_folders), by slurm, k8s
    or save, and the --out is refused as typed, nothing written; a link of one's own elsewhere is still followed."""
    from dockyard.launch import slurm

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs", "jobs_dir": tmp_path / "jobs",
                                    "hf_cache": tmp_path / "hf", "compile_cache": str(tmp_path / "compile")})
    elsewhere = tmp_path / "elsewhere"  # where a container's link leads: outside every mount
    elsewhere.mkdir()
    for folder in (tmp_path / "runs", tmp_path / "hf", tmp_path / "compile"):
        folder.mkdir()
        (folder / "planted").symlink_to(elsewhere)
        out = folder / "planted"
        for write in _writers_to(s, out):
            with pytest.raises(DockyardError, match=f"--out {re.escape(str(out))}(/x.sbatch)? is inside "
                                                    f"{re.escape(str(folder))} .*which every run's container can write"):
                write()
        assert not any(elsewhere.iterdir()), folder
    mine = tmp_path / "mine"  # the user's own link to a folder of theirs: followed
    mine.symlink_to(elsewhere)
    script = slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu",
                         out=str(mine / "x.sbatch"))
    assert script == elsewhere / "x.sbatch" and script.is_file()


@pytest.mark.parametrize("aliased", ["the settings", "the --out"])
def test_an_out_through_a_planted_link_is_refused_whichever_route_names_the_folder_a_container_writes(
        settings, tmp_path, aliased):
    """users_folder told an --out inside a folder a container writes by comparing the path as typed with the setting
    as written: where the two named that folder by different routes (the runs folder resolved, /nfs/home/u/proj/runs,
    and --out=~/proj/runs/x/job.sbatch with ~ a link to /nfs/home/u; hf_cache=~/.cache/huggingface with ~/.cache a
    link to /scratch/cache, and the --out typed through /scratch), it missed, followed the link a container planted
    at x, and the script was written where x led. Each folder is here reached through a link of the user's own
    (alias -> real), the settings written one way and the --out typed the other: refused by slurm, k8s and save,
    nothing written where the planted link leads."""
    real, alias = tmp_path / "real", tmp_path / "alias"
    real.mkdir()
    alias.symlink_to(real)
    named, typed = (alias, real) if aliased == "the settings" else (real, alias)
    s = settings.model_copy(update={"runs_dir": named / "runs", "jobs_dir": tmp_path / "jobs",
                                    "hf_cache": named / "hf", "compile_cache": str(named / "compile")})
    elsewhere = tmp_path / "elsewhere"  # where a container's link leads: outside every mount
    elsewhere.mkdir()
    for folder in ("runs", "hf", "compile"):
        (real / folder).mkdir()
        (real / folder / "planted").symlink_to(elsewhere)
        out = typed / folder / "planted"
        for write in _writers_to(s, out):
            with pytest.raises(DockyardError, match=f"is inside {re.escape(str(named / folder))} .*which every run's "
                                                    "container can write"):
                write()
        assert not any(elsewhere.iterdir()), folder



def test_a_link_of_ones_own_to_an_entry_a_container_replaced_with_a_link_is_refused_not_followed(settings, tmp_path):
    """A user's own link to an entry of the runs folder (~/latest -> runs/exp1, a common habit), where code in a
    container replaced exp1 with a link of its own: the path was resolved through both links at once (realpath), the
    runs folder never seen on the way, and slurm, k8s and save wrote where the planted link led; the jobs_dir setting
    through it was taken too. The links are now followed one at a time, and the path stops inside the runs folder."""
    from dockyard.launch import caches

    runs, home, elsewhere = tmp_path / "runs", tmp_path / "home", tmp_path / "elsewhere"
    for folder in (runs, home, elsewhere):
        folder.mkdir()
    (runs / "exp1").symlink_to(elsewhere)  # planted by a run's container
    (home / "latest").symlink_to(runs / "exp1")  # the user's own
    s = settings.model_copy(update={"runs_dir": runs, "jobs_dir": tmp_path / "jobs", "hf_cache": tmp_path / "hf",
                                    "compile_cache": str(tmp_path / "compile")})
    for write in _writers_to(s, home / "latest"):
        with pytest.raises(DockyardError, match=f"is inside {re.escape(str(runs))} .*which every run's container can"):
            write()
    with pytest.raises(DockyardError, match=f"jobs_dir .* is inside {re.escape(str(runs))} "):
        caches.check_out_of_reach(s, home / "latest" / "jobs", "the jobs_dir setting", "set another")
    assert not any(elsewhere.iterdir())
    (home / "mine").symlink_to(elsewhere)  # a link of one's own that passes no such folder is followed as before
    assert runfolder.users_folder(home / "mine" / "x", caches.container_writable(s)) == elsewhere / "x"

@contextlib.contextmanager
def bind_mounted(folder: Path, at: Path):
    """`folder` mounted a second time at `at` (a bind mount: the same folder under another name, as a second mount of
    /home or of a scratch filesystem gives it), unmounted after."""
    at.mkdir()
    subprocess.run(["mount", "--bind", str(folder), str(at)], check=True, capture_output=True)
    try:
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=True, capture_output=True)


def test_an_out_through_a_second_mount_of_a_folder_a_container_writes_is_refused(settings, tmp_path):
    """A folder a run's container writes was known by its path, as written or resolved: the same folder reached
    through a second mount point (a bind mount of it, or of a folder above it: /home mounted again at /mnt/home) was
    another path, and slurm, k8s and save wrote the sbatch script, the manifests or load.sh there, or through a link
    a container planted there; the jobs_dir setting through it was taken too. A folder is now known also by what it is
    (its device and inode), on the way to the path: refused, nothing written; a second mount of a folder of one's own
    is written through as before."""
    from dockyard.launch import caches, slurm

    real, elsewhere = tmp_path / "real", tmp_path / "elsewhere"  # elsewhere: where a container's link leads
    real.mkdir()
    elsewhere.mkdir()
    s = settings.model_copy(update={"runs_dir": real / "runs", "jobs_dir": tmp_path / "jobs", "hf_cache": real / "hf",
                                    "compile_cache": str(real / "compile")})
    for folder in ("runs", "hf", "compile"):
        (real / folder).mkdir()
        (real / folder / "planted").symlink_to(elsewhere)
    with bind_mounted(real, tmp_path / "again"), bind_mounted(real / "runs", tmp_path / "runs-again"):
        for out in [tmp_path / "again" / f / name for f in ("runs", "hf", "compile") for name in ("planted", "jobs")] \
                + [tmp_path / "runs-again" / "planted", tmp_path / "runs-again" / "jobs"]:
            for write in _writers_to(s, out):
                with pytest.raises(DockyardError, match=f"--out {re.escape(str(out))}(/x.sbatch)? is inside .*which "
                                                        "every run's container can write"):
                    write()
        with pytest.raises(DockyardError, match=f"jobs_dir .* is inside {re.escape(str(real / 'runs'))} "):
            caches.check_out_of_reach(s, tmp_path / "runs-again" / "jobs", "the jobs_dir setting", "set another")
        assert not any(elsewhere.iterdir()) and not any((real / f / "jobs").exists() for f in ("runs", "hf", "compile"))
        with bind_mounted(elsewhere, tmp_path / "mine"):  # one's own folder, mounted twice: written through
            script = slurm.write(s, recipe="zero2", nodes=2, gpus_per_node=0, overrides=[], variant="cpu",
                                 out=str(tmp_path / "mine" / "x.sbatch"))
            assert script == tmp_path / "mine" / "x.sbatch" and (elsewhere / "x.sbatch").is_file()


def test_a_setting_whose_dotdot_follows_a_link_planted_in_a_folder_a_container_writes_is_refused(settings, tmp_path):
    """A jobs_dir or dist_dir setting through the runs folder and out again (runs/exp1/../../jobs): the file is opened
    as the kernel reads its path, `..` taken after the link before it, so a link a container planted at exp1 chose
    where `..` led; the check read the path with its `..` struck out as written (inside no such folder) and resolved
    (where the planted link led: no such folder either), and slurm, k8s and save wrote the sbatch script, the
    manifests and load.sh where the container chose. check_out_of_reach now walks the path as the kernel does, from /
    a link at a time, as well as as written, one check where there were three: refused as soon as it enters the
    folder, nothing written."""
    from dockyard.launch import k8s, slurm
    from dockyard.transport import save as save_mod

    runs, chosen = tmp_path / "runs", tmp_path / "chosen"  # chosen: where a container's link has `..` lead
    (chosen / "a" / "b").mkdir(parents=True)
    runs.mkdir()
    (runs / "exp1").symlink_to(chosen / "a" / "b")  # planted by a run's container
    s = settings.model_copy(update={"runs_dir": runs, "hf_cache": tmp_path / "hf",
                                    "compile_cache": str(tmp_path / "compile")})
    through = runs / "exp1" / ".." / ".." / "jobs"
    for write in [
        lambda: slurm.write(s.model_copy(update={"jobs_dir": through}), recipe="zero2", nodes=2, gpus_per_node=0,
                            overrides=[], variant="cpu"),
        lambda: k8s.write(s.model_copy(update={"jobs_dir": through}), recipe="zero2", nodes=2, gpus_per_node=0,
                          variant="cpu", run_id="r3"),
        lambda: save_mod.save(s.model_copy(update={"dist_dir": through}), image="x:1"),
    ]:
        with pytest.raises(DockyardError, match=f"is inside {re.escape(str(runs))} .*which every run's container can"):
            write()
    assert not (chosen / "jobs").exists() and not (tmp_path / "jobs").exists()
    # out of the folder itself by `..` is its parent, which no container changes: taken (it was said to be inside runs)
    beside = runs / ".." / "jobs"
    slurm.write(s.model_copy(update={"jobs_dir": beside}), recipe="zero2", nodes=2, gpus_per_node=0, overrides=[],
                variant="cpu")
    assert [f.suffix for f in (tmp_path / "jobs" / "slurm").iterdir()] == [".sbatch"]


def test_the_settings_a_resume_takes_again_are_read_as_untrusted(tmp_path):
    """overrides.json (what the run was given after `--`, which --resume trains with again) sits in a folder every
    run's container can write: a link is not followed, and anything but the trainer's shape is refused by name."""
    run = tmp_path / "run"
    run.mkdir()
    assert runfolder.saved_overrides(run) == {}  # a run from before it was kept: the settings given now alone
    runfolder.save_overrides(run, {"max_steps": 60, "gradient_checkpointing_kwargs": {"use_reentrant": False}})
    assert runfolder.saved_overrides(run) == {"max_steps": 60, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    secret = _outside(tmp_path, "settings.json")
    secret.write_text('{"max_steps": 1}')
    for planted in ("[1, 2]", '{"max steps": 1}', "not json", "[" * 100000):
        (run / runfolder.OVERRIDES).write_text(planted)
        with pytest.raises(DockyardError, match=r"overrides.json is not the list of settings the trainer wrote; remove"):
            runfolder.saved_overrides(run)
    (run / runfolder.OVERRIDES).unlink()
    (run / runfolder.OVERRIDES).symlink_to(secret)
    with pytest.raises(DockyardError, match="overrides.json is not the list of settings"):
        runfolder.saved_overrides(run)
    (run / runfolder.OVERRIDES).unlink()  # gone: the run's own, as its manifest records them, not the defaults
    (run / runfolder.MANIFEST).write_text(json.dumps({"run_id": "r", "status": "completed", "overrides": {"lr": 1}}))
    assert runfolder.saved_overrides(run) == {"lr": 1}
