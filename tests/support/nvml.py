"""A FAKE pynvml (no GPU here): it behaves as nvidia-ml-py 13.615.71 does where that matters
(NVML_P2P_CAPS_INDEX_READ is the tuple (0,); ctypes rejects a tuple where it wants an int; a MIG device raises
NOT_SUPPORTED for utilisation). Its GPUs' handles are their indices."""

from __future__ import annotations

import contextlib
import ctypes
from types import SimpleNamespace

from dockyard import gpus

# nvidia/cuda:12.8.1's NVIDIA_REQUIRE_CUDA (a --devel cu128 build's), shortened to its 470, 535 and 550 driver
# branches: CUDA 12.8, or one of those drivers on the brands it names (GeForce and TITAN are not among them)
REQUIRE_CUDA_128 = "cuda>=12.8 " + " ".join(
    f"brand={brand},driver>={branch},driver<{branch + 1}" for branch in (470, 535, 550)
    for brand in ("unknown", "grid", "tesla", "nvidia", "quadro", "quadrortx", "nvidiartx", "vapps", "vpc", "vcs", "vws",
                  "cloudgaming"))


class NVMLError(Exception):
    pass


def fake_pynvml(n=2, mig=False, util: list[float] | None = None, brand: int = 14):
    """`n` Tesla T4s, each `util` percent busy (42 where not given), 1 GiB of 16 in use, of NVML brand `brand`
    (14, NVML_BRAND_NVIDIA: a T4's, as `nvidia-smi -q` says "Product Brand: NVIDIA" of one on driver 530)."""
    def p2p(a, b, index):
        if not isinstance(index, int):  # what ctypes does with (0,)
            raise ctypes.ArgumentError("argument 3: TypeError: wrong type")
        return 0

    def utilisation(h):
        if mig:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=util[h] if util else 42)

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_P2P_CAPS_INDEX_READ=(0,), NVML_P2P_CAPS_INDEX_NVLINK=2, NVML_P2P_STATUS_OK=0,
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlDeviceGetP2PStatus=p2p, nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 50,
        nvmlDeviceGetName=lambda h: b"Tesla T4", nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=16 * 2**30, used=2**30),
        nvmlDeviceGetCudaComputeCapability=lambda h: (7, 5), nvmlDeviceGetMigMode=lambda h: (int(mig), int(mig)),
        nvmlDeviceGetBrand=lambda h: brand,
        nvmlSystemGetDriverVersion=lambda: "535.183.01", nvmlSystemGetCudaDriverVersion=lambda: 12020,
        nvmlDeviceGetUtilizationRates=utilisation, nvmlDeviceGetComputeRunningProcesses=lambda h: [])


def install(monkeypatch, n=2, **kw) -> None:
    """gpus.nvml() opens `n` fake GPUs (fake_pynvml's other arguments in `kw`) in place of the real library."""
    @contextlib.contextmanager
    def opened():
        yield gpus.Nvml(fake_pynvml(n, **kw), list(range(n)))

    monkeypatch.setattr(gpus, "nvml", opened)
