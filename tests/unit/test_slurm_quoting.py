"""`invoke slurm` with hostile values: recipe folders, archives, image files, runs folders, overrides, sbatch's own
arguments and DOCKYARD_RUN_ID full of quotes, $(...), backticks, newlines, spaces, leading dashes and unicode.

The written script runs under a real bash with recording stand-ins (tests/support/hostile.py) for srun, scontrol,
docker, apptainer, torchrun and `invoke` itself: each must be given exactly the words the user gave, and no attack
may run ($MARK never appears). What no script can carry (a control character in a path, a NUL) is refused with
the flag named. The real Slurm runs the docker form in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, event, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard.common.errors import DockyardError
from dockyard.common.recipes import RECIPES
from dockyard.launch import run as launch_run
from dockyard.launch import slurm
from tests.support.hostile import environment, hostile_text, hostile_value, path_name, recorder, records, unsafe

SCONTROL = """#!/bin/sh
case "$2" in
  hostnames) printf 'gpu-a\\ngpu-b\\n' ;;
  node) echo "NodeName=$3 NodeAddr=10.9.0.$([ "$3" = gpu-a ] && echo 1 || echo 2) NodeHostName=$3" ;;
esac
"""
SRUN = """
while [ $# -gt 0 ] && case $1 in --*) true ;; *) false ;; esac; do shift; done
for i in 0 1; do SLURM_NODEID=$i SLURM_NNODES=2 "$@" || exit $?; done
"""
APPTAINER = """
shift  # exec
while case $1 in --nv) shift; true ;; --*) shift 2; true ;; *) false ;; esac; do :; done
shift  # the .sif
exec "$@"
"""
ATTACK = 'it\'s a "test" `touch "$MARK"` $(touch "$MARK") ${HOME} \\ * #x %j'
EXAMPLES = hsettings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                     phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])  # explaining reruns for minutes


def sbatch_options(text: str) -> list[str]:
    """The arguments sbatch reads from the `#SBATCH` lines: blanks split, quotes and backslashes as in its
    src/sbatch/opt.c, an unescaped `#` ends the line."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        rest, i = line[len("#SBATCH"):], 0
        while i < len(rest):
            if rest[i] in " \t\r\v\f":
                i += 1
                continue
            arg, quote, escaped = [], "", False
            while i < len(rest) and (quote or rest[i] not in " \t\r\v\f"):
                c, i = rest[i], i + 1
                if escaped:
                    escaped = False
                    arg.append(c)
                elif c == "\\":
                    escaped = True
                elif quote:
                    if c == quote:
                        quote = ""
                    else:
                        arg.append(c)
                elif c in "\"'":
                    quote = c
                elif c == "#":
                    i = len(rest)
                else:
                    arg.append(c)
            out += ["".join(arg)] if arg else []
    return out


def _recipe_folder(base: Path, name: str) -> Path:
    folder = base / name
    shutil.copytree(RECIPES / "zero2", folder)
    return folder


RECORDED = ("DOCKYARD_RENDEZVOUS", "DOCKYARD_NODE_RANK", "INVOKE_DOCKYARD_RUNS_DIR")


def _submit(base: Path, text: str, *after: str, record: tuple[str, ...] = RECORDED,
            **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the script as sbatch would on node 0 (the stand-ins start each node's part); `record`: the variables each
    stand-in records."""
    script = base / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, "bash -n: not valid bash"
    bin_, log = base / "bin", base / "argv.jsonl"
    (bin_ / "scontrol").write_text(SCONTROL)
    (bin_ / "scontrol").chmod(0o755)
    (bin_ / "docker").write_text("#!/bin/sh\nexit 1\n")  # no node has the image yet
    (bin_ / "docker").chmod(0o755)
    # bytes, decoded here: text=True reads "\r" as a line end, and the script says the value it refused as given
    p = subprocess.run(["bash", str(script), *after], capture_output=True, timeout=60,
                       env=environment(bin_, log, base / "pwned", SLURM_JOB_ID="77", SLURM_JOB_NODELIST="gpu-[a-b]",
                                       RECORD_ENV=",".join(record), **env))
    p.stdout, p.stderr = p.stdout.decode(), p.stderr.decode()
    assert not (base / "pwned").exists(), "a value ran as a command"
    return p, records(log, record)


def _refused(e: DockyardError, values: dict[str, str], refuses: dict[str, str] | None = None) -> None:
    """A refusal names a flag whose value no script can carry (`refuses`: what else a flag's value may not hold;
    the runs folder never a backslash)."""
    event("refused")
    refuses = refuses or {"runs_dir": "\\"}
    assert any(flag in str(e) for flag, v in values.items() if (unsafe(v) and flag != "trainer overrides") or "\0" in v
               or any(c in v for c in refuses.get(flag, ""))), e


def _default_run_id(folder_name: str) -> str:
    return (re.sub(r"[^A-Za-z0-9_.-]", "-", folder_name).lstrip("-._") or "run") + "-slurm-77"


@EXAMPLES
@example(recipe="-r $(touch \"$MARK\")", archive="a b", runs="r u'n # %j", override=ATTACK, after=ATTACK)
@example(recipe="r", archive="a", runs="r", override=ATTACK, after="--")  # the script's overrides follow it
@example(recipe="'", archive="'", runs="'", override="::", after="'")  # a run name YAML reads as a mapping
@given(recipe=path_name, archive=path_name, runs=path_name, override=hostile_value,
       after=hostile_text.filter(lambda s: "\0" not in s))
def test_docker_nodes_get_every_value_as_one_word_and_nothing_runs(settings, tmp_path_factory, recipe, archive, runs,
                                                                  override, after):
    base = tmp_path_factory.mktemp("job")
    recorder(base / "bin", "invoke")
    recorder(base / "bin", "srun", then=SRUN)
    folder = base / "recipes" / recipe
    kw = {"recipe": str(folder), "archive": str(base / archive), "overrides": ["--run_name", override, "--max_steps", "5"]}
    s = settings.model_copy(update={"runs_dir": str(base / runs)})
    try:
        if not unsafe(recipe):
            _recipe_folder(base / "recipes", recipe)
        if not unsafe(archive):
            (base / archive).write_bytes(b"")  # `invoke slurm` refuses an archive that is not there
        with mock.patch.object(slurm, "INVOKE", [str(base / "bin" / "invoke")]):
            text = slurm.script(s, nodes=2, gpus_per_node=0, variant="cpu", **kw)
    except DockyardError as e:
        _refused(e, {"--recipe": recipe, "--archive": archive, "runs_dir": runs, "trainer overrides": override})
        return
    assert not any(unsafe(v) for v in (recipe, archive, runs)) and "\\" not in runs and "\0" not in override
    runs_dir = (base / runs).resolve()
    assert sbatch_options(text)[:2] == [f"--job-name=dockyard-{_default_run_id(recipe)[:-len('-slurm-77')]}",
                                        "--nodes=2"]
    assert f"--output={str(runs_dir).replace('%', '%%')}/slurm-%j.out" in sbatch_options(text)
    # a resume names the run it continues (a new job's default is a new run): here, the default the first job had
    p, got = _submit(base, text, "--resume", after, DOCKYARD_RUN_ID=_default_run_id(folder.resolve().name))
    assert p.returncode == 0, p.stderr
    by_tool = {t: [r["argv"] for r in got if r["tool"] == t] for t in ("invoke", "srun")}
    load = ["load", f"--file={(base / archive).resolve()}"]
    run = ["run", f"--recipe={folder.resolve()}", "--variant=cpu", "--nodes=2", "--node-rank=0",
           "--master-addr=10.9.0.1", "--master-port=29500", f"--run-id={_default_run_id(folder.resolve().name)}",
           "--resume", *([] if after == "--" else [after]), "--", "--run_name", override, "--max_steps", "5"]
    assert by_tool["invoke"] == [load, load, run, [*run[:4], "--node-rank=1", *run[5:]]]
    # every node's run goes to the runs folder the script was written for (the job log's), whatever sbatch's
    # environment said
    assert {r["env"]["INVOKE_DOCKYARD_RUNS_DIR"] for r in got if r["tool"] == "invoke" and r["argv"][0] == "run"} == \
        {str(runs_dir)}


@EXAMPLES
@example(runtime="apptainer", image="i m'g", recipe="-r $(touch \"$MARK\")", runs="r u'n # %j", override=ATTACK,
         after=ATTACK)
@example(runtime="pyxis", image="i", recipe="r", runs="r", override=ATTACK, after="--")
@example(runtime="pyxis", image="'", recipe="'", runs="'", override="'", after="\r")  # said as given, not as a line end
@given(runtime=st.sampled_from(["pyxis", "apptainer"]), image=path_name, recipe=path_name, runs=path_name,
       override=hostile_value, after=hostile_text.filter(lambda s: "\0" not in s and s != "--resume"))  # that needs a run id
def test_container_nodes_get_every_value_as_one_word_and_nothing_runs(settings, tmp_path_factory, runtime, image,
                                                                     recipe, runs, override, after):
    base = tmp_path_factory.mktemp("job")
    recorder(base / "bin", "torchrun")
    recorder(base / "bin", "srun", then=SRUN)
    recorder(base / "bin", "apptainer", then=APPTAINER)
    image_file = base / (image + {"pyxis": ".sqsh", "apptainer": ".sif"}[runtime])
    folder = base / "recipes" / recipe
    s = settings.model_copy(update={"runs_dir": str(base / runs)})
    try:
        if not unsafe(recipe):
            _recipe_folder(base / "recipes", recipe)
        if not unsafe(image):
            image_file.write_bytes(b"")  # `invoke slurm` refuses an image file that is not there
        text = slurm.script(s, recipe=str(folder), nodes=2, gpus_per_node=4, runtime=runtime,
                            image_file=str(image_file), overrides=["--run_name", override])
    except DockyardError as e:
        # a mount list splits on ',' and ':': the runs folder and the recipe folder, both mounted, hold neither
        _refused(e, {"--recipe": recipe, "--image-file": image, "runs_dir": runs, "trainer overrides": override},
                 {"runs_dir": "\\,:", "--recipe": ",:"})
        return
    if after != "--":  # before `--`, --resume alone: refused, the value said as given, and no node started
        p, got = _submit(base, text, after)
        assert p.returncode == 2 and p.stderr.startswith(f"dockyard: {after}: give trainer settings after") and not got
    p, got = _submit(base, text, "--", after)
    assert p.returncode == 0, p.stderr
    run_id = _default_run_id(folder.resolve().name)
    torchrun = [r for r in got if r["tool"] == "torchrun"]
    assert [r["env"]["DOCKYARD_NODE_RANK"] for r in torchrun] == ["0", "1"]
    for node, r in enumerate(torchrun):
        argv = r["argv"]
        assert f"--rdzv-id={run_id}" in argv and f"--local-addr=10.9.0.{node + 1}" in argv
        # the recipe folder as the container sees it: mounted there, as `invoke run` mounts it
        inside = f"/workspace/recipes/{folder.resolve().name}"
        assert argv[argv.index("-m"):] == ["-m", "dockyard.train", "--recipe", inside, "--run-dir",
                                           f"/workspace/runs/{run_id}", "--", "--run_name", override, after]
    srun = next(r["argv"] for r in got if r["tool"] == "srun")
    runs_dir = (base / runs).resolve()
    if runtime == "pyxis":
        assert f"--container-image={image_file.resolve()}" in srun
        spec = next(a for a in srun if a.startswith("--container-mounts="))[len("--container-mounts="):]
    else:
        calls = [r["argv"] for r in got if r["tool"] == "apptainer"]
        assert len(calls) == 2 and all(c[:4] == ["exec", "--nv", "--bind", calls[0][3]] for c in calls)
        assert calls[0][6:9] == ["--cleanenv", "--no-home", str(image_file.resolve())]
        spec = calls[0][3]
    assert spec.startswith(f"{runs_dir}:/workspace/runs,")
    assert f"{folder.resolve()}:{inside}:ro" in spec.split(",")


@EXAMPLES
@example(run_id=ATTACK)
@given(run_id=hostile_text.filter(lambda s: "\0" not in s))
def test_a_run_id_from_the_environment_is_used_as_given_or_refused_before_any_node_starts(settings, tmp_path_factory,
                                                                                         run_id):
    base = tmp_path_factory.mktemp("job")
    recorder(base / "bin", "torchrun")
    recorder(base / "bin", "srun", then=SRUN)
    (base / "x.sqsh").write_bytes(b"")
    text = slurm.script(settings, recipe="zero2", nodes=2, gpus_per_node=4, runtime="pyxis",
                        image_file=str(base / "x.sqsh"), overrides=[])
    p, got = _submit(base, text, DOCKYARD_RUN_ID=run_id)
    if launch_run.RUN_ID.fullmatch(run_id):
        assert p.returncode == 0, p.stderr
        assert [f"--rdzv-id={run_id}" in r["argv"] for r in got if r["tool"] == "torchrun"] == [True, True]
    else:
        assert p.returncode == 2 and "run id" in p.stderr and not got


@pytest.mark.parametrize("value,flag", [("a\nb", "--recipe"), ("x\0y", "trainer overrides")])
def test_what_no_script_can_carry_is_refused_naming_the_flag(settings, value, flag):
    kw = {"recipe": value, "overrides": []} if flag == "--recipe" else {"recipe": "zero2", "overrides": [value]}
    with pytest.raises(DockyardError, match=flag):
        slurm.script(settings, nodes=2, gpus_per_node=0, **kw)


def test_a_recipe_path_with_a_space_and_a_quote_reaches_invoke_run_whole(settings, tmp_path):
    folder = _recipe_folder(tmp_path, "my recipe's $(touch \"$MARK\")")
    recorder(tmp_path / "bin", "invoke")
    recorder(tmp_path / "bin", "srun", then=SRUN)
    with mock.patch.object(slurm, "INVOKE", [str(tmp_path / "bin" / "invoke")]):
        text = slurm.script(settings, recipe=str(folder), nodes=1, gpus_per_node=0, variant="cpu", overrides=[])
    p, got = _submit(tmp_path, text)
    assert p.returncode == 0, p.stderr
    run = next(r["argv"] for r in got if r["tool"] == "invoke")
    assert run[:2] == ["run", f"--recipe={folder}"] and run[-1] == "--run-id=my-recipe-s---touch---MARK---slurm-77"


@pytest.mark.parametrize("runtime", ["docker", "pyxis"])
def test_overrides_given_at_sbatch_time_follow_the_scripts_own_and_win(settings, tmp_path, runtime):
    """`sbatch FILE -- --max_steps 50` on a script written with `-- --max_steps 5`: every node got two `--`
    (`invoke run ... -- --max_steps 50 -- --max_steps 5`, and the trainer likewise), refused on every node once the
    job had waited in the queue ("override '--' is not of the form --key value")."""
    recorder(tmp_path / "bin", "invoke")
    recorder(tmp_path / "bin", "torchrun")
    recorder(tmp_path / "bin", "srun", then=SRUN)
    (tmp_path / "x.sqsh").write_bytes(b"")
    kw = {"runtime": "pyxis", "image_file": str(tmp_path / "x.sqsh"), "gpus_per_node": 4} if runtime == "pyxis" else \
        {"gpus_per_node": 0, "variant": "cpu"}
    with mock.patch.object(slurm, "INVOKE", [str(tmp_path / "bin" / "invoke")]):
        text = slurm.script(settings, recipe="zero2", nodes=2, overrides=["--run_name", ATTACK, "--max_steps", "5"],
                            **kw)
    own = ["--run_name", ATTACK, "--max_steps", "5"]
    for after, tail in (((), ["--", *own]), (("--resume",), ["--resume", "--", *own]),
                        (("--resume", "--", "--max_steps", "50"), ["--resume", "--", *own, "--max_steps", "50"]),
                        (("--", "--max_steps", "50", "--", "x"), ["--", *own, "--max_steps", "50", "--", "x"])):
        base = tmp_path / f"job{len(after)}"
        shutil.copytree(tmp_path / "bin", base / "bin")
        p, got = _submit(base, text, *after, DOCKYARD_RUN_ID="r1")
        assert p.returncode == 0, p.stderr
        if runtime == "pyxis":
            argvs = [r["argv"][r["argv"].index("--run-dir") + 2:] for r in got if r["tool"] == "torchrun"]
        else:
            argvs = [r["argv"][r["argv"].index("--run-id=r1") + 1:] for r in got if r["tool"] == "invoke"]
        assert argvs == [tail, tail], (after, argvs)


def test_trainer_settings_given_before_the_double_dash_are_refused_where_the_nodes_start_the_trainer(settings, tmp_path):
    """pyxis (and Apptainer) start the trainer itself on every node: `sbatch FILE --max_steps 5` reached it before the
    script's own `-- --max_steps 50`, which outweighed it without a word (found by the fifteenth red-team pass)."""
    recorder(tmp_path / "bin", "torchrun")
    recorder(tmp_path / "bin", "srun", then=SRUN)
    (tmp_path / "x.sqsh").write_bytes(b"")
    text = slurm.script(settings, recipe="zero2", nodes=2, overrides=["--max_steps", "50"], runtime="pyxis",
                        image_file=str(tmp_path / "x.sqsh"), gpus_per_node=4)
    p, got = _submit(tmp_path, text, "--max_steps", "5", DOCKYARD_RUN_ID="r1")
    assert p.returncode == 2 and not [r for r in got if r["tool"] in ("srun", "torchrun")], p.stderr
    assert p.stderr == ("dockyard: --max_steps: give trainer settings after `--` (sbatch FILE -- --max_steps 50); "
                        "before it this script takes --resume alone\n")
    p, got = _submit(tmp_path, text, "--resume", "--", "--max_steps", "5", DOCKYARD_RUN_ID="r1")
    assert p.returncode == 0, p.stderr
    argvs = [r["argv"][r["argv"].index("--run-dir") + 2:] for r in got if r["tool"] == "torchrun"]
    assert argvs == [["--resume", "--", "--max_steps", "50", "--max_steps", "5"]] * 2


def test_the_settings_each_docker_node_reads_are_the_scripts_whatever_the_jobs_environment_says(settings, tmp_path):
    """INVOKE_DOCKYARD_IMAGE_NAME=reg.example/team/dockyard in the shell that ran `invoke slurm --archive=...`: the
    script checked for, and loaded, reg.example/team/dockyard:..., while each node's `invoke run` read the setting from
    the job's environment (sbatch --export=NONE, or submitted from another shell) and ran dockyard:..., another image
    or none; likewise a variants file of one's own (its variants unknown to the nodes) and the Hugging Face cache a hub
    model is looked up in. Each node's `invoke run` now reads the settings the script was written with, as it
    already read its runs folder."""
    variants_file = tmp_path / "my variants.yaml"
    variants_file.write_text((slurm.ROOT / settings.variants_file).read_text())
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs", "image_name": "reg.example/team/dockyard",
                                    "variants_file": variants_file, "hf_cache": tmp_path / "h f",
                                    "compile_cache": str(tmp_path / "compiled")})
    recorder(tmp_path / "bin", "invoke")
    recorder(tmp_path / "bin", "srun", then=SRUN)
    with mock.patch.object(slurm, "INVOKE", [str(tmp_path / "bin" / "invoke")]):
        text = slurm.script(s, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu", overrides=[])
    names = ("IMAGE_NAME", "VARIANTS_FILE", "HF_CACHE", "COMPILE_CACHE", "RUNS_DIR")
    p, got = _submit(tmp_path, text, record=tuple(f"INVOKE_DOCKYARD_{n}" for n in names),
                     INVOKE_DOCKYARD_IMAGE_NAME="dockyard", INVOKE_DOCKYARD_HF_CACHE="/elsewhere")
    assert p.returncode == 0, p.stderr
    nodes = [r["env"] for r in got if r["tool"] == "invoke"]
    assert nodes == 2 * [{"INVOKE_DOCKYARD_IMAGE_NAME": "reg.example/team/dockyard",
                          "INVOKE_DOCKYARD_VARIANTS_FILE": str(variants_file), "INVOKE_DOCKYARD_HF_CACHE": str(tmp_path / "h f"),
                          "INVOKE_DOCKYARD_COMPILE_CACHE": str(tmp_path / "compiled"),
                          "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}], nodes
    # the image each node's `invoke run` then runs is the one `invoke slurm` checked the archive for
    from dockyard import settings as settings_mod
    from dockyard.images import variants

    on_node = settings_mod.load({"variants_file": "images/variants.yaml"}, environ=nodes[0])
    cpu = variants.resolve(on_node, "cpu")[0]
    assert variants.tag(on_node, cpu) == variants.tag(s, variants.resolve(s, "cpu")[0]) == \
        "reg.example/team/dockyard:0.1.0-cpu"


def test_each_node_loads_the_archive_with_the_settings_of_the_script_its_signers_included(settings, tmp_path):
    """allowed_signers set in the shell that ran `invoke slurm --archive=...` (the archive's signature checked there):
    each node's `invoke load` ran before the script's settings were exported, with the job's environment alone, and
    loaded the archive on the shared storage unsigned, or swapped since; it also looked for the image under the
    job's image name. The load now reads the script's settings; allowed_signers only where it is set, so that a
    node's own (its ~/.invoke.yaml) is never turned off by an empty one."""
    archive, signers = tmp_path / "a.tar.zst", tmp_path / "allowed signers"
    archive.write_bytes(b"")
    signers.write_text("me@example namespaces=\"file\" ssh-ed25519 AAAA\n")
    recorder(tmp_path / "bin", "invoke")
    recorder(tmp_path / "bin", "srun", then=SRUN)
    names = ("INVOKE_DOCKYARD_ALLOWED_SIGNERS", "INVOKE_DOCKYARD_IMAGE_NAME")
    for written, job, loaded in ((str(signers), "", str(signers)), ("", "/node/signers", "/node/signers")):
        s = settings.model_copy(update={"runs_dir": tmp_path / "runs", "image_name": "reg.example/team/dockyard",
                                        "allowed_signers": written})
        with mock.patch.object(slurm, "INVOKE", [str(tmp_path / "bin" / "invoke")]):
            text = slurm.script(s, recipe="ddp", nodes=2, gpus_per_node=0, variant="cpu", overrides=[],
                                archive=str(archive))
        (tmp_path / "argv.jsonl").unlink(missing_ok=True)
        p, got = _submit(tmp_path, text, record=names, INVOKE_DOCKYARD_IMAGE_NAME="dockyard",
                         **({"INVOKE_DOCKYARD_ALLOWED_SIGNERS": job} if job else {}))
        assert p.returncode == 0, p.stderr
        loads = [r["env"] for r in got if r["tool"] == "invoke" and r["argv"][0] == "load"]
        assert loads == 2 * [{"INVOKE_DOCKYARD_ALLOWED_SIGNERS": loaded,
                              "INVOKE_DOCKYARD_IMAGE_NAME": "reg.example/team/dockyard"}], loads


@pytest.mark.parametrize("runs", ["/tmp/a\nb", "/tmp/a\\b"])
def test_a_runs_folder_no_script_carries_is_refused_naming_its_variable(monkeypatch, runs):
    """INVOKE_DOCKYARD_RUNS_DIR with a newline or backslash: invoke run named the variable, invoke slurm "the runs_dir
    setting" alone, which a user who set the variable long ago looked for in invoke.yaml, in vain."""
    from dockyard.settings import Settings

    with pytest.raises(DockyardError) as e:
        slurm.script(Settings(runs_dir=runs), recipe="ddp", nodes=2, gpus_per_node=0, overrides=[])
    assert str(e.value).startswith("the runs_dir setting (INVOKE_DOCKYARD_RUNS_DIR) ") and "\n" not in str(e.value)
