"""`invoke run` plans: the docker run flags every GPU user needs, and the refusals that come before it.

GPUs are recorded NVML readings (dockyard.gpus.Host), since this host has none; nothing is run."""

import os
import re

import pytest

from dockyard.common import recipes
from dockyard.common.errors import DockyardError
from dockyard.gpus import Gpu, Host
from dockyard.images import variants
from dockyard.launch import command as launch_command
from dockyard.launch import multinode, node
from dockyard.launch import run as launch_run
from tests.support.cli import invoke_here, short_error

GPU = Gpu(0, "NVIDIA A100-SXM4-80GB", 80 * 2**30)
TWO_GPUS = Host(driver="580.65", cuda="13.0", gpus=[GPU, Gpu(1, GPU.name, GPU.memory_bytes)])
NVIDIA_ENGINE = {"Runtimes": {"runc": {}, "nvidia": {}}}


def _plan(settings, tmp_path, variant="cu132", host=TWO_GPUS, info=NVIDIA_ENGINE, overrides=(), **topo):
    v = variants.resolve(settings, variant)[0]
    t = launch_command.validate_topology(topo.pop("nproc", 0), topo.pop("nodes", 1), topo.pop("node_rank", 0),
                                 topo.pop("master_addr", ""), topo.pop("master_port", 29500), host, v)
    return launch_command.run_command(settings, recipe="zero2", variant=v, host=host, engine_info=info, topo=t,
                           run_dir=tmp_path / "runs" / "r1", overrides=list(overrides), **topo)


def _after_image(argv, image):
    return argv[argv.index(image) + 1:]


def test_gpu_run_has_the_flags_multi_gpu_training_needs(settings, tmp_path):
    argv = _plan(settings, tmp_path).argv
    joined = " ".join(argv)
    for flag in ("--gpus all", "--ipc=host", "--ulimit memlock=-1", "--ulimit stack=67108864", "--init", "--rm"):
        assert flag in joined
    assert f"--user {os.getuid()}:{os.getgid()}" in joined
    assert "HF_HUB_OFFLINE=1" in argv and "NVIDIA_DISABLE_REQUIRE=1" not in argv
    cmd = _after_image(argv, "dockyard:0.1.0-cu132")
    assert cmd[:3] == ["torchrun", "--nproc-per-node=2", "--standalone"], "one process per GPU"
    assert cmd[3] == "--local-addr=127.0.0.1", "a container without a network cannot resolve its hostname"
    assert cmd[4:10] == ["-m", "dockyard.train", "--recipe", "zero2", "--run-dir", "/workspace/runs/r1"]
    assert f"{tmp_path / 'runs'}:/workspace/runs" in argv


def test_cpu_run_has_no_gpu_flags_and_two_processes(settings, tmp_path):
    argv = _plan(settings, tmp_path, variant="cpu", host=Host(error="no driver"), info={}).argv
    assert "--gpus" not in argv and "--ipc=host" in argv
    assert "--nproc-per-node=2" in _after_image(argv, "dockyard:0.1.0-cpu")


def test_overrides_reach_the_trainer_after_a_bare_double_dash(settings, tmp_path):
    cmd = _plan(settings, tmp_path, overrides=["--max_steps", "5", "--learning_rate", "1e-4"]).argv
    assert cmd[-5:] == ["--", "--max_steps", "5", "--learning_rate", "1e-4"]


def test_disable_require_is_opt_in(settings, tmp_path):
    assert "NVIDIA_DISABLE_REQUIRE=1" in _plan(settings, tmp_path, disable_require=True).argv


def _two_nodes(settings, tmp_path, node_rank, ib_root):
    v = variants.resolve(settings, "cu132")[0]
    t = launch_command.validate_topology(0, 2, node_rank, "10.1.2.3", 29600, TWO_GPUS, v)
    t.rendezvous = multinode.rendezvous(master_addr="10.1.2.3", master_port=29600, node_rank=node_rank, run_id="exp1",
                                        join_timeout=90, max_restarts=1, recipe="zero2",
                                        routes={"iface": "ens5", "addr": f"10.1.2.{3 + node_rank}"})
    return launch_command.run_command(settings, recipe="zero2", variant=v, host=TWO_GPUS, engine_info=NVIDIA_ENGINE, topo=t,
                           run_dir=tmp_path / "runs" / "exp1", overrides=[], ib_root=ib_root)


def test_multinode_uses_c10d_rendezvous_hosted_by_node_0_and_host_network(settings, tmp_path):
    node0, node1 = (_two_nodes(settings, tmp_path, r, tmp_path / "no-ib").argv for r in (0, 1))
    cmd0, cmd1 = (_after_image(a, "dockyard:0.1.0-cu132") for a in (node0, node1))
    for cmd in (cmd0, cmd1):
        assert cmd[:6] == ["torchrun", "--nproc-per-node=2", "--nnodes=2", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=10.1.2.3:29600", "--rdzv-id=exp1"]
        assert "--max-restarts=1" in cmd
    assert "--rdzv-conf=is_host=1,join_timeout=90" in cmd0 and "--rdzv-conf=is_host=0,join_timeout=90" in cmd1
    assert "--local-addr=10.1.2.3" in cmd0 and "--local-addr=10.1.2.4" in cmd1, "each node advertises its own address"
    assert "NCCL_SOCKET_IFNAME=ens5" in node1 and "GLOO_SOCKET_IFNAME=ens5" in node1 and "DOCKYARD_NODE_RANK=1" in node1
    assert "--network" in node0 and "host" in node0
    # under the host network docker copies the host's /etc/hosts, unless given an --add-host: then its own file,
    # without the host's names (the nodes', the host's own), which the run would look up on a DNS server instead
    assert "--add-host" not in node0 and "--add-host" not in node1
    assert "--device" not in node0 and "IPC_LOCK" not in node0, "no InfiniBand on this host: nothing passed"


def test_multinode_gpu_run_gets_the_infiniband_devices_and_ipc_lock(settings, tmp_path):
    ib = tmp_path / "dev" / "infiniband"
    ib.mkdir(parents=True)
    for name in ("uverbs0", "uverbs1", "rdma_cm"):
        (ib / name).touch()
    argv = _two_nodes(settings, tmp_path, 0, ib).argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--device"] == [str(ib / n) for n in
                                                                            ("rdma_cm", "uverbs0", "uverbs1")]
    assert argv[argv.index("--cap-add") + 1] == "IPC_LOCK"


@pytest.mark.parametrize("kw, message", [
    (dict(nodes=2), "needs --master-addr"),
    (dict(nodes=2, node_rank=2, master_addr="h"), "--node-rank must be in 0..1"),
    (dict(nproc=3), "one process per GPU"),
    (dict(master_port=70000), "TCP port"),
])
def test_bad_topology_is_refused(settings, tmp_path, kw, message):
    with pytest.raises(DockyardError, match=message):
        _plan(settings, tmp_path, **kw)


def test_several_nodes_need_each_nodes_rank_and_a_rank_needs_the_node_count(tmp_path, monkeypatch):
    """The newcomer audit: `--nodes=2 --master-addr=...` with --node-rank forgotten on node 1 ran as node 0, hosting a
    rendezvous of its own (both nodes then wait for the other until the join timeout), and the warning it printed
    told node 1 to use its own address; `--node-rank=1` without --nodes said "must be in 0..0". Each is one line
    naming what to add, before a run folder is made; one node needs no rank (0 is the only one)."""
    # this node's route to --master-addr as `ip route get` would give it on a node of that network: not this host's
    # routing table (a host with no default route, an air-gapped node, answers "Network is unreachable")
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "192.0.2.7"})
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke_here("run", "--dry", "--cpu", "--nodes=2", "--master-addr=192.0.2.1", "--run-id=mn", env=env)
    short_error(r, "--nodes=2 needs this node's --node-rank: 0 on the node at --master-addr (it hosts the "
                   "rendezvous), 1 on the other")
    r = invoke_here("run", "--dry", "--cpu", "--node-rank=1", "--run-id=mn", env=env)
    short_error(r, "--node-rank=1 is for several nodes: give their number too, --nodes=N")
    assert not (tmp_path / "runs").exists()
    given = invoke_here("run", "--dry", "--cpu", "--nodes=2", "--node-rank=1", "--master-addr=192.0.2.1",
                        "--run-id=mn", env=env)
    assert given.returncode == 0 and "--rdzv-conf=is_host=0" in given.stdout + given.stderr, given.stderr
    assert "--local-addr=192.0.2.7 " in given.stdout + given.stderr  # the address this node reaches node 0 from
    for one in ([], ["--node-rank=0"]):
        alone = invoke_here("run", "--dry", "--cpu", *one, env=env)
        assert alone.returncode == 0 and "--standalone" in alone.stdout + alone.stderr, alone.stderr


def test_gpus_without_nvidia_runtime_says_how_to_configure_it(settings, tmp_path, monkeypatch):
    monkeypatch.setattr(launch_run.engine, "which", lambda name: None)
    with pytest.raises(DockyardError, match="nvidia-ctk runtime configure"):
        _plan(settings, tmp_path, info={"Runtimes": {"runc": {}}})


def test_driver_older_than_image_cuda_is_refused_before_starting(settings, tmp_path):
    old = Host(driver="550.54", cuda="12.4", gpus=[GPU])
    with pytest.raises(DockyardError, match=r"needs CUDA 13\.2 but driver 550\.54 supports CUDA 12\.4.*--variant=auto"):
        _plan(settings, tmp_path, host=old)


def test_cuda_image_on_a_host_without_gpus_trains_on_cpu_only_when_asked(settings, tmp_path):
    v = variants.resolve(settings, "cu132")[0]
    with pytest.raises(DockyardError, match="needs NVIDIA GPUs.*--variant=cpu.*--cpu"):
        launch_command.validate_topology(0, 1, 0, "", 29500, Host(error="NVML unavailable"), v)
    t = launch_command.validate_topology(0, 1, 0, "", 29500, Host(), v, cpu=True)
    argv = launch_command.run_command(settings, recipe="zero2", variant=v, host=Host(), engine_info={}, topo=t,
                           run_dir=tmp_path / "r", overrides=[], cpu=True).argv
    assert "--gpus" not in argv and "DS_ACCELERATOR=cpu" in argv, "DeepSpeed must not look for a GPU"
    assert _after_image(argv, "dockyard:0.1.0-cu132")[1] == f"--nproc-per-node={node.CPU_NPROC}"


def test_unknown_recipe_lists_valid_names(settings, tmp_path):
    s = settings.model_copy(update={"runs_dir": tmp_path})
    with pytest.raises(DockyardError, match=r"unknown recipe 'zero9'.*zero2"):
        launch_run.run(s, launch_run.RunRequest(recipe="zero9", variant="cpu", dry=True))
    assert not list(tmp_path.iterdir()), "refused before any run folder"


@pytest.mark.parametrize("native", [False, True])
def test_a_dry_run_loads_its_recipe_once(settings, tmp_path, monkeypatch, native):
    loaded = []
    real = launch_run.load_recipe
    monkeypatch.setattr(launch_run, "load_recipe", lambda name: loaded.append(name) or real(name))
    monkeypatch.setattr(recipes, "load_recipe", lambda name: pytest.fail(f"{name} loaded again"))
    s = settings.model_copy(update={"runs_dir": tmp_path})
    launch_run.run(s, launch_run.RunRequest(recipe="zero2", variant="cpu", dry=True, native=native))
    assert loaded == ["zero2"]


@pytest.mark.parametrize("native", [False, True])
def test_a_run_of_one_node_given_no_node_rank_is_executed_as_node_0(settings, tmp_path, monkeypatch, native):
    """`invoke run` (no --node-rank: -1, not given, as tasks.py passes it) is node 0's run. When the checks and the
    command were split from their execution, the request's settled rank stayed with the checks, and execution read -1:
    a completed native run said 'the run wrote no manifest (.../manifest-node-1.json)' and named its monitor files node
    -1's. The execution is a stand-in here (the real one trains): what it is handed is what it would claim, watch and
    summarise with."""
    handed = []
    monkeypatch.setattr(launch_run, "execute", lambda settings, r, command, devices: handed.append(r.node_rank))
    monkeypatch.setattr(launch_run.engine, "engine_info", lambda settings: {})
    monkeypatch.setattr(launch_run.engine, "image_inspect", lambda settings, ref: {"Id": "sha256:" + "a" * 64})
    s = settings.model_copy(update={"runs_dir": tmp_path})
    launch_run.run(s, launch_run.RunRequest(recipe="ddp", variant="cpu", native=native, cpu=native, node_rank=-1))
    assert handed == [0]


def test_existing_run_is_never_overwritten(settings, tmp_path):
    s = settings.model_copy(update={"runs_dir": tmp_path})
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "manifest.json").write_text("{}")
    with pytest.raises(DockyardError, match="already holds a run.*--resume"):
        launch_run.new_run_dir(s, "zero2", "r1", resume=False)
    assert launch_run.new_run_dir(s, "zero2", "r1", resume=True) == tmp_path / "r1"
    with pytest.raises(DockyardError, match="no run folder"):
        launch_run.new_run_dir(s, "zero2", "nope", resume=True)


def test_node_0_is_not_refused_for_what_the_other_nodes_wrote_first(settings, tmp_path):
    """Slurm and Kubernetes start the nodes together: node 1 may write its own files into the shared folder
    before node 0 looks. Those are not an earlier run; anything else still is."""
    s = settings.model_copy(update={"runs_dir": tmp_path})
    (tmp_path / "r2").mkdir()
    for name in ("monitor-node1.jsonl", "manifest-node1.json", "gpu-node12.png"):
        (tmp_path / "r2" / name).write_text("")
    assert launch_run.new_run_dir(s, "zero2", "r2", resume=False, node_rank=0) == tmp_path / "r2"
    (tmp_path / "r2" / "monitor.jsonl").write_text("")
    with pytest.raises(DockyardError, match="already holds a run"):
        launch_run.new_run_dir(s, "zero2", "r2", resume=False, node_rank=0)


def test_memlock_is_unlimited_unless_the_engine_cannot_grant_it(capsys):
    assert launch_command.memlock_flag(None) == "memlock=-1"
    assert launch_command.memlock_flag(8388608) == "memlock=8388608"
    assert "LimitMEMLOCK=infinity" in capsys.readouterr().err


@pytest.mark.parametrize("value,flag", [("8388608", "memlock=8388608"), ("0", "memlock=0"), ("-1", "memlock=-1"),
                                        ("unlimited", "memlock=-1")])
def test_dockyard_memlock_says_the_engines_limit_in_bytes_or_unlimited(capsys, monkeypatch, value, flag):
    monkeypatch.setenv("DOCKYARD_MEMLOCK", value)
    assert launch_command.memlock_flag(None) == flag and launch_command.memlock_flag(4096) == flag
    err = capsys.readouterr().err
    assert ("hard memlock limit is -1" not in err) and (("LimitMEMLOCK" in err) == (flag != "memlock=-1"))


@pytest.mark.parametrize("task", [["run", "--dry", "--variant=cpu"], ["shell", "--dry", "--variant=cpu"]])
@pytest.mark.parametrize("value", ["abc", "1e9", "-5", "1.5", "99999999999999999999"])
def test_a_dockyard_memlock_that_is_not_bytes_is_one_error_naming_it(tmp_path, task, value):
    r = invoke_here(*task, env={"DOCKYARD_MEMLOCK": value, "INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "DOCKYARD_MEMLOCK")
    assert "in bytes" in r.stderr and "unlimited" in r.stderr and "docker run" not in r.stdout + r.stderr
    assert not (tmp_path / "runs").exists()


def test_shell_cpu_opens_a_cuda_image_on_a_host_without_gpus(tmp_path, monkeypatch):
    """A build host without GPUs works in a CUDA image's stack (then `invoke commit`s it): `invoke shell --cpu` gives
    the container no GPU and DeepSpeed the CPU accelerator; without --cpu the refusal names a flag shell has."""
    monkeypatch.setattr(launch_run, "read_host", lambda: Host(error="NVML unavailable (no driver)"))
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke_here("shell", "--dry", "--variant=cu128", "--cpu", env=env)
    assert r.returncode == 0, r.stderr
    assert "--gpus" not in r.stdout + r.stderr and "DS_ACCELERATOR=cpu" in r.stdout + r.stderr
    r = invoke_here("shell", "--dry", "--variant=cu128", env=env)
    short_error(r, "needs NVIDIA GPUs")
    assert "--cpu" in r.stderr
    assert invoke_here("shell", "--dry", "--variant=cu128", "--cpu", env=env).returncode == 0


def test_a_native_run_of_a_cuda_variant_on_a_host_without_gpus_is_told_what_a_native_run_can_do(tmp_path,
                                                                                                   monkeypatch):
    """`invoke run --native --variant=cu132` on a host without GPUs was told to try "this image's stack" on CPU, and
    --native uses no image: it is told to add --cpu (this host's torch on its CPUs), or to run on a GPU host."""
    monkeypatch.setattr(launch_run, "read_host", lambda: Host(error="NVML unavailable (no driver)"))
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke_here("run", "--dry", "--native", "--variant=cu132", env=env)
    short_error(r, "--native --variant=cu132 trains on this host's NVIDIA GPUs but NVML unavailable (no driver); add "
                   "--cpu to train on its CPUs with its own torch, or run it on a host with GPUs")
    assert "image" not in r.stderr, r.stderr
    assert invoke_here("run", "--dry", "--native", "--variant=cu132", "--cpu", env=env).returncode == 0
    short_error(invoke_here("run", "--dry", "--variant=cu132", env=env), "this image's stack")  # in the image: so


def test_a_shell_kept_for_commit_is_not_removed_and_says_the_name_to_commit(tmp_path, monkeypatch):
    """The newcomer audit: `invoke shell --help` said "(then `invoke commit`)", yet the shell's container was
    `docker run --rm`: what was installed in it was gone when it ended, and commit found no container. It still goes
    by default; `--keep` keeps it and names it for the commit."""
    from dockyard import engine

    monkeypatch.setattr(launch_run, "read_host", lambda: Host(error="NVML unavailable (no driver)"))
    # the docker setting left empty, as by default: the client is the one found on PATH (here a stand-in)
    monkeypatch.setattr(engine, "docker_binary", lambda setting="": setting or "/opt/found/docker")
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs"), "INVOKE_DOCKYARD_DOCKER": ""}
    kept = invoke_here("shell", "--dry", "--variant=cpu", "--keep", env=env)
    assert kept.returncode == 0, kept.stderr
    name = re.search(r"--name (dockyard-shell-\d+)", kept.stdout + kept.stderr).group(1)
    assert f"`invoke commit --container={name}` makes an image of what you changed" in kept.stderr
    # it said "(` rm dockyard-shell-N` drops it)": the empty setting, not the client found
    assert f"(`/opt/found/docker rm {name}` drops it)" in kept.stderr
    assert " --rm " not in kept.stdout + kept.stderr
    gone = invoke_here("shell", "--dry", "--variant=cpu", env=env)
    assert " --rm " in gone.stdout + gone.stderr and "invoke commit" not in gone.stderr


def test_gpus_are_chosen_by_index_uuid_or_a_uuids_unique_start_and_never_a_mig_device(monkeypatch):
    from dockyard.gpus import Gpu, select

    host = Host(driver="580.1", cuda="13.0", gpus=[Gpu(0, "H100", 80 << 30, uuid="GPU-5d5ba0d6-aaaa"),
                                                   Gpu(1, "H100", 80 << 30, uuid="GPU-5d5c0000-bbbb")])
    assert select(host, "GPU-5d5ba").visible == "0" and select(host, "1,GPU-5d5c").visible == "1"
    with pytest.raises(DockyardError, match="starts the UUID of several GPUs"):
        select(host, "GPU-5d5")
    with pytest.raises(DockyardError, match="is a MIG device: runs take whole GPUs"):
        select(host, "MIG-c6d4f1ef-1234")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert select(host).gpus == [host.gpus[1]]


def test_gpus_asked_for_on_a_host_without_gpus_are_refused_not_trained_on_cpu(settings, tmp_path, monkeypatch):
    """`invoke run --gpus=0,2` on a host where NVML sees no GPU (the driver not loaded, the wrong host) was accepted and
    the run went to CPU; a CUDA_VISIBLE_DEVICES left set there is no request and stays ignored."""
    from dockyard.gpus import select

    cpu_host = Host(error="NVML could not be loaded (no NVIDIA driver)")
    with pytest.raises(DockyardError, match=r"--gpus=0,2, but NVML could not be loaded \(no NVIDIA driver\): leave "
                                            r"--gpus out to train on CPU"):
        select(cpu_host, "0,2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert select(cpu_host) == cpu_host


def test_shell_of_an_image_not_built_is_refused_not_pulled_from_a_registry(tmp_path, monkeypatch):
    """`invoke shell` ran `docker run` at once: with no such image, docker looked for it on docker.io. The engine here
    is a stand-in that has no image (and would fail the test if the shell started)."""
    from dockyard import engine

    monkeypatch.setattr(launch_run, "read_host", lambda: Host(error="NVML unavailable (no driver)"))
    monkeypatch.setattr(engine, "engine_info", lambda settings: {})
    monkeypatch.setattr(engine, "image_inspect", lambda settings, ref: None)
    monkeypatch.setattr(launch_run.os, "execvp", lambda *a: pytest.fail(f"started {a}"))
    r = invoke_here("shell", "--variant=cpu", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "image dockyard:0.1.0-cpu not built: `invoke build --variant=cpu`")


def test_a_node_of_several_without_the_image_is_told_to_ship_it_from_the_node_that_built_it(tmp_path, monkeypatch):
    """Node 1 of a run of two, whose engine lacks the image: told `invoke build`, which makes another image there (an
    hour's build, on an air-gapped node one that cannot fetch its wheels) where docs/multinode.md asks for the same
    image on every node, built once and shipped. The engine here is a stand-in that has no image."""
    from dockyard import engine

    monkeypatch.setattr(launch_run, "read_host", lambda: Host(error="NVML unavailable (no driver)"))
    monkeypatch.setattr(engine, "engine_info", lambda settings: {})
    monkeypatch.setattr(engine, "image_inspect", lambda settings, ref: None)
    r = invoke_here("run", "--variant=cpu", "--nodes=2", "--node-rank=1", "--master-addr=192.0.2.1", "--run-id=mn1",
                    env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(r, "image dockyard:0.1.0-cpu is not on this node: every node runs the same image, built once: from the "
                   "node that has it, `invoke ship --image=dockyard:0.1.0-cpu --to=THIS_NODE` (or `invoke save "
                   "--image=dockyard:0.1.0-cpu` there and `invoke load --file=...` here)")
    alone = invoke_here("run", "--variant=cpu", "--run-id=one1", env={"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")})
    short_error(alone, "image dockyard:0.1.0-cpu not built: `invoke build --variant=cpu`")
