"""`invoke export` plans: the run's image and model mounted where the run saw them, an output folder never
overwritten, a missing run said plainly. Nothing runs (the export itself: tests/integration/test_export.py)."""

import json
import os
import re
import sys
from pathlib import Path

import pytest

from dockyard.common.errors import DockyardError
from dockyard.common.runfolder import fingerprint
from dockyard.launch import export

REF = "dockyard:0.0.9-cpu"  # the cpu image of an earlier version of the project: a run made with it exports with it


def _run(tmp_path, **extra):
    run = tmp_path / "runs" / "r1"
    (run / "model").mkdir(parents=True)  # what a completed run saved (its files are the exporter's to read)
    m = {"run_id": "r1", "status": "completed", "variant": "cpu", "image": {"ref": REF, "id": "sha256:x"}, **extra}
    (run / "manifest.json").write_text(json.dumps(m))
    return m, run


def _model(folder):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return {"path": str(folder), "inside": "/workspace/inputs/model", **fingerprint(folder)}


def test_export_runs_in_the_runs_image_with_its_model_mounted_read_only(settings, tmp_path):
    model = tmp_path / "model"
    m, run = _run(tmp_path, inputs={"model": _model(model)})
    argv, _ = export.export_command(settings, m, run, tmp_path / "out", merge=True)
    assert f"{model}:/workspace/inputs/model:ro" in argv and f"{tmp_path / 'out'}:/workspace/export" in argv
    assert "--gpus" not in argv
    assert argv[argv.index(REF):] == [REF, "python", "-m", "dockyard.train.export", "--run-dir",
                                      "/workspace/runs/r1", "--out", "/workspace/export", "--merge"]


def test_an_export_another_host_writes_in_a_shared_runs_folder_is_left_to_it(settings, tmp_path, monkeypatch):
    """A run folder on storage several nodes share (a multi-node run's): node B's export of a run that node A was
    exporting took A's marker for one of an export killed outright (its pid runs nothing on B) and removed the folder
    A's export was writing. B now leaves it, and says whose it is and what to do."""
    import subprocess

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    (run / "export").mkdir()
    (run / "export" / "model.safetensors").write_bytes(b"half")
    marker = subprocess.run([sys.executable, "-c", "import socket, sys; socket.gethostname = lambda: 'node-a'; "
                             "from dockyard.common import locks; print(locks.partial(__import__('pathlib').Path("
                             "sys.argv[1])))", str(run / "export")], capture_output=True, text=True, check=True,
                            cwd=Path(export.__file__).parents[2]).stdout.strip()  # its pid: a process that ended
    Path(marker).write_text("invoke export is writing export/ beside this file\n")
    monkeypatch.setattr(export, "check_image", lambda *a: None)
    monkeypatch.setattr(export.engine, "engine_info", lambda settings: {})
    monkeypatch.setattr(export.caches, "prepare", lambda *a, **kw: None)
    monkeypatch.setattr(export.engine, "run", lambda argv, **kw: pytest.fail(f"ran {argv}, after: "
                                                                              f"{sorted(os.listdir(run))}"))
    with pytest.raises(DockyardError, match=rf"^{re.escape(str(run / 'export'))} is being written by an export on "
                       rf"another host, or was left by one killed there \(its marker {re.escape(Path(marker).name)};"):
        export.export(s, run="r1")
    assert (run / "export" / "model.safetensors").read_bytes() == b"half" and Path(marker).exists()


def test_existing_output_and_missing_runs_are_refused(settings, tmp_path):
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    (run / "export").mkdir()
    with pytest.raises(DockyardError, match="already exists"):
        export.export(s, run="r1", dry=True)
    with pytest.raises(DockyardError, match=r"no run 'nope' in .*: give the id of a completed run \(the newest in "
                                               r".*: r1; `invoke runs` lists them all\)"):
        export.export(s, run="nope", dry=True)
    # --run left out, as `invoke export` alone: the same offer ("a folder under the runs folder" named none)
    with pytest.raises(DockyardError, match=r"^--run is required: the id of a completed run \(the newest in .*: r1; "):
        export.export(s, run="", dry=True)
    m, _ = _run(tmp_path / "b", inputs={"model": {"path": str(tmp_path / "gone"), "inside": "/workspace/inputs/model",
                                                  "sha256": "0" * 64}})
    with pytest.raises(DockyardError, match="is gone"):
        export.export_command(settings, m, run, tmp_path / "o", merge=False)


@pytest.mark.parametrize("status", ["failed", "running"])
def test_a_run_that_did_not_complete_is_refused_before_an_image_starts(settings, tmp_path, status):
    """A failed run's export started the image, loaded torch and was then refused by the trainer's export."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _run(tmp_path, status=status)
    with pytest.raises(DockyardError, match=f"run r1 did not complete \\(status {status}\\): it saved no model"):
        export.export(s, run="r1", dry=True)
    assert not (tmp_path / "runs" / "r1" / "export").exists()


def test_a_failed_run_is_sent_to_resume_only_where_it_saved_a_checkpoint(settings, tmp_path):
    """A run that failed on a setting before its first step was told to "continue it (invoke run --resume ...)",
    which then had no checkpoint to continue from: it is told its error and to start it again."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path, status="failed", error="unknown trainer override(s): --max_stepz\nmore")
    with pytest.raises(DockyardError) as early:
        export.export(s, run="r1", dry=True)
    assert str(early.value).endswith("it saved no checkpoint to resume either: fix what stopped it (unknown trainer "
                                     "override(s): --max_stepz) and start it again, or export a completed run")
    (run / "checkpoints" / "checkpoint-8").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-8" / "complete.json").write_text("{}")
    with pytest.raises(DockyardError, match=r"continue it \(invoke run --resume --run-id=r1\), or export"):
        export.export(s, run="r1", dry=True)


def test_the_commands_a_refused_export_of_a_native_run_gives_are_the_ones_that_run_it(settings, tmp_path):
    """A run trained with --native: `invoke export --run=r1 --native` of it, failed, said 'continue it (invoke run
    --resume --run-id=r1)', which then refused, 'resumes the same way: ... --native'; of a full fine-tune with --merge,
    'export it as it is: invoke export --run=r1', which refused, 'say so: ... --native'. Each now names --native."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path, status="failed", variant="native", model={"format": "full"})
    (run / "checkpoints" / "checkpoint-8").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-8" / "complete.json").write_text("{}")
    with pytest.raises(DockyardError, match=r"continue it \(invoke run --resume --run-id=r1 --native\), or export"):
        export.export(s, run="r1", dry=True, native=True)
    m = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**m, "status": "completed"}))
    with pytest.raises(DockyardError, match=r"export it as it is: invoke export --run=r1 --native$"):
        export.export(s, run="r1", dry=True, native=True, merge=True)
    (run / "manifest.json").write_text(json.dumps({**m, "variant": "cpu"}))  # a run in the image: as they were
    with pytest.raises(DockyardError, match=r"continue it \(invoke run --resume --run-id=r1\), or export"):
        export.export(s, run="r1", dry=True)


def test_merging_a_full_fine_tune_is_refused_before_an_image_starts(settings, tmp_path):
    """`export --merge` of a ddp run said there were no adapters to merge, then wrote the model again to merged/
    (16 GB more for an 8B model)."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    m, run = _run(tmp_path, model={"format": "full"})
    with pytest.raises(DockyardError, match=r"run r1 trained the whole model: it has no adapters for --merge to "
                                            r"merge; export it as it is: invoke export --run=r1"):
        export.export(s, run="r1", merge=True, dry=True)
    assert not (tmp_path / "runs" / "r1" / "merged").exists()
    (run / "manifest.json").write_text(json.dumps({**m, "model": {"format": "adapter"}}))
    assert export.export(s, run="r1", merge=True, dry=True) == tmp_path / "runs" / "r1" / "merged"


def test_an_export_folder_holding_a_colon_is_refused_before_docker(settings, tmp_path):
    m, run = _run(tmp_path)
    with pytest.raises(DockyardError, match=r"export folder \(--out\) '.*/a:b': a path with ':'"):
        export.export_command(settings, m, run, tmp_path / "a:b", merge=False)


@pytest.mark.parametrize("native", [False, True])
def test_an_export_folder_holding_a_control_character_is_refused_before_anything_is_made(settings, tmp_path, native):
    """`--native --out=$'/tmp/x\\e[31mred'` made the folder and printed the escape sequence to the terminal as it was
    (':' was refused, in the image alone)."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _run(tmp_path, **({"variant": "native", "model": {"format": "full"}} if native else {}))
    for name in ("x\x1b[31mred", "new\nline", "tab\there"):
        with pytest.raises(DockyardError, match=r"^--out '.*': holds the control character '\\[a-z0-9]+', which would "
                                                "reach the terminal as it is where the export prints the folder's "
                                                "name: give --out a name without control characters$"):
            export.export(s, run="r1", out=str(tmp_path / "out" / name), native=native)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit, says", [
    ({"image": {"ref": "alpine:3"}}, "not an image of this project"),
    ({"image": {"ref": "dockyard:0.1.0-cu128"}}, "not an image of this project for variant cpu"),
    ({"image": {"ref": "dockyard:0.1.0-cpu --privileged"}}, "not an image of this project"),
    ({"variant": "auto"}, "names variant 'auto'"),
    ({"image": "dockyard:0.1.0-cpu"}, "image 'dockyard:0.1.0-cpu': takes `key: value` entries"),
    ({"run_id": "r2"}, "manifest of run 'r2', not of 'r1'"),
    ({"status": None}, "status given no value: takes text"),
    ({"inputs": {"model": {"path": "/home", "inside": "/workspace/inputs/model", "sha256": "0" * 64}}},
     "names model /home, which is no model folder"),
    ({"inputs": {"model": {"path": "/etc", "inside": "/workspace/inputs/elsewhere"}}}, "not /workspace/inputs/model"),
    ({"inputs": {"model": {"path": "/a:/workspace/runs", "inside": "/workspace/inputs/model"}}}, "path that can be mounted"),
    ({"inputs": {"model": {"path": "etc", "inside": "/workspace/inputs/model"}}}, "path that can be mounted"),
])
def test_an_edited_manifest_cannot_choose_the_image_or_mount_another_folder(settings, tmp_path, edit, says):
    """Any run's container can rewrite any manifest in the runs folder: `invoke export` runs only the project's
    image of the run's variant and mounts only the folder the run trained on, whatever the manifest says."""
    m, run = _run(tmp_path, inputs={"model": _model(tmp_path / "model")})
    m.update(edit)
    with pytest.raises(DockyardError, match=says):
        export.export_command(settings, m, run, tmp_path / "out", merge=False)


def test_a_model_folder_changed_since_the_run_is_not_mounted(settings, tmp_path):
    """The folder at the recorded path is checked against the manifest's fingerprint: another folder put there
    (or the manifest pointed at ~/.ssh with a made-up hash) is refused."""
    model = tmp_path / "model"
    m, run = _run(tmp_path, inputs={"model": _model(model)})
    (model / "id_rsa").write_text("secret")
    with pytest.raises(DockyardError, match="not the model folder the run trained on"):
        export.export_command(settings, m, run, tmp_path / "out", merge=False)


def test_a_manifest_naming_a_big_tree_as_its_model_is_refused_without_walking_it_all(settings, tmp_path, monkeypatch):
    """A manifest pointing model.path at /usr made `export --dry` list and size every file there before refusing."""
    tree = tmp_path / "usr"
    for i in range(30):
        (tree / f"d{i}").mkdir(parents=True)
        (tree / f"d{i}" / "f").write_text("x")
    (tree / "config.json").write_text("{}")  # as a model folder has
    seen = []
    real = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda p: seen.append(p) or real(p))
    m, run = _run(tmp_path, inputs={"model": {"path": str(tree), "inside": "/workspace/inputs/model", "files": 3,
                                              "sha256": "ab" * 32}})
    with pytest.raises(DockyardError, match="not the model folder the run trained on"):
        export.export_command(settings, m, run, tmp_path / "out", merge=False)
    assert len({p for p in seen if p.name in ("f", "config.json")}) == 4, "the walk stops past the 3 the run recorded"
    # a count the manifest makes up is no licence: the walk stops at MODEL_FILES_MAX whatever it says
    monkeypatch.setattr(export.runfolder, "MODEL_FILES_MAX", 5)  # the module export reads it from
    seen.clear()
    m["inputs"]["model"]["files"] = 10**12
    with pytest.raises(DockyardError, match="not the model folder the run trained on"):
        export.export_command(settings, m, run, tmp_path / "out", merge=False)
    assert len({p for p in seen if p.name in ("f", "config.json")}) == 6, "the walk stops past MODEL_FILES_MAX"


@pytest.mark.parametrize("kind", ["socket", "fifo", "empty folder", "folder without config.json"])
def test_a_manifest_naming_no_model_folder_is_refused_before_it_is_mounted(settings, tmp_path, kind):
    """Every run container can write the runs folder: a manifest naming /var/run/docker.sock as its model, with the
    sha256 of an empty file list (anyone's to compute: a socket lists no files), had `invoke export` mount the
    engine's socket into the export's container. Only a folder with config.json, as every run read, is a model."""
    import hashlib
    import socket

    where = tmp_path / "thing"
    if kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(where))
    elif kind == "fifo":
        os.mkfifo(where)
    else:
        where.mkdir()
        if kind != "empty folder":
            (where / "weights.bin").write_text("x")
    listed = fingerprint(where)["sha256"] if where.is_dir() else hashlib.sha256(b"").hexdigest()
    m, run = _run(tmp_path, inputs={"model": {"path": str(where), "inside": "/workspace/inputs/model",
                                              "sha256": listed}})
    with pytest.raises(DockyardError, match=f"names model {where}, which is no model folder .*: refused"):
        export.export_command(settings, m, run, tmp_path / "out", merge=False)


def test_a_run_id_that_leaves_the_runs_folder_or_a_linked_run_is_refused(settings, tmp_path):
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _run(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "manifest.json").write_text(json.dumps({"run_id": "r1", "status": "completed"}))
    for bad in ("../elsewhere", "/etc", "r1/../../elsewhere"):
        with pytest.raises(DockyardError, match="use letters, digits, '_', '.' and '-'.*give the name of a folder"):
            export.export(s, run=bad, dry=True)
    with pytest.raises(DockyardError, match="is 200 characters: use at most 128: give the name of a folder"):
        export.export(s, run="r" * 200, dry=True)
    (tmp_path / "runs" / "linked").symlink_to(elsewhere)
    with pytest.raises(DockyardError, match="symbolic link"):
        export.export(s, run="linked", dry=True)
    (tmp_path / "runs" / "r1" / "model").rmdir()
    (tmp_path / "runs" / "r1" / "model").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DockyardError, match=r"r1/model is a symbolic link \(to .*elsewhere\)"):
        export.export(s, run="r1", dry=True)


def test_a_finished_export_says_where_the_folder_is_on_this_host(settings, tmp_path, monkeypatch, capsys):
    """`invoke export --run=ID` ended "exported model of run ID to /workspace/export": the container's path, where
    nothing is on the host; the folder is runs/ID/export (or --out)."""
    import subprocess

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    monkeypatch.setattr(export, "check_image", lambda *a: None)
    said = []

    def container(argv, **kw):  # what the image's exporter prints, through the engine's output as the user sees it
        shown = export.engine.container_paths_shown(argv) if kw.get("host_paths") else str
        said.append(shown("exported model of run r1 to /workspace/export"))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(export.engine, "run", container)
    monkeypatch.setattr(export.engine, "engine_info", lambda settings: {})  # an engine that maps no users
    assert export.export(s, run="r1") == run / "export"
    assert said == [f"exported model of run r1 to {run / 'export'}"]


def test_a_manifest_saying_native_does_not_move_the_export_onto_this_host_nor_choose_its_base(settings, tmp_path):
    """Any container can write a run's manifest: `variant: native` with `model.base` at a folder of this host only
    exported there, in this host's Python, merging that folder into the runs folder for every container to read.
    The host export is now the user's word (--native), and its base the run's own or its recorded input."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "config.json").write_text("{}")
    _, run = _run(tmp_path, variant="native", model={"base": str(secret), "format": "adapter"})
    with pytest.raises(DockyardError, match="trained on this host .*say so: invoke export --run=r1 --native"):
        export.export(s, run="r1", dry=True)
    with pytest.raises(DockyardError, match=f"names base model '{secret}', neither its own base/ nor the model it "
                                            "recorded as its input: refused"):
        export.export(s, run="r1", dry=True, native=True)
    given = tmp_path / "given"
    (run / "manifest.json").write_text(json.dumps({"run_id": "r1", "status": "completed", "variant": "native",
                                                   "model": {"base": str(given), "format": "adapter"},
                                                   "inputs": {"model": {**_model(given), "inside": str(given)}}}))
    assert export.export(s, run="r1", dry=True, native=True) == run / "export"  # the base the run recorded
    _, env = export.export_command(s, json.loads((run / "manifest.json").read_text()), run, run / "export", False)
    assert env["DS_ACCELERATOR"] == "cpu"  # on CPU, as in the image: DeepSpeed warned it found no GPU
    (given / "extra.bin").write_text("swapped")
    with pytest.raises(DockyardError, match="is not the model folder the run trained on"):
        export.export(s, run="r1", dry=True, native=True)
    _, image_run = _run(tmp_path / "b")
    with pytest.raises(DockyardError, match="trained in the cpu image, and is exported there: leave out --native"):
        export.export(settings.model_copy(update={"runs_dir": tmp_path / "b" / "runs"}), run="r1", dry=True,
                      native=True)


def test_a_native_export_from_a_python_without_torch_says_how_to_get_it(settings, tmp_path, monkeypatch):
    """The README's host install (no torch): `invoke export --native` was a ModuleNotFoundError traceback."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _run(tmp_path, variant="native", model={"format": "full"})
    monkeypatch.setitem(sys.modules, "torch", None)  # what importlib finds where torch is not installed
    with pytest.raises(DockyardError, match="--native exports with this host's Python .*, which lacks torch: install"):
        export.export(s, run="r1", dry=True, native=True)


@pytest.mark.parametrize("stop", ["interrupted", "failed"])
def test_an_export_that_stops_partway_keeps_no_folder_and_the_same_export_can_run_again(settings, tmp_path,
                                                                                         monkeypatch, stop):
    """Ctrl-C 7 s into `invoke export` left config.json, model.safetensors and the tokenizer in the folder, never
    reloaded nor compared, and the next `invoke export` said "already exists". Here the image's exporter is a stand-in
    that writes its first files, then is stopped (or fails)."""
    import subprocess

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    monkeypatch.setattr(export, "check_image", lambda *a: None)
    monkeypatch.setattr(export.engine, "engine_info", lambda settings: {})

    def container(argv, **kw):
        (run / "export" / "config.json").write_text("{}")
        (run / "export" / "model.safetensors").write_bytes(b"half")
        if stop == "interrupted":
            raise export.engine.Interrupted("interrupted: the export stopped", stopped=True)
        return subprocess.CompletedProcess(argv, 1)

    monkeypatch.setattr(export.engine, "run", container)
    with pytest.raises(DockyardError, match="interrupted" if stop == "interrupted" else "failed .* nothing was kept"):
        export.export(s, run="r1")
    assert not (run / "export").exists()
    monkeypatch.setattr(export.engine, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0))
    assert export.export(s, run="r1") == run / "export"
    # an --out whose folders above it the export made: removed with it ("nothing was kept" left them)
    monkeypatch.setattr(export.engine, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1))
    (tmp_path / "kept").mkdir()
    with pytest.raises(DockyardError, match="nothing was kept"):
        export.export(s, run="r1", out=str(tmp_path / "kept" / "new" / "deep" / "out"))
    assert list((tmp_path / "kept").iterdir()) == []


def test_an_export_that_cannot_start_says_so_on_the_host_dry_too(settings, tmp_path):
    """`--out` under a file passed `export --dry` (the real export refused it), and a run without its model/ started
    an image to say so."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DockyardError, match=r"cannot make the folder .*afile/x: .*afile is a file, not a folder; give "
                                            "--out=FOLDER where you can write"):
        export.export(s, run="r1", out=str(tmp_path / "afile" / "x"), dry=True)
    (run / "model").rmdir()
    with pytest.raises(DockyardError, match="run r1 completed, but its folder holds no model/ folder"):
        export.export(s, run="r1", dry=True)


def test_an_exported_adapter_names_its_base_where_it_is_on_this_host(settings, tmp_path, monkeypatch, capsys):
    """adapter_config.json said "base_model_name_or_path": "/workspace/runs/r1/base", where the image saw the base:
    AutoPeftModel on this host found nothing there. The image's exporter is a stand-in writing what it writes."""
    import subprocess

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    monkeypatch.setattr(export, "check_image", lambda *a: None)
    monkeypatch.setattr(export.engine, "engine_info", lambda settings: {})

    def container(argv, **kw):
        (run / "export" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path":
                                                                         "/workspace/runs/r1/base", "r": 8}))
        (run / "export" / "README.md").write_text("base_model: /workspace/runs/r1/base\n")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(export.engine, "run", container)
    export.export(s, run="r1")
    config = json.loads((run / "export" / "adapter_config.json").read_text())
    assert config == {"base_model_name_or_path": str(run / "base"), "r": 8}
    assert (run / "export" / "README.md").read_text() == f"base_model: {run / 'base'}\n"
    assert f"its base: {run / 'base'}" in capsys.readouterr().out
    # a run trained with --native, exported on this host: its adapter named its base already, which went unsaid
    native = settings.model_copy(update={"runs_dir": tmp_path / "n" / "runs"})
    _, run = _run(tmp_path / "n", variant="native", model={"base": str(tmp_path / "n" / "runs" / "r1" / "base"),
                                                           "format": "adapter"})
    (run / "base").mkdir()

    def on_this_host(argv, **kw):
        (run / "export" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(run / "base")}))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(export.engine, "run", on_this_host)
    export.export(native, run="r1", native=True)
    assert f"its base: {run / 'base'} (peft loads the adapter onto it)" in capsys.readouterr().out


def test_an_export_into_the_run_folder_itself_is_refused(settings, tmp_path):
    """`--out=runs/r1/model/sub` wrote a second model into the run's trained one."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    with pytest.raises(DockyardError, match="is inside the run folder"):
        export.export(s, run="r1", out=str(run / "model" / "sub"), dry=True)
    assert list((run / "model").iterdir()) == []


@pytest.mark.parametrize("where", ["another run's folder", "the runs folder", "the hf cache", "a link to a run's"])
def test_an_export_into_a_folder_a_container_writes_is_refused_before_anything_is_made(settings, tmp_path, where):
    """`--out=runs/r2/export` wrote run r1's export into run r2's folder (which `invoke export --run=r2` then found
    taken), and any --out in the runs folder or a cache is a folder every run's container writes, where code in one
    could change the exported model before it is loaded or shipped. Refused as invoke save's --out is, a link of the
    user's own to such a folder too; a folder elsewhere is taken as before. The refusal does not offer the run's own
    export folder as out of reach: it is in the runs folder too."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs", "hf_cache": tmp_path / "hf"})
    _, run = _run(tmp_path)
    (tmp_path / "runs" / "r2").mkdir()
    (tmp_path / "hf").mkdir()
    (tmp_path / "mine").symlink_to(tmp_path / "runs" / "r2")
    out = {"another run's folder": tmp_path / "runs" / "r2" / "export", "the runs folder": tmp_path / "runs" / "mine",
           "the hf cache": tmp_path / "hf" / "export", "a link to a run's": tmp_path / "mine" / "export"}[where]
    inside = tmp_path / ("hf" if where == "the hf cache" else "runs")
    with pytest.raises(DockyardError) as refused:
        export.export(s, run="r1", out=str(out), dry=True)
    said = str(refused.value)
    assert f"is inside {inside} (the {'hf_cache' if 'hf' in where else 'runs_dir'} setting), which every run's " \
           "container can write" in said and "give --out a folder outside the runs folder and the caches" in said, said
    # the run's own export folder is in the runs folder too: named as no way out of the containers' reach (it was
    # offered as the way out, "or leave out --out for the run's own, runs/r1/export", in the same line)
    assert f"without --out the export stays in the run's own folder, {run / 'export'}, which every run's container " \
           "can write too" in said, said
    assert not out.exists() and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r1", "r2"]
    assert export.export(s, run="r1", out=str(tmp_path / "elsewhere"), dry=True) == tmp_path / "elsewhere"


def test_a_manifest_nested_too_deeply_is_refused_naming_it(settings, tmp_path):
    """A run folder any container can write: JSON nested 100k deep was a RecursionError traceback."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    (run / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DockyardError, match=r"manifest.json is not valid JSON \(nested too deeply to read\)"):
        export.export(s, run="r1", dry=True)


KILLED_EXPORT = """
import sys, time, subprocess
from pathlib import Path
import yaml
from dockyard import settings as settings_mod
from dockyard.launch import export
from dockyard.settings import ROOT

s = settings_mod.load(yaml.safe_load((ROOT / "invoke.yaml").read_text())["dockyard"])
s = s.model_copy(update={"runs_dir": Path(sys.argv[1])})
export.check_image = lambda *a: None
export.engine.engine_info = lambda settings: {}

def container(argv, **kw):  # the image's exporter: its first files, then the kill
    out = Path(sys.argv[1]) / "r1" / "export"
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"half")
    Path(sys.argv[2]).touch()
    time.sleep(600)

export.engine.run = container
export.export(s, run="r1")
"""


def test_an_export_killed_outright_is_removed_by_the_next_export_which_says_so(settings, tmp_path, monkeypatch,
                                                                               capsys):
    """`kill -9` of `invoke export` (the OOM killer, a CI job's end) as it writes: no clean-up runs. Its folder,
    config.json and weights never reloaded nor compared, looked like a whole export, and the next export of the run
    refused it: "already exists: give a new --out folder". The next export removes it and says so; an export whose
    process still runs is left to finish."""
    import signal
    import subprocess
    import time

    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    written = tmp_path / "written"
    killed = subprocess.Popen([sys.executable, "-c", KILLED_EXPORT, str(tmp_path / "runs"), str(written)],
                              cwd=Path(export.__file__).parents[2], start_new_session=True)
    deadline = time.monotonic() + 60
    while not written.exists():
        assert killed.poll() is None and time.monotonic() < deadline, "the export ended before it wrote"
        time.sleep(0.02)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    marker = [p.name for p in run.iterdir() if p.name.startswith("export.")]
    assert (run / "export" / "model.safetensors").exists() and len(marker) == 1, marker
    assert "killed before it finished" in (run / marker[0]).read_text()

    monkeypatch.setattr(export, "check_image", lambda *a: None)
    monkeypatch.setattr(export.engine, "engine_info", lambda settings: {})
    running = run / f"export.{os.getpid()}.0123456789ab.partial"  # as an export of this user's still under way
    (run / marker[0]).rename(running)
    with pytest.raises(DockyardError, match="already exists"):
        export.export(s, run="r1", dry=True)
    running.rename(run / marker[0])
    export.export(s, run="r1", dry=True)
    assert "is the folder of an export killed before it finished: the export removes it first" in capsys.readouterr().out
    assert (run / "export" / "model.safetensors").exists()

    def container(argv, **kw):
        if "inspect" in argv:  # whether the killed export's container still writes: the engine has none of that name
            return subprocess.CompletedProcess(argv, 1, "", "Error response from daemon: No such container: x")
        assert list((run / "export").iterdir()) == []
        (run / "export" / "model.safetensors").write_bytes(b"whole")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(export.engine, "run", container)
    assert export.export(s, run="r1") == run / "export"
    assert (f"removed {run / 'export'}: an export killed before it finished left it, never reloaded nor compared"
            in capsys.readouterr().out)
    assert sorted(p.name for p in run.iterdir()) == ["export", "manifest.json", "model"]
    assert (run / "export" / "model.safetensors").read_bytes() == b"whole"


def test_a_misspelt_run_id_is_answered_with_the_run_meant(settings, tmp_path):
    """`invoke export --run=lora-1r3` listed the three newest runs and said nothing of lora-lr3, an older one: the
    refusal names the closest run id, as a misspelt recipe or setting is answered (a resume's too)."""
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, first = _run(tmp_path)
    meant = first.rename(first.parent / "lora-lr3")
    for age, name in enumerate(("a1", "a2", "a3", "lora-lr3")):  # lora-lr3 the oldest of four
        if name != "lora-lr3":
            _, r = _run(tmp_path / name)
            r.rename(meant.parent / name)
        os.utime(meant.parent / name, (1e9 - age * 100, 1e9 - age * 100))
    with pytest.raises(DockyardError, match=r"^no run 'lora-1r3' in .*: give the id of a completed run \(did you mean "
                                            r"lora-lr3\? the newest in .*: a1, a2, a3; `invoke runs` lists them all\)"):
        export.export(s, run="lora-1r3", dry=True)
    with pytest.raises(DockyardError, match=r"^no run 'zzzz' in .*: give the id of a completed run \(the newest in "):
        export.export(s, run="zzzz", dry=True)  # nothing near: no guess
    from dockyard.launch import run as launch_run

    with pytest.raises(DockyardError, match=r"^--resume: no run folder .*lora-1r3 to resume \(did you mean lora-lr3\? "):
        launch_run.new_run_dir(s, "ddp", "lora-1r3", resume=True)
