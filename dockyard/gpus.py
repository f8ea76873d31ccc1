"""GPUs through NVML (nvidia-ml-py), behind a small interface so tests can feed recorded readings.

`probe()` returns plain data. Nothing else in the project imports pynvml.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_bytes: int
    uuid: str = ""


@dataclass(frozen=True)
class Host:
    """What NVML says about this host. `cuda` is the highest CUDA the driver supports, e.g. "12.8"."""

    driver: str = ""
    cuda: str = ""
    gpus: list[Gpu] = field(default_factory=list)
    error: str = ""  # why NVML could not be read (no driver, no library): not an error on a CPU host

    @property
    def count(self) -> int:
        return len(self.gpus)


def cuda_from_int(v: int) -> str:
    """NVML's cudaDriverVersion (12080) as "12.8"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def probe() -> Host:
    """Read the real NVML. Never raises: a host without GPUs gives Host(error=...)."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        return Host(error=f"nvidia-ml-py not installed: {e}")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return Host(error=f"NVML unavailable ({e}): no NVIDIA driver on this host")
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        cuda = cuda_from_int(pynvml.nvmlSystemGetCudaDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else name,
                            int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                            uuid.decode() if isinstance(uuid, bytes) else uuid))
        return Host(driver=driver, cuda=cuda, gpus=gpus)
    finally:
        pynvml.nvmlShutdown()
