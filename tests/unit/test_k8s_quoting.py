"""`invoke k8s` with hostile values: the image, the output folder (named in the files' header comments) and the
trainer overrides. The written files must parse back to exactly the manifests meant (a header comment that a
value broke out of would add keys or documents), the image must be the scalar given, and each pod's command, run
under bash with a recording torchrun (tests/support/hostile.py), must hand the trainer the overrides word for word
and run no attack."""

from __future__ import annotations

import subprocess

import yaml
from hypothesis import HealthCheck, Phase, event, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.launch import k8s
from tests.support.hostile import environment, hostile_text, hostile_value, path_name, recorder, records, unsafe

ATTACK = 'it\'s a "test" `touch "$MARK"` $(touch "$MARK") ${HOME} \\ * #x\n- evil: 1'
EXAMPLES = hsettings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                     phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])


def _not_a_reference(image: str) -> bool:
    """Not an image name a registry takes (engine.image_name): refused before any file is written."""
    try:
        engine.image_name(image)
    except DockyardError:
        return True
    return False


# Image references engine.image_name takes, built by the grammar it checks (dockyard.settings.IMAGE_NAME):
# [host[:port]/]path[/path...][:tag][@digest]. Words YAML reads as something other than a string (1:20 is a
# base-60 int, 2001-12-14 a date, true, null, 0x1f, 1_000...) are valid names too: the manifest must quote them.
_YAML_WORDS = ["true", "no", "on", "off", "y", "null", "1", "12", "20", "0x1f", "0o17", "1_000", "1.5", "2001-12-14",
               "nan", "inf", "e1"]
_alnum = st.text("abcxyz0123456789", min_size=1, max_size=6)
_component = st.one_of(
    st.lists(_alnum, min_size=1, max_size=3).flatmap(
        lambda ws: st.lists(st.sampled_from([".", "_", "__", "-", "--"]), min_size=len(ws) - 1, max_size=len(ws) - 1)
        .map(lambda seps: ws[0] + "".join(sep + w for sep, w in zip(seps, ws[1:], strict=True)))),
    st.sampled_from(_YAML_WORDS))
_label = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9-]{0,8}[A-Za-z0-9])?", fullmatch=True)
_host = st.tuples(st.lists(_label, min_size=1, max_size=3).map(".".join),
                  st.one_of(st.just(""), st.integers(0, 65535).map(lambda p: f":{p}"))).map("".join)
_tag = st.one_of(st.sampled_from(["latest", "0.1.0-cu132", "1", "20", "true", "e1"]),
                 st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True))
_digest = st.text("0123456789abcdef", min_size=32, max_size=64).map(lambda h: f"@sha256:{h}")
image_reference = st.tuples(
    st.one_of(st.just(""), _host.map(lambda h: h + "/")),
    st.lists(_component, min_size=1, max_size=3).map("/".join),
    st.one_of(st.just(""), _tag.map(lambda t: ":" + t)),
    st.one_of(st.just(""), st.just(""), st.just(""), _digest)).map("".join)
# Mostly references the kubelet takes, so that the hostile output folders and overrides get through to the
# files and the pods' commands; one in eight a hostile one, alone or after a valid name, that --image refuses.
# (one_of weighs strategies that are the same as one: the share is drawn here, shrinking towards a valid name)
image_given = st.integers(0, 15).flatmap(
    lambda i: image_reference if i < 14 else hostile_text if i == 14 else
    st.tuples(image_reference, hostile_text).map("".join))


@EXAMPLES
@example(image="reg.example/x:'$(touch\"$MARK\")`#", out="o u't # x\u2028y: 1", override=ATTACK)
@example(image="reg.example/x:1", out="o u't # x", override=ATTACK)
@example(image="1:20", out="o u't # x", override=ATTACK)  # YAML 1.1 reads a plain 1:20 as the int 80
@given(image=image_given, out=path_name, override=hostile_value)
def test_values_stay_one_scalar_and_one_word_and_nothing_runs(settings, tmp_path_factory, image, out, override):
    base = tmp_path_factory.mktemp("k8s")
    kw = {"recipe": "zero2", "nodes": 2, "gpus_per_node": 0, "run_id": "exp1", "image": image,
          "overrides": ["--run_name", override]}
    try:
        paths = k8s.write(settings, out=str(base / out), **kw)
    except DockyardError as e:
        event("refused at " + next(w for w in ("--image", "--out", "trainer overrides", "?") if w in str(e)))
        assert (("--image" in str(e) and _not_a_reference(image)) or ("--out" in str(e) and unsafe(out))
                or ("trainer overrides" in str(e) and "\0" in override)), e
        return
    event("written: the manifests and pods' commands checked")
    assert not _not_a_reference(image) and not unsafe(out) and "\0" not in override
    s = k8s.spec(settings, **kw)
    service, job = k8s.job_manifests(s)
    trainjob = k8s.trainjob_manifest(s)
    assert list(yaml.safe_load_all(paths["job"].read_text())) == [service, job]
    assert list(yaml.safe_load_all(paths["trainjob"].read_text())) == [trainjob]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == trainjob["spec"]["trainer"]["image"] == image
    bin_, log = base / "bin", base / "argv"
    recorder(bin_, "torchrun")
    want = ["-m", "dockyard.train", "--recipe", "zero2", "--run-dir", "/workspace/runs/exp1", "--", "--run_name", override]
    pods = [([*container["command"], *container["args"]], {"JOB_COMPLETION_INDEX": "1", "POD_IP": "10.1.0.6"}),
            (trainjob["spec"]["trainer"]["command"], {"PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2",
                                                      "PET_MASTER_ADDR": "node-0", "PET_MASTER_PORT": "29500",
                                                      "POD_IP": "10.1.0.6"})]
    for command, env in pods:
        p = subprocess.run(command, env=environment(bin_, log, base / "pwned", **env), capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 0, p.stderr
    assert not (base / "pwned").exists(), "a value ran as a command"
    got = records(log)
    assert len(got) == 2 and all(r["argv"][r["argv"].index("-m"):] == want for r in got)
    assert all("--local-addr=10.1.0.6" in r["argv"] and "--rdzv-id=exp1" in r["argv"] for r in got)
