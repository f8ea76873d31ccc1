"""GPUs through NVML (nvidia-ml-py), behind a small interface so tests can feed recorded readings.

A *source* answers three questions: what the host has (`host()`), how its GPUs are connected (`links()`),
and how busy each GPU is right now (`sample()`). `Nvml` asks the real library; `Recorded` replays a JSON file
(tests/fixtures/nvml/ holds some). Everything returned is plain data. Nothing else in the project imports pynvml.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol


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


@dataclass(frozen=True)
class Link:
    """How two GPUs reach each other: `path` in words, whether P2P reads work, whether that is over NVLink."""

    a: int
    b: int
    path: str
    p2p: bool
    nvlink: bool = False


@dataclass(frozen=True)
class Reading:
    """One device at one moment: percent busy, memory used, and the processes using it.

    For GPUs `util` is NVML's SM utilisation; the monitor uses the same shape for CPU ranks (CPU % of the
    rank process, RSS), so the verdict and the plots work on both.
    """

    device: int
    util: float
    mem: int
    mem_total: int = 0
    pids: tuple[int, ...] = ()


class Source(Protocol):
    kind: str  # "gpu" or "cpu"

    def sample(self) -> list[Reading]: ...


# NVML's nvmlDeviceGetTopologyCommonAncestor levels, in the words `nvidia-smi topo -m` uses
_PATHS = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches", 30: "PCIe host bridge",
          40: "same NUMA node", 50: "across CPU sockets"}


def cuda_from_int(v: int) -> str:
    """NVML's cudaDriverVersion (12080) as "12.8"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


class NvmlUnavailable(Exception):
    """No NVIDIA driver or library on this host: normal on a CPU host."""


@contextlib.contextmanager
def nvml() -> Iterator[Nvml]:
    """NVML for the length of the block: the one place that initialises and shuts it down.
    Raises NvmlUnavailable on entry where there is no driver or library."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable(f"nvidia-ml-py not installed: {e}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML unavailable ({e}): no NVIDIA driver on this host") from None
    try:
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML cannot list the GPUs ({e})") from None
        yield Nvml(pynvml, handles)
    finally:
        pynvml.nvmlShutdown()


class Nvml:
    """The real NVML, open while `nvml()`'s block runs."""

    kind = "gpu"

    def __init__(self, nv, handles: list):
        self.nv, self.handles = nv, handles

    def host(self) -> Host:
        nv = self.nv
        gpus = [Gpu(i, _text(nv.nvmlDeviceGetName(h)), int(nv.nvmlDeviceGetMemoryInfo(h).total),
                    _text(nv.nvmlDeviceGetUUID(h))) for i, h in enumerate(self.handles)]
        return Host(driver=_text(nv.nvmlSystemGetDriverVersion()),
                    cuda=cuda_from_int(nv.nvmlSystemGetCudaDriverVersion()), gpus=gpus)

    def links(self) -> list[Link]:
        nv, out = self.nv, []
        for a, ha in enumerate(self.handles):
            for b in range(a + 1, len(self.handles)):
                hb = self.handles[b]
                try:
                    p2p = nv.nvmlDeviceGetP2PStatus(ha, hb, nv.NVML_P2P_CAPS_INDEX_READ) == nv.NVML_P2P_STATUS_OK
                    nvlink = nv.nvmlDeviceGetP2PStatus(ha, hb, nv.NVML_P2P_CAPS_INDEX_NVLINK) == nv.NVML_P2P_STATUS_OK
                except nv.NVMLError:
                    p2p = nvlink = False
                try:
                    path = _PATHS.get(nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb), "unknown")
                except nv.NVMLError:
                    path = "unknown"
                out.append(Link(a, b, "NVLink" if nvlink else path, p2p, nvlink))
        return out

    def sample(self) -> list[Reading]:
        nv, out = self.nv, []
        for i, h in enumerate(self.handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                pids = tuple(sorted(p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)))
            except nv.NVMLError:
                pids = ()
            out.append(Reading(i, float(nv.nvmlDeviceGetUtilizationRates(h).gpu), int(mem.used),
                               int(mem.total), pids))
        return out


class Recorded:
    """Readings recorded earlier, replayed one sample per call (then no readings: the recording is over).

    The file: {"host": {"driver", "cuda", "gpus": [{"index", "name", "memory_bytes"}]},
               "links": [{"a", "b", "path", "p2p", "nvlink"}],
               "samples": [{"devices": [{"device", "util", "mem", "mem_total", "pids"}]}]}
    `samples` has the shape of the monitor's own monitor.jsonl lines, so a real run can be replayed.
    """

    def __init__(self, data: dict, kind: str = "gpu"):
        self.kind = kind
        self.data = data
        self._next = 0

    @classmethod
    def from_file(cls, path: Path | str) -> Recorded:
        data = json.loads(Path(path).read_text())
        return cls(data, kind=data.get("kind", "gpu"))

    def host(self) -> Host:
        h = self.data.get("host", {})
        return Host(driver=h.get("driver", ""), cuda=h.get("cuda", ""),
                    gpus=[Gpu(**g) for g in h.get("gpus", [])], error=h.get("error", ""))

    def links(self) -> list[Link]:
        return [Link(**link) for link in self.data.get("links", [])]

    def sample(self) -> list[Reading]:
        samples = self.data.get("samples", [])
        if self._next >= len(samples):
            return []
        self._next += 1
        return [reading_from_dict(d) for d in samples[self._next - 1]["devices"]]


def reading_from_dict(d: dict) -> Reading:
    return Reading(int(d["device"]), float(d["util"]), int(d["mem"]), int(d.get("mem_total", 0)),
                   tuple(d.get("pids", ())))


def reading_to_dict(r: Reading) -> dict:
    return {**asdict(r), "pids": list(r.pids)}


def probe() -> Host:
    """What the real NVML says about this host. Never raises: a host without GPUs gives Host(error=...)."""
    try:
        with nvml() as nv:
            try:
                return nv.host()
            except nv.nv.NVMLError as e:
                return Host(error=f"NVML cannot read the GPUs ({e})")
    except NvmlUnavailable as e:
        return Host(error=str(e))
