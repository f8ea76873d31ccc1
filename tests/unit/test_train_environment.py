"""What the trainer finds where it runs: which model types liger-kernel can patch here, and whether the compile cache
its launcher named may be used.

liger-kernel is not in this CPU environment (the CUDA images pin it), so the tests lay out small stand-in packages
of that name: one whose import fails as a real install does against a triton it was not built for, one without the
table of model types. The compile caches are real folders; compose runs the check for real in
tests/integration/test_deploy.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard.common import recipes
from dockyard.train import environment

ROOT = Path(__file__).resolve().parents[2]
ASK = "from dockyard.train import environment; print(environment.liger_kinds())"


def kinds_with(tmp_path: Path, init: str, monkey_patch: str) -> subprocess.CompletedProcess:
    package = tmp_path / "liger_kernel" / "transformers"
    package.mkdir(parents=True)
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(init)
    (package / "monkey_patch.py").write_text(monkey_patch)
    return subprocess.run([sys.executable, "-c", ASK], env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_an_installed_liger_kernel_that_does_not_import_counts_as_absent_and_says_why(tmp_path):
    """Before, its model types were taken from our own list: the auto could turn Liger on, and the Trainer's own
    import of it then failed with a traceback after the model had loaded. Now the manifest's reason, the refusal of
    `use_liger_kernel true` and train.log's warning (dockyard.train.__main__) say why it is off."""
    from dockyard.common import autos
    from dockyard.common.errors import DockyardError
    from dockyard.common.recipes import load_recipe
    from dockyard.common.run_settings import resolve_settings

    h100 = autos.Device("NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0))
    ddp = load_recipe("ddp")
    settings, overrides = resolve_settings(ddp, {})

    done = kinds_with(tmp_path, "raise ImportError(\"cannot import name 'make_tensor_descriptor' from 'triton'\")\n", "")
    assert done.returncode == 0, done.stderr
    kinds, why = eval(done.stdout)  # noqa: S307 - the tuple printed by the child above
    assert kinds == () and why == ("liger-kernel is installed but does not import (ImportError: cannot import name "
                                   "'make_tensor_descriptor' from 'triton')")
    resolved = autos.resolve(ddp, settings, overrides, world_size=1, gpus_per_node=1, device=h100,
                             shape=None, kind="llama", liger=kinds, liger_broken=why)
    assert resolved.record["use_liger_kernel"] == {"value": False, "why": why}
    with pytest.raises(DockyardError, match="use_liger_kernel true needs liger-kernel: liger-kernel is installed but "
                                            "does not import"):
        autos.resolve(ddp, settings, {**overrides, "use_liger_kernel": True}, world_size=1, gpus_per_node=1,
                      device=h100, shape=None, kind="llama", liger=kinds, liger_broken=why)


def test_a_liger_kernel_without_its_table_of_model_types_gets_ours(tmp_path):
    from dockyard.common.autos import LIGER_TYPES

    done = kinds_with(tmp_path, "def _apply_liger_kernel_to_instance(model, **kw): pass\n", "")
    assert done.returncode == 0 and done.stdout.strip() == str((LIGER_TYPES, "")), done.stderr
    table = kinds_with(tmp_path / "t", "def _apply_liger_kernel_to_instance(model, **kw): pass\n",
                       "MODEL_TYPE_TO_APPLY_LIGER_FN = {'llama': None, 'qwen3': None}\n")
    assert table.stdout.strip() == "(('llama', 'qwen3'), '')", table.stderr


def _named(tmp_path: Path, folder: Path) -> dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton"),
            "HOME": str(tmp_path)}


def test_a_missing_compile_cache_is_made_for_this_process_alone_and_kept(tmp_path):
    env = _named(tmp_path, tmp_path / "compile")
    assert environment.compile_cache(env) == []
    assert env == _named(tmp_path, tmp_path / "compile"), "both kept"
    for name in ("inductor", "triton"):
        st = os.stat(tmp_path / "compile" / name)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert environment.compile_cache(env) == [] and len(env) == 3, "made once, used again"


@pytest.mark.parametrize("mode, group, kept", [
    (0o707, None, False),        # anyone can write it
    (0o770, "another", False),   # a group other than the process's own
    (0o770, "own", True),        # the process's own group: Kubernetes' fsGroup makes a volume's files so
])
def test_a_compile_cache_others_can_write_is_dropped_so_the_run_compiles_in_its_tmp(tmp_path, monkeypatch, mode, group,
                                                                                    kept):
    env = _named(tmp_path, tmp_path / "compile")
    inductor = tmp_path / "compile" / "inductor"
    inductor.mkdir(parents=True)
    inductor.chmod(mode)
    if group == "another":  # the folder keeps its group; the process is in another (no root needed to give it away)
        gid = inductor.stat().st_gid
        monkeypatch.setattr(os, "getegid", lambda: gid + 1)
    dropped = environment.compile_cache(env)
    assert ("TORCHINDUCTOR_CACHE_DIR" in env) == kept
    assert "TRITON_CACHE_DIR" in env, "each folder on its own"
    if not kept:
        assert dropped == [f"TORCHINDUCTOR_CACHE_DIR={inductor} can be written by other users "
                           f"(mode {stat.filemode(inductor.stat().st_mode)})"]


def test_a_compile_cache_of_another_user_or_that_cannot_be_made_is_dropped(tmp_path, monkeypatch):
    """Docker makes a missing bind-mount source as root: the run's user can then make nothing in it."""
    (tmp_path / "compile").mkdir()
    (tmp_path / "compile" / "triton").write_text("a file")
    (tmp_path / "blocked").write_text("a file")
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "compile"), "TRITON_CACHE_DIR": str(tmp_path / "compile/triton")}
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)  # the folder stays this user's; the process becomes another
    assert environment.compile_cache(env) == [
        f"TORCHINDUCTOR_CACHE_DIR={tmp_path / 'compile'} belongs to uid {me}, not to this process's uid {me + 1}",
        f"TRITON_CACHE_DIR={tmp_path / 'compile/triton'} is not a folder"]
    assert env == {}
    env = {"TRITON_CACHE_DIR": str(tmp_path / "blocked" / "triton")}
    assert environment.compile_cache(env) == [f"TRITON_CACHE_DIR={tmp_path / 'blocked/triton'} cannot be made "
                                              "(Not a directory)"]
    assert env == {}


def test_a_compile_cache_in_a_folder_others_can_write_is_dropped_but_not_in_a_sticky_one(tmp_path):
    """The cache folder itself was checked, not the folders above it: a user who can write its parent could rename it
    once checked and put their own in its place, minutes before torch reads it. /tmp's sticky bit stops that."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = _named(tmp_path, shared / "compile")
    dropped = environment.compile_cache(env)
    assert dropped[0] == (f"TORCHINDUCTOR_CACHE_DIR={shared / 'compile' / 'inductor'} sits in {shared}, which other "
                          "users can write (mode drwxrwxrwx): they could put code of theirs in its place")
    assert "TORCHINDUCTOR_CACHE_DIR" not in env and "TRITON_CACHE_DIR" not in env
    shared.chmod(0o1777)  # sticky: only an entry's owner renames it
    env = _named(tmp_path, shared / "compile")
    assert environment.compile_cache(env) == [] and "TORCHINDUCTOR_CACHE_DIR" in env


def test_a_cpu_adam_op_still_to_compile_is_found_and_one_compiled_is_not(tmp_path, monkeypatch):
    """An offload run on the CPU sat minutes without a line while DeepSpeed compiled cpu_adam: the trainer now says so
    first. Real DeepSpeed, its CPU accelerator; the extensions cache is a folder of the test's."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = environment.cpu_adam_to_compile()
    assert folder is not None and folder.startswith(str(tmp_path)) and folder.endswith("cpu_adam")
    (tmp_path / "cpu_adam").mkdir(exist_ok=True)
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"\x7fELF")
    assert environment.cpu_adam_to_compile() is None


def test_ops_torch_builds_are_kept_per_python_and_torch_in_a_folder_checked_like_the_others(tmp_path):
    """A CUDA image run with --cpu compiled DeepSpeed's cpu_adam in every run (~85 s of 2 cores): its build folder
    was the container's /tmp. Kept in the compile cache, in a folder of this Python and torch: TORCH_EXTENSIONS_DIR
    is taken as it is, and another image's torch would load the op this one built."""
    import torch

    env = {"DOCKYARD_OPS_CACHE": str(tmp_path / "compile" / "extensions")}
    assert environment.compile_cache(env) == []
    ops = tmp_path / "compile" / "extensions" / f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}"
    assert env["TORCH_EXTENSIONS_DIR"] == str(ops) and ops.is_dir()
    assert stat.S_IMODE(ops.parent.stat().st_mode) == 0o700 and stat.S_IMODE(ops.stat().st_mode) == 0o700

    mine = {"DOCKYARD_OPS_CACHE": str(tmp_path / "compile" / "extensions"), "TORCH_EXTENSIONS_DIR": "/mine"}
    assert environment.compile_cache(mine) == [] and mine["TORCH_EXTENSIONS_DIR"] == "/mine", "the user's own stays"

    (tmp_path / "shared").mkdir(mode=0o777)
    (tmp_path / "shared").chmod(0o777)
    env = {"DOCKYARD_OPS_CACHE": str(tmp_path / "shared")}
    assert environment.compile_cache(env) == [f"DOCKYARD_OPS_CACHE={tmp_path / 'shared'} can be written by other "
                                              "users (mode drwxrwxrwx)"]
    assert env == {}, "dropped: torch builds in its default folder instead"


def _op_folder(root: Path, op: str, age_s: float) -> Path:
    """An op's build folder as torch leaves it mid-build (its lock, ninja's file, an object), untouched for age_s."""
    folder = root / op
    folder.mkdir(parents=True)
    for name in ("lock", "build.ninja", f"{op}.o"):
        (folder / name).write_bytes(b"")
    then = time.time() - age_s
    for f in (*folder.iterdir(), folder):
        os.utime(f, (then, then))
    return folder


def test_a_lock_a_killed_op_build_left_is_removed_and_one_a_live_build_holds_is_kept(tmp_path):
    """A build of DeepSpeed's cpu_adam killed by SIGKILL (the OOM killer; torchrun after its grace period) left torch's
    lock file, and every later offload run waited on it before its first step, silently, forever (a CI run here sat
    13 minutes). The trainer now removes a lock no process has open whose folder nothing changed in for longer than a
    build takes, and says any other. Real files; the live build is a real process holding the lock open, as torch's
    FileBaton does."""
    dead = _op_folder(tmp_path, "cpu_adam", environment.STALE_BUILD_S + 60)
    removed, kept = environment.build_locks(str(tmp_path))
    assert not (dead / "lock").exists() and (dead / "cpu_adam.o").exists(), "the lock alone goes"
    assert kept == [] and len(removed) == 1
    assert removed[0].startswith(f"removed {dead / 'lock'}, left by a build of the op cpu_adam that was killed")

    live = _op_folder(tmp_path, "shm_comm", environment.STALE_BUILD_S + 60)
    holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "print(flush=True); time.sleep(60)", str(live / "lock")], stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()  # it has the lock open
        removed, kept = environment.build_locks(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert (live / "lock").exists() and removed == []
    assert kept == [f"DeepSpeed's shm_comm op is being built by process {holder.pid} (nothing changed in its folder "
                    f"since {time.strftime('%H:%M:%S', time.localtime((live / 'lock').stat().st_mtime))}): "
                    "this run waits for it"]


def test_a_run_that_loads_no_deepspeed_op_is_told_of_no_build_it_does_not_wait_on(tmp_path):
    """A newcomer's lora run (DDP: no DeepSpeed op loaded) started while another run built cpu_adam (an offload
    recipe's first run, minutes on a small host) said 'DeepSpeed's cpu_adam op is being built by process N ...: this
    run waits for it', and trained at once. A run whose recipe is not DeepSpeed's says nothing of a build going on,
    live or recent; a lock a killed build left is still removed (the next offload run would wait on it forever)."""
    live = _op_folder(tmp_path, "cpu_adam", 5)
    recent = _op_folder(tmp_path, "shm_comm", 30)
    dead = _op_folder(tmp_path, "fused_adam", environment.STALE_BUILD_S + 60)
    holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "print(flush=True); time.sleep(60)", str(live / "lock")], stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()  # it has the lock open
        removed, kept = environment.build_locks(str(tmp_path), loads=set())
        assert len(environment.build_locks(str(tmp_path))[1]) == 2, "a DeepSpeed run is told of both, as before"
    finally:
        holder.kill()
        holder.wait()
    assert kept == [] and (live / "lock").exists() and (recent / "lock").exists()
    assert len(removed) == 1 and not (dead / "lock").exists()


@pytest.mark.parametrize("name", recipes.recipe_names())
def test_only_a_recipe_that_loads_cpu_adam_is_told_it_waits_on_its_build(tmp_path, name):
    """zero2 (no offload: the HF Trainer's torch AdamW, no DeepSpeed op) started beside an offload run's first build
    of cpu_adam was told 'DeepSpeed's cpu_adam op is being built by process N ...: this run waits for it', and trained
    at once. Each of the repository's recipes is told of that build where it loads cpu_adam (an offloaded optimizer)
    and of no other op's; every recipe still removes a lock a killed build left."""
    live = _op_folder(tmp_path, "cpu_adam", 5)
    other = _op_folder(tmp_path, "fused_adam", 30)
    dead = _op_folder(tmp_path, "deepspeed_shm_comm", environment.STALE_BUILD_S + 60)
    holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "print(flush=True); time.sleep(60)", str(live / "lock")], stdout=subprocess.PIPE)
    recipe = recipes.load_recipe(name)
    try:
        holder.stdout.readline()  # it has the lock open
        removed, kept = environment.build_locks(str(tmp_path), loads=recipe.deepspeed_ops())
    finally:
        holder.kill()
        holder.wait()
    told = [line.split(" op ")[0] for line in kept]
    assert told == (["DeepSpeed's cpu_adam"] if recipe.strategy_spec.offload_optimizer else []), kept
    assert len(removed) == 1 and not (dead / "lock").exists() and (other / "lock").exists()


def test_the_ops_a_deepspeed_config_makes_its_optimizer_with():
    """What a run waits on follows its config: the HF Trainer's AdamW loads no op, an offloaded optimizer cpu_adam,
    an `optimizer` section on the device its fused op (a user's ds_config)."""
    assert recipes.optimizer_ops({"zero_optimization": {"stage": 2}}) == set()
    assert recipes.optimizer_ops({"zero_optimization": {"offload_optimizer": {"device": "cpu"}},
                                  "optimizer": {"type": "AdamW"}}) == {"cpu_adam"}
    assert recipes.optimizer_ops({"optimizer": {"type": "AdamW"}}) == {"fused_adam"}
    assert recipes.optimizer_ops({"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}) == set()


def test_a_recent_lock_no_process_here_holds_is_kept_and_said_with_the_file_to_remove(tmp_path):
    """Another container's run may be building the op into the same cache (its processes are not seen here): a lock
    touched within STALE_BUILD_S stays, and the run says what it waits on and what to remove if no build runs."""
    folder = _op_folder(tmp_path, "cpu_adam", 30)
    removed, kept = environment.build_locks(str(tmp_path))
    assert (folder / "lock").exists() and removed == [] and len(kept) == 1
    assert "locked by a build no process here runs" in kept[0]
    assert kept[0].endswith(f"if no other run is building cpu_adam, that build was killed: remove {folder / 'lock'}")
    (folder / "lock").unlink()
    assert environment.build_locks(str(tmp_path)) == ([], []), "a finished build leaves nothing to say"


def test_accelerates_accumulation_mismatch_warning_is_left_off_and_its_other_warnings_are_not(caplog):
    """Every ZeRO run that accumulates (a resume on fewer processes, keeping its global batch, does) warned on each
    rank "Gradient accumulation steps mismatch: GradientAccumulationPlugin has 1, DeepSpeed config has 2. Using
    DeepSpeed's value.": the accumulation the run asked for, said as a fault. The text is accelerate's own (read from
    its source here), as its logger hands it over, with the rank in front."""
    import inspect
    import logging

    from accelerate import Accelerator

    assert environment.ACCUMULATION_MISMATCH in inspect.getsource(Accelerator)
    environment.quiet_libraries()
    accelerate_log = logging.getLogger("accelerate.accelerator")
    with caplog.at_level(logging.WARNING):
        accelerate_log.warning(f"[RANK 0] {environment.ACCUMULATION_MISMATCH} 1, DeepSpeed config has 2. Using "
                               "DeepSpeed's value.")
        accelerate_log.warning("[RANK 0] something else accelerate says")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] something else accelerate says"]
