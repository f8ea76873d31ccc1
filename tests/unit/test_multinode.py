"""Several nodes: the rendezvous each node gets, the refusals before anything starts, naming a lost node, and
which checkpoint a resume after a node failure may trust. Nothing trains; the only network touched is loopback
(doctor's peer checks: ssh refused there, and a listener opened and reached there)."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from dockyard.common import runfolder
from dockyard.common.errors import DockyardError
from dockyard.common.recipes import RECIPES, load_recipe
from dockyard.launch import multinode, node, run
from dockyard.train import manifest, nodes
from tests.support.ports import held_port

ROUTE = {"iface": "ens5", "addr": "10.0.0.2"}


def _rdzv(**kw):
    args = dict(master_addr="10.0.0.1", master_port=29500, node_rank=1, run_id="exp1", join_timeout=120,
                max_restarts=0, recipe="zero2", routes=ROUTE) | kw
    return multinode.rendezvous(**args)


def test_every_node_needs_the_same_run_id_and_is_told_so():
    with pytest.raises(DockyardError, match="needs --run-id, the same on every node"):
        _rdzv(run_id="")


@pytest.mark.parametrize("recipe, suggested", [("lora", "lora-exp1"), ("zero3-offload", "zero3-offload-exp1"),
                                               ("{tmp}/my recipe/", "my-recipe-exp1")])
def test_the_run_id_a_multinode_run_is_told_to_give_is_built_from_its_recipe(recipe, suggested, tmp_path):
    """`invoke run --recipe=lora --nodes=2` without --run-id was told `--run-id=zero2-exp1` whatever the recipe: a
    user who copied it named a LoRA run zero2. The id suggested is now the recipe's (a folder's own name), and one
    the run takes."""
    (tmp_path / "my recipe").mkdir()
    (tmp_path / "my recipe" / "recipe.yaml").write_text("strategy: zero2\n")
    with pytest.raises(DockyardError) as e:
        _rdzv(run_id="", recipe=recipe.format(tmp=tmp_path))
    given = re.search(r"--run-id=(\S+) on each node", str(e.value))[1]
    assert given == suggested
    assert _rdzv(run_id=given).run_id == given and not run.not_a_run_id(given)


@pytest.mark.parametrize("kw, message", [(dict(join_timeout=0), "--join-timeout"),
                                         (dict(max_restarts=-1), "--max-restarts")])
def test_bad_rendezvous_settings_are_refused(kw, message):
    with pytest.raises(DockyardError, match=message):
        _rdzv(**kw)


def test_a_loopback_master_address_is_refused_before_starting():
    with pytest.raises(DockyardError, match="loopback address: the other nodes cannot reach it"):
        multinode.route_to("127.0.0.1")


@pytest.mark.parametrize("addr", ["0.0.0.0", "::"])
def test_an_any_address_as_master_address_is_refused_by_name(addr):
    """0.0.0.0 was blamed on --iface (no route), and :: went on to a rendezvous no node could dial."""
    with pytest.raises(DockyardError, match=f"--master-addr {addr} means any address, none the other nodes can dial"):
        multinode.route_to(addr)


@pytest.mark.parametrize("addr, says", [("::ffff:127.0.0.1", "is a loopback address"),
                                         ("224.0.0.1", "is a multicast or broadcast address, no one node's"),
                                         ("255.255.255.255", "is a multicast or broadcast address, no one node's")])
def test_a_master_address_no_node_holds_is_refused_by_name(addr, says):
    """::ffff:127.0.0.1 got past the loopback refusal (Python calls a mapped address no loopback), and a multicast or
    broadcast address went on to a rendezvous no node hosts."""
    with pytest.raises(DockyardError, match=f"--master-addr {re.escape(addr)} {says}"):
        multinode.route_to(addr)



def test_a_master_address_this_node_has_no_route_to_says_what_to_give(tmp_path, monkeypatch):
    """A mistyped --master-addr on a node without a default route (a cluster's private network): `ip route get`
    fails, and that was the whole error, "`ip route get 198.19.71.1` failed: RTNETLINK answers: Network is
    unreachable", with no word of the flag or what to give. `ip` here answers as it did in a network namespace."""
    fake = tmp_path / "ip"
    fake.write_text('#!/bin/sh\ncase "$*" in\n  *route*) echo "RTNETLINK answers: Network is unreachable" >&2; '
                    'exit 2;;\n  *) echo "[]";;\nesac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(DockyardError) as refused:
        multinode.route_to("198.19.71.1")
    assert str(refused.value) == (
        "--master-addr 198.19.71.1: this node has no route to 198.19.71.1 (Network is unreachable): give node 0's "
        "address on the network the nodes share (`ip -4 addr` there shows it; `ip route` here, the networks this node "
        "reaches), or --iface=NAME")


@pytest.mark.parametrize("name", ["node0..cluster", "a" * 64 + ".cluster"])
def test_a_name_no_host_can_have_is_one_line_not_a_traceback(name):
    """An empty label, or one past 63 characters, fails as the name is encoded, before any lookup: it was a
    UnicodeError traceback in `invoke run` and in doctor's peer checks, which lost the whole report."""
    from dockyard.machine import peer

    with pytest.raises(DockyardError, match=f"cannot resolve '{name}'"):
        multinode.route_to(name)
    assert peer.connect(name, 29500).startswith(f"cannot resolve '{name}' here")
    assert peer.check_route(name).status == "fail"


def test_node_0_on_its_own_address_is_not_warned_when_another_interface_carries_the_collectives(monkeypatch, capsys):
    """Rendezvous on the management network, NCCL on a fast interface: node 0 at its own 10.0.0.1 with --iface ib0
    was told its --master-addr was not an address of this node."""
    monkeypatch.setattr(multinode, "interface_address", lambda iface: "192.168.7.1")
    r = _rdzv(node_rank=0, iface="ib0", routes={"iface": "ens5", "addr": "10.0.0.1"})
    assert "is not an address of this node" not in capsys.readouterr().err
    assert (r.iface, r.local_addr) == ("ib0", "192.168.7.1")
    _rdzv(node_rank=0, master_addr="10.0.0.9", iface="ib0", routes={"iface": "ens5", "addr": "10.0.0.1"})
    assert "--master-addr 10.0.0.9 is not an address of this node" in capsys.readouterr().err


@pytest.mark.parametrize("iface", ["lo", ""])
def test_a_loopback_interface_is_refused_before_starting(iface):
    """Once `--iface lo` was taken: the node advertised 127.0.0.1 (GLOO_SOCKET_IFNAME=lo), which no other node reaches."""
    with pytest.raises(DockyardError, match=r"--iface lo is a loopback interface \(127.0.0.1\): the other nodes cannot "
                                            "reach it"):
        _rdzv(iface=iface, routes={"iface": "lo", "addr": "127.0.0.1"})


@pytest.mark.parametrize("iface", ["lo:x", 'lo:a b"c', "nope0"])
def test_an_interface_name_ip_answers_for_by_another_is_refused(iface):
    """`ip addr show dev lo:x` answers for lo (the real `ip`, this host's loopback): the name went on to gloo and
    NCCL, which look it up as given and failed at run time. A name of no interface at all was ip's own error
    (`Device "nope0" does not exist`): the same line now."""
    with pytest.raises(DockyardError, match=f"--iface {re.escape(iface)}: no interface .nor address label. of that "
                                            "name here"):
        multinode.interface_address(iface)
    assert multinode.interface_address("lo") == "127.0.0.1"


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


def test_the_trainer_binds_gloo_and_nccl_to_the_interface_of_the_advertised_address(monkeypatch, tmp_path):
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
    # an IPv6 address (a name resolving to one alone, as the launcher now takes): its interface all the same, from
    # the kernel's table of them (written here as the kernel writes it: the machine may have IPv6 off)
    table = tmp_path / "if_inet6"
    table.write_text("00000000000000000000000000000001 01 80 10 80       lo\n"
                     "fd000000000000000000000000000002 04 40 00 82     eth7\n")
    monkeypatch.setattr(nodes, "IF_INET6", table)
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps({"endpoint": "x:1", "local_addr": "fd00::2"}))
    assert nodes.pin_interface() == "eth7" and os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
    assert nodes.interface_of("fd00::3") is None and nodes.interface_of("::1") == "lo"



def test_one_node_meeting_on_loopback_binds_gloo_there_and_leaves_nccl(monkeypatch):
    """A node whose own hostname resolves to nothing (missing from /etc/hosts: a fresh air-gapped node, a container
    with the host's network) had every rank of a one-node run warn "Unable to resolve hostname to a (local)
    address. Using the loopback address as fallback": its ranks meet on 127.0.0.1 (torchrun --standalone
    --local-addr=127.0.0.1), so gloo is bound there. Several nodes, or a user's choice, are left alone."""
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "DOCKYARD_RENDEZVOUS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert nodes.pin_interface() == "lo" and os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert "NCCL_SOCKET_IFNAME" not in os.environ, "NCCL meets on no socket within a node"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one rank of two nodes: its master is node 0, elsewhere
    assert nodes.pin_interface() is None and "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "198.18.0.1")
    assert nodes.pin_interface() is None and "GLOO_SOCKET_IFNAME" not in os.environ

# --- a node lost at any moment: the heartbeat's bound and verdicts ----------------------------------------------

@pytest.mark.parametrize("rdzv, bound", [({"join_timeout": 45}, 45.0), ({}, float(node.JOIN_TIMEOUT)),
                                         ({"join_timeout": "x"}, float(node.JOIN_TIMEOUT)),
                                         ({"join_timeout": 0}, float(node.JOIN_TIMEOUT))])
def test_the_silence_bound_is_the_join_timeout_the_launcher_gave(monkeypatch, rdzv, bound):
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps(rdzv))
    assert nodes.silence_bound() == bound


def test_the_join_timeout_reaches_the_trainer_from_every_launcher():
    """`invoke run` and the schedulers' node command both record it where the trainer reads it."""
    assert json.loads(_rdzv(join_timeout=33).env()["DOCKYARD_RENDEZVOUS"])["join_timeout"] == 33
    line = node.node_command(index="$I", nnodes=2, nproc=8, endpoint="n0:29500", entry="-m dockyard.train",
                                  run_id="r", join_timeout=33)
    assert '\\"join_timeout\\": 33' in line and re.search(r"join_timeout=33\b", line)


@pytest.mark.parametrize("bound, interval", [(1, 0.5), (20, 2.0), (120, 5.0), (600, 5.0)])
def test_ten_beats_fit_in_the_bound(bound, interval):
    assert nodes.beat_interval(bound) == interval


def test_a_node_that_keeps_beating_is_never_lost_and_a_still_one_is_after_the_bound():
    s = nodes.Silence([1, 2], bound=10, started=0.0)
    for t in range(1, 30):
        assert s.see({1: t, 2: t}, float(t)) is None
    assert s.see({1: 30, 2: 29}, 30.0) is None      # node 2 still for 1 s
    assert s.see({1: 40, 2: 29}, 39.0) is None      # ... for 10 s: not more than the bound yet
    assert s.see({1: 41, 2: 29}, 39.5) == (2, 10.5, True)


def test_a_node_that_never_beats_is_lost_a_bound_after_watching_started():
    s = nodes.Silence([1], bound=10, started=100.0)
    assert s.see({1: 0}, 109.0) is None
    assert s.see({1: 0}, 111.0) == (1, 11.0, False)
    late = nodes.Silence([1], bound=10, started=100.0)
    assert late.see({1: 0}, 109.0) is None and late.see({1: 1}, 109.5) is None, "late, but within the bound"
    assert late.see({1: 1}, 119.0) is None and late.see({1: 1}, 120.0) == (1, 10.5, True)


def test_a_node_done_with_its_run_is_never_lost_and_the_longest_silent_is_named():
    s = nodes.Silence([1, 2, 3], bound=5, started=0.0)
    s.see({1: 1, 2: 1, 3: 1}, 1.0)
    s.see({1: 1 + nodes.DONE, 2: 2, 3: 1}, 2.0)
    assert s.see({1: 1 + nodes.DONE, 2: 2, 3: 1}, 100.0) == (3, 99.0, True)


def test_the_lost_node_is_named_as_a_collective_names_it():
    info = {"node_rank": 1, "host": "gpu-b", "addr": "10.0.0.2"}
    said = nodes.lost_message(1, 21.4, True, info, "loading the data and the model")
    assert said.startswith("lost node 1 (10.0.0.2, host gpu-b): it stopped answering")
    assert "no heartbeat for 21 s, while this node was loading the data and the model" in said
    never = nodes.lost_message(1, 20.2, False, None, "setting up the process group")
    assert never.startswith("lost node 1: it stopped answering") and "never started" in never


def _heartbeats(monkeypatch, port, bound, ranks=(0, 1)):
    """One Heartbeat per node rank, as each node's first process makes it, in this process (real TCPStore)."""
    import queue

    said = {r: queue.Queue() for r in ranks}
    beats = {}
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("GROUP_WORLD_SIZE", str(len(ranks)))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps({"local_addr": "127.0.0.1"}))
    for r in ranks:
        monkeypatch.setenv("DOCKYARD_NODE_RANK", str(r))
        beats[r] = nodes.Heartbeat(said[r].put, bound=bound)
    return beats, said


def _said_who_it_is(store, rank, within=30.0):
    """Until node `rank`'s heartbeat has written its info (once, before its first beat): a fixed second was not enough
    on a loaded host, where the info then came after a stranger's write and overwrote it."""
    import time

    until = time.monotonic() + within
    while not store.check([nodes.NODE.format(rank)]):
        assert time.monotonic() < until, f"node {rank} wrote no info within {within:g} s"
        time.sleep(0.05)


def _after_each_request(monkeypatch, beat, seen):
    """`beat`'s connection to the store, calling `seen(name, args, answer)` after each of its requests (a stranger
    acting in between, or a count of what it downloads)."""
    class Watched:
        def __init__(self, store):
            self.store = store

        def __getattr__(self, name):
            def call(*args):
                answer = getattr(self.store, name)(*args)
                seen(name, args, answer)
                return answer
            return call

    connect = nodes.Heartbeat._connect
    monkeypatch.setattr(beat, "_connect", lambda deadline: Watched(connect(beat, deadline)))


def test_heartbeats_through_a_real_store_name_a_node_that_goes_silent(monkeypatch, loopback_port):
    """Two nodes' heartbeats through a real store: nobody is lost while both beat, and the one that goes silent is
    named about a bound later. The bound is 3 s, not less: with 1.5 s, a loaded CI host that left a beat's thread
    unscheduled that long would have a live node called lost."""
    import datetime
    import queue
    import time

    from torch.distributed import TCPStore

    port = loopback_port
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    bound = 3.0
    beats, said = _heartbeats(monkeypatch, port, bound=bound)
    beats[0].phase = "setting up the process group"
    for b in beats.values():
        b.start()
    time.sleep(bound + 1)  # longer than the bound: both beat, nobody is lost
    assert said[0].empty() and said[1].empty()
    beats[1]._stop = True  # node 1 goes silent, as a killed node does
    stopped = time.monotonic()
    message = said[0].get(timeout=bound + 30)  # (a hang's guard)
    took = time.monotonic() - stopped
    assert bound - 2 * nodes.beat_interval(bound) <= took < 3 * bound, took  # its last beat came before (a loaded host)
    assert message.startswith("lost node 1 (127.0.0.1, host ") and "while this node was setting up the process" in message
    assert beats[0].verdict == message and said[1].empty()
    del store
    with pytest.raises(queue.Empty):
        said[1].get(timeout=0.1)


def test_a_node_done_with_its_run_is_not_lost_and_losing_the_store_names_its_node(monkeypatch, loopback_port):
    import datetime
    import time

    from torch.distributed import TCPStore

    port = loopback_port
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    bound = 3.0  # not less: a beat's thread a loaded CI host left unscheduled for 1 s would have node 0 lost before done
    beats, said = _heartbeats(monkeypatch, port, bound=bound)
    for b in beats.values():
        b.start()
    _said_who_it_is(store, 0)  # node 0 reached the store (a done() before that tells nobody)
    beats[0].done()  # node 0 finished first, then is silent for good
    beats[0]._stop = True  # (as its process ends: a thread still beating kept node 1 from ever calling it lost)
    time.sleep(bound + 1)
    assert said[1].empty(), "a node done with its run is not lost"
    del store  # the store's host (node 0's torchrun) is gone
    message = said[1].get(timeout=10)
    assert message.startswith("lost node 0 (127.0.0.1, host ") and "torchrun's store there failed" in message


@pytest.mark.parametrize("key, value, named", [
    ("dockyard/beat/1", "abc", "lost node 1 (127.0.0.1, host "),  # TCPStore.add on it: the store drops the connection
    ("dockyard/node/1", json.dumps({"node_rank": 1, "host": "\x1b]0;pwned\x07\x1b[2Jevil", "addr": "127.0.0.1"}),
     "lost node 1: it stopped answering (no heartbeat for "),  # node 1 named without the stranger's info
    ("dockyard/node/1", json.dumps({"node_rank": 1}), "lost node 1: it stopped answering (no heartbeat for "),
    ("dockyard/node/1", "{not json", "lost node 1: it stopped answering (no heartbeat for "),
])
def test_a_strangers_heartbeat_key_neither_stops_the_run_nor_reaches_the_terminal(monkeypatch, loopback_port, key,
                                                                                 value, named):
    """The heartbeat's keys live in torchrun's store, which anyone who reaches its port may write (TCPStore has no
    password). Measured with two real torchruns on loopback: one `set('dockyard/beat/1', 'abc')` by a stranger stopped
    a healthy run, each node recording the other as lost ("torchrun's store there failed") under torch's C++ frames; a
    node's info of escape sequences reached node 0's terminal raw in its verdict; one of another shape ended the
    heartbeat's thread in a traceback, so that a node lost later was never named. Nobody is lost while both beat, and
    the node that then goes silent is named, as text.
    Node 0 is watched until it has read the stranger's value: a node's info is read once that node beats, and node 1
    writes its own before its first beat, so a stranger's info written before node 1 started was overwritten unread
    (the three info cases passed with node 0's checks of it removed); a counter, node 1 sets at its first beat."""
    import datetime
    import threading
    import time

    from torch.distributed import TCPStore

    port = loopback_port
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    stranger = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))
    bound = 3.0
    beats, said = _heartbeats(monkeypatch, port, bound=bound)
    read = threading.Event()  # node 0 got the stranger's value from the store
    _after_each_request(monkeypatch, beats[0], lambda name, args, answer: read.set() if (
        args[:1] == (key,) and answer == value.encode()) else None)
    info = key == nodes.NODE.format(1)
    if info:  # the stranger writes over what node 1 said of itself; node 0 reads it once node 1 beats
        beats[1].start()
        _said_who_it_is(store, 1)
    stranger.set(key, value)
    beats[0].start()
    assert read.wait(30), f"node 0 never read the stranger's {key}"
    if not info:  # node 1 beats on the stranger's counter
        beats[1].start()
    time.sleep(bound + 1)
    assert said[0].empty() and said[1].empty(), (said[0].queue, said[1].queue)
    beats[1]._stop = True
    message = said[0].get(timeout=bound + 30)
    assert message.startswith(named) and "\x1b" not in message and "evil" not in message, message
    del store


def test_a_stranger_deleting_a_node_s_info_as_it_is_read_costs_no_false_verdict(monkeypatch, loopback_port):
    """A stranger on the store's port deletes dockyard/node/1 right after each of node 0's requests that names it:
    read as a check and then a get, the get met the key gone, waited the bound for it and failed, and node 0 took the
    store for lost ("lost node 0 ...: torchrun's store there failed: wait timeout") while both nodes beat. Nobody is
    lost while both beat; node 1, silent at last, is named by what it said of itself."""
    import datetime
    import time

    from torch.distributed import TCPStore

    port = loopback_port
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    stranger = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))

    def delete_after_each_read(name, args, answer):
        if name != "set" and "dockyard/node/1" in str(args):
            stranger.delete_key("dockyard/node/1")

    bound = 3.0
    beats, said = _heartbeats(monkeypatch, port, bound=bound)
    _after_each_request(monkeypatch, beats[0], delete_after_each_read)
    beats[1].start()
    _said_who_it_is(store, 1)
    beats[0].start()
    time.sleep(bound + 2)
    assert said[0].empty() and said[1].empty(), (said[0].queue, said[1].queue)
    beats[1]._stop = True
    message = said[0].get(timeout=bound + 30)
    assert message.startswith("lost node 1 (127.0.0.1, host ") and "no heartbeat" in message, message
    del store


def test_a_strangers_megabytes_in_a_node_s_info_are_downloaded_once_not_at_every_beat(monkeypatch, loopback_port):
    """A stranger on the store's port sets dockyard/node/1 to a megabyte once: every process of every other node
    downloaded it at every beat (each 0.5 to 5 s) for the whole run, as a value not of the nodes' shape was asked for
    again. torch's Store cannot read less than a whole value (no ranged get, no size of a value), so a node's info,
    which its node writes once, before its first beat, is read once that node beats, and then never again. The
    counters its node sets anew at every beat are read at every beat (a stranger's value lasts one beat there)."""
    import datetime
    import time

    from torch.distributed import TCPStore

    port = loopback_port
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    stranger = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))
    downloaded = []
    bound = 3.0
    beats, said = _heartbeats(monkeypatch, port, bound=bound)
    _after_each_request(monkeypatch, beats[0], lambda name, args, answer: downloaded.append(len(answer)) if isinstance(
        answer, bytes) and len(answer) > 1024 else None)
    beats[1].start()
    _said_who_it_is(store, 1)
    stranger.set("dockyard/node/1", "x" * (1 << 20))
    # TCPStore's set is sent without an answer: on a loaded host node 0's first read came before the megabyte had
    # arrived, got node 1's own info, and named node 1 by it (2 of 5 full suites here)
    until = time.monotonic() + 30
    while len(store.get("dockyard/node/1")) != 1 << 20:
        assert time.monotonic() < until, "the stranger's value never reached the store"
        time.sleep(0.05)
    beats[0].start()
    time.sleep(bound + 1)  # several beats (one each 0.5 s)
    assert said[0].empty() and said[1].empty(), (said[0].queue, said[1].queue)
    assert len(downloaded) <= 1, f"the stranger's megabyte was downloaded {len(downloaded)} times"
    beats[1]._stop = True
    message = said[0].get(timeout=bound + 30)
    assert message.startswith("lost node 1: it stopped answering (no heartbeat for "), message
    del store


def test_resume_after_a_run_lost_before_its_first_checkpoint_starts_it_again(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "failed", "error": "lost node 1 (...)"}))
    _checkpoint(tmp_path, 5, shards=3, rng_states=0, state=False)  # lost while saving the first checkpoint
    assert manifest.check_run_dir(tmp_path, resume=True) is None
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "completed"}))
    # not "run without --resume", which the folder refuses ("already holds a run; ... add --resume"), round again
    with pytest.raises(DockyardError, match="no checkpoint to continue from, and its record stays: start the run again "
                                            r"in a new run folder \(invoke run: another --run-id\)"):
        manifest.check_run_dir(tmp_path, resume=True)


def test_resume_of_a_run_killed_before_its_manifest_starts_it_again(tmp_path):
    """An OOM kill before the first checkpoint leaves train.log and metrics.jsonl, no manifest: `invoke run` refuses
    that folder without --resume (it holds files), and --resume said it held no checkpoint: no way on."""
    for name in ("train.log", "metrics.jsonl"):
        (tmp_path / name).write_text("left by the killed run\n")
    assert manifest.check_run_dir(tmp_path, resume=True) is None


def _node_0_of_two_beside_the_store(monkeypatch, port: int) -> None:
    """This process as node 0's first, of two nodes; torchrun's store at 127.0.0.1:port is node 1's (this node
    advertises 127.0.0.9), as when torchrun ranked node 1 first."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("DOCKYARD_NODE_RANK", "0")
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps({"local_addr": "127.0.0.9"}))


def test_losing_the_store_before_its_host_said_who_it_is_names_the_other_of_two_nodes(monkeypatch, loopback_port):
    """torchrun hosts its store on the node it ranked first, which sorting addresses as text may make node 1
    (10.0.0.10 before 10.0.0.9): lost before it said who it is, it is still named, as the other of two nodes."""
    import datetime
    import queue

    from torch.distributed import TCPStore

    port = loopback_port
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    _node_0_of_two_beside_the_store(monkeypatch, port)
    said: queue.Queue = queue.Queue()
    beat = nodes.Heartbeat(said.put, bound=60).start()  # node 1 never beats: only the store's loss can end this
    _said_who_it_is(store, 0)  # it reached the store (lost before that, it is named only at the bound: 60 s)
    del store
    message = said.get(timeout=15)
    assert message.startswith("lost node 1 (127.0.0.1): it stopped answering (torchrun's store there failed")
    assert beat.verdict == message


def test_a_store_gone_before_the_heartbeat_reached_it_is_named_within_the_bound(monkeypatch, loopback_port):
    """Node 1, hosting torchrun's store, killed between the rendezvous and this process's first beat: TCPStore's
    own connect would retry for twice its timeout plus a random pause (52 s for a 20 s bound, once past the
    multinode test's bound); the store must be called lost a bound after the watch started, well before twice the
    bound. A bound of 10 s leaves a loaded host 10 s of slack there (with 3 s, it had 5 s, and TCPStore's retries
    were told apart from the fix by under a second)."""
    import queue
    import time

    _node_0_of_two_beside_the_store(monkeypatch, loopback_port)  # nobody listens there
    said: queue.Queue = queue.Queue()
    started = time.monotonic()
    nodes.Heartbeat(said.put, bound=10).start()
    message = said.get(timeout=60)
    took = time.monotonic() - started
    assert 10 <= took < 2 * 10, f"lost after {took:.1f} s, bound 10 s"  # TCPStore's own retries: 2 bounds and more
    assert message.startswith("lost node 1 (127.0.0.1): it stopped answering (torchrun's store there failed: "
                              "not reachable for 10 s"), message


def test_a_broken_connection_that_names_no_peer_is_explained_by_the_store_lost_with_its_host(monkeypatch,
                                                                                              loopback_port):
    """Setting up a gloo group goes through torchrun's store: with its host (node 1, ranked first) killed, the main
    thread fails with "DistNetworkError: Broken pipe", naming nobody. The heartbeat finds the store gone within a
    beat, and that verdict is the error's explanation; an error of another kind waits for nothing."""
    import datetime
    import time

    from torch.distributed import TCPStore

    port = loopback_port
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    _node_0_of_two_beside_the_store(monkeypatch, port)
    beat = nodes.Heartbeat(lambda message: None, bound=20).start()  # node 1 (the store's host) never beats
    _said_who_it_is(store, 0)  # it reached the store (lost before that, it is named only at the bound: 20 s)
    started = time.monotonic()
    assert beat.verdict_for("ValueError: max_steps must be positive", []) is None
    # (a broken connection's wait is a beat and 2 s, 4 s here: less than one beat is no wait, even on a loaded host)
    assert time.monotonic() - started < nodes.beat_interval(20), "an error that is not a broken connection waits for nothing"
    del store
    started = time.monotonic()
    verdict = beat.verdict_for("torch.distributed.DistNetworkError: Broken pipe", [])
    assert verdict and verdict.startswith("lost node 1 (127.0.0.1): it stopped answering (torchrun's store"), verdict
    assert time.monotonic() - started < nodes.beat_interval(20) + 2 + 3, "a beat's wait, not the bound's (20 s)"


SHARED_CHECK = """
import json, os, sys
from pathlib import Path
import torch.distributed as dist
from dockyard.common.errors import DockyardError
from dockyard.train import nodes
dist.init_process_group("gloo")
try:
    started_with = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
    print(json.dumps({"nodes": nodes.check_shared(Path(sys.argv[1]), started_with)}))
except DockyardError as e:
    print(json.dumps({"error": str(e)}))
dist.destroy_process_group()
"""


def _two_nodes_check(tmp_path, nodes: list[dict]) -> list[dict]:
    """check_shared on two real gloo processes, one per entry of `nodes` (global rank 0, then 1): each entry's
    node_rank, run folder (`runs`), timeout, advertised address (`addr`) and what it was started with."""
    import subprocess
    import sys

    from dockyard import ROOT

    procs = []
    with held_port() as port:  # until rank 0's store has it: rank 0 binds it when it gets there
        for rank, n in enumerate(nodes):
            n["runs"].mkdir(exist_ok=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "DOCKYARD_NODE_RANK": str(n["node_rank"]), "DOCKYARD_SHARED_TIMEOUT": str(n.get("timeout", 5)),
                   **({"DOCKYARD_RENDEZVOUS": json.dumps({"local_addr": n["addr"]})} if "addr" in n else {})}
            procs.append(subprocess.Popen([sys.executable, "-c", SHARED_CHECK, str(n["runs"]),
                                           json.dumps(n.get("started_with", {}))], env=env, cwd=tmp_path,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        said = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            said.append(json.loads(out.strip().splitlines()[-1]))
    return said


@pytest.mark.parametrize("shared", [True, False])
def test_the_run_folder_check_is_led_by_node_0_wherever_torchrun_ranked_it(tmp_path, shared):
    """Global rank 0 on node 1 (as torchrun ranks 10.0.0.10 before 10.0.0.9): node 0 still writes the token, and
    an unshared folder is blamed on the node that cannot see it, node 1, on both nodes."""
    said = _two_nodes_check(tmp_path, [{"node_rank": node_rank, "timeout": 2, "addr": f"10.0.0.{9 + node_rank}",
                                        "runs": tmp_path / ("runs" if shared else f"runs-node{node_rank}")}
                                       for node_rank in (1, 0)])
    if shared:
        assert said[0] == said[1] and [n["node_rank"] for n in said[0]["nodes"]] == [0, 1]
        assert (tmp_path / "runs" / runfolder.SHARED_TOKEN).is_file()
    else:
        for s in said:
            assert s["error"].startswith("the run folder is not shared: node 1 (10.0.0.10) did not see in "), s
        # node 0 wrote the token (into its own folder), not torchrun's rank 0 on node 1
        assert (tmp_path / "runs-node0" / runfolder.SHARED_TOKEN).is_file()
        assert not (tmp_path / "runs-node1" / runfolder.SHARED_TOKEN).exists()


def test_nodes_started_with_another_recipe_or_settings_are_refused_on_every_node(tmp_path):
    """Node 1 given zero2 against node 0's ddp hung in the Trainer's set-up for the process group's 30 minutes; given
    --learning_rate 0.5 against 1e-3, each node trained its replica its own way and both said "completed"."""
    node0 = {"recipe": "ddp", "resume": False, "--max_steps": 2, "--learning_rate": 0.001}
    node1 = {"recipe": "zero2", "resume": False, "--max_steps": 2, "--learning_rate": 0.5}
    said = _two_nodes_check(tmp_path, [{"node_rank": 0, "runs": tmp_path / "runs", "started_with": node0},
                                       {"node_rank": 1, "runs": tmp_path / "runs", "started_with": node1}])
    for s in said:
        assert s["error"] == ('the nodes were not started alike: node 1 with --learning_rate 0.5 (node 0: 0.001); '
                              'recipe "zero2" (node 0: "ddp"). Start every node with the same recipe and settings '
                              '(the same command but for --node-rank)'), s
    said = _two_nodes_check(tmp_path, [{"node_rank": rank, "runs": tmp_path / "runs", "started_with": node0}
                                       for rank in (0, 1)])
    assert [n["node_rank"] for n in said[0]["nodes"]] == [0, 1] and said[0] == said[1]


def test_nodes_whose_checkouts_or_images_differ_under_one_command_are_refused_naming_the_file(tmp_path,
                                                                                              monkeypatch):
    """Each node's `invoke run` mounts its own checkout's recipes/: node 1's recipe.yaml of the same name setting
    learning_rate 0.5 against node 0's 1e-3 passed the check (recipe name and overrides alike) and each node trained
    its replica its own way, "completed"; so did a node whose image held another trainer or torch."""
    recipes = {}
    for rank, rate in ((0, "1.0e-3"), (1, "0.5")):
        folder = tmp_path / f"checkout{rank}" / "mine"
        folder.mkdir(parents=True)
        (folder / "recipe.yaml").write_text(f"# mine\nwhen: a test\nstrategy: ddp\nsettings:\n  learning_rate: {rate}\n")
        recipes[rank] = manifest.recipe_files(load_recipe(str(folder)), RECIPES / "defaults.yaml")
    started = {rank: nodes.started_with(load_recipe(str(tmp_path / f"checkout{rank}" / "mine")), False,
                                    {"max_steps": 2}, files) for rank, files in recipes.items()}
    assert started[0]["--max_steps"] == 2 and started[0]["torch"] == started[1]["torch"]
    said = _two_nodes_check(tmp_path, [{"node_rank": rank, "runs": tmp_path / "runs", "started_with": started[rank]}
                                       for rank in (0, 1)])
    digest = {rank: recipes[rank]["mine/recipe.yaml"][:12] for rank in (0, 1)}
    for s in said:
        assert s["error"].startswith(f'the nodes were not started alike: node 1 with recipe file mine/recipe.yaml '
                                     f'"{digest[1]}" (node 0: "{digest[0]}"). Start every node with the same recipe '
                                     "and settings (the same command but for --node-rank); a recipe file of another "
                                     "content: each node reads its own checkout's recipes/"), s
    # another image: another torch (or trainer code) under the same command
    other = dict(started[0], torch="2.0.0")
    said = _two_nodes_check(tmp_path, [{"node_rank": 0, "runs": tmp_path / "runs", "started_with": started[0]},
                                       {"node_rank": 1, "runs": tmp_path / "runs", "started_with": other}])
    assert said[0]["error"].startswith(f'the nodes were not started alike: node 1 with torch "2.0.0" (node 0: '
                                       f'"{started[0]["torch"]}")'), said[0]
    assert "the nodes run other images, so give every node the same image" in said[0]["error"]
    # the trainer's own code is told apart by its content, not its version
    monkeypatch.setattr(Path, "read_bytes", lambda self: b"edited")
    assert nodes.what_this_node_runs(None)["dockyard code"] != started[0]["dockyard code"]


def test_files_of_a_recipe_folder_the_trainer_does_not_read_may_differ_between_the_nodes(tmp_path):
    """Every file of the recipe folder was compared: node 1's checkout holding a README of its own, an editor's
    backup (recipe.yaml~) or swap file (.recipe.yaml.swp), or a log written into the folder, refused the run ("node 1
    with recipe file mine/README.md ... (node 0: (not given))") though both nodes trained alike. What the trainer reads
    is still compared: recipe.yaml, its DeepSpeed (or FSDP) file and recipes/defaults.yaml."""
    started = {}
    for rank in (0, 1):
        folder = tmp_path / f"checkout{rank}" / "mine"
        folder.mkdir(parents=True)
        (folder / "recipe.yaml").write_text("# mine\nwhen: a test\nstrategy: zero2\ndeepspeed: ds_config.json\n")
        (folder / "ds_config.json").write_text((RECIPES / "zero2" / "ds_config.json").read_text())
        if rank == 1:
            for name in ("README.md", "recipe.yaml~", ".recipe.yaml.swp", "node1.log"):
                (folder / name).write_text("node 1's own\n")
        recipe = load_recipe(str(folder))
        started[rank] = nodes.started_with(recipe, False, {}, manifest.recipe_files(recipe, RECIPES / "defaults.yaml"))
    assert started[0] == started[1]
    assert {k for k in started[0] if k.startswith(nodes.RECIPE_FILE)} == {
        "recipe file defaults.yaml", "recipe file mine/recipe.yaml", "recipe file mine/ds_config.json"}
    (tmp_path / "checkout1" / "mine" / "ds_config.json").write_text('{"zero_optimization": {"stage": 2}}')
    recipe = load_recipe(str(tmp_path / "checkout1" / "mine"))
    edited = nodes.started_with(recipe, False, {}, manifest.recipe_files(recipe, RECIPES / "defaults.yaml"))
    assert [k for k in edited if edited[k] != started[0][k]] == ["recipe file mine/ds_config.json"]

def test_a_node_given_another_recipe_is_told_that_alone_not_the_files_of_both(tmp_path):
    """Node 1 given --recipe=zero3 against node 0's zero2, from the same checkout, was told each file of both recipes
    as "(not given)" on the other node, and to give every node the same checkout: what differed was the command."""
    everyone = []
    for rank, name in ((0, "zero2"), (1, "zero3")):
        recipe = load_recipe(name)
        files = manifest.recipe_files(recipe, RECIPES / "defaults.yaml")
        everyone.append({"node_rank": rank, "started_with": nodes.started_with(recipe, False, {}, files)})
    with pytest.raises(DockyardError) as e:
        nodes.check_started_alike(everyone)
    assert str(e.value) == ('the nodes were not started alike: node 1 with recipe "zero3" (node 0: "zero2"). Start '
                            "every node with the same recipe and settings (the same command but for --node-rank)")

def test_a_store_that_cannot_be_reached_names_the_other_of_two_nodes(monkeypatch):
    """Setting up the process group, a rank whose store (on the node torchrun ranked first: node 1 here) is gone
    fails with "(ADDR, PORT)" before any node said who it is: of two nodes, that is the other one."""
    error = ("DistStoreError: The client socket has timed out after 20000ms while trying to connect to "
             "(10.0.0.10, 32847).")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.10")
    monkeypatch.setenv("DOCKYARD_NODE_RANK", "0")
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps({"local_addr": "10.0.0.9"}))
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert nodes.lost_node(error, []) == "lost node 1 (10.0.0.10): it stopped answering"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "3")  # which of two others: not known, not guessed
    assert nodes.lost_node(error, []) is None
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("DOCKYARD_RENDEZVOUS", json.dumps({"local_addr": "10.0.0.10"}))  # the store is this node's
    assert nodes.lost_node(error, []) is None


def test_doctor_peer_that_ssh_cannot_reach_is_a_failed_check_in_the_report(settings, loopback_port):
    """ssh to the peer failing by itself (here: nothing listens on the loopback port it is pointed at) used to end
    doctor with ssh's error alone, no report; it is the `peer ssh` check, failed with ssh's reason."""
    from dockyard.machine import peer

    port = loopback_port  # nothing listens there
    checks = peer.diagnose(settings.model_copy(update={"ssh": f"ssh -o BatchMode=yes -p {port}"}), "127.0.0.1", port)
    by_name = {c.name: c for c in checks}
    assert by_name["peer ssh"].status == "fail" and "Connection refused" in by_name["peer ssh"].detail
    assert by_name["rendezvous port"].status == "pass"  # the checks before ssh are still reported
    # the loopback peer is said as the --peer it was given, not as a --master-addr nobody gave
    assert by_name["peer route"].detail.startswith("--peer 127.0.0.1 is a loopback address"), by_name["peer route"]


def test_resume_of_a_run_killed_while_saving_its_first_checkpoint_starts_it_again(tmp_path):
    """An OOM kill during the first save leaves a checkpoint folder without complete.json, and no manifest."""
    (tmp_path / "train.log").write_text("left by the killed run\n")
    _checkpoint(tmp_path, 25, shards=3, rng_states=0, state=False)
    assert manifest.check_run_dir(tmp_path, resume=True) is None


def test_doctor_peer_reaches_the_ssh_port_and_the_ipv6_address_it_was_given(settings, loopback_port):
    """`--peer=host:2222` was read as host and a folder: ssh went to port 22 and the report blamed it; an IPv6
    address was cut at its first colon (`--peer=fd00::2`: "cannot resolve 'fd00'")."""
    from dockyard.common.errors import DockyardError
    from dockyard.machine import peer

    port = loopback_port  # nothing listens there: ssh's refusal names the port it tried
    batch = settings.model_copy(update={"ssh": "ssh -o BatchMode=yes"})
    by_name = {c.name: c for c in peer.diagnose(batch, f"ssh://127.0.0.1:{port}", port)}
    assert f"port {port}: Connection refused" in by_name["peer ssh"].detail
    with pytest.raises(DockyardError, match=r"--peer='127.0.0.1:2222': expected \[user@\]host; for another ssh port "
                                            r"give ssh://\[user@\]host:PORT"):
        peer.diagnose(batch, "127.0.0.1:2222", port)
    for given in ("::1", "[::1]", "me@::1"):
        assert peer.parse_peer(given).host == given.replace("[", "").replace("]", "")
    by_name = {c.name: c for c in peer.diagnose(batch, "::1", port)}
    assert "::1 is a loopback address" in by_name["peer route"].detail  # the address given, not "cannot resolve ''"


def _ssh_here(tmp_path):
    """A stand-in for ssh that runs the remote command on this machine (the peer is this host): the `ssh` setting
    names it. tests/integration/test_multinode.py does the same through real ssh to a second node."""
    fake = tmp_path / "ssh-here"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift 2\nexec sh -c "$1"\n')
    fake.chmod(0o755)
    return str(fake)


def test_doctor_peer_says_a_refused_port_is_one_no_run_listens_on_yet(loopback_port):
    """`invoke doctor --peer` said of node 0's port before its run "answers; nothing listens yet", which read as a
    contradiction (answers what?). It now says what happened and what it means: the connection was refused, no run
    listens there yet."""
    from dockyard.machine import peer

    check = peer.check_port("127.0.0.1", loopback_port)
    assert check.status == "pass"
    assert check.detail.startswith(f"127.0.0.1:{loopback_port} refused the connection: no run listens there yet "
                                   "(normal until node 0 starts `invoke run`)"), check.detail


def test_doctor_peer_tells_a_port_nothing_listens_on_yet_by_listening_there_for_a_moment(settings, tmp_path,
                                                                                        loopback_port, monkeypatch):
    """A refused rendezvous port passed whatever refused it: before node 0 starts nothing listens, but a firewall
    that rejects refuses the same way. doctor now opens a listener on the peer at that port and connects again;
    here nothing is in the way, and the port is free again at once: the listener ended by itself as doctor was done,
    not killed after doctor had waited for it (it took under 5 s here, but so did a loaded CI host's ssh and python
    start)."""
    import socket
    import subprocess

    from dockyard.machine import peer
    from dockyard.transport import remote

    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            started.append(self)

    monkeypatch.setattr(peer.subprocess, "Popen", Recorded)
    port = loopback_port  # the listener binds it as node 0's torch would: with SO_REUSEADDR
    here = settings.model_copy(update={"ssh": _ssh_here(tmp_path)})
    r = remote.Remote("peer")
    check = peer.check_port("127.0.0.1", port, lambda: peer.listen_there(here, r, "no-such-image", "127.0.0.1", port))
    assert check.status == "pass" and "no run listens there yet" in check.detail and "was reached from here" in check.detail, \
        check
    [listener] = started
    assert listener.returncode == 0, f"the listener was waited for after it was reached, then ended: {listener.returncode}"
    with socket.socket() as s:  # the listener is gone: the port is free for node 0's run (whose torch listens there
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as this does; a listener left there is refused)
        s.bind(("", port))
        s.listen()


def test_doctor_peer_says_when_the_port_is_taken_there_and_a_refusal_cannot_be_told(settings, tmp_path):
    import socket

    from dockyard.machine import peer
    from dockyard.transport import remote

    with socket.socket() as holder:  # bound, not listening: connections are refused, and the port is in use
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        here = settings.model_copy(update={"ssh": _ssh_here(tmp_path)})
        check = peer.check_port("127.0.0.1", port,
                                lambda: peer.listen_there(here, remote.Remote("peer"), "x", "127.0.0.1", port))
    assert check.status == "pass" and "no run listens there yet" in check.detail
    assert f"whether a firewall rejects it is not known: port {port} is taken there (Address already in use)" \
        in check.detail



def test_doctor_says_a_peer_name_that_does_not_resolve_is_that_not_a_firewall(monkeypatch):
    """A name this node cannot resolve failed the port check as a firewall that drops the port. The resolver is a
    stand-in here (a real lookup of an unknown name would ask the machine's DNS servers)."""
    import socket

    from dockyard.machine import peer

    def no_such_name(host, port, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    check = peer.check_port("gpu-b", 29500, lambda: pytest.fail("no listener is opened for a name that does not resolve"))
    assert check.status == "fail"
    assert check.detail == "gpu-b:29500: cannot resolve 'gpu-b' here (Name or service not known)"
    assert check.fix.startswith("give node 0's IP address, or make its name resolve") and "firewall" not in check.fix


@pytest.mark.parametrize("name, value, says", [
    ("DOCKYARD_NODE_RANK", "1a", "DOCKYARD_NODE_RANK='1a': give the node's number, 0 for the node that hosts"),
    ("DOCKYARD_NODE_RANK", "²", "DOCKYARD_NODE_RANK='²': give the node's number"),
    ("DOCKYARD_RENDEZVOUS", '{"local_addr": "10.0.0.1"x}', "DOCKYARD_RENDEZVOUS is not a JSON object (Expecting"),
    ("DOCKYARD_RENDEZVOUS", "[1]", "DOCKYARD_RENDEZVOUS is not a JSON object (list)"),
])
def test_a_node_variable_of_no_meaning_is_one_error_line_before_anything_is_made(tmp_path, capsys, monkeypatch, name,
                                                                                 value, says):
    """compose pastes NODE_RANK, LOCAL_ADDR and IFACE into these: `NODE_RANK=1a` was a ValueError traceback, raised
    again while the failure was being recorded; a quote in LOCAL_ADDR a JSONDecodeError one."""
    from dockyard.train.__main__ import main

    monkeypatch.setenv(name, value)
    code = main(["--recipe", "ddp", "--run-dir", str(tmp_path / "r1"), "--", "--max_steps", "1"])
    err = capsys.readouterr().err
    assert code == 1 and f"error: {says}" in err and "Traceback" not in err, err
    assert not (tmp_path / "r1").exists()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "1e9"])
def test_a_shared_folder_timeout_that_is_no_number_of_seconds_is_refused(monkeypatch, value):
    """DOCKYARD_SHARED_TIMEOUT=abc was a ValueError traceback as the trainer was imported, on every node."""
    from dockyard.common import envvars

    monkeypatch.setenv("DOCKYARD_SHARED_TIMEOUT", value)
    with pytest.raises(DockyardError, match=f"DOCKYARD_SHARED_TIMEOUT='{value}': give the seconds the nodes wait"):
        envvars.shared_timeout()
    monkeypatch.setenv("DOCKYARD_SHARED_TIMEOUT", "120")
    assert envvars.shared_timeout() == 120


def test_the_shared_folder_timeout_a_user_sets_reaches_every_nodes_trainer(tmp_path, monkeypatch):
    """docs/multinode.md tells users to raise DOCKYARD_SHARED_TIMEOUT for slow network filesystems; `invoke run` did not
    hand it to the container, so the trainer waited its 30 s all the same."""
    from tests.support.cli import invoke_here

    # the route to node 0 as a node of that network has it, not as this host's routing table does (none at all on a
    # host with no default route: `ip route get` answers "Network is unreachable")
    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.2"})
    args = ("run", "--dry", "--variant=cpu", "--nodes=2", "--node-rank=1", "--master-addr=198.18.0.1", "--run-id=t1")
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    r = invoke_here(*args, env={**env, "DOCKYARD_SHARED_TIMEOUT": "120"})
    assert r.returncode == 0 and "-e DOCKYARD_SHARED_TIMEOUT=120 " in r.stdout + r.stderr, r.stderr
    r = invoke_here(*args, env=env)
    assert r.returncode == 0 and "DOCKYARD_SHARED_TIMEOUT" not in r.stdout + r.stderr


def test_inputs_host_paths_of_no_meaning_are_warned_of_and_the_inside_paths_recorded(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DOCKYARD_HOST_PATHS", "{bad")
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    record = manifest.inputs_record({"data": str(tmp_path / "d.jsonl")})
    assert record["data"]["path"] == str(tmp_path / "d.jsonl")
    assert "DOCKYARD_HOST_PATHS is not a JSON object" in caplog.text


def test_node_0_given_an_address_not_its_own_is_warned_that_the_others_will_look_there(capsys):
    """`--node-rank=0 --master-addr=<node 1's address>`: node 0 hosted the store at home while the others looked for
    it at node 1, and both waited past the join bound."""
    args = dict(master_port=29500, run_id="exp1", join_timeout=120, max_restarts=0, recipe="zero2",
                routes={"iface": "eth0", "addr": "10.0.0.1"})
    multinode.rendezvous(master_addr="10.0.0.5", node_rank=0, **args)
    assert ("warning: --master-addr 10.0.0.5 is not an address of this node, yet --node-rank=0 hosts the rendezvous "
            "here: the other nodes will look for it there; give node 0 its own address (10.0.0.1 on eth0), or, where this "
            "is another node, its own --node-rank"
            in capsys.readouterr().err)
    multinode.rendezvous(master_addr="10.0.0.1", node_rank=0, **args)  # its own
    multinode.rendezvous(master_addr="10.0.0.5", node_rank=1, **args)  # another node's, as it should be
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("given,says", [
    ("10.0.0.1:29500", "--master-addr 10.0.0.1:29500: give node 0's address alone (--master-addr=10.0.0.1), and the "
                       "port as --master-port=29500"),
    ("gpu-a:29501", "--master-addr gpu-a:29501: give node 0's address alone (--master-addr=gpu-a), and the port as "
                    "--master-port=29501"),
    ("[fd00::1]", "--master-addr [fd00::1]: give the IPv6 address without brackets (--master-addr=fd00::1)"),
    ("[fd00::1]:29500", "--master-addr [fd00::1]:29500: give node 0's address alone (--master-addr=fd00::1), and the "
                        "port as --master-port=29500"),
])
def test_a_master_address_given_with_its_port_or_in_brackets_says_how_to_give_it(given, says):
    """torchrun's HOST:PORT habit, and an IPv6 address as a URL writes it, were "cannot resolve '10.0.0.1:29500' ...:
    give node 0's IP address", which it was."""
    with pytest.raises(DockyardError) as e:
        multinode.rendezvous(master_addr=given, master_port=29500, node_rank=1, run_id="r", join_timeout=120,
                             max_restarts=0, recipe="zero2")
    assert str(e.value) == says


def test_a_name_that_resolves_to_an_ipv6_address_alone_is_that_address(monkeypatch):
    """An IPv6-only cluster: gethostbyname knows IPv4 alone, so node 0's name was "cannot resolve 'gpu-a'", where
    torchrun and gloo reach it. IPv4 stays first where a name has both."""
    import socket

    answers = {"gpu-a": [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::1%eth0", 0, 0, 2))],
               "gpu-b": [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::2", 0, 0, 0)),
                         (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.2", 0))]}
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **kw: answers[host])
    assert multinode.resolve_address("gpu-a") == "fd00::1"
    assert multinode.resolve_address("gpu-b") == "10.0.0.2"


def test_two_nodes_on_one_host_get_containers_of_their_own(tmp_path, monkeypatch):
    """Both nodes' containers were dockyard-<run-id>: two nodes started on one host (trying several nodes on one
    machine) had the second refused by docker, a name in use, and said "the trainer did not start on this node"."""
    from tests.support.cli import invoke_here

    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.2"})
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    names = []
    for rank in (0, 1):
        r = invoke_here("run", "--dry", "--variant=cpu", "--nodes=2", f"--node-rank={rank}",
                        "--master-addr=198.18.0.2", "--run-id=t1", env=env)
        assert r.returncode == 0, r.stderr
        names += re.findall(r"--name (\S+)", r.stdout + r.stderr)
    assert names == ["dockyard-t1-node0", "dockyard-t1-node1"]
    r = invoke_here("run", "--dry", "--variant=cpu", "--run-id=t1", env=env)  # one node: the run's own name
    assert re.findall(r"--name (\S+)", r.stdout + r.stderr) == ["dockyard-t1"]


@pytest.mark.parametrize("name", ["NCCL_TOPO_FILE", "NCCL_GRAPH_FILE"])
def test_the_nccl_topology_file_a_node_names_is_seen_by_its_container_or_refused(tmp_path, monkeypatch, name):
    """NCCL_TOPO_FILE (a cloud VM's topology file for NCCL) reached the container of a node of several, and the file
    did not: NCCL warned that it could not open it and went on without it. NCCL_GRAPH_FILE (the rings and trees NCCL
    is to use) the same, where NCCL failed as it started. Each is mounted read-only at the same path; one that is not
    a file here, or not an absolute path, is refused in one line before anything starts."""
    from tests.support.cli import invoke_here, short_error

    monkeypatch.setattr(multinode, "route_to", lambda host, flag="--master-addr": {"iface": "eth9", "addr": "198.18.0.2"})
    topo = tmp_path / "ndv5 topo.xml"
    topo.write_text("<system version='1'></system>\n")
    env = {"INVOKE_DOCKYARD_RUNS_DIR": str(tmp_path / "runs")}
    node1 = ("run", "--dry", "--variant=cpu", "--nodes=2", "--node-rank=1", "--master-addr=198.18.0.2", "--run-id=t1")
    r = invoke_here(*node1, env={**env, name: str(topo)})
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    assert shlex.quote(f"{topo}:{topo}:ro") in said and shlex.quote(f"{name}={topo}") in said, said
    for given, why in ((str(tmp_path / "missing.xml"), "no such file on this node"), (str(tmp_path), "no such file"),
                       ("topo.xml", "not an absolute path")):
        r = invoke_here(*node1, env={**env, name: given})
        short_error(r, f"{name}={given}: {why}")
        assert f"unset {name}" in r.stderr and not (tmp_path / "runs").exists()
    # set but empty (an image's NCCL_GRAPH_FILE="", a way to unset it that is none): NCCL opens "", which fails it
    # for the graph file, and is warned of for the topology file
    r = invoke_here(*node1, env={**env, name: ""})
    if name == "NCCL_GRAPH_FILE":
        short_error(r, f"{name} is set but empty, and NCCL in the container would fail as it starts")
        assert f"unset {name}" in r.stderr and not (tmp_path / "runs").exists()
    else:
        assert r.returncode == 0 and f"{name}=" in r.stdout + r.stderr, r.stderr
    # one node: its container gets no NCCL setting that names a file of the host's (as before), and mounts none
    r = invoke_here("run", "--dry", "--variant=cpu", "--run-id=t1", env={**env, name: "/missing.xml"})
    assert r.returncode == 0 and name not in r.stdout + r.stderr, r.stderr


def test_nodes_whose_data_differs_at_the_same_path_are_refused_naming_it(tmp_path):
    """One command on every node mounts each node's own --data path: node 1's older copy of the data (another file at
    the same path) passed the check, and each node trained its replica on its own rows, "completed". The same file at
    another host path is alike: the content is compared, not the path."""
    recipe = load_recipe("ddp")
    files = manifest.recipe_files(recipe, RECIPES / "defaults.yaml")
    for rank, rows in ((0, '{"text": "new rows"}\n'), (1, '{"text": "the old rows"}\n'), (2, '{"text": "new rows"}\n')):
        (tmp_path / f"node{rank}").mkdir()
        (tmp_path / f"node{rank}" / "chat.jsonl").write_text(rows)
    started = [nodes.started_with(recipe, False, {}, files,
                                  manifest.inputs_record({"data": str(tmp_path / f"node{rank}" / "chat.jsonl")}))
               for rank in range(3)]
    with pytest.raises(DockyardError) as e:
        nodes.check_started_alike([{"node_rank": 0, "started_with": started[0]},
                                   {"node_rank": 1, "started_with": started[1]}])
    said = str(e.value)
    assert said.startswith("the nodes were not started alike: node 1 with input data "), said
    assert ("another data or model file at the same path: each node mounts its own --data and --model, so give every "
            "node the same files (shared storage, or the same copy on each)") in said
    nodes.check_started_alike([{"node_rank": 0, "started_with": started[0]}, {"node_rank": 1, "started_with": started[2]}])


def test_a_run_folder_that_holds_a_run_says_how_compose_adds_resume(tmp_path):
    """compose/multinode.yml after a lost node, the same command again (walked on two nodes): "already holds a run;
    ... add --resume", a flag the compose user has no place for; DOCKYARD_RESUME=1 is how compose gives it."""
    (tmp_path / "manifest.json").write_text('{"status": "failed"}')
    with pytest.raises(DockyardError) as e:
        manifest.check_run_dir(tmp_path, resume=False)
    assert str(e.value) == (f"{tmp_path} already holds a run; pick a new run folder, or add --resume (compose: "
                            "DOCKYARD_RESUME=1) to continue it from its last checkpoint")


def test_the_same_model_downloaded_on_each_node_is_alike_whatever_its_hidden_files(tmp_path):
    """`hf download ORG/NAME --local-dir DIR` on each node leaves DIR/.cache/huggingface/download/*.metadata beside the
    files, each ending in the time of its download as Python writes a float (1733552345.1234567, or a digit shorter):
    two nodes' copies of one model differed in those files' sizes nine times in ten, and the nodes refused to start,
    "another data or model file at the same path ... give every node the same files" (reproduced: two real torchruns
    on loopback, each node's copy mounted at one path). The trainer reads no hidden file: a .git/ or an editor's file
    there is alike too; another weights file is still refused."""
    recipe = load_recipe("ddp")
    files = manifest.recipe_files(recipe, RECIPES / "defaults.yaml")
    started = []
    for rank, (stamp, weights) in enumerate((("1733552345.1234567", 4096), ("1733552346.12345", 4096),
                                            ("1733552347.1234567", 4097))):
        model = tmp_path / f"node{rank}" / "model"
        (model / ".cache" / "huggingface" / "download").mkdir(parents=True)
        for name, text in (("config.json", '{"model_type": "llama"}'), ("model.safetensors", "w" * weights)):
            (model / name).write_text(text)
            (model / ".cache" / "huggingface" / "download" / f"{name}.metadata").write_text(
                f"{'a' * 40}\netag-{name}\n{stamp}\n")
        (model / f".{rank}.swp").write_text("x" * rank)
        started.append(nodes.started_with(recipe, False, {}, files, manifest.inputs_record({"model": str(model)})))
    nodes.check_started_alike([{"node_rank": 0, "started_with": started[0]}, {"node_rank": 1, "started_with": started[1]}])
    with pytest.raises(DockyardError, match="node 1 with input model "):
        nodes.check_started_alike([{"node_rank": 0, "started_with": started[0]},
                                   {"node_rank": 1, "started_with": started[2]}])


def test_the_nodes_compare_the_inputs_fingerprint_the_manifest_records_and_an_older_record_still_works(tmp_path):
    """The nodes' check walked each input folder again for its fingerprint less hidden files, which the manifest had
    just recorded as `read` (what a resume compares): two walks of one folder, which can disagree (a file written
    between them) and cost a second walk of a data folder of many files. It reads the record's `read` now; a record
    without it (written before, or a file hashed whole) is walked as before, and says the same of the same folder."""
    model = tmp_path / "model"
    (model / ".cache").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 4096)
    (model / ".cache" / "download.metadata").write_text("1733552345.1234567\n")
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n')
    record = manifest.inputs_record({"model": str(model), "data": str(data)})
    older = {key: {k: v for k, v in found.items() if k not in ("read", "read_bytes")} for key, found in record.items()}
    assert nodes.inputs_read(older) == nodes.inputs_read(record), "the record's and the walk's fingerprints agree"
    assert nodes.inputs_read(record)["input model"] == f"{record['model']['read'][:12]} (4098 bytes)"
    (model / "tokenizer.json").write_text("{}")  # after the record: the nodes compare what the manifest holds
    assert nodes.inputs_read(record)["input model"] == f"{record['model']['read'][:12]} (4098 bytes)"
    assert nodes.inputs_read(older)["input model"] != nodes.inputs_read(record)["input model"]
