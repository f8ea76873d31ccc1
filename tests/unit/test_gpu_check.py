"""benchmarks/gpu_check.sh, the one command a 15-minute GPU lease runs: what it hands pytest and the benchmarks, and
that it stops where there is no GPU. The GPU host is faked here (a stand-in python3 that records what it is asked and
an nvidia-smi that prints a GPU or fails): this machine has neither a GPU nor the host's Python."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


H100 = "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB"
H200 = "NVIDIA H200, 580.159.04, 143771 MiB"


def fake_host(tmp_path: Path, cuda: bool = True, smi: bool = True, gpu: str = H100,
              liger: bool = True) -> tuple[dict, Path]:
    """PATH with a python3 that answers gpu_check's import checks and records each -m call (one line of argv), and an
    nvidia-smi that names one GPU (an H100 unless told) or fails as a broken driver does. `liger`: whether
    liger-kernel loads with the host's triton."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"""#!/bin/sh
case "$1" in
-c) case "$2" in
    *cuda.is_available*) exit {0 if cuda else 1} ;;
    *pytest_timeout*) exit 1 ;;
    *liger_kinds*) {"exit 0" if liger else "echo 'ImportError: cannot import name triton_op' >&2; exit 1"} ;;
    *) exit 0 ;;
    esac ;;
-m) printf '%s\\n' "$*" >>{shlex.quote(str(calls))}; echo "ran $2" ;;
esac
""")
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{gpu}'\n" if smi else
                                        "#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\n"
                                        "exit 18\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out")}, calls


def gpu_check(tmp_path: Path, *args: str, **host) -> tuple[subprocess.CompletedProcess, list[str]]:
    env, calls = fake_host(tmp_path, **host)
    r = subprocess.run(["sh", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return r, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("host,said", [({"cuda": False}, "torch sees no GPU"),
                                       ({"smi": False}, "Driver/library version mismatch")])
def test_without_a_usable_gpu_nothing_runs_and_the_call_fails(tmp_path, host, said):
    r, calls = gpu_check(tmp_path, "tests", **host)
    assert r.returncode == 1 and said in r.stderr and calls == []


DEFAULT_SLICE = ["tests/gpu/test_nvml.py", "tests/gpu/test_recipes_gpu.py", "tests/gpu/test_qlora_lean_gpu.py"]


@pytest.mark.parametrize("args,files", [
    ([], DEFAULT_SLICE),
    (["-k", "qlora"], DEFAULT_SLICE),
    # an option's value is no test path: pytest must not fall back to its testpaths (the CPU and Docker suite)
    (["--deselect", "tests/gpu/test_recipes_gpu.py::test_x"], DEFAULT_SLICE),
    (["--ignore=tests/gpu/test_nvml.py"], DEFAULT_SLICE),
    (["autos"], ["tests/gpu/test_autos_gpu.py"]),
    (["autos-kernels"], ["tests/gpu/test_autos_gpu.py"]),
    (["resume-a"], ["tests/gpu/test_resume_gpu.py"]),
    (["resume-b"], ["tests/gpu/test_resume_gpu.py"]),
    (["tests/gpu/test_resume_gpu.py", "-k", "ddp"], ["tests/gpu/test_resume_gpu.py"]),
    (["tests/gpu"], ["tests/gpu"]),
])
def test_tests_runs_gpu_tests_only(tmp_path, args, files):
    r, calls = gpu_check(tmp_path, "tests", *args)
    assert r.returncode == 0, r.stderr
    [call] = calls
    words = call.split()
    assert words[:2] == ["-m", "pytest"] and [w for w in words if w.startswith("tests/")] == files + [
        w for w in args if w.startswith("tests/gpu/test_recipes_gpu.py::")]
    assert "--basetemp=/tmp/dockyard-gpu-tests" in words


def test_a_path_from_the_checkout_root_is_a_test_path(tmp_path):
    r, calls = gpu_check(tmp_path, "tests", "./tests/gpu/test_nvml.py")
    assert r.returncode == 0 and calls[0].split()[-1] == "./tests/gpu/test_nvml.py", r.stderr


def test_a_test_path_outside_tests_gpu_is_refused(tmp_path):
    r, calls = gpu_check(tmp_path, "tests", "tests/unit/test_autos.py")
    assert r.returncode == 2 and "not under tests/gpu/" in r.stderr and calls == []


def test_bench_and_compile_pass_their_arguments_on(tmp_path):
    r, calls = gpu_check(tmp_path, "bench", "fsdp,qlora", "--steps", "40")
    assert r.returncode == 0, r.stderr
    words = calls[0].split()
    assert words[words.index("--recipes") + 1] == "fsdp,qlora" and words[-2:] == ["--steps", "40"]
    (tmp_path / "compile").mkdir()
    r, calls = gpu_check(tmp_path / "compile", "compile", "--layers", "8")
    assert r.returncode == 0 and calls[0].split()[-2:] == ["--layers", "8"], r.stderr


def test_tests_all_runs_every_gpu_test_file_in_slices_of_their_own(tmp_path):
    """`tests all` on an H200: six pytest processes side by side, each with its own folder (pytest empties its
    --basetemp as it starts: a shared one would pull the others' runs from under them) and its own log, every
    tests/gpu file in one."""
    r, calls = gpu_check(tmp_path, "tests", "all", gpu=H200)
    assert r.returncode == 0, r.stderr
    assert len(calls) == 6 and all(c.split()[:2] == ["-m", "pytest"] for c in calls)
    temps = {w for c in calls for w in c.split() if w.startswith("--basetemp=")}
    assert len(temps) == 6
    files = {w for c in calls for w in c.split() if w.startswith("tests/gpu/")}
    assert files == {f"tests/gpu/{p.name}" for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert len(list((tmp_path / "out").glob("tests-gpu-*.log"))) == 6
    assert len(list((tmp_path / "out").iterdir())) <= 8  # what one device call brings back


def test_tests_all_on_a_gpu_under_100_gb_leaves_the_944m_runs_to_a_call_of_their_own(tmp_path):
    """Their auto micro-batch leaves the plan's 10 % margin of an H100 (80 or 94 GB): five other pytest processes beside them
    (a CUDA context and a tiny run each) would take it. The call says what to run next."""
    for i, gpu in enumerate((H100, "NVIDIA H100 NVL, 580.159.04, 95830 MiB")):
        (tmp_path / str(i)).mkdir()
        r, calls = gpu_check(tmp_path / str(i), "tests", "all", gpu=gpu)
        assert r.returncode == 0, r.stderr
        assert len(calls) == 5 and not any("dockyard-gpu-tests-autos-944m" in c for c in calls), calls
        assert "run: sh benchmarks/gpu_check.sh tests autos-944m" in r.stdout
    (tmp_path / "alone").mkdir()
    r, calls = gpu_check(tmp_path / "alone", "tests", "autos-944m")
    assert r.returncode == 0 and calls[0].split()[-2:] == ["-k", "944m"], r.stderr


def test_bench_leaves_the_liger_row_out_where_liger_kernel_does_not_load(tmp_path):
    r, calls = gpu_check(tmp_path, "bench", liger=False)
    assert r.returncode == 0, r.stderr
    assert "liger-kernel does not load here (ImportError: cannot import name triton_op)" in r.stdout
    words = calls[0].split()
    assert not any(w.startswith("use_liger_kernel") for w in words) and "torch_compile=true" in words
    (tmp_path / "loads").mkdir()
    r, calls = gpu_check(tmp_path / "loads", "bench")
    # where they load the autos turn them on: the row that differs from the default goes without them
    assert "use_liger_kernel=false" in calls[0].split() and "liger-kernel does not load" not in r.stdout


def test_bench_plain_runs_each_recipe_once_with_no_tuning_flags(tmp_path):
    env, calls = fake_host(tmp_path)
    r = subprocess.run(["sh", str(SCRIPT), "bench", "ddp,fsdp,zero2,lora,qlora"], cwd=tmp_path,
                       env={**env, "PLAIN": "1"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    words = calls.read_text().split()
    assert "--try" not in words and words[words.index("--recipes") + 1] == "ddp,fsdp,zero2,lora,qlora"


def test_tests_all_fails_when_one_slice_fails(tmp_path):
    env, calls = fake_host(tmp_path)
    fake = Path(env["PATH"].split(":")[0]) / "python3"
    fake.write_text(fake.read_text().replace('echo "ran $2"', 'echo "ran $2"; case "$*" in *resume*) exit 1 ;; esac'))
    r = subprocess.run(["sh", str(SCRIPT), "tests", "all"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "== resume-a: exit 1" in r.stdout and "== recipes: exit 0" in r.stdout, r.stdout


def test_tests_all_refuses_a_deadline_that_is_not_seconds(tmp_path):
    env, calls = fake_host(tmp_path)
    for bad in ("8m", "0", "00"):  # 00: timeout(1) would read it as no bound at all
        r = subprocess.run(["sh", str(SCRIPT), "tests", "all"], cwd=tmp_path, env={**env, "DEADLINE": bad},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"DEADLINE={bad}: give the seconds" in r.stderr and not calls.exists()
    assert not (tmp_path / "out").exists()  # refused before anything was installed, probed or written


@pytest.mark.parametrize("args", [["all", "-k", "ddp"], ["autos", "-k", "lora"], ["autos-944m", "-kqlora"],
                                  ["resume-b", "-k", "zero3"]])
def test_a_named_slice_refuses_a_k_that_would_replace_its_own(tmp_path, args):
    """pytest keeps the last -k: `tests autos -k X` ran X from every slice, `all -k X` the same tests six times over."""
    r, calls = gpu_check(tmp_path, "tests", *args)
    assert r.returncode == 2 and "would replace the slice's own choice of tests" in r.stderr and calls == []
    assert not (tmp_path / "out").exists()  # refused before anything was installed, probed or written


def test_the_resume_halves_hold_every_resume_test_once(tmp_path):
    """resume-a and resume-b, each a call of its own: their two -k filters are one expression and its negation."""
    ks = []
    for half in ("resume-a", "resume-b"):
        (tmp_path / half).mkdir()
        r, [call] = gpu_check(tmp_path / half, "tests", half)
        assert r.returncode == 0 and " tests/gpu/test_resume_gpu.py -k " in call, r.stderr
        ks.append(call.split(" -k ", 1)[1])  # the last words: the fake records its argv joined by spaces
    assert ks[0] and ks[1] == f"not ({ks[0]})", ks
