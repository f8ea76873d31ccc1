"""`invoke k8s` with hostile values: the image, the output folder (named in the files' header comments) and the
trainer overrides. The written files must parse back to exactly the manifests meant (a header comment that a
value broke out of would add keys or documents), the image must be the scalar given, and each pod's command, run
under bash with a recording torchrun (tests/support/hostile.py), must hand the trainer the overrides word for word
and run no attack."""

from __future__ import annotations

import subprocess

import yaml
from hypothesis import HealthCheck, Phase, example, given
from hypothesis import settings as hsettings

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


@EXAMPLES
@example(image="reg.example/x:'$(touch\"$MARK\")`#", out="o u't # x\u2028y: 1", override=ATTACK)
@example(image="reg.example/x:1", out="o u't # x", override=ATTACK)
@given(image=hostile_text, out=path_name, override=hostile_value)
def test_values_stay_one_scalar_and_one_word_and_nothing_runs(settings, tmp_path_factory, image, out, override):
    base = tmp_path_factory.mktemp("k8s")
    kw = {"recipe": "zero2", "nodes": 2, "gpus_per_node": 0, "run_id": "exp1", "image": image,
          "overrides": ["--run_name", override]}
    try:
        paths = k8s.write(settings, out=str(base / out), **kw)
    except DockyardError as e:
        assert (("--image" in str(e) and _not_a_reference(image)) or ("--out" in str(e) and unsafe(out))
                or ("trainer overrides" in str(e) and "\0" in override)), e
        return
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
