"""Several nodes: the rendezvous each node gets, the refusals before anything starts, naming a lost node, and
which checkpoint a resume after a node failure may trust. Nothing is run; no network is touched."""

import json
import os

import pytest

from dockyard.common.errors import DockyardError
from dockyard.launch import multinode
from dockyard.train import manifest, nodes

ROUTE = {"iface": "ens5", "addr": "10.0.0.2"}


def _rdzv(**kw):
    args = dict(master_addr="10.0.0.1", master_port=29500, node_rank=1, run_id="exp1", join_timeout=120,
                max_restarts=0, routes=ROUTE) | kw
    return multinode.rendezvous(**args)


def test_every_node_needs_the_same_run_id_and_is_told_so():
    with pytest.raises(DockyardError, match="needs --run-id, the same on every node"):
        _rdzv(run_id="")


@pytest.mark.parametrize("kw, message", [(dict(join_timeout=0), "--join-timeout"),
                                         (dict(max_restarts=-1), "--max-restarts")])
def test_bad_rendezvous_settings_are_refused(kw, message):
    with pytest.raises(DockyardError, match=message):
        _rdzv(**kw)


def test_a_loopback_master_address_is_refused_before_starting():
    with pytest.raises(DockyardError, match="loopback address: the other nodes cannot reach it"):
        multinode.route_to("127.0.0.1")


def test_the_rendezvous_is_recorded_for_the_manifest_and_names_the_interface():
    env = _rdzv().env()
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert '"endpoint": "10.0.0.1:29500"' in env["DOCKYARD_RENDEZVOUS"] and '"id": "exp1"' in env["DOCKYARD_RENDEZVOUS"]


def test_no_infiniband_folder_means_no_device_flags(tmp_path):
    assert multinode.infiniband_flags(tmp_path / "absent") == []


SEEN = [{"node_rank": 0, "host": "gpu-a", "addr": "10.0.0.1"}, {"node_rank": 1, "host": "gpu-b", "addr": "10.0.0.2"}]


def test_a_gloo_error_names_the_lost_node(monkeypatch):
    monkeypatch.setenv("DOCKYARD_NODE_RANK", "0")
    error = ("RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:15063: "
             "Connection reset by peer")
    assert nodes.lost_node(error, SEEN) == "lost node 1 (10.0.0.2, host gpu-b): it stopped answering"
    assert nodes.lost_node("CUDA out of memory", SEEN) is None


def _checkpoint(root, step, shards, rng_states, state=True, published=False):
    ck = root / "checkpoints" / f"checkpoint-{step}"
    (ck / f"global_step{step}").mkdir(parents=True)
    for r in range(shards):
        (ck / f"global_step{step}" / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt").touch()
    for r in range(rng_states):
        (ck / f"rng_state_{r}.pth").touch()
    if state:
        (ck / "trainer_state.json").write_text("{}")
    if published:  # what the trainer adds once every rank has saved (callbacks.PublishCheckpoint)
        manifest.mark_complete(ck, step)
    return ck


def test_resume_skips_a_checkpoint_a_lost_node_left_incomplete(tmp_path):
    good = _checkpoint(tmp_path, 3, shards=4, rng_states=4, published=True)
    _checkpoint(tmp_path, 6, shards=4, rng_states=2)            # node 1 died before writing its RNG states
    _checkpoint(tmp_path, 7, shards=4, rng_states=4)            # all written, but killed before the barrier after
    _checkpoint(tmp_path, 9, shards=3, rng_states=0, state=False)  # died while DeepSpeed was saving
    assert manifest.check_run_dir(tmp_path, resume=True) == str(good)


def test_doctor_peer_says_which_image_to_ship_and_where_infiniband_is_missing():
    from dockyard.machine import peer

    same = peer.check_same_image("dockyard:0.1.0-cu132", "sha256:aa", "sha256:aa", "gpu-b")
    differs = peer.check_same_image("dockyard:0.1.0-cu132", "sha256:aa", "sha256:bb", "gpu-b")
    missing = peer.check_same_image("dockyard:0.1.0-cu132", "sha256:aa", "", "gpu-b")
    assert same.status == "pass" and differs.status == missing.status == "fail"
    assert "invoke ship --image=dockyard:0.1.0-cu132 --to=gpu-b" in missing.fix and "differs" in differs.detail
    one_sided = peer.check_infiniband(["uverbs0"], [])
    assert one_sided.status == "warn" and "this node only" in one_sided.detail
    assert peer.check_peer_shm(str(64 * 1024)).status == "warn" and peer.check_peer_shm(str(8 * 2**20)).status == "pass"


def test_a_rank_that_saw_only_its_neighbour_stop_still_reports_the_lost_node(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCKYARD_NODE_RANK", "0")
    first = nodes.explain("Read error [10.0.0.2]:15063: Connection reset by peer", tmp_path, SEEN)
    later = nodes.explain("Connection closed by peer [10.0.0.1]:40112", tmp_path, SEEN)  # its neighbour on node 0
    assert first.startswith("lost node 1 (10.0.0.2") and later.startswith("lost node 1 (10.0.0.2")
    assert capsys.readouterr().err.count("error: lost node 1") == 1, "said once, by the rank that found it"
    assert nodes.explain("CUDA out of memory", tmp_path / "other", SEEN) == "CUDA out of memory"


def test_the_trainer_binds_gloo_and_nccl_to_the_interface_of_the_advertised_address(monkeypatch):
    """A hostname that resolves to loopback would make every rank advertise 127.0.0.1: the interface holding the
    address the launcher advertises is used instead, unless the user chose one."""
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps({"endpoint": "x:1", "local_addr": "127.0.0.1"}))
    assert nodes.pin_interface() == "lo"
    assert os.environ["GLOO_SOCKET_IFNAME"] == os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    assert nodes.pin_interface() is None and os.environ["NCCL_SOCKET_IFNAME"] == "ib0", "the user's choice"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps({"endpoint": "x:1", "local_addr": "198.18.255.254"}))
    assert nodes.pin_interface() is None and "GLOO_SOCKET_IFNAME" not in os.environ, "no such address here"
