"""Assemble one CUDA_HOME out of the CUDA toolkit wheels in the venv: run by the Dockerfile at build time.

PyPI's toolkit wheels install into site-packages/nvidia/: CUDA 13 puts every component in nvidia/cu13/,
CUDA 12 gives each its own nvidia/<component>/. nvcc, DeepSpeed's op builder and torch's cpp_extension
all expect the classic layout ($CUDA_HOME/bin, include, lib64, nvvm), so this makes that layout as a tree
of symlinks: nothing is copied, so no library exists twice. The link step of an op asks for `-lcudart`
while the wheels ship only the versioned file, hence the unversioned links in lib64.
"""

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

PARTS = {"bin": "bin", "include": "include", "lib": "lib64", "nvvm": "nvvm"}


def merge(src: Path, dst: Path) -> None:
    """Link every entry of src into dst; folders both sides hold become real folders, merged in turn."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        target = dst / entry.name
        if not target.exists() and not target.is_symlink():
            target.symlink_to(entry)
        elif entry.is_dir() and target.is_dir():
            if target.is_symlink():  # a second component brings the same folder: split the link open
                first = target.resolve()
                target.unlink()
                merge(first, target)
            merge(entry, target)


def make_driver_stub(stubs: Path) -> None:
    """An empty libcuda.so for the link step only (DeepSpeed's async_io links -lcuda), found through
    LIBRARY_PATH as in NVIDIA's devel images: at run time the container toolkit mounts the driver's libcuda.so.1,
    the only name the loader asks for. The wheels ship no stub, and a build host has no driver."""
    stubs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-x", "c", "-shared", "-o", str(stubs / "libcuda.so"), "-Wl,-soname,libcuda.so.1", "-"],
                   input=b"", check=True)


def main() -> int:
    home = Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/local/cuda")
    if home.exists():
        print(f"{home} exists (a registry base brought its toolkit): left as it is")
        return 0
    return assemble(Path(sysconfig.get_paths()["purelib"]) / "nvidia", home)


def assemble(nvidia: Path, home: Path) -> int:
    roots = [d for d in sorted(nvidia.iterdir()) if d.is_dir() and any((d / p).is_dir() for p in PARTS)]
    # nvcc's component first, so that its own headers (crt/) win over a copy another component carries
    roots.sort(key=lambda d: not (d / "bin" / "nvcc").exists())
    if not any((d / "bin" / "nvcc").exists() for d in roots):
        print(f"no nvcc under {nvidia}: pin the CUDA toolkit wheels (nvidia-cuda-nvcc...) in the variant",
              file=sys.stderr)
        return 1
    for root in roots:
        for part, name in PARTS.items():
            if (root / part).is_dir():
                merge(root / part, home / name)
    lib64 = home / "lib64"
    for so in sorted(lib64.iterdir()):
        m = re.match(r"^(lib[\w.+-]+?\.so)\.\d+$", so.name)
        if m and not (lib64 / m.group(1)).exists():
            (lib64 / m.group(1)).symlink_to(so.name)
    os.symlink("lib64", home / "lib")
    make_driver_stub(home / "lib64" / "stubs")
    print(f"{home}: CUDA_HOME assembled from {', '.join(d.name for d in roots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
