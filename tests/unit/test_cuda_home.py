"""images/cuda_home.py on fake wheel trees of both layouts (files made here; the real image build runs it on
PyPI's toolkit wheels): the CUDA_HOME that nvcc, DeepSpeed and cpp_extension read, made of links only."""

import importlib.util

from dockyard.settings import ROOT

spec = importlib.util.spec_from_file_location("cuda_home", ROOT / "images" / "cuda_home.py")
cuda_home = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cuda_home)


def _files(root, *paths):
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text(p)


def _real_files(home):
    """Files that are not links, the driver's link stub aside."""
    return [p for p in home.rglob("*") if p.is_file() and p.parent.name != "stubs"
            and not any(q.is_symlink() for q in [p, *p.parents])]


def test_cuda13_wheels_one_folder(tmp_path):
    nvidia = tmp_path / "nvidia"
    _files(nvidia, "cu13/bin/nvcc", "cu13/bin/ptxas", "cu13/include/cuda_runtime.h", "cu13/include/crt/host_defines.h",
           "cu13/lib/libcudart.so.13", "cu13/lib/libcublas.so.13", "cu13/nvvm/bin/cicc",
           "cudnn/include/cudnn.h", "cudnn/lib/libcudnn.so.9", "nccl/include/nccl.h", "nccl/lib/libnccl.so.2")
    home = tmp_path / "cuda"
    assert cuda_home.assemble(nvidia, home) == 0
    for p in ("bin/nvcc", "bin/ptxas", "include/cuda_runtime.h", "include/crt/host_defines.h", "include/cudnn.h",
              "nvvm/bin/cicc", "lib64/libcudart.so.13", "lib64/libcublas.so.13", "lib64/libnccl.so.2"):
        assert (home / p).exists() and (home / p).resolve().is_relative_to(nvidia.resolve()), p
    assert (home / "lib64" / "libcudart.so").resolve() == (nvidia / "cu13/lib/libcudart.so.13").resolve()
    assert (home / "lib" / "libcudart.so").exists(), "tools that look in $CUDA_HOME/lib find it too"
    assert (home / "lib64" / "stubs" / "libcuda.so").is_file(), "a link stub for -lcuda: no driver on a build host"
    assert _real_files(home) == [], "links only: no library twice"


def test_cuda12_wheels_one_folder_per_component_merge(tmp_path):
    nvidia = tmp_path / "nvidia"
    _files(nvidia, "cuda_nvcc/bin/nvcc", "cuda_nvcc/include/crt/host_defines.h", "cuda_nvcc/nvvm/bin/cicc",
           "cuda_runtime/include/cuda_runtime.h", "cuda_runtime/lib/libcudart.so.12",
           "cuda_cccl/include/cuda/std/version", "cublas/include/cublas_v2.h", "cublas/lib/libcublas.so.12",
           "cusparse/include/crt/extra.h")
    home = tmp_path / "cuda"
    assert cuda_home.assemble(nvidia, home) == 0
    for p in ("bin/nvcc", "nvvm/bin/cicc", "include/cuda_runtime.h", "include/cuda/std/version",
              "include/cublas_v2.h", "include/crt/host_defines.h", "include/crt/extra.h", "lib64/libcudart.so"):
        assert (home / p).exists(), p
    assert _real_files(home) == []


def test_no_nvcc_is_refused(tmp_path, capsys):
    _files(tmp_path / "nvidia", "cublas/lib/libcublas.so.12")
    assert cuda_home.assemble(tmp_path / "nvidia", tmp_path / "cuda") == 1
    assert "no nvcc" in capsys.readouterr().err


def test_a_registry_bases_cuda_home_is_left_alone(tmp_path, monkeypatch):
    (tmp_path / "cuda").mkdir()
    monkeypatch.setattr("sys.argv", ["cuda_home.py", str(tmp_path / "cuda")])
    assert cuda_home.main() == 0 and list((tmp_path / "cuda").iterdir()) == []
