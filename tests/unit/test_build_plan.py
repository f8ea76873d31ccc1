"""Build plans: the exact docker build / pip download / uv commands, built without running anything."""

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from dockyard import engine
from dockyard.common.errors import DockyardError
from dockyard.images import build, variants
from dockyard.settings import ROOT
from tests.support.ports import held_port
from tests.support.stub_index import loopback_only_env, serve_index, sha256, stub_wheel


def _args(argv, flag):
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == flag)


@pytest.fixture
def cu132(settings):
    return variants.resolve(settings, "cu132")[0]


def test_cuda_build_steps(settings, cu132):
    (argv, env), = build.build_steps(settings, cu132, revision="deadbeef", created="t").steps
    assert env == {"DOCKER_BUILDKIT": "1"}
    assert argv[argv.index("-t") + 1] == "dockyard:0.1.0-cu132"
    args = _args(argv, "--build-arg")
    assert args["BASE_IMAGE"] == settings.base_image_cpu, "the CUDA image builds FROM the registry-free base"
    assert args["CUDA_TOOLKIT"] == "wheels" and args["EXPECT_CUDA"] == cu132.cuda
    assert "7.5" in args["TORCH_CUDA_ARCH_LIST"].split(";"), "T4 (sm_75) is served"
    assert set(args["DOCKYARD_DS_OPS"].split()) >= {"CPU_ADAM", "FUSED_ADAM", "AIO"}
    assert args["TORCH_CUDA_ARCH_LIST"] and args["DS_ACCELERATOR"] == "cuda"
    assert args["EXPECT_TORCH"] == cu132.pins["torch"] and args["EXPECT_TRITON"] == cu132.pins["triton"]
    labels = _args(argv, "--label")
    assert labels["org.opencontainers.image.revision"] == "deadbeef" and labels["dockyard.variant"] == "cu132"
    assert args["DOCKYARD_VARIANT"] == "cu132"  # the image's environment: every container says its variant
    assert "--no-cache" not in argv and argv[-1] == str(ROOT)


def test_cpu_build_uses_the_debootstrap_base_and_cpu_ops(settings):
    cpu = variants.resolve(settings, "cpu")[0]
    (argv, _), = build.build_steps(settings, cpu, no_cache=True).steps
    args = _args(argv, "--build-arg")
    assert args["BASE_IMAGE"] == settings.base_image_cpu and args["CUDA_TOOLKIT"] == "none"
    assert "CPU_ADAM" in args["DOCKYARD_DS_OPS"] and args["DS_ACCELERATOR"] == "cpu"
    assert "--no-cache" in argv


def test_cu128_builds_from_the_debian_base_without_nvcc_and_checks_what_it_holds(settings):
    cu128 = variants.resolve(settings, "cu128")[0]
    (argv, _), = build.build_steps(settings, cu128).steps
    args, labels = _args(argv, "--build-arg"), _args(argv, "--label")
    assert args["BASE_IMAGE"] == settings.base_image_cpu and args["CUDA_TOOLKIT"] == "none"
    assert args["CHECK_NVCC"] == "" and args["DS_ACCELERATOR"] == "cuda" and args["BNB_CUDA"] == "128"
    assert args["DOCKYARD_DS_OPS"].split() == ["CPU_ADAM", "AIO"] and args["EXPECT_CUDA_ARCHS"] == cu128.torch_archs
    assert labels["dockyard.ds_ops"] == "cpu_adam,async_io" and labels["dockyard.nvcc"] == ""
    assert labels["dockyard.cuda_archs"] == cu128.torch_archs and labels["dockyard.base"] == settings.base_image_cpu


def test_build_devel_dry_prints_the_registry_base_build(settings, capsys):
    build.build(settings, "cu128", devel=True, dry=True)
    out = capsys.readouterr().out
    assert "FROM its devel base nvidia/cuda:12.8" in out
    assert "BASE_IMAGE=nvidia/cuda:12.8" in out and "CHECK_NVCC=--nvcc" in out and "CUDA_TOOLKIT=none" in out
    assert "'DOCKYARD_DS_OPS=CPU_ADAM FUSED_ADAM AIO'" in out and "dockyard.nvcc=base" in out


def test_a_variant_naming_a_registry_base_builds_from_it_with_that_toolkit(settings, cu132):
    ngc = cu132.model_copy(update={"base": "nvcr.io/nvidia/cuda:13.2.0-cudnn-devel-ubuntu24.04"})
    (argv, _), = build.build_steps(settings, ngc).steps
    args = _args(argv, "--build-arg")
    assert args["BASE_IMAGE"] == ngc.base and args["CUDA_TOOLKIT"] == "none"
    assert args["ALLOW_DUPLICATE_CUDA_LIBS"], "the base's CUDA libraries duplicate torch's: warned, not refused"
    assert args["CHECK_NVCC"] == "--nvcc", "the base's nvcc must match torch's CUDA"


def test_every_cuda_lock_holds_a_toolkit_at_torchs_cuda_release(settings):
    """nvcc, nvvm and crt of torch's CUDA release (a newer nvvm breaks ptxas), and a runtime of the variant's CUDA."""
    for v in variants.all_variants(settings).values():
        if v.toolkit != "wheels":  # cpu, a registry base (brings its own), cu128 (no nvcc on PyPI for CUDA 12)
            continue
        build.check_lock(v)
        pins = build.lock_pins(v)
        nvcc = pins.get("nvidia-cuda-nvcc") or pins.get("nvidia-cuda-nvcc-cu12")
        assert nvcc and nvcc.startswith(v.cuda + "."), f"{v.name}: nvcc {nvcc} for CUDA {v.cuda}"
        if "nvidia-nvvm" in pins:
            assert pins["nvidia-nvvm"] == pins["nvidia-cuda-crt"] == nvcc


def test_a_lock_whose_cuda_runtime_disagrees_with_the_variant_is_refused(settings, cu132):
    wrong = cu132.model_copy(update={"cuda": "13.0"})
    with pytest.raises(Exception, match=r"CUDA runtime torch pulls is 13\.2\.\d+ \(the variant says cuda 13\.0\)"):
        build.check_lock(wrong)


def test_wheelhouse_plan_is_hash_checked_for_the_image_platform(settings, cu132):
    (argv, _), = build.wheelhouse_steps(settings, cu132).steps
    assert "--require-hashes" in argv and "--no-deps" in argv
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert "manylinux_2_28_x86_64" in argv and str(cu132.lock_file) in argv


def test_index_and_ca_settings_reach_pip_but_not_the_image(settings, cu132):
    s = settings.model_copy(update={"index_url": "https://pypi.corp/simple", "ca_bundle": "/etc/corp-ca.pem"})
    (argv, env), = build.wheelhouse_steps(s, cu132).steps
    assert env["PIP_INDEX_URL"] == "https://pypi.corp/simple" and env["PIP_CERT"] == "/etc/corp-ca.pem"
    (bargv, _), = build.build_steps(s, cu132).steps
    assert "corp" not in " ".join(bargv)  # never a build arg: args are recorded in the image history
    spaced = build.wheelhouse_steps(settings.model_copy(update={"ca_bundle": "/etc/my ca.pem"}), cu132)
    assert spaced.show().startswith("PIP_CERT='/etc/my ca.pem' ")  # --dry prints a command that can be pasted


def test_a_token_in_an_index_url_is_never_printed_nor_on_a_command_line(settings, cu132, capsys):
    """index_url: https://alice:TOKEN@pypi.corp/simple was printed whole by `invoke lock --dry`, `invoke wheelhouse
    --dry`, the echo of every real run and an error quoting the command, and stood in pip's and uv's command lines
    (ps shows them to every user). Now pip and uv get it in their environment and what is printed says ***."""
    import subprocess

    from dockyard import engine
    from dockyard.common.errors import DockyardError

    token = "s3cr@t-tok"  # an @ in a password: pip and uv split the user part at the last one
    s = settings.model_copy(update={"index_url": f"https://alice:{token}@pypi.corp/simple",
                                    "extra_index_url": f"https://{token}@extra.corp/simple"})
    for plan, tool in ((build.wheelhouse_steps(s, cu132), "PIP_"), (build.lock_steps(s, cu132, cu132.lock_file), "UV_")):
        (argv, env), = plan.steps
        assert env[tool + "INDEX_URL"] == s.index_url and env[tool + "EXTRA_INDEX_URL"] == s.extra_index_url
        assert token not in " ".join(argv)
        assert token not in plan.show() and "https://***@pypi.corp/simple" in plan.show()
    engine.echo(argv, env)
    with pytest.raises(DockyardError) as failed:
        engine.run(["sh", "-c", "exit 3", s.index_url], env=env, quiet=True, capture=True)
    assert token not in capsys.readouterr().err and token not in str(failed.value) and "exit 3" in str(failed.value)
    # what runs still gets the whole URL
    got = subprocess.run(["sh", "-c", 'printf %s "$UV_INDEX_URL"'], env=env, capture_output=True, text=True).stdout
    assert got == s.index_url


@pytest.mark.parametrize("key", ["index_url", "extra_index_url", "find_links"])
def test_an_index_setting_that_is_no_url_nor_folder_is_refused_without_its_value(settings, cu132, tmp_path, key):
    """index_url: alice:TOKEN@pypi.corp/simple (the scheme left out) reached uv, which took it for a folder and said
    "torch was not found in the package registry", naming neither the setting nor the URL. Refused before pip or uv
    runs, the value unsaid (it may hold a token); a URL, or a folder that exists, is taken as before."""
    from dockyard.common.errors import DockyardError

    bad = settings.model_copy(update={key: "https://ok.corp/simple alice:s3cret@pypi.corp/simple"})
    for steps in (lambda s: build.lock_steps(s, cu132, cu132.lock_file), lambda s: build.wheelhouse_steps(s, cu132)):
        with pytest.raises(DockyardError, match=rf"^the {key} setting \(INVOKE_DOCKYARD_{key.upper()}\) is neither a "
                                                r"URL nor a folder on this host: give the index's URL with its scheme"
                           ) as e:
            steps(bad)
        assert "s3cret" not in str(e.value)
        for good in ("https://pypi.corp/simple", f"file://{tmp_path}", str(tmp_path)):
            (_, env), = steps(settings.model_copy(update={key: good})).steps
            assert good in env.values()


def test_dockerfile_stays_offline_and_layers_code_last():
    text = (ROOT / "images" / "Dockerfile").read_text()
    assert not re.search(r"^#\s*syntax=", text, re.M), "a syntax line makes BuildKit pull a frontend (fails offline)"
    assert "libaio-dev" in text and "--no-index" in text and "DS_BUILD_EVOFORMER_ATTN=0" in text
    # DeepSpeed's ops build against the image's torch, never one pip fetches into an isolated build (no GPU, offline)
    assert re.search(r"pip wheel [^\n]*--no-build-isolation", text)
    # an NGC base's PIP_CONSTRAINT (its own torch) made pip refuse the lock: the base stage empties it for every step
    base_env = re.search(r"^FROM \$\{BASE_IMAGE\} AS base\n(?:.*\n)*?ENV ((?:.*\\\n)*.*)", text, re.M).group(1)
    assert re.search(r"(^|\s)PIP_CONSTRAINT=(\s|$)", base_env)
    copies = [ln.split()[1] for ln in text.splitlines()
              if ln.startswith("COPY ") and "--from" not in ln and "wheel" not in ln and "locks" not in ln]
    assert copies[-1] == "recipes/", "recipes must be the top layer so a recipe change rebuilds only that"
    last_run = max(i for i, ln in enumerate(text.splitlines()) if ln.startswith("RUN "))
    first_copy = min(i for i, ln in enumerate(text.splitlines()) if ln.startswith("COPY dockyard/"))
    assert last_run < first_copy, "no heavy RUN step may come after the project's code"


def test_build_step_tracker_names_the_failing_step():
    t = build._StepTracker()
    for line in ["#5 [base 2/2] RUN apt-get update", "#5 12.1 Reading...", "#10 [deepspeed-build 1/1] RUN pip wheel x",
                 "#10 4.3 error: metadata-generation-failed"]:
        t(line)
    assert t.last.startswith("[deepspeed-build 1/1] RUN pip wheel")


def test_a_silent_build_step_is_said_to_be_alive_with_where_it_is(capsys):
    """pip compiling DeepSpeed's ops prints nothing for 10-20 minutes of a cold CUDA build: the user saw the step's
    line and then nothing. A real command streamed as `invoke build` streams docker build's output, silent for a while
    in one step: the heartbeat names that step (with the hint for DeepSpeed's) while it is silent, and only then."""
    script = ("echo '#5 [base 2/2] RUN apt-get update'; echo '#5 DONE 0.1s'; "
              "echo '#10 [deepspeed-build 1/1] RUN pip wheel deepspeed'; sleep 1.4; echo '#10 DONE 1.4s'")
    beats = _heartbeats(capsys, script, every=0.4)
    silent = [b for b in beats if b.startswith("build: still at [deepspeed-build 1/1] RUN pip wheel deepspeed, ")]
    assert silent, f"no word during the silent step: {beats}"
    assert "DeepSpeed's ops compile: 10-20 minutes cold" in silent[0] and len(silent) <= 4
    assert not [b for b in beats if "[base 2/2]" in b], "a step that printed as it went was said to be silent"


def test_a_step_printed_again_as_it_resumes_keeps_its_time(capsys):
    """BuildKit prints a long step's line again after another step printed (a cached stage beside it): cu132's
    DeepSpeed step, 25 minutes in, was then said to be "74 s in this step"."""
    script = ("echo '#9 [deepspeed-build 1/1] RUN pip wheel deepspeed'; sleep 1; echo '#16 [base 1/3] FROM debian'; "
              "echo '#16 CACHED'; echo '#9 [deepspeed-build 1/1] RUN pip wheel deepspeed'; sleep 2.6; echo '#9 DONE'")
    beats = [b for b in _heartbeats(capsys, script, every=0.8) if b.startswith("build: still at [deepspeed-build")]
    assert beats, "no word during the silent step"
    seconds = [float(re.search(r", ([\d.]+) s in this step", b).group(1)) for b in beats]
    assert max(seconds) >= 2.5, beats  # counted from the step's first line, not from its line printed again


def test_the_first_word_of_a_silence_comes_at_half_the_interval(capsys, monkeypatch):
    """The build's first 'still at' came after a full minute of silence: a user who saw a step's line and then
    nothing for 40 s wondered whether it hung. The first word now comes at half the interval (30 s of 60), the
    next ones a whole interval apart.
    The heartbeat's clock is the test's: with a real one (a step silent 1.6 s, the word due at 1 s), a loaded host
    that woke the heartbeat's thread half a second late failed it. Each time set is read by the thread's own check
    before anything is asserted of it."""
    import threading

    now, checks = [1000.0], [0]

    def clock() -> float:
        if threading.current_thread().name == "dockyard-build-heartbeat":
            checks[0] += 1
        return now[0]

    def at(seconds: float) -> list[str]:
        """The words said once the heartbeat checked the silence with `seconds` past the step's line."""
        now[0], seen = 1000.0 + seconds, checks[0]
        deadline = time.monotonic() + 60  # the real clock: a heartbeat that stopped checking fails, not hangs
        while checks[0] < seen + 2:  # one check may have read the time before it was set
            assert time.monotonic() < deadline, "the heartbeat stopped checking"
            time.sleep(0.01)
        said.extend(ln.split(",")[0] for ln in capsys.readouterr().out.splitlines() if ln.startswith("build: still at"))
        return said

    said: list[str] = []
    word = "build: still at [runtime 3/5] RUN pip install --no-index /wheels/*.whl"
    t = build._StepTracker()
    monkeypatch.setattr(build.time, "monotonic", clock)
    with t.heartbeat(every=2.0):
        t("#7 [runtime 3/5] RUN pip install --no-index /wheels/*.whl")
        assert at(0.99) == [], "a word before half the interval"
        assert at(1.0) == [word], "no word at half the interval"
        assert at(2.99) == [word], "the next word sooner than a whole interval after the first"
        assert at(3.0) == [word, word]
        t("#7 DONE 3.0s")
        assert at(3.99) == [word, word], "a word in a new silence shorter than half the interval"


def test_the_builds_last_line_says_how_long_it_took(settings, tmp_path, monkeypatch, capsys):
    """`invoke build` ended "built dockyard:0.1.0-cpu (2.03 GB, id ...)": nothing said whether it took seconds (code
    layers) or 40 minutes (a cold CUDA build), for the user who came back to it or read it in a CI log. The engine is
    a stand-in: docker build is a command that takes a second; nothing reaches the real engine."""
    real = engine.run
    built = {"Id": "sha256:" + "ab" * 32, "Size": 2.03e9}
    images = {}  # the tag's image before the build, then after

    def stand_in(argv, **kw):
        if argv[0] == "git":
            return real(argv, **kw)
        if argv[1:2] != ["build"] and "build" not in argv:
            pytest.fail(f"ran {argv}")
        kw["on_line"]("#7 [runtime 3/5] RUN pip install --no-index /wheels/*.whl")
        time.sleep(1.2)
        images["dockyard:0.1.0-cpu"] = built
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(engine, "run", stand_in)
    monkeypatch.setattr(engine, "engine_info", lambda s: {"ServerVersion": "29.0.1", "Driver": "overlay2"})
    monkeypatch.setattr(engine, "image_inspect", lambda s, ref: images.get(ref, {"Id": "the base"} if "base" in ref else None))
    monkeypatch.setattr(build, "wheelhouse_complete", lambda s, v: True)
    monkeypatch.setattr(build, "copy_context", lambda dst, variant, wheels=None: dst.mkdir(parents=True))
    s = settings.model_copy(update={"wheelhouse_dir": tmp_path / "wh"})
    assert build.build(s, "cpu") == "dockyard:0.1.0-cpu"
    last = capsys.readouterr().out.splitlines()[-1]
    took = re.fullmatch(r"built dockyard:0\.1\.0-cpu in (\d+) s \(2\.03 GB, id abababababab\)", last)
    assert took and 1 <= int(took.group(1)) <= 30, last
    build.build(s, "cpu")  # again: the image the engine holds is the one built before
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"dockyard:0\.1\.0-cpu is up to date: .*; checked in \d+ s", last), last


def _heartbeats(capsys, script: str, every: float) -> list[str]:
    """What `invoke build`'s heartbeat said while a real command streamed as docker build's output streams."""
    t = build._StepTracker()
    with t.heartbeat(every=every):
        engine.run(["sh", "-c", script], on_line=t, quiet=True)
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("build: still at")]


def test_a_failed_build_says_buildkits_reason_first():
    """The cpu build failed after 41 minutes with "error: build failed at step [runtime 1/5] RUN --mount=..." and the
    reason (here: the engine had lost its docker0 bridge) only at the end of a quoted line of 900 characters that
    repeats the whole RUN command; a newer BuildKit's 'did not complete successfully: exit code: 1' likewise."""
    command = "pip install --no-index --no-deps /dist/*.whl " + "--x " * 200
    t = build._StepTracker()
    for line in [f"#10 [runtime 1/5] RUN {command}", "#10 sha256:e850d24d",
                 f"#10 ERROR: executor failed running [/bin/sh -c {command}]: failed to create endpoint w on network "
                 "bridge: adding interface veth0 to bridge docker0 failed: could not find bridge docker0: route ip+net: "
                 "no such network interface"]:
        t(line)
    said = t.failure()
    assert said.startswith("build failed at step [runtime 1/5] RUN pip install") and len(said) < 500
    assert said.endswith(": failed to create endpoint w on network bridge: adding interface veth0 to bridge docker0 "
                         "failed: could not find bridge docker0: route ip+net: no such network interface")
    newer = build._StepTracker()
    for line in ["#9 [base 2/3] RUN apt-get update", '#9 ERROR: process "/bin/sh -c apt-get update" did not complete '
                 "successfully: exit code: 100"]:
        newer(line)
    assert newer.failure() == "build failed at step [base 2/3] RUN apt-get update: exit code: 100"
    assert build._StepTracker().failure() == "build failed at step (before the first step)"


def test_lock_resolution_for_a_cuda_variant_pins_the_triton_torch_wants(settings, cu132, tmp_path):
    """Real resolution (the lock step's own `uv pip compile`, no GPU needed) against an index this test serves on
    127.0.0.1, given as a user gives theirs (index_url): the lock holds torch's own triton and the CUDA torch's nccl.

    The index holds a stub wheel of every package the variant's requirements name, at its pin, and the packages the
    CUDA torch pulls; the stub torch requires what PyPI's CUDA build of torch does (its triton on Linux, NCCL and the
    CUDA libraries on Linux x86_64, in a cp311 manylinux_2_28 wheel). Nothing may leave loopback: proxies name a
    closed loopback port, so a lock step that lost the index fails here instead of asking pypi.org."""
    real = build.lock_pins(cu132)  # the committed lock: the versions PyPI's CUDA torch pulled
    nccl = next(k for k in real if k.startswith("nvidia-nccl"))
    linux, x86 = 'platform_system == "Linux"', 'platform_system == "Linux" and platform_machine == "x86_64"'
    files = tmp_path / "files"
    wheels = {}
    wheels["torch"] = stub_wheel(files, "torch", cu132.pins["torch"], tag="cp311-cp311-manylinux_2_28_x86_64",
                                 requires=[f"triton=={cu132.pins['triton']}; {linux}", f"{nccl}=={real[nccl]}; {x86}"])
    wheels["triton"] = stub_wheel(files, "triton", cu132.pins["triton"],
                                  tag="cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64")
    wheels[nccl] = stub_wheel(files, nccl, real[nccl], tag="py3-none-manylinux_2_18_x86_64")
    runtime = real["nvidia-cuda-runtime"]  # nvcc's, as on PyPI: the CUDA runtime the lock's check reads
    wheels["nvidia-cuda-nvcc"] = stub_wheel(files, "nvidia-cuda-nvcc", cu132.pins["nvidia-cuda-nvcc"],
                                            requires=[f"nvidia-cuda-runtime=={runtime}; {x86}"])
    wheels["nvidia-cuda-runtime"] = stub_wheel(files, "nvidia-cuda-runtime", runtime)
    for line in cu132.requirements_in.splitlines():  # the rest, each at its pin (build tools: the committed lock's)
        name, _, version = line.partition("==")
        if name not in wheels:
            wheels[name] = stub_wheel(files, name, version or real.get(name, "1.0"))
    in_file = tmp_path / "cu132.in"
    in_file.write_text(cu132.requirements_in)
    with serve_index(tmp_path, list(wheels.values())) as index, loopback_only_env() as offline:
        mine = settings.model_copy(update={"index_url": index.url, "extra_index_url": "", "find_links": ""})
        (argv, env), = build.lock_steps(mine, cu132, in_file, tmp_path / "lock.txt").steps
        # uv's own: no Python downloads, this interpreter, a cache and configuration of nobody's
        hermetic = {"UV_PYTHON_DOWNLOADS": "never", "UV_PYTHON": sys.executable, "UV_NO_CONFIG": "1",
                    "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
        outside = {k: v for k, v in os.environ.items() if not k.startswith("UV_") and "proxy" not in k.lower()}
        r = subprocess.run(argv, env={**outside, **offline, **hermetic, **env}, cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "/simple/torch/" in index.requested, "the lock was not resolved from the index it was given"
    lock = (tmp_path / "lock.txt").read_text()
    pins = variants.parse_lock_pins(lock)
    assert {k: pins.get(k) for k, v in cu132.pins.items() if v} == {k: v for k, v in cu132.pins.items() if v}
    assert pins["triton"] == cu132.pins["triton"] and _via(lock, "triton") >= {"torch"}
    assert pins.get(nccl) == real[nccl] and _via(lock, nccl) == {"torch"}  # the CUDA build of torch, not a CPU one
    assert pins.get("nvidia-cuda-runtime") == runtime
    assert f"--hash=sha256:{sha256(wheels['torch'])}" in lock  # hashed from the files this index served


def _via(lock: str, name: str) -> set[str]:
    """What uv's annotations say pulled `name` into the lock (`# via torch`, or `# via` and `#   torch` lines)."""
    block = re.search(rf"^{re.escape(name)}==[^\n]*\n((?:[ \t]+[^\n]*\n)*)", lock, re.M).group(1)
    said = re.findall(r"^\s+#\s+(?:via\s+)?(\S[^\n]*)$", block, re.M)
    return {s.strip() for s in said if s.strip() != "via"}


def test_lock_with_a_triton_torch_does_not_want_is_refused(settings, cu132):
    bad = cu132.model_copy(update={"pins": {**cu132.pins, "triton": "2.1.0"}})
    wanted = re.escape(build.lock_pins(cu132)["triton"])  # the lock's: the version torch requires
    with pytest.raises(DockyardError, match=rf"^lock for cu132 disagrees with images/variants\.yaml: triton {wanted} "
                       r"\(pinned 2\.1\.0\)\. "):
        build.check_lock(bad)


def test_the_build_check_names_ops_as_the_labels_and_doctor_do():
    """images/check_image.py runs alone in the build: its op table must be the project's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_image", ROOT / "images" / "check_image.py")
    check_image = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_image)
    assert check_image.OP_NAMES == variants.OP_NAMES and set(check_image.BUILDERS) == set(variants.OP_NAMES)


def test_a_second_build_of_the_same_variant_is_refused_at_once_and_the_first_keeps_its_context(tmp_path):
    """Two builds would share one staged context: the second one would remove the files the first is sending."""
    ctx = build.staged_context_dir(tmp_path / "wh" / "cpu", "cpu")
    with build._only_build_of(ctx):
        with pytest.raises(DockyardError, match="another build reads .*context-cpu .*wait for it to finish"):
            with build._only_build_of(ctx):
                pass
    with build._only_build_of(ctx):  # free again once the first ends
        pass


def test_the_created_label_is_the_commits_time_or_source_date_epoch(monkeypatch):
    """A clock reading made every cached rebuild a new image (test_image checks it on the engine)."""
    import datetime as dt

    from dockyard.common.errors import DockyardError

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert build.build_time() == "2023-11-14T22:13:20+00:00"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    commit = int(build._git("log", "-1", "--format=%ct"))
    assert build.build_time() == dt.datetime.fromtimestamp(commit, dt.timezone.utc).isoformat()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(DockyardError, match="SOURCE_DATE_EPOCH='yesterday': give the build's time as seconds since"):
        build.build_time()


def test_a_pin_the_lock_does_not_hold_is_refused_before_building_and_every_pin_is_checked_in_the_image(settings,
                                                                                                       monkeypatch):
    """transformers pinned 9.9.9 in a variants file, the lock unchanged: the build made an image labelled 9.9.9 that
    held 5.23.0 (the image check compared torch, triton and deepspeed alone)."""
    cpu = variants.resolve(settings, "cpu")[0]
    lying = cpu.model_copy(update={"pins": {**cpu.pins, "transformers": "9.9.9"}})
    monkeypatch.setattr(variants, "resolve", lambda *a, **k: (lying, "variant cpu"))
    with pytest.raises(DockyardError, match=r"lock for cpu disagrees with images/variants.yaml: transformers 5\.\d+\.\d+ "
                                            r"\(pinned 9.9.9\)"):
        build.build(settings, "cpu", dry=True)
    (argv, _), = build.build_steps(settings, cpu).steps
    import json

    pins = json.loads(_args(argv, "--build-arg")["EXPECT_PINS"])
    assert pins == {k: v for k, v in cpu.pins.items() if v} and "transformers" in pins


def test_a_wheelhouse_folder_that_cannot_be_made_is_one_line(settings, monkeypatch):
    """INVOKE_DOCKYARD_WHEELHOUSE_DIR=/dev/null: pip's traceback (NotADirectoryError: '/dev/null/cpu')."""
    from pathlib import Path

    monkeypatch.setattr(engine, "run", lambda *a, **k: pytest.fail("downloaded"))
    s = settings.model_copy(update={"wheelhouse_dir": Path("/dev/null")})
    with pytest.raises(DockyardError, match=r"cannot make the wheelhouse folder /dev/null/cpu \(Not a directory\): "
                                            "set wheelhouse_dir"):
        build.wheelhouse(s, "cpu")


def test_a_failed_build_quotes_the_first_error_its_step_printed():
    """BuildKit's own reason for a failed pip step is "exit code: 1": pip's reason (a pin no wheel has) was a screen
    above, among the lines of another step running beside it, and the step named was that other one, the last begun."""
    t = build._StepTracker()
    for line in ["#9 [runtime 2/5] RUN pip install --no-index /wheels/*.whl", "#8 [base 2/3] RUN apt-get update",
                 "#9 1.02 Looking in links: /wheels", "#8 1.10 Get:1 http://deb.debian.org bookworm InRelease",
                 "#9 1.50 ERROR: pip's dependency resolver does not currently take into account all the packages "
                 "that are installed.",  # pip's notice, printed before what failed: not the reason
                 "#9 1.80 ERROR: Could not find a version that satisfies the requirement torch==9.9 (from versions: "
                 "2.11.0)", "#9 1.81 ERROR: No matching distribution found for torch==9.9",
                 '#9 ERROR: process "/bin/sh -c pip install --no-index /wheels/*.whl" did not complete successfully: '
                 "exit code: 1"]:
        t(line)
    assert t.failure() == ("build failed at step [runtime 2/5] RUN pip install --no-index /wheels/*.whl: exit code: 1; "
                           "it printed: ERROR: Could not find a version that satisfies the requirement torch==9.9 (from "
                           "versions: 2.11.0)")
    compiler = build._StepTracker()
    for line in ["#10 [deepspeed-build 1/1] RUN pip wheel deepspeed", "#10 61.2 csrc/adam/cpu_adam.cpp:9:10: fatal "
                 "error: cuda_fp16.h: No such file or directory", "#10 70.0 error: subprocess-exited-with-error",
                 '#10 ERROR: process "/bin/sh -c pip wheel deepspeed" did not complete successfully: exit code: 1']:
        compiler(line)
    assert compiler.failure().endswith("exit code: 1; it printed: csrc/adam/cpu_adam.cpp:9:10: fatal error: "
                                       "cuda_fp16.h: No such file or directory")


def test_a_wheelhouse_missing_a_wheel_since_its_download_is_fetched_again(settings, monkeypatch, tmp_path, capsys):
    """The stamp alone said "matches the lock": a wheelhouse copied half to a node, or with a wheel deleted, failed the
    build minutes later inside pip. pip itself is not run here (engine.run writes what its download would)."""
    downloads = []

    def download(argv, **_):
        downloads.append(argv)
        (tmp_path / "cpu").mkdir(exist_ok=True)
        for name, size in (("torch-2.11.0-cp311-none-linux_x86_64.whl", 5000), ("peft-0.21.2-py3-none-any.whl", 300)):
            if not (tmp_path / "cpu" / name).exists():
                (tmp_path / "cpu" / name).write_bytes(b"w" * size)

    monkeypatch.setattr(engine, "run", download)
    s = settings.model_copy(update={"wheelhouse_dir": tmp_path})
    variant = variants.resolve(s, "cpu")[0]
    build.wheelhouse(s, "cpu")
    assert build.wheelhouse_complete(s, variant)
    torch = tmp_path / "cpu" / "torch-2.11.0-cp311-none-linux_x86_64.whl"
    torch.write_bytes(b"w" * 10)  # a copy cut short
    capsys.readouterr()
    assert not build.wheelhouse_complete(s, variant)
    assert ("1 of 2 files missing or changed since they were downloaded (torch-2.11.0-cp311-none-linux_x86_64.whl): "
            "fetching them again") in capsys.readouterr().out
    assert (tmp_path / "cpu" / build.WHEELHOUSE_STAMP).read_text().strip() == variants.lock_hash(variant), \
        "one line, as earlier versions read it from a wheelhouse they share"
    torch.unlink()
    assert not build.wheelhouse_complete(s, variant)
    build.wheelhouse(s, "cpu")
    assert len(downloads) == 2 and build.wheelhouse_complete(s, variant)
    (tmp_path / "cpu" / build.WHEELHOUSE_STAMP).write_text("another lock\n")
    assert not build.wheelhouse_complete(s, variant)


def test_a_wheelhouse_that_matches_its_lock_is_not_downloaded_again(settings, monkeypatch, tmp_path, capsys):
    """`invoke wheelhouse` ran `pip download` (the index asked again for every file) on a complete wheelhouse, where
    setup and build found it complete and went on. It says so and downloads nothing, --dry included; a wheelhouse of
    another lock is downloaded."""
    downloads = []

    def download(argv, **_):
        downloads.append(argv)
        (tmp_path / "cpu").mkdir(exist_ok=True)
        (tmp_path / "cpu" / "peft-0.21.2-py3-none-any.whl").write_bytes(b"w" * 300)

    monkeypatch.setattr(engine, "run", download)
    s = settings.model_copy(update={"wheelhouse_dir": tmp_path})
    build.wheelhouse(s, "cpu")
    assert len(downloads) == 1
    capsys.readouterr()
    for dry in (False, True):
        build.wheelhouse(s, "cpu", dry=dry)
        assert capsys.readouterr().out == (f"wheelhouse {tmp_path / 'cpu'} matches cpu.txt, every file at its size: "
                                           "nothing to download\n")
    assert len(downloads) == 1, "downloaded again"
    (tmp_path / "cpu" / build.WHEELHOUSE_STAMP).write_text("another lock\n")
    build.wheelhouse(s, "cpu", dry=True)
    assert "pip download" in capsys.readouterr().out
    build.wheelhouse(s, "cpu")
    assert len(downloads) == 2


def test_lock_says_when_pips_own_index_is_not_the_one_it_resolves_against(settings, capsys, monkeypatch):
    """invoke.yaml said index_url "" meant pip's own configuration, but uv (which resolves the lock) reads none of it:
    with a private index configured for pip only, the lock resolved against PyPI while the wheelhouse downloaded from
    the private index. `invoke lock` now says so (pip's configuration here, as the real `pip config list` reads it,
    from PIP_INDEX_URL), and the URL, which may hold a token, is not printed."""
    monkeypatch.setenv("PIP_INDEX_URL", "https://alice:tok3n@pypi.corp/simple")
    build.lock(settings, "cpu", dry=True)
    err = capsys.readouterr().err
    assert "warning: pip's configuration names index-url" in err and "set index_url" in err, err
    assert "tok3n" not in err
    given = settings.model_copy(update={"index_url": "https://pypi.corp/simple"})
    build.lock(given, "cpu", dry=True)  # the index is invoke.yaml's: uv gets it, nothing to say
    assert "warning" not in capsys.readouterr().err


@pytest.fixture
def lock_of_two(tmp_path, monkeypatch):
    """The cpu variant with a lock of two stub wheels (the real lock's form: `name==version \\`, then its hashes), and
    an index URL at a loopback port nothing listens on: a pip that asks any index fails at once, as offline."""
    files = tmp_path / "files"
    wheels = [stub_wheel(files, "peft", "0.21.2"), stub_wheel(files, "einops", "0.8.2")]
    lock = tmp_path / "cpu.txt"
    lock.write_text("".join(f"{w.name.split('-')[0]}=={w.name.split('-')[1]} \\\n    --hash=sha256:{'0' * 64} \\\n"
                            f"    --hash=sha256:{sha256(w)}\n    # via -r cpu.in\n" for w in wheels))
    monkeypatch.setattr(variants.Variant, "lock_file", property(lambda self: lock))
    with loopback_only_env() as offline:
        for k, v in {**offline, "PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "0", "PIP_FIND_LINKS": ""}.items():
            monkeypatch.setenv(k, v)
        yield wheels


def test_a_wheelhouse_carried_in_without_its_stamps_is_checked_not_downloaded(settings, lock_of_two, tmp_path, capsys):
    """An air-gapped host given the wheelhouse's files (copied without the hidden stamps `invoke wheelhouse` writes,
    or from `pip download` elsewhere): setup, wheelhouse and build ran `pip download`, which asks the index before
    it looks in the folder, and failed offline with every file there. The files are checked against the lock's
    sha256 instead, and stamped."""
    import shutil

    with socket_closed() as url:
        s = settings.model_copy(update={"wheelhouse_dir": tmp_path / "wh", "index_url": url, "extra_index_url": "",
                                        "find_links": ""})
        (tmp_path / "wh" / "cpu").mkdir(parents=True)
        for w in lock_of_two:
            shutil.copy(w, tmp_path / "wh" / "cpu")
        variant = variants.resolve(s, "cpu")[0]
        assert not build.wheelhouse_complete(s, variant)
        build.wheelhouse(s, "cpu", dry=True)
        assert "holds every file of cpu.txt (sha256 checked): nothing to download\n" in capsys.readouterr().out
        assert not build.wheelhouse_complete(s, variant), "--dry stamped it"
        build.wheelhouse(s, "cpu")
        assert ("holds every file of cpu.txt (sha256 checked): nothing to download, stamped as downloaded"
                in capsys.readouterr().out)
        assert build.wheelhouse_complete(s, variant)


def test_a_wheel_of_the_lock_saved_under_another_name_is_named_with_the_fix(settings, tmp_path, monkeypatch):
    """A wheelhouse carried in without its stamps is checked by sha256 (holds_the_lock); a wheel saved by a browser
    from an index writes its version's + as %2B (torch-2.13.0%2Bcpu-...whl), which pip's --no-index, finding a
    package's files by name, does not take: the check passed it and the build failed minutes in. It names the file and
    the name to give it; a file of the right name passes."""
    files = tmp_path / "files"
    wheel = stub_wheel(files, "torch", "2.13.0+cpu")
    lock = tmp_path / "cpu.txt"
    lock.write_text(f"torch==2.13.0+cpu \\\n    --hash=sha256:{sha256(wheel)}\n    # via -r cpu.in\n")
    monkeypatch.setattr(variants.Variant, "lock_file", property(lambda self: lock))
    variant = variants.resolve(settings, "cpu")[0]
    wh = tmp_path / "wh"
    wh.mkdir()
    saved = wh / wheel.name.replace("+", "%2B")
    saved.write_bytes(wheel.read_bytes())
    with pytest.raises(DockyardError) as e:
        build.holds_the_lock(wh, variant)
    assert (f"{saved.name} holds torch==2.13.0+cpu of the lock (its sha256), but its name says otherwise, and pip finds "
            f"a package's files by name: rename it to {wheel.name}") in str(e.value)
    saved.rename(wh / wheel.name)
    assert build.holds_the_lock(wh, variant)


def test_a_wheelhouse_carried_in_as_links_reaches_the_build_as_its_files(settings, lock_of_two, tmp_path):
    """A wheelhouse carried in as links to its files (`cp -s` from a mounted store, a folder of links into a shared
    cache) passed the lock's check through them and was stamped complete, and the build's context held the links
    themselves, which lead nowhere inside the build: pip failed there on every wheel. The context now holds the
    files the links name; a link to nothing beside them (a wheel its store has dropped since) is left out, where it
    failed the build ("No such file or directory")."""
    s = settings.model_copy(update={"wheelhouse_dir": tmp_path / "wh"})
    (tmp_path / "wh" / "cpu").mkdir(parents=True)
    for w in lock_of_two:
        (tmp_path / "wh" / "cpu" / w.name).symlink_to(w)
    (tmp_path / "wh" / "cpu" / "dropped-0.1-py3-none-any.whl").symlink_to(tmp_path / "store" / "dropped.whl")
    variant = variants.resolve(s, "cpu")[0]
    build.wheelhouse(s, "cpu")  # checked against the lock through the links, and stamped
    assert build.wheelhouse_complete(s, variant)
    context = build.copy_context(tmp_path / "context", variant, wheels=tmp_path / "wh" / "cpu")
    sent = {p.name: p for p in (context / "wheels").iterdir() if p.suffix == ".whl"}
    assert sorted(sent) == sorted(w.name for w in lock_of_two)
    for w in lock_of_two:
        assert not sent[w.name].is_symlink() and sha256(sent[w.name]) == sha256(w), w.name


def test_a_wheelhouse_link_to_no_file_is_left_out_of_the_context(settings, lock_of_two, tmp_path):
    """A link beside the lock's wheels to what is no file: /dev/zero was copied into the build's context without end
    (another file system: no hard link), filling the disk; a link to a folder (/) had copytree walk all of it; a pipe
    waited for ever. None is a wheel pip could take: each is left out, the lock's wheels reach the context. (The copy
    runs in a process whose files may grow to 1 MiB: before, it failed there instead of filling this disk.)"""
    wh = tmp_path / "wh" / "cpu"
    wh.mkdir(parents=True)
    for w in lock_of_two:
        (wh / w.name).symlink_to(w)
    (wh / "zero-0.1-py3-none-any.whl").symlink_to("/dev/zero")
    (tmp_path / "tree" / "deep").mkdir(parents=True)
    (tmp_path / "tree" / "deep" / "x.whl").write_bytes(b"x")
    (wh / "everything").symlink_to(tmp_path / "tree")
    os.mkfifo(tmp_path / "pipe")
    (wh / "pipe-0.1-py3-none-any.whl").symlink_to(tmp_path / "pipe")
    os.mkfifo(wh / "fifo-0.1-py3-none-any.whl")
    script = ("import resource, sys; from pathlib import Path; from dockyard.images import build, variants; "
              "from tests.conftest import settings; resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20)); "
              "build.copy_context(Path(sys.argv[1]), variants.resolve(settings.__wrapped__(), 'cpu')[0], "
              "wheels=Path(sys.argv[2]))")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "context"), str(wh)], cwd=ROOT, timeout=60,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    sent = sorted(p.name for p in (tmp_path / "context" / "wheels").iterdir())
    assert sent == sorted([*(w.name for w in lock_of_two), "lock.txt"])


def test_only_the_sample_data_of_the_checkout_goes_into_the_image(settings, lock_of_two, tmp_path, monkeypatch):
    """A user's dataset kept in the checkout's data/ (`--data=data/mine.jsonl`, mounted when the run starts) was
    copied into the build's context, so into every image and every archive saved from it (gigabytes shipped to the
    air-gapped node, their data in an image others pull); a link there to /dev/zero was read without end. The
    context's data/ holds the samples the trainer falls back on, nothing else."""
    checkout = tmp_path / "checkout"
    (checkout / "data").mkdir(parents=True)
    for name in ("dockyard", "recipes", "images", ".dockerignore"):
        (checkout / name).symlink_to(ROOT / name)
    for sample in ("sample.jsonl", "sample-classify.jsonl"):
        shutil.copy2(ROOT / "data" / sample, checkout / "data" / sample)
    (checkout / "data" / "mine.jsonl").write_text('{"text": "private"}\n')
    (checkout / "data" / "corpus").mkdir()
    (checkout / "data" / "corpus" / "part-0.jsonl").write_text('{"text": "private"}\n')
    (tmp_path / "elsewhere.jsonl").write_text('{"text": "private, outside the checkout"}\n')
    (checkout / "data" / "linked.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")  # not /dev/zero: a regression
    # would then fill this disk (it did once, in a check of this kind), where a plain file shows the same
    monkeypatch.setattr(build, "ROOT", checkout)
    wh = tmp_path / "wh" / "cpu"
    wh.mkdir(parents=True)
    for w in lock_of_two:
        shutil.copy2(w, wh / w.name)
    context = build.copy_context(tmp_path / "context", variants.resolve(settings, "cpu")[0], wheels=wh)
    assert sorted(p.name for p in (context / "data").iterdir()) == ["sample-classify.jsonl", "sample.jsonl"]
    for sample in ("sample.jsonl", "sample-classify.jsonl"):
        assert sha256(context / "data" / sample) == sha256(ROOT / "data" / sample)


def test_a_wheelhouse_no_index_answers_for_says_how_to_bring_it(settings, lock_of_two, tmp_path):
    """A file of the lock missing (or another's in its place) and no index answering: pip's failure alone, with
    nothing on what an offline host does about it."""
    with socket_closed() as url:
        s = settings.model_copy(update={"wheelhouse_dir": tmp_path / "wh", "index_url": url, "extra_index_url": "",
                                        "find_links": ""})
        (tmp_path / "wh" / "cpu").mkdir(parents=True)
        (tmp_path / "wh" / "cpu" / lock_of_two[0].name).write_bytes(b"not the wheel the lock names")
        with pytest.raises(DockyardError, match=r"downloading the wheelhouse of cpu failed (.|\n)*\nwhere no "
                           r"package index answers: copy into .*wh/cpu/ the wheelhouse `invoke wheelhouse "
                           r"--variant=cpu` made on a host where one does"):
            build.wheelhouse(s, "cpu")
        assert not build.wheelhouse_complete(s, variants.resolve(s, "cpu")[0])


@contextlib.contextmanager
def socket_closed():
    """An index URL at a loopback port bound and never listening: refused at once."""
    with held_port() as port:
        yield f"http://127.0.0.1:{port}/simple"


def test_an_engine_whose_buildkit_reads_no_run_mount_is_told_before_the_build(settings, monkeypatch, tmp_path):
    """Docker 19.03 (Ubuntu 20.04's docker.io as released) passed doctor's engine and buildkit checks, then
    `invoke build` failed inside docker with "Dockerfile parse error line 19: Unknown flag: mount": its built-in
    Dockerfile frontend reads RUN --mount only after a `# syntax=` line, which pulls an image. The engine's answer is
    a stand-in (this host's is newer); nothing is run."""
    from dockyard.machine import doctor

    monkeypatch.setattr(engine, "engine_info", lambda s: {"ServerVersion": "19.03.8", "Driver": "overlay2"})
    real = engine.run

    def git_only(argv, **kw):  # the checkout's revision and time, for the labels: nothing else may run
        if argv[0] != "git":
            pytest.fail(f"ran {argv}")
        return real(argv, **kw)

    monkeypatch.setattr(engine, "run", git_only)
    s = settings.model_copy(update={"wheelhouse_dir": tmp_path})
    with pytest.raises(DockyardError, match=r"^Docker 19\.03\.8 cannot build the images: its BuildKit reads RUN "
                       r"--mount \(images/Dockerfile\) only from 20\.10 on, and fails with 'Unknown flag: mount': "
                       r"upgrade the engine to 20\.10 or newer, or build on a host that has one and load the image "
                       r"here \(`invoke save --variant=cpu` there, `sh load.sh` here\)$"):
        build.build(s, "cpu")
    check = doctor.check_buildkit(s, {"ServerVersion": "19.03.8"})
    assert check.status == doctor.WARN and check.detail.startswith("Docker 19.03.8 cannot build the images")
    assert check.fix.startswith("upgrade the engine to 20.10 or newer to build here; runs work as they are")
    assert doctor.check_engine({"ServerVersion": "19.03.8"}).status == doctor.PASS, "it runs GPU containers (--gpus)"
    for newer in ("20.10.24+dfsg1", "29.0.1", "5.4.2"):  # 5.4.2: Podman's, which builds RUN --mount
        assert build.engine_cannot_build({"ServerVersion": newer}) == ""
    assert build.engine_cannot_build({"ServerVersion": None}) == build.engine_cannot_build({}) == ""


@pytest.mark.parametrize("change, said", [
    (lambda p: p.unlink(), "is missing"),
    (lambda p: (p.unlink(), p.symlink_to(p.parent.parent / "elsewhere.jsonl")), "is a link"),  # never /dev/zero:
    # the code before this test's fix copied it until this disk was full (33 GB, in the check that it failed)
])
def test_a_sample_deleted_or_linked_in_the_checkout_is_one_line_naming_it(settings, lock_of_two, tmp_path,
                                                                          monkeypatch, change, said):
    """data/sample.jsonl deleted from the checkout: invoke build ended in a FileNotFoundError traceback; replaced
    by a link, the link was followed (to /dev/zero: read without end). Each is now a line naming the file and how
    to get it back."""
    checkout = tmp_path / "checkout"
    for name in ("dockyard", "recipes"):
        (checkout / name).mkdir(parents=True)
    (checkout / "data").mkdir()
    for sample in ("sample.jsonl", "sample-classify.jsonl"):
        shutil.copy2(ROOT / "data" / sample, checkout / "data" / sample)
    (checkout / "elsewhere.jsonl").write_text('{"text": "not the sample"}\n')
    change(checkout / "data" / "sample.jsonl")
    monkeypatch.setattr(build, "ROOT", checkout)
    with pytest.raises(DockyardError, match=rf"data/sample.jsonl {said}: every image carries it as the sample data "
                                            rf"a run falls back on; restore the checkout's own \(`git -C {checkout} "
                                            r"checkout -- data/sample.jsonl`\)"):
        build.copy_context(tmp_path / "context", variants.resolve(settings, "cpu")[0], wheels=tmp_path / "wh")
