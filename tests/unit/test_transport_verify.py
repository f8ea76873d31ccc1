"""Verification without an engine, on hand-made archive sets: sha256s, manifest, signatures, load.sh."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard.common.errors import DockyardError
from dockyard.settings import Settings
from dockyard.transport import load as load_mod
from dockyard.transport.layout import ArchivePaths, write_loader
from tests.support.archive_sets import engine_answering_info, keypair, make_set, reseal
from tests.support.processes import bounded_run


def test_verify_accepts_a_good_set_and_sha256sum_agrees(tmp_path):
    paths = make_set(tmp_path)
    assert load_mod.verify(Settings(), paths)["archive"] == "t_1.tar.zst"
    assert subprocess.run(["sha256sum", "-c", paths.sha256.name], cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("damage,message", [
    ("truncate", "truncated"),
    ("longer", r"is \d+ bytes, the manifest says \d+: the copy is damaged"),
    ("bitflip", "does not match its sha256"),
    ("manifest", "manifest was changed"),
    ("missing", "is missing"),
])
def test_verify_refuses_damage(tmp_path, damage, message):
    paths = make_set(tmp_path)
    data = bytearray(paths.archive.read_bytes())
    if damage == "truncate":
        paths.archive.write_bytes(data[: len(data) // 2])
    elif damage == "longer":  # told by its size, before a byte is hashed
        paths.archive.write_bytes(data + b"more")
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x01
        paths.archive.write_bytes(data)
    elif damage == "manifest":
        paths.manifest.write_text(paths.manifest.read_text().replace("a" * 64, "b" * 64))
    else:
        paths.sha256.unlink()
    with pytest.raises(DockyardError, match=message):
        load_mod.verify(Settings(), paths)


def test_an_unsigned_or_re_written_manifest_is_refused_and_a_signed_one_verifies(tmp_path):
    paths = make_set(tmp_path)
    good, other = keypair(tmp_path, "release"), keypair(tmp_path, "intruder")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'release@site namespaces="{load_mod.SIGN_NAMESPACE}" '
                       + " ".join(good.with_suffix(".pub").read_text().split()[:2]) + "\n")
    settings = Settings(allowed_signers=str(allowed))

    with pytest.raises(DockyardError, match="not signed"):
        load_mod.verify(settings, paths)
    load_mod.sign_file(paths.manifest, good)
    assert load_mod.verify_signature(allowed, paths, paths.manifest.read_bytes()) == "release@site"
    load_mod.verify(settings, paths)

    # A manifest re-written after signing (with its sha256 line updated to match) is refused.
    text = paths.manifest.read_text().replace("t:1", "evil:1")
    paths.manifest.write_text(text)
    sums = paths.sha256.read_text().splitlines()
    sums[1] = f"{hashlib.sha256(text.encode()).hexdigest()}  {paths.manifest.name}"
    paths.sha256.write_text("\n".join(sums) + "\n")
    with pytest.raises(DockyardError, match="does not verify"):
        load_mod.verify(settings, paths)

    paths = make_set(tmp_path)
    paths.signature.unlink()
    load_mod.sign_file(paths.manifest, other)
    with pytest.raises(DockyardError, match="not in"):
        load_mod.verify(settings, paths)


def test_load_sh_finds_its_archive_and_refuses_damage_before_docker_load(tmp_path):
    loader = write_loader(tmp_path)
    assert subprocess.run(["sh", "-n", loader]).returncode == 0
    paths = make_set(tmp_path)
    data = bytearray(paths.archive.read_bytes())
    data[100] ^= 1
    paths.archive.write_bytes(data)
    env = engine_answering_info(tmp_path)
    r = subprocess.run(["sh", loader], capture_output=True, text=True, env=env)  # the only archive: no name needed
    assert r.returncode == 1 and "t_1.tar.zst is damaged" in r.stderr and "nothing was loaded" in r.stderr
    assert not (tmp_path / "docker-used").exists(), "the engine was asked for more than whether it answers"
    make_set(tmp_path, name="t_2.tar.zst")
    r = subprocess.run(["sh", loader], capture_output=True, text=True)
    assert r.returncode == 1 and "name the archive to load" in r.stderr
    r = subprocess.run(["sh", loader, "t_3.tar.zst"], capture_output=True, text=True)
    assert r.returncode == 1 and "t_3.tar.zst is missing here" in r.stderr


def test_load_sh_given_the_sets_folder_or_another_ending_names_the_archive_and_that_command_checks_it(tmp_path):
    """The newcomer's walk: `sh load.sh /tmp/node` (the folder the set was carried in) said "/tmp/node is missing",
    of a folder that is there; `sh load.sh dockyard_0.1.0-cu128.tar.gz` (or without its ending) beside the .tar.zst
    said "... is missing here: copy the archive". A folder is said to be one, naming the archive in it; a name
    whose archive is here under another ending is answered with it. The command named then checks that archive
    (damaged here, so that no engine is needed past `docker info`)."""
    carried = tmp_path / "carried"
    carried.mkdir()
    loader = write_loader(carried)
    paths = make_set(carried)
    data = bytearray(paths.archive.read_bytes())
    data[100] ^= 1
    paths.archive.write_bytes(data)
    env = engine_answering_info(tmp_path)

    def load_sh(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", *argv], capture_output=True, text=True, env=env, cwd=tmp_path)

    for typed, says in ((str(carried), f"{carried} is a folder, not an archive: name the archive in it, "
                                       f"sh load.sh {paths.archive}"),
                        ("carried/", "carried/ is a folder, not an archive: name the archive in it, "
                                     "sh load.sh carried/t_1.tar.zst"),
                        ("carried/t_1.tar.gz", "carried/t_1.tar.gz is missing here: did you mean sh load.sh "
                                               "carried/t_1.tar.zst?"),
                        ("t_1", "t_1 is missing here: did you mean sh load.sh t_1.tar.zst?")):  # beside load.sh
        r = load_sh(loader, typed)
        assert r.returncode == 1 and r.stderr == f"load.sh: {says}\n", (typed, r.stderr)
        meant = says.rsplit("sh load.sh ", 1)[1].removesuffix("?")
        r = load_sh(loader, meant)
        assert r.returncode == 1 and "t_1.tar.zst is damaged" in r.stderr, (meant, r.stderr)
    (tmp_path / "empty").mkdir()
    r = load_sh(loader, "empty")
    assert r.stderr == "load.sh: empty is a folder, not an archive: it holds no archive (.tar.zst, .tar.gz or .tar)\n"
    assert not (tmp_path / "docker-used").exists(), "the engine was asked for more than whether it answers"


def test_an_archive_named_with_another_ending_than_its_own_is_answered_with_the_one_there_which_verifies(tmp_path):
    """`invoke load --file=x.tar.gz` (and `invoke ship --file=...`) beside x.tar.zst said "x.tar.gz is missing: an
    archive travels with its .sha256 and .manifest.json", as load.sh did: it names the archive there, which loads."""
    paths = make_set(tmp_path)
    typed = tmp_path / "t_1.tar.gz"
    with pytest.raises(DockyardError) as e:
        load_mod.verify(Settings(), ArchivePaths(typed))
    assert str(e.value) == f"{typed} is missing: did you mean {paths.archive}?"
    assert load_mod.verify(Settings(), ArchivePaths(paths.archive))["archive"] == "t_1.tar.zst"
    with pytest.raises(DockyardError, match=r"t_2.tar.zst is missing: an archive travels with its .sha256"):
        load_mod.verify(Settings(), ArchivePaths(tmp_path / "t_2.tar.zst"))  # none of that name: as before


@pytest.mark.parametrize("which", ["empty", "archive only", "manifest only", "another file too"])
def test_load_sh_refuses_a_sha256_file_that_does_not_list_exactly_the_set(tmp_path, which):
    loader = write_loader(tmp_path)
    paths = make_set(tmp_path)
    other = tmp_path / "notes.txt"
    other.write_text("x")
    reseal(paths, sums={"empty": [], "archive only": [paths.archive], "manifest only": [paths.manifest],
                        "another file too": [paths.archive, paths.manifest, other]}[which])
    r = subprocess.run(["sh", loader, paths.archive.name], capture_output=True, text=True)
    assert r.returncode == 1 and "must list exactly t_1.tar.zst and t_1.manifest.json" in r.stderr
    assert "loading" not in r.stdout


def test_load_sh_loads_the_archive_named_by_its_path_never_a_namesake_beside_it(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "other").mkdir()
    loader = write_loader(tmp_path / "a")
    make_set(tmp_path / "a")  # intact: verifying this one instead would pass
    theirs = make_set(tmp_path / "other")
    theirs.archive.write_bytes(b"changed" + theirs.archive.read_bytes()[7:])
    r = subprocess.run(["sh", loader, "../other/t_1.tar.zst"], cwd=tmp_path / "a", capture_output=True, text=True,
                       env=engine_answering_info(tmp_path))
    assert r.returncode == 1 and "t_1.tar.zst is damaged" in r.stderr
    r = subprocess.run(["sh", loader, "nowhere/t_1.tar.zst"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1 and "nowhere/t_1.tar.zst is missing" in r.stderr


def test_load_sh_stops_its_line_of_work_however_soon_the_step_ends_and_whatever_sigterm_does(tmp_path):
    """load.sh's "still at it" lines come from a background loop it stopped with kill's SIGTERM. A step that ends at
    once (a small archive) sent it before the loop's shell had set its signals up, and dash then lost it; a load.sh
    started where SIGTERM is ignored (inherited: a job runner's, a daemon's) cannot undo that either. The loop went on
    for good after load.sh ended, a line every 30 s into the output (met as this test file's namesake case hanging 300 s
    in a loaded suite: the loop held its pipe open). It is stopped with SIGKILL now. Here SIGTERM is ignored, which
    makes the lost signal certain."""
    import signal

    (tmp_path / "a").mkdir()
    loader = write_loader(tmp_path / "a")
    theirs = make_set(tmp_path / "a")
    theirs.archive.write_bytes(b"changed" + theirs.archive.read_bytes()[7:])  # verified, then refused: the loop ran
    with subprocess.Popen(["sh", loader, theirs.archive.name], cwd=tmp_path / "a", stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env={**engine_answering_info(tmp_path), "LOAD_SH_EVERY": "1"},
                          start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)) as p:
        try:
            out, err = p.communicate(timeout=30)  # the output closes once load.sh and all it started are gone
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise AssertionError("load.sh's line of work went on after load.sh ended, holding its output open") from None
    assert p.returncode == 1 and "t_1.tar.zst is damaged" in err, err


@pytest.mark.parametrize("changes", [
    {"load_sh": {"check_images": "-q=sha256:" + "a" * 64, "require_chains": "", "need_kb": "20"}},
    {"tar_bytes": "lots"},
    {"load_sh": {"check_images": "t:1=sha256:" + "a" * 64, "require_chains": "", "need_kb": "-5"}},
])
def test_load_sh_refuses_a_manifest_it_cannot_trust_before_docker_load(tmp_path, changes):
    loader = write_loader(tmp_path)
    paths = make_set(tmp_path)
    reseal(paths, changes)
    r = subprocess.run(["sh", loader, paths.archive.name], capture_output=True, text=True)
    assert r.returncode == 1 and "refused" in r.stderr and "loading" not in r.stdout


@pytest.mark.parametrize("where", ["check_images", "archive", "archive found"])
def test_load_sh_refuses_a_manifest_holding_an_escape_sequence_before_any_of_it_reaches_the_terminal(tmp_path, where):
    """A crafted set (a .sha256 to match) whose manifest names a tag, or its archive, with a raw escape sequence: JSON
    allows none, so `invoke load` refuses it, but load.sh read it with sed and said the tag as it was ("load.sh: <ESC>]0;
    ...<ESC>[2J t:1 is missing") after docker load had run, retitling and clearing the terminal. Now refused after the
    manifest's sha256, before the engine is asked anything, and nothing of it is shown; `sh load.sh` alone, which takes
    the archive's name from the one manifest beside it, refuses such a name as it reads it ("... is missing here")."""
    import io
    import tarfile

    loader = write_loader(tmp_path)
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.GNU_FORMAT) as t:
        member = tarfile.TarInfo("manifest.json")
        member.size = 2
        t.addfile(member, io.BytesIO(b"[]"))
    paths = make_set(tmp_path, payload=tar.getvalue(), name="t_1.tar")
    escape = "\x1b]0;owned\x07\x1b[2J"
    text = paths.manifest.read_text().replace('"tar_bytes": 10000', f'"tar_bytes": {len(tar.getvalue())}')
    text = text.replace('"t:1=sha256', f'"{escape}t:1=sha256') if where == "check_images" else \
        text.replace('"archive": "t_1.tar"', f'"archive": "{escape}t_1.tar"')
    paths.manifest.write_text(text)
    reseal(paths)
    bin_dir = tmp_path / "bin"  # an engine that holds nothing and loads what it is given
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "$*" >>"{tmp_path}/docker-used"\ncase "$1 $2" in\n'
                                    '"info "* | "image ls") exit 0 ;;\n"load ") cat >/dev/null; exit 0 ;;\nesac\nexit 1\n')
    (bin_dir / "docker").chmod(0o755)
    r = subprocess.run(["sh", loader, *([] if where == "archive found" else [paths.archive.name])], cwd=tmp_path,
                       capture_output=True, text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 1 and "\x1b" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert ("t_1.manifest.json names as its archive a name holding a control character" if where == "archive found" else
            "t_1.manifest.json holds control characters or bytes outside ASCII, which no manifest invoke save writes "
            "holds") in r.stderr and "nothing was loaded" in r.stderr
    assert not (tmp_path / "docker-used").exists()  # refused before the engine was asked anything


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_sha256_file_verifies_or_is_refused_never_a_crash(tmp_path, content):
    paths = make_set(tmp_path)
    paths.sha256.write_bytes(content)
    with pytest.raises(DockyardError, match="[Rr]efused|changed or damaged|disagree|renamed"):
        load_mod.verify(Settings(), paths)


@pytest.mark.parametrize("which", ["archive", "sha256", "manifest"])
def test_a_file_of_the_set_that_is_a_folder_is_one_error_line(tmp_path, which):
    """`invoke load --file=DIR` and `invoke ship --file=DIR` (a folder named like an archive), or a companion that
    is a folder: said so, not an IsADirectoryError."""
    from dockyard.transport import ship

    paths = make_set(tmp_path)
    folder = getattr(paths, which)
    folder.unlink()
    folder.mkdir()
    write_loader(tmp_path)
    for run in (lambda: load_mod.load(Settings(), str(paths.archive)),
                lambda: ship.ship_file(Settings(), str(paths.archive), "node7:/tmp/nowhere")):
        with pytest.raises(DockyardError, match=f"{folder.name} is a folder, not a file of an archive set"):
            run()


def test_the_folder_of_an_archive_given_for_it_names_the_archive(tmp_path):
    """The newcomer audit: `invoke load --file=images/dist` (the folder the save printed), or load.sh beside the
    archive, was "not an image archive: expected a name ending in ..." with no word of the archive sitting there."""
    paths = make_set(tmp_path)
    write_loader(tmp_path)
    for wrong in (tmp_path, tmp_path / "load.sh"):
        with pytest.raises(DockyardError, match=f"not an image archive: .* holds {paths.archive}$"):
            load_mod.load(Settings(), str(wrong))
    for n in range(4):  # a folder of many: three named, and how many more (there were three, and no word of the rest)
        (tmp_path / f"other{n}.tar.zst").write_bytes(b"")
    with pytest.raises(DockyardError, match=r"holds \S+/other0.tar.zst, \S+/other1.tar.zst, \S+/other2.tar.zst and 2 "
                                            r"more$"):
        load_mod.load(Settings(), str(tmp_path))


def test_a_sign_key_that_is_no_key_is_refused_before_the_save(tmp_path, monkeypatch):
    """`--sign=FOLDER` (or a file of anything) was refused by ssh-keygen after the whole save had run; real keys,
    private and public, are taken."""
    from dockyard.transport import save as save_mod

    monkeypatch.setattr(save_mod.inventory, "inspect_images", lambda *a: pytest.fail("the save started"))
    (tmp_path / "notes.txt").write_text("not a key\n")
    for key_file, says in ((tmp_path, "a folder, not a key file"), (tmp_path / "notes.txt", "not an ssh key file"),
                        (tmp_path / "gone", "no such key file")):
        with pytest.raises(DockyardError, match=says):
            save_mod.save(Settings(), image="t:1", sign=str(key_file))
    key = keypair(tmp_path, "release")
    for real in (key, key.with_suffix(".pub")):
        save_mod.check_key_file(real, str(real))


def planted_signature(paths, kind: str) -> None:
    """A .manifest.json.sig that is no signature: a link to /dev/zero (never ends), a pipe no one writes (waits for
    ever), or a plain file of more than any ssh signature holds."""
    if kind == "/dev/zero":
        paths.signature.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(paths.signature)
    else:
        with open(paths.signature, "wb") as f:
            f.truncate(1 << 20)


SIGNATURE_REFUSED = {"/dev/zero": "not a plain file", "fifo": "not a plain file", "1 MiB": "more than 64 KiB"}


def allowed_signers(folder):
    key = keypair(folder, "release")
    allowed = folder / "allowed_signers"
    allowed.write_text(f'release@site namespaces="{load_mod.SIGN_NAMESPACE}" '
                       + " ".join(key.with_suffix(".pub").read_text().split()[:2]) + "\n")
    return allowed


@pytest.mark.parametrize("kind", list(SIGNATURE_REFUSED))
def test_a_signature_that_is_a_device_a_pipe_or_huge_is_one_error_line_in_invoke_load(tmp_path, kind):
    """`invoke load` with allowed_signers handed the .sig beside the archive to ssh-keygen as it was: a link to
    /dev/zero or a pipe waited for ever. Now it is read bounded (a plain file of at most 64 KiB), and ssh-keygen
    reads a private copy."""
    from dockyard import ROOT
    from tests.support.cli import INVOKE, short_error

    (tmp_path / "set").mkdir()
    paths = make_set(tmp_path / "set")
    planted_signature(paths, kind)
    env = {**os.environ, "INVOKE_DOCKYARD_ALLOWED_SIGNERS": str(allowed_signers(tmp_path)),
           "INVOKE_DOCKYARD_DOCKER": "/bin/false"}
    r = bounded_run([*INVOKE, "load", f"--file={paths.archive}"], timeout=30, cwd=ROOT, env=env)
    short_error(r, SIGNATURE_REFUSED[kind])
    assert "t_1.manifest.json.sig" in r.stderr and "refused, nothing was loaded" in r.stderr


@pytest.mark.parametrize("kind", list(SIGNATURE_REFUSED))
def test_load_sh_refuses_a_signature_that_is_a_device_a_pipe_or_huge_and_copies_none_of_it(tmp_path, kind):
    """load.sh with ALLOWED_SIGNERS copied the .sig into TMPDIR with `cp`: a link to /dev/zero filled the disk, a
    pipe waited for ever. Now it must be a plain file, of at most 64 KiB."""
    write_loader(tmp_path)
    paths = make_set(tmp_path)
    planted_signature(paths, kind)
    private = tmp_path / "tmp"
    private.mkdir()
    env = {**engine_answering_info(tmp_path), "ALLOWED_SIGNERS": str(allowed_signers(tmp_path)), "TMPDIR": str(private)}
    r = bounded_run(["sh", "load.sh", paths.archive.name], timeout=30, cwd=tmp_path, env=env)
    said = {"/dev/zero": "t_1.manifest.json.sig is not a plain file", "fifo": "t_1.manifest.json.sig is not a plain file",
            "1 MiB": "t_1.manifest.json.sig is more than 64 KiB"}[kind]
    assert r.returncode == 1 and said in r.stderr and "nothing was loaded" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "loading" not in r.stdout
    assert not list(private.iterdir()) and not (tmp_path / "docker-used").exists()


def many_names(paths, images: int, tags: int) -> None:
    """The set's manifest rewritten (and resealed) to give `images` images `tags` tags each, in the Python
    loaders' fields and in load.sh's."""
    ids = ["sha256:" + f"{i:064x}" for i in range(images)]
    named = [(f"t:{i}-{j}", image_id) for i, image_id in enumerate(ids) for j in range(tags)]
    reseal(paths, {"images": [{"ref": f"t:{i}-0", "tags": [f"t:{i}-{j}" for j in range(tags)], "id": image_id,
                               "diff_ids": []} for i, image_id in enumerate(ids)],
                   "load_sh": {"check_images": " ".join(f"{ref}={image_id}" for ref, image_id in named),
                               "check_layers": " ".join(f"{ref}=" for ref, _ in named),
                               "require_chains": "", "need_kb": "20"}})


@pytest.mark.parametrize("images,tags,says", [
    (1, 300, "takes at most 64 entries): refused, nothing was loaded"),  # images.0.tags ['t:0-0', ...]
    (3, 60, "its images have 180 names (tags, or the id of an untagged image), more than any save gives them"),
])
def test_a_manifest_naming_hundreds_of_images_is_refused_before_the_engine_is_asked(tmp_path, images, tags, says):
    """300 tags of one image were 300 `docker image inspect` calls (40 s) before `invoke load` said anything; the
    16 MiB a manifest may hold could name enough for hours. load.sh asked the engine about each as well."""
    from tests.support.cli import invoke_here, short_error

    paths = make_set(tmp_path)
    many_names(paths, images, tags)
    asked = tmp_path / "docker-used"
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\necho "$*" >>"{asked}"\nexit 1\n')
    docker.chmod(0o755)
    short_error(invoke_here("load", f"--file={paths.archive}", env={"INVOKE_DOCKYARD_DOCKER": str(docker)}), says)
    assert not asked.exists()

    write_loader(tmp_path)
    r = subprocess.run(["sh", "load.sh", paths.archive.name], cwd=tmp_path, capture_output=True, text=True,
                       env=engine_answering_info(tmp_path), timeout=60)
    assert r.returncode == 1 and r.stderr == (
        "load.sh: t_1.manifest.json names more than 128 images (tags, or ids of untagged images), more than any save "
        "gives them, each to be looked up in the engine: refused, nothing was loaded\n")
    assert not asked.exists() and "loading" not in r.stdout


@pytest.mark.parametrize("which,says", [
    ("manifest", "t_1.manifest.json is more than 16 MiB, more than any archive manifest holds"),
    ("sha256", "t_1.sha256 is more than 64 KiB, more than any checksum file of a set holds"),
    ("requires", "t_1.manifest.json requires more than 8192 base layers"),
])
def test_load_sh_reads_a_manifest_and_sha256_bounded_and_caps_the_base_layers(tmp_path, which, says):
    """load.sh copied the manifest and the .sha256 whole into TMPDIR and looped over every base layer its manifest
    listed (a grep each): a file of gigabytes was copied and read by sed for every field."""
    write_loader(tmp_path)
    paths = make_set(tmp_path)
    if which == "requires":
        reseal(paths, {"load_sh": {**json.loads(paths.manifest.read_text())["load_sh"],
                                   "require_chains": " ".join(["sha256:" + "c" * 64] * 8193)}})
    else:
        with open(getattr(paths, which), "ab") as f:  # sparse: no disk
            f.truncate(17 << 20)
    private = tmp_path / "tmp"
    private.mkdir()
    r = bounded_run(["sh", "load.sh", paths.archive.name], timeout=60, cwd=tmp_path,
                    env={**engine_answering_info(tmp_path), "TMPDIR": str(private)})
    assert r.returncode == 1 and r.stderr.startswith(f"load.sh: {says}") and len(r.stderr.splitlines()) == 1, r.stderr
    assert "refused, nothing was loaded" in r.stderr and not list(private.iterdir())
    assert not (tmp_path / "docker-used").exists()


def test_load_sh_has_the_limits_of_invoke_load():
    from dockyard.transport.layout import LOADER_TEMPLATE, MANIFEST_LIMIT, SIGNATURE_LIMIT, SUMS_LIMIT

    script = LOADER_TEMPLATE.read_text()
    assert f"\nMAX_NAMES={load_mod.MAX_NAMES}\n" in script and f"\nMAX_CHAINS={load_mod.MAX_CHAINS}\n" in script
    assert f"-le {MANIFEST_LIMIT} ]" in script and f"-le {SUMS_LIMIT} ]" in script
    assert f"-le {SIGNATURE_LIMIT} ]" in script


@pytest.mark.timeout(30)
def test_an_archive_swapped_for_a_pipe_after_its_checks_is_refused_as_it_is_opened(tmp_path):
    """The set's checks look at the archive by its path (its size against the manifest's); it is read later, by
    `invoke load --verify` and as it is loaded. A pipe put in its place in between (someone who can write the
    set's folder) made that read wait for ever on the pipe. The file is now checked as it is opened."""
    paths = make_set(tmp_path)
    manifest = load_mod.check_set(Settings(), paths)
    paths.archive.unlink()
    os.mkfifo(paths.archive)  # no writer: an open() without O_NONBLOCK, then a read, would never return
    not_plain = f"{paths.archive}: not a plain file (a pipe, device or socket); give the archive itself"
    with pytest.raises(DockyardError, match="not a plain file") as said:
        load_mod.sha256_file(paths.archive, "verify")
    assert str(said.value) == not_plain
    with pytest.raises(DockyardError, match="not a plain file") as said:
        load_mod.load_verified(paths, manifest, None, ["/bin/false"], set())
    assert str(said.value) == not_plain
