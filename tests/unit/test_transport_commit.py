"""`invoke commit` decisions without an engine: secrets in a diff, the diff summary, drift from the lock."""

from __future__ import annotations

import datetime
import json

import pytest

from dockyard.common.errors import DockyardError
from dockyard.images import variants
from dockyard.settings import Settings
from dockyard.transport import commit

DIFF = """C /root
A /root/.cache
A /root/.cache/huggingface
A /root/.cache/huggingface/token
A /root/.ssh
A /root/.ssh/id_ed25519
A /root/.ssh/id_ed25519.pub
A /root/.ssh/known_hosts
A /work/.env
A /work/.env.example
D /root/.netrc
C /opt/venv/lib/python3.11/site-packages/peft-0.22.0.dist-info
A /opt/venv/lib/python3.11/site-packages/requests-2.32.3.dist-info
A /opt/venv/lib/python3.11/site-packages/requests-2.32.3.dist-info/METADATA
D /opt/venv/lib/python3.11/site-packages/accelerate-1.15.0.dist-info
A /opt/venv/lib/python3.11/site-packages/torch-2.13.0+cpu.dist-info
"""

LOCK = """accelerate==1.15.0 \\
    --hash=sha256:aa
peft==0.21.2 \\
    --hash=sha256:bb
torch==2.13.0+cpu \\
    --hash=sha256:cc
typing_extensions==4.12.2 ; python_version < "3.13" \\
"""


def test_secrets_in_the_diff_are_named():
    found = commit.find_secrets(commit.parse_diff(DIFF))
    assert found == [("/root/.cache/huggingface/token", "Hugging Face token"),
                     ("/root/.ssh/id_ed25519", "ssh private key"),
                     ("/work/.env", "env file")]


# One case per pattern of commit.SECRETS: a path the pattern is there for, and what it must be called.
SECRET_CASES = [
    ("*/.cache/huggingface/token", "/root/.cache/huggingface/token", "Hugging Face token"),
    ("*/.cache/huggingface/stored_tokens", "/home/u/.cache/huggingface/stored_tokens", "Hugging Face tokens"),
    ("*/.huggingface/token", "/root/.huggingface/token", "Hugging Face token"),
    ("*/.netrc", "/home/u/.netrc", "netrc credentials"),
    ("*/.ssh/id_*", "/root/.ssh/id_rsa", "ssh private key"),
    ("*/.git-credentials", "/root/.git-credentials", "git credentials"),
    ("*/.aws/credentials", "/root/.aws/credentials", "AWS credentials"),
    ("*/.config/gcloud/*credentials*", "/root/.config/gcloud/application_default_credentials.json",
     "Google Cloud credentials"),
    ("*/.azure/*token*", "/root/.azure/msal_token_cache.json", "Azure tokens"),
    ("*/.docker/config.json", "/root/.docker/config.json", "registry credentials"),
    ("*/.kube/config", "/root/.kube/config", "Kubernetes credentials"),
    ("*/.pypirc", "/root/.pypirc", "package index credentials"),
    ("*/.env", "/work/.env", "env file"),
    ("*/.env.*", "/work/.env.production", "env file"),
    ("*.env", "/work/prod.env", "env file"),
]


@pytest.mark.parametrize("pattern,path,what", SECRET_CASES, ids=[c[0] for c in SECRET_CASES])
def test_each_secret_pattern_refuses_its_file(pattern, path, what):
    assert (pattern, what) in commit.SECRETS  # the pattern is still on the list, under this name
    assert commit.find_secrets([("A", path)]) == [(path, what)]
    assert commit.find_secrets([("C", path)]) == [(path, what)]  # changed after the build: still captured
    assert commit.find_secrets([("D", path)]) == []  # deleted: nothing to capture


def test_every_secret_pattern_has_its_case():
    assert sorted(commit.SECRETS) == sorted((pattern, what) for pattern, _, what in SECRET_CASES)


def test_drift_lists_packages_changed_by_hand_against_the_lock():
    pins = variants.parse_lock_pins(LOCK)
    assert pins == {"accelerate": "1.15.0", "peft": "0.21.2", "torch": "2.13.0+cpu", "typing-extensions": "4.12.2"}
    assert variants.parse_lock_pins("Zope.Interface==7.1 \\\n    --hash=sha256:dd\n") == {"zope-interface": "7.1"}
    assert commit.drift(commit.parse_diff(DIFF), pins) == [
        "peft==0.22.0 (lock: 0.21.2)", "requests==2.32.3 (lock: absent)", "-accelerate (lock: 1.15.0)"]


def test_diff_summary_counts_and_places():
    s = commit.diff_summary(commit.parse_diff(DIFF))
    assert s.startswith("12 added, 2 changed, 2 deleted; most under /root/.ssh (4)")
    # a file one folder down is counted in that folder: "most under /tmp/nc74.txt (1)" named a file as a folder
    assert "/work (2)" in s and "/root (1)" in s and "/work/.env" not in s, s
    assert commit.diff_summary([("C", "/tmp"), ("A", "/tmp/nc74.txt")]) == "1 added, 1 changed, 0 deleted; most under /tmp (1)"


def test_default_tag_says_where_it_came_from():
    now = datetime.datetime(2026, 11, 22, 4, 5, 6)
    assert commit.default_tag("dockyard:0.1.0-cpu", "dockyard", now) == "dockyard:0.1.0-cpu-commit-20261122-040506"
    assert commit.default_tag("reg:5000/team/img", "dockyard", now) == "reg:5000/team/img:commit-20261122-040506"
    assert commit.default_tag("sha256:" + "a" * 64, "dockyard", now) == "dockyard:commit-20261122-040506"
    digest = "@sha256:" + "b" * 64
    assert commit.default_tag("python" + digest, "dockyard", now) == "python:commit-20261122-040506"
    assert commit.default_tag("python:3.12" + digest, "dockyard", now) == "python:3.12-commit-20261122-040506"


def test_a_commit_of_a_commits_container_gets_a_tag_docker_takes():
    """Each commit of a container started from a commit appended its time to the source's: the fifth one's tag was
    past docker's 128 characters, refused by `docker commit` only after the container's files were read."""
    source = "dockyard:0.1.0-cpu"
    for minute in range(10):
        now = datetime.datetime(2026, 11, 22, 4, minute, 6, tzinfo=datetime.timezone.utc)
        source = commit.default_tag(source, "dockyard", now)
        assert source == f"dockyard:0.1.0-cpu-commit-20261122-04{minute:02}06"
        commit.check_tag(source)
    now = datetime.datetime(2026, 11, 22, 4, 5, 6, tzinfo=datetime.timezone.utc)
    assert commit.default_tag("img:commit-20261122-040000", "d", now) == "img:commit-20261122-040506"
    long = commit.default_tag("reg:5000/img:" + "v" * 128, "d", now)
    assert long.endswith("-commit-20261122-040506") and len(long.split(":")[-1]) == 128
    commit.check_tag(long)


HF = "hf_" + "A1b2C3d4" * 5
AWS_ID = "AKIA" + "ABCDEFGHIJKLMNOP"
GH = "ghp_" + "x" * 36


@pytest.mark.parametrize("content,what", [
    (f"token={HF}\n", "Hugging Face token"),
    (f"export AWS_ACCESS_KEY_ID={AWS_ID}", "AWS access key id"),
    ("aws_secret_access_key = " + "s" * 40, "AWS secret access key"),
    (f"git push https://{GH}@github.com/x/y", "GitHub token"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn...", "private key"),
    ("-----BEGIN RSA PRIVATE KEY-----", "private key"),
    ("export OPENAI_API_KEY=sk-proj-" + "Ab3_" * 12, "OpenAI API key"),
    ("key = 'sk-" + "aB3d" * 12 + "'", "OpenAI API key"),
    ("ANTHROPIC_API_KEY=sk-ant-api03-" + "Zy9-" * 10, "Anthropic API key"),
    ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none", "PuTTY private key"),
    ("DATABASE_URL=postgres://admin:Sup3rS3cret@db/prod", "password in a URL"),
    ("index-url = https://me:s3cr3t-pw@pypi.corp.example/simple", "password in a URL"),
    ('wandb_api_key: "0123456789abcdef0123456789abcdef01234567"', "secret assigned by its name"),
    ("MY_SERVICE_TOKEN = 'Zm9vYmFyYmF6cXV4cXV1eA'", "secret assigned by its name"),
])
def test_token_patterns_find_tokens_wherever_they_were_left(content, what):
    assert commit.token_in(content.encode()) == what


@pytest.mark.parametrize("content", [
    "hf_short", "AKIA lowercase", "-----BEGIN PUBLIC KEY-----", "ghp_tooshort", "sk-learn", "task-ask-something",
    "MAX_TOKENS = 2048", "TOKENIZER_PATH=/workspace/models/tokenizer", "PASSWORD=$DB_PASSWORD_FROM_VAULT",
    "url = postgres://${USER}:${PASSWORD}@db/x", "see https://example.org/a:b@c", "api_key: <your key here, 40 chars>",
    # what every fine-tuning script and notebook holds (review of the first patterns)
    "tokenizer.pad_token = tokenizer.eos_token", "num_token = config.max_position_embeddings",
    "hf_token = huggingface_hub.get_token()", "api_key: ENV_VAR_OPENAI_APIKEY", "pad_token =\n  'abcdefghijklmnop1234'",
    "sk-learn-classifier-training-pipeline-config-v2",
])
def test_token_patterns_leave_look_alikes_alone(content):
    assert commit.token_in(content.encode()) is None


def test_the_environment_is_scanned_by_value_and_by_name_and_the_secret_is_never_named():
    env = [f"HF_TOKEN={HF}", f"OTHER={GH}", "DB_PASSWORD=hunter2", "EMPTY_TOKEN=", "HF_HUB_OFFLINE=1", "PATH=/bin",
           "WANDB_KEY=0123456789abcdef", "DB_URL=postgres://admin:pw1@db/x", "BASIC_AUTH=me:pw", "GPG_KEY=A035C8C1",
           "SSH_AUTH_SOCK=/tmp/ssh-x/agent.1", "XAUTHORITY=/root/.Xauthority", "AUTHOR=me", "SORT_KEY=name"]
    found = commit.env_secrets(env)
    assert found == [("env HF_TOKEN", "Hugging Face token"), ("env OTHER", "GitHub token"),
                     ("env DB_PASSWORD", "secret by its name"), ("env WANDB_KEY", "secret by its name"),
                     ("env DB_URL", "password in a URL"), ("env BASIC_AUTH", "secret by its name")]
    assert not any(secret in str(found) for secret in (HF, GH, "hunter2", "pw1"))


# --- what is read for tokens: a container played by a folder, behind a stand-in docker client -------------------

DOCKER = """#!/bin/sh
# A stand-in docker client for `invoke commit`: the container's files are the folder $FS, its `docker diff` the
# file $FS.diff; `docker commit` only writes its argv to $FS.committed.
case "$1" in
container) cat "$FS.inspect" ;;
diff) cat "$FS.diff" ;;
cp) path=${2#*:}; exec tar -C "$FS$(dirname "$path")" -cf - "$(basename "$path")" ;;
image) echo '[{"Id": "sha256:0", "Config": {"Labels": {}}}]' ;;
commit) echo "$*" >"$FS.committed" ;;
esac
"""


def container(tmp_path, monkeypatch, files: dict[str, str]):
    """Settings whose docker client plays a container that added `files` (path → content) to its image, and the
    file a commit of it writes."""
    fs = tmp_path / "fs"
    for path, content in files.items():
        (fs / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (fs / path.lstrip("/")).write_text(content)
    added = sorted({"/" + str(p.relative_to(fs)) for p in fs.rglob("*")})
    (tmp_path / "fs.diff").write_text("".join(f"A {p}\n" for p in added))
    (tmp_path / "fs.inspect").write_text(json.dumps([{"Id": "c" * 64, "Name": "/box", "Image": "sha256:" + "a" * 64,
                                                      "Config": {"Image": "python:3.12", "Env": []}}]))
    client = tmp_path / "docker"
    client.write_text(DOCKER)
    client.chmod(0o755)
    monkeypatch.setenv("FS", str(fs))
    return Settings(docker=str(client)), tmp_path / "fs.committed"


def test_a_commit_ends_with_the_save_that_carries_its_image_to_another_node(tmp_path, monkeypatch, capsys):
    """`invoke commit` ended at "drift from the lock: none": the step it is for (the image to another server, the
    README's "Moving images") went unsaid, where run, save and inventory each end with theirs. A pasteable
    `invoke save --image=TAG` now; a commit holding secrets (--allow-secrets) is told not to ship it, and gets none."""
    import shlex

    settings, committed = container(tmp_path, monkeypatch, {"/workspace/notes.txt": "kept\n"})
    tag = commit.commit(settings, "box", tag="team/img:v1")
    said = capsys.readouterr().out
    line = next((x for x in said.splitlines() if x.startswith("next: ")), None)
    assert committed.exists() and line is not None, said
    assert shlex.split(line.removeprefix("next: ").split(" writes ")[0]) == ["invoke", "save", f"--image={tag}"]
    settings, _ = container(tmp_path / "2", monkeypatch, {"/root/.netrc": f"password {HF}\n"})
    commit.commit(settings, "box", tag="t:9", allow_secrets=True)
    said = capsys.readouterr().out
    assert "do not push or ship it" in said and "next: invoke save" not in said, said


def test_a_token_behind_hundreds_of_cached_downloads_is_found(tmp_path, monkeypatch):
    """600 wheels in pip's cache come before /workspace/run.sh in `docker diff`: the cache is not read (nothing a
    user writes is there), run.sh is, and the commit is refused without making the image."""
    files = {f"/root/.cache/pip/http-v2/{i:03}/body": "wheel bytes" for i in range(600)}
    files["/workspace/run.sh"] = f"export HF_TOKEN={HF}\npython train.py\n"
    settings, committed = container(tmp_path, monkeypatch, files)
    with pytest.raises(DockyardError) as e:
        commit.commit(settings, "box", tag="t:9")
    assert "/workspace/run.sh  (content: Hugging Face token)" in str(e.value) and HF not in str(e.value)
    assert not committed.exists()
    # a stopped container (as most committed ones are) takes no `docker exec`: the fix starts it first
    assert "Remove them (docker start box, then docker exec box rm ...;" in str(e.value)
    assert "Remove them (docker exec box rm ...;" in commit.refusal("box", [("/x", "y")], [], running=True)


@pytest.mark.parametrize("path", ["/root/dev/run.sh", "/workspace/sys/run.sh", "/home/u/var/cache/x/run.sh"])
def test_a_token_in_a_user_folder_named_like_a_system_one_is_found(tmp_path, monkeypatch, path):
    """/dev/, /sys/, /var/cache/ are left unread from the root only: ~/dev/<project> is a common layout."""
    settings, committed = container(tmp_path, monkeypatch, {path: f"export HF_TOKEN={HF}\n"})
    with pytest.raises(DockyardError, match=f"{path}  \\(content: Hugging Face token\\)"):
        commit.commit(settings, "box", tag="t:9")
    assert not committed.exists()


def test_a_token_at_the_end_of_a_long_log_is_found_and_binary_files_are_not_read(tmp_path, monkeypatch):
    """A token after 1.1 MB of log lines was not read (files over 1 MiB were skipped without a word); one cut by
    the boundary of the blocks the file is read in is found too. Weights and libraries (a NUL in their first
    block) are not read for tokens."""
    cut = commit.BLOCK * 17 - len(HF) // 2  # past 1.1 MB, the token starts in block 17 and ends in block 18
    log = "step loss 1.234\n" * (cut // 16) + " " * (cut % 16)
    files = {"/workspace/train.log": log + HF + "\n", "/workspace/model.bin": "\0weights " + GH}
    settings, committed = container(tmp_path, monkeypatch, files)
    with pytest.raises(DockyardError) as e:
        commit.commit(settings, "box", tag="t:9")
    assert "/workspace/train.log  (content: Hugging Face token)" in str(e.value)
    assert "model.bin" not in str(e.value) and not committed.exists()


def test_a_text_file_longer_than_is_read_is_read_in_its_head_and_said(tmp_path, monkeypatch, capsys):
    """A dataset of GBs in /workspace/data: its first SCAN_BYTES are read (a token there refuses the commit), the
    commit is made, and the note says which files were read in part."""
    monkeypatch.setattr(commit, "SCAN_BYTES", 2 * commit.BLOCK)
    rows = "line\n" * commit.BLOCK
    settings, committed = container(tmp_path, monkeypatch, {"/workspace/data/big.jsonl": rows})
    commit.commit(settings, "box", tag="t:9")
    assert committed.exists()
    out = capsys.readouterr().out
    assert "note: 1 text file(s) longer than 131.1 kB were read for tokens in that much of their start only, most " \
           "under /workspace/data (1)" in out
    committed.unlink()
    (tmp_path / "fs" / "workspace" / "data" / "big.jsonl").write_text(f"{HF}\n" + rows)
    with pytest.raises(DockyardError, match="big.jsonl  \\(content: Hugging Face token\\)"):
        commit.commit(settings, "box", tag="t:9")
    assert not committed.exists()


def test_more_changed_files_than_are_read_refuse_the_commit_unless_allowed(tmp_path, monkeypatch, capsys):
    """Past SCAN_FILES the files are not read: that is a refusal saying how many and where, never a commit made
    as if they had been read; --allow-secrets commits and says so."""
    monkeypatch.setattr(commit, "SCAN_FILES", 3)
    settings, committed = container(tmp_path, monkeypatch, {f"/workspace/data/{i}.txt": "rows" for i in range(5)})
    with pytest.raises(DockyardError) as e:
        commit.commit(settings, "box", tag="t:9")
    assert "2 past the first 3 were not read, most under /workspace/data (2)" in str(e.value)
    assert "--allow-secrets" in str(e.value) and not committed.exists()
    commit.commit(settings, "box", tag="t:9", allow_secrets=True)
    assert committed.exists()
    assert "WARNING: 2 changed files were not read for tokens (--allow-secrets)" in capsys.readouterr().out


def test_a_token_in_a_gzip_file_is_found_as_in_its_text(tmp_path, monkeypatch):
    """A rotated log (train.log.1.gz) or a .tar.gz of a home folder with its .netrc: gzip's bytes hold a NUL early, so
    they were taken for binary and never read. They are read decompressed, at most SCAN_BYTES of them."""
    import gzip
    import io
    import tarfile

    netrc = f"machine hf.co login u password {HF}\n".encode()
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        member = tarfile.TarInfo("root/.netrc")
        member.size = len(netrc)
        tar.addfile(member, io.BytesIO(netrc))
    contents = {"/workspace/train.log.1.gz": gzip.compress(("step\n" * 50_000 + f"HF_TOKEN={HF}\n").encode()),
                "/workspace/home.tar.gz": packed.getvalue(),
                "/workspace/clean.log.gz": gzip.compress(b"step loss 1.0\n" * 1000)}
    settings, committed = container(tmp_path, monkeypatch, dict.fromkeys(contents, ""))
    for path, data in contents.items():
        (tmp_path / "fs" / path.lstrip("/")).write_bytes(data)
    with pytest.raises(DockyardError) as e:
        commit.commit(settings, "box", tag="t:9")
    assert "/workspace/train.log.1.gz  (content: Hugging Face token)" in str(e.value)
    assert "/workspace/home.tar.gz  (content: Hugging Face token)" in str(e.value)
    assert "clean.log.gz" not in str(e.value) and HF not in str(e.value) and not committed.exists()
    bomb = gzip.compress(b"\0" * (3 * commit.BLOCK))  # past what is read: said as read in part, never all of it
    monkeypatch.setattr(commit, "SCAN_BYTES", commit.BLOCK)
    assert commit.text_token(io.BytesIO(bomb), len(bomb)) == commit.TOO_LONG


@pytest.mark.parametrize("tag", ["dockyard:0.1.0-cpu", "docker.io/library/dockyard:0.1.0-cu132"])
def test_a_commit_never_takes_a_built_images_own_tag(tag):
    """`--tag=dockyard:0.1.0-cpu` moved the build's tag onto a container changed by hand, which kept the build's
    labels: run, save and ship took it for the reproducible image. Refused before any docker command."""
    with pytest.raises(DockyardError, match="is the tag `invoke build --variant="):
        commit.commit(Settings(docker="/bin/false"), "c1", tag=tag)  # a client that would say "no container c1"


@pytest.mark.parametrize("tag", ["dockyard-base:bookworm", "docker.io/library/dockyard-base:bookworm",
                                 "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"])
def test_a_commit_never_takes_the_tag_of_a_base_a_build_starts_from(tag):
    """`--tag=dockyard-base:bookworm` replaced the base `invoke build` starts cpu and cu132 from (base_image_cpu):
    every later build took in the container changed by hand. Refused before any docker command, as a build's tag."""
    with pytest.raises(DockyardError, match=r"is the base image `invoke build` builds .* from"):
        commit.commit(Settings(docker="/bin/false"), "c1", tag=tag)  # a client that would say "no container c1"


@pytest.mark.parametrize("client", ["/bin/true", "/bin/echo"])
def test_a_docker_setting_that_is_no_docker_client_is_one_line(client):
    with pytest.raises(DockyardError, match="did not answer as a Docker client does"):
        commit.commit(Settings(docker=client), "c1", tag="mine:1")


def test_a_client_found_on_path_that_is_no_docker_client_is_named_as_found(monkeypatch, tmp_path):
    """With the docker setting left empty (the default) the error named "`` container inspect c1`"."""
    client = tmp_path / "docker"
    client.write_text("#!/bin/sh\necho '[]'\n")  # JSON, but no container's
    client.chmod(0o755)
    monkeypatch.setattr(commit.engine, "docker_binary", lambda setting="": setting or str(client))
    with pytest.raises(DockyardError) as e:
        commit.commit(Settings(docker=""), "c1", tag="mine:1")
    assert str(e.value).startswith(f"`{client} container inspect c1` did not answer as a Docker client does")


def test_the_shells_mounts_are_not_the_containers_changes(tmp_path, monkeypatch, capsys):
    """After `echo 'echo hi > /tmp/mark' | invoke shell --keep`, `invoke commit` said "most under /workspace/.cache
    (3), /workspace (1), /workspace/runs (1), /tmp/mark (1), /usr/sbin (1)": `docker diff` lists each mount point,
    the folders made to hold it and --init's docker-init. What was mounted is not committed, and a mounted ~/.netrc is
    the host's: the summary counts, and the secret scan reads, what the container changed itself."""
    settings, committed = container(tmp_path, monkeypatch, {"/tmp/mark": "hi\n", "/root/.netrc": f"password {HF}\n"})
    (tmp_path / "fs.diff").write_text("C /tmp\nA /tmp/mark\nC /usr\nC /usr/sbin\nA /usr/sbin/docker-init\n"
                                      "A /workspace\nA /workspace/.cache\nA /workspace/.cache/compile\n"
                                      "A /workspace/.cache/huggingface\nA /workspace/runs\nC /root\nA /root/.netrc\n")
    mounts = ["/workspace/.cache/huggingface", "/workspace/.cache/compile", "/workspace/runs", "/opt/dockyard/recipes",
              "/root/.netrc"]
    (tmp_path / "fs.inspect").write_text(json.dumps([{
        "Id": "c" * 64, "Name": "/dockyard-shell-1", "Image": "sha256:" + "a" * 64,
        "Config": {"Image": "dockyard:0.1.0-cpu", "Env": []}, "HostConfig": {"Init": True},
        "Mounts": [{"Type": "bind", "Source": f"/host{m}", "Destination": m} for m in mounts]}]))

    commit.commit(settings, "dockyard-shell-1", tag="t:9")

    said = capsys.readouterr().out
    assert "  1 added, 1 changed, 0 deleted; most under /tmp (1)\n" in said and committed.exists()


@pytest.mark.parametrize("tag", ["Img:v1", "img:-x", "img:" + "a" * 129, "img:v1@sha256:" + "a" * 64, "a..b:v1",
                                 "img:v1:v2"])
def test_a_tag_docker_would_refuse_is_refused_before_the_container_is_read(tag):
    """Such a --tag passed, the container's changed files were read for tokens (minutes, for thousands), and only
    then did `docker commit` refuse it: "invalid reference format" under the command line. Refused first now,
    saying the form, before any docker command (the client here would say "no container c1")."""
    with pytest.raises(DockyardError, match="is not a tag docker takes") as e:
        commit.commit(Settings(docker="/bin/false"), "c1", tag=tag)
    assert len(str(e.value).splitlines()) == 1


def test_an_image_given_as_the_container_is_said_to_be_an_image(tmp_path):
    """`invoke commit --container=dockyard:0.1.0-cpu` (the image, not the container started from it) was answered
    "no container dockyard:0.1.0-cpu", though `docker images` lists it."""
    client = tmp_path / "docker"
    client.write_text('#!/bin/sh\n[ "$1" = image ] && { echo \'[{"Id": "sha256:ab"}]\'; exit 0; }\n'
                      'echo "Error: No such container: $3" >&2; exit 1\n')
    client.chmod(0o755)
    with pytest.raises(DockyardError, match=r"^img:1 is an image, not a container: give the container to commit"):
        commit.commit(Settings(docker=str(client)), "img:1")
    client.write_text('#!/bin/sh\necho "Error: No such $2: $3" >&2; exit 1\n')
    with pytest.raises(DockyardError, match=r"^no container c1: see `docker ps -a`$"):
        commit.commit(Settings(docker=str(client)), "c1")
