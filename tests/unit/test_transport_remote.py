"""A node over ssh, without a node: destinations, the ssh argv, the node-state script (run by a real sh)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess

import pytest

from dockyard.common.errors import DockyardError
from dockyard.settings import Settings
from dockyard.transport import inventory, remote
from dockyard.transport.inventory import INVENTORY_FORMAT
from dockyard.transport.remote import Remote


def test_parse_destinations():
    assert remote.parse_to("gpu@node7:/srv/images/", 2222, "~/.ssh/k") == Remote("gpu@node7", "/srv/images", 2222,
                                                                                  "~/.ssh/k")
    assert remote.parse_to("node7:dist").dir == "dist"
    assert remote.parse_to("node7", need_dir=False).host == "node7"
    with pytest.raises(DockyardError, match=r"\[user@\]host:/dir"):
        remote.parse_to("node7")
    assert remote.parse_ssh_url("ssh://me@node7:2200") == Remote("me@node7", port=2200)
    assert remote.parse_ssh_url("ssh://node7").port == 0
    with pytest.raises(DockyardError, match="ssh://"):
        remote.parse_ssh_url("node7:/x")
    assert Remote("me@node7", port=2200).url == "ssh://me@node7:2200" and Remote("node7").url == "ssh://node7"


def test_an_ipv6_node_takes_a_port_in_the_url_form_as_urls_write_it():
    """`doctor --peer='ssh://u@[::1]:22'` was "expected ssh://[user@]host[:port]", the form given; a bare IPv6 --peer
    had no way to name a port."""
    assert remote.parse_ssh_url("ssh://u@[::1]:2222") == Remote("u@::1", port=2222)
    assert remote.parse_ssh_url("ssh://[2001:db8::5]/") == Remote("2001:db8::5")
    assert Remote("u@::1", port=2222).url == "ssh://u@[::1]:2222"  # read back as it was given
    for bad in ("ssh://[node7]:22", "ssh://u@::1:22", "ssh://[::1"):
        with pytest.raises(DockyardError, match=r"expected ssh://\[user@\]host\[:port\] \(an IPv6 address in brackets"):
            remote.parse_ssh_url(bad)


@pytest.mark.parametrize("given", ["-oProxyCommand=touch${IFS}x", "me@-oProxyCommand=x", "-l", "-"])
def test_a_host_that_ssh_would_read_as_an_option_is_refused(given):
    """--peer, --to and --thin-for: ssh would run `-oProxyCommand=...` here, as an option."""
    for parse in (lambda: remote.parse_to(given, need_dir=False), lambda: remote.parse_to(given + ":/srv"),
                  lambda: remote.parse_ssh_url(f"ssh://{given}"), lambda: remote.parse_ssh_url(f"ssh://{given}:22")):
        with pytest.raises(DockyardError, match=r"a host cannot start with '-' \(ssh would read it as an option\)"):
            parse()


def test_a_hostile_host_runs_nothing_and_ssh_never_reads_the_host_as_an_option(tmp_path):
    mark = tmp_path / "mark"
    s = fake_node(tmp_path, b"")
    with pytest.raises(DockyardError, match="a host cannot start with '-'"):
        remote.run_there(s, Remote(f"-oProxyCommand=touch {mark}"), "true", "x")
    assert not (tmp_path / "argv").exists() and not mark.exists()  # ssh was not even started
    # and the destination always follows `--`: the real ssh takes a hostile word there as a (bad) host name
    argv = remote.ssh_argv(Settings(), Remote("node7"), "true")
    argv[argv.index("node7")] = f"-oProxyCommand=touch {mark}"
    said = subprocess.run([*argv[:-3], "-G", *argv[-3:-1]], capture_output=True, text=True)
    assert said.returncode != 0 and "hostname contains invalid characters" in said.stderr and not mark.exists()


def test_ssh_honours_the_users_ssh_and_its_options():
    s = Settings(ssh="ssh -F /etc/cluster.conf")
    r = Remote("node7", "/d", 2222, "/k")
    argv = remote.ssh_argv(s, r, "echo 'hi' && true")
    assert argv[:7] == ["ssh", "-F", "/etc/cluster.conf", "-p", "2222", "-i", "/k"]
    assert argv[-3:-1] == ["--", "node7"] and argv[-1] == "sh -c " + shlex.quote("echo 'hi' && true")
    # The remote command runs in POSIX sh whatever the login shell is: check the quoting round-trips.
    assert subprocess.run(["sh", "-c", argv[-1]], capture_output=True, text=True).stdout == "hi\n"


LOGIN_SHELLS = ("sh", "bash", "dash", "zsh", "fish", "csh", "tcsh")  # .ci/run installs them


@pytest.mark.parametrize("login_shell", ["sh", "tcsh"])
def test_a_script_sent_through_its_escaped_form_starts_with_none_of_its_own_variables_set(login_shell):
    """The escaped form (a script of several lines) held the script in `s`, which it then ran: a script reading `s`
    before setting it (NVIDIA_SMI_SCRIPT sets one) read its own text."""
    said = subprocess.run([login_shell, "-c", remote.sh_command('echo "[$s]"\necho done!')], capture_output=True,
                          text=True, timeout=30)
    assert said.stdout == "[]\ndone!\n", said


def test_the_nodes_nvidia_smi_is_asked_under_a_time_limit(tmp_path):
    """An nvidia-smi of a GPU fallen off the bus hangs for minutes: invoke ship's question of the node, and a thin
    save's over ssh, waited on it without end. Each nvidia-smi the node runs is under coreutils' timeout (a stand-in
    here records how it is called, and runs it)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "timeout").write_text('#!/bin/sh\necho "$*" >> "$LOG"\nshift\nexec "$@"\n')
    (bin_ / "nvidia-smi").write_text("#!/bin/sh\necho '| Driver Version: 580.65.06   CUDA Version: 13.0 |'\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    log = tmp_path / "log"
    r = subprocess.run(["sh", "-c", remote.NVIDIA_SMI_SCRIPT], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "LOG": str(log)})
    assert "smi=| Driver Version: 580.65.06" in r.stdout, r
    asked = [line.split() for line in log.read_text().splitlines()]
    assert [a[:2] for a in asked if "nvidia-smi" in a] == [["20", "nvidia-smi"]] * 2, asked


@pytest.mark.parametrize("login_shell", LOGIN_SHELLS)
def test_what_runs_on_the_node_is_the_script_whatever_the_users_login_shell(login_shell, tmp_path):
    """sshd runs the command as `$SHELL -c COMMAND`. A tcsh user's node answered "Unmatched '''." to every script of
    several lines (the node's state, asked first by every `invoke ship`; load.sh's watcher); csh and tcsh also took a
    `!` in a folder's name as history ("Event not found"), fish a doubled backslash in it as one. Here the login shell
    is real, and a folder's name holds all of those."""
    shell = shutil.which(login_shell)
    assert shell, f"{login_shell} is not installed (.ci/run installs it: apt-get install {login_shell})"
    folder = tmp_path / "in box!1 a\\\\b c\\ 'q' $HOME `x` \"z\" é"
    folder.mkdir()
    (folder / "x.tar").write_bytes(b"12345")
    (folder / "x.tar.partial").write_bytes(b"12")

    def on_the_node(script: str) -> subprocess.CompletedProcess:
        command = remote.ssh_argv(Settings(), Remote("node7", str(folder)), script)[-1]
        # ssh's stdin stays open while the command runs (run_there's `held`)
        with subprocess.Popen([shell, "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={**os.environ, "HOME": "/h"}) as p:
            out = p.stdout.read()
            return subprocess.CompletedProcess(command, p.wait(timeout=30), out)

    state = remote.parse_node_state(on_the_node(remote.node_state_script(str(folder), "x.tar")).stdout.decode())
    assert (state.get("final"), state.get("partial"), state.get("sha256sum")) == ("5", "2", shutil.which("sha256sum"))
    # load.sh's run over ssh, as ship --load starts it: its output, and its exit code, come back as they are
    held = on_the_node(f"cd {remote.rpath(str(folder))} || exit 1\n" + remote.held_open("ls; echo '!x' $HOME; exit 3"))
    assert (held.stdout, held.returncode) == (b"x.tar\nx.tar.partial\n!x /h\n", 3)
    # a script of one line without such characters goes as it is written
    assert on_the_node("printf '%s' \"$HOME\" '{{json .}}'").stdout == b"/h{{json .}}"


def effective(argv: list[str]) -> dict[str, str]:
    """The options the real ssh would use for this argv (`ssh -G` prints them without connecting)."""
    out = subprocess.run([*argv[:-3], "-G", *argv[-3:-1]], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_ssh_gives_up_on_a_silent_node_in_bounded_time_unless_the_setting_says_otherwise(tmp_path):
    (tmp_path / "config").write_text("Host *\n  ConnectTimeout 300\n")
    used = effective(remote.ssh_argv(Settings(ssh=f"ssh -F {tmp_path / 'config'}"), Remote("node7"), "true"))
    assert used["connecttimeout"] == "15" and used["serveraliveinterval"] == "15"
    assert used["serveralivecountmax"] == "4"
    used = effective(remote.ssh_argv(Settings(ssh="ssh -o ConnectTimeout=3 -o ServerAliveCountMax=9"),
                                     Remote("node7"), "true"))
    assert used["connecttimeout"] == "3" and used["serveralivecountmax"] == "9"  # the setting's own values win


def test_node_state_script_reports_tools_space_and_partial_copies(tmp_path):
    (tmp_path / "x.tar.zst.partial").write_bytes(b"a" * 1234)
    out = subprocess.run(["sh", "-c", remote.node_state_script(str(tmp_path), "x.tar.zst")],
                         capture_output=True, text=True, check=True).stdout
    have = remote.parse_node_state(out)
    assert have["partial"] == "1234" and "final" not in have
    assert int(have["free_kb"]) > 0 and have["sha256sum"].endswith("sha256sum")
    # A folder that does not exist yet: free space of the nearest parent, nothing created.
    script = remote.node_state_script(str(tmp_path / "new" / "deeper"), "x")
    have = remote.parse_node_state(subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                                                  check=True).stdout)
    assert int(have["free_kb"]) > 0 and not (tmp_path / "new").exists()


def fake_node(tmp_path, stdout: bytes, code: int = 0) -> Settings:
    """An `ssh` setting whose node answers every command with `stdout` and exit `code`; it records its argv."""
    (tmp_path / "answer").write_bytes(stdout)
    ssh = tmp_path / "ssh"
    ssh.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\ncat {tmp_path}/answer\n'
                   f'echo "node says bye" >&2\nexit {code}\n')
    ssh.chmod(0o755)
    return Settings(ssh=str(ssh))


def docker_prints(info, inspected, smi: str = "") -> bytes:
    """What INVENTORY_SCRIPT prints: the node's nvidia-smi lines (none: no nvidia-smi), docker info, the images."""
    return (smi + remote.SEP + "\n" + json.dumps(info) + "\n" + remote.SEP + "\n" + json.dumps(inspected)).encode()


LAYERS = ["sha256:" + "a" * 64]


def test_the_inventory_script_is_read_like_docker_prints_it(tmp_path):
    """What INVENTORY_SCRIPT prints over ssh becomes an inventory; the Remote given is the one used."""
    s = fake_node(tmp_path, docker_prints({"ServerVersion": "20.10", "DriverStatus": []},
                                          [{"Id": "sha256:" + "1" * 64, "RootFS": {"Layers": LAYERS}}]))
    inv = remote.remote_inventory(s, Remote("node7", port=2200, identity="/keys/k"))
    assert inv["format"] == INVENTORY_FORMAT and inv["host"] == "node7" and inv["chain_ids"] == LAYERS
    sent = (tmp_path / "argv").read_text().split("\n")
    assert sent[:4] == ["-p", "2200", "-i", "/keys/k"] and "node7" in sent


def test_the_inventory_read_over_ssh_holds_the_nodes_driver_where_its_nvidia_smi_says_one_a_thin_save_can_read(
        tmp_path):
    """What a thin save checks the node by (inventory.driver_host), read as invoke ship reads nvidia-smi; a node
    without nvidia-smi records none."""
    smi = "smi=| NVIDIA-SMI 535.183.01   Driver Version: 535.183.01   CUDA Version: 12.2 |\n"
    answer = docker_prints({}, [], smi + "gpus=Tesla T4, 7.5;Tesla T4, 7.5;\n")
    host = inventory.driver_host(remote.remote_inventory(fake_node(tmp_path, answer), Remote("node7")))
    assert (host.driver, host.cuda, [(g.name, g.capability) for g in host.gpus]) == (
        "535.183.01", "12.2", [("Tesla T4", "7.5")] * 2)
    assert inventory.driver_host(remote.remote_inventory(fake_node(tmp_path, docker_prints({}, [])),
                                                         Remote("node7"))) is None


@pytest.mark.parametrize("answer,says", [
    (remote.SEP.encode() + b"\nnot json\n" + remote.SEP.encode() + b"\n[]", "Invalid JSON"),
    (docker_prints([1], []), "inventory [1]: takes `key: value` entries (a mapping)"),
    (docker_prints({}, {"Id": "x"}), "takes a list"),
    (docker_prints({}, [{"RootFS": {}}]), "Id: missing: add it"),
    (docker_prints({}, [{"Id": "x", "RootFS": {"Layers": ["sha256:../../etc"]}}]), "RootFS.Layers.0"),
    (docker_prints({"DriverStatus": "containerd"}, []), "DriverStatus"),
])
def test_a_node_that_sends_something_else_than_docker_prints_is_refused_by_name(tmp_path, answer, says):
    with pytest.raises(DockyardError, match="the image inventory node7 sent over ssh is not what docker prints") as e:
        remote.remote_inventory(fake_node(tmp_path, answer), Remote("node7"))
    assert says in str(e.value)


def test_a_node_that_sends_too_much_or_fails_is_refused_by_name(tmp_path):
    with pytest.raises(DockyardError, match="node7 sent more than 64 MiB for its image inventory"):
        remote.remote_inventory(fake_node(tmp_path, b"{" * (64 << 20) + b"}"), Remote("node7"))
    with pytest.raises(DockyardError, match="cannot read the images of node7 over ssh .* node says bye"):
        remote.remote_inventory(fake_node(tmp_path, b"", code=1), Remote("node7"))
    with pytest.raises(DockyardError, match=r"ssh to node7 failed \(node says bye\)\. Check that node7 is up"):
        remote.remote_inventory(fake_node(tmp_path, b"", code=255), Remote("node7"))


def test_thin_for_names_a_node_or_an_inventory_file(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(remote, "remote_inventory", lambda settings, r: seen.append(r) or {"chain_ids": []})
    remote.target_inventory(Settings(), "ssh://me@node7:2200")
    assert seen == [Remote("me@node7", port=2200)]
    (tmp_path / "n.json").write_text(json.dumps({"format": INVENTORY_FORMAT, "engine": {"store": "classic"},
                                                 "chain_ids": []}))
    assert remote.target_inventory(Settings(), str(tmp_path / "n.json"))["chain_ids"] == []
