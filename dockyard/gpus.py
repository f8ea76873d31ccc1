"""GPUs through NVML (nvidia-ml-py), behind a small interface so tests can feed recorded readings.

A *source* answers three questions: what the host has (`host()`), how its GPUs are connected (`links()`),
and how busy each GPU is right now (`sample()`). `Nvml` asks the real library; `Recorded` replays a JSON file
(tests/fixtures/nvml/ holds some). Everything returned is plain data. Nothing else in the project imports pynvml.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, with_config

from dockyard.common import locks
from dockyard.common.errors import DockyardError, MiB, cut, json_object, problems, read_bounded, short


def read_host() -> Host:
    """What NVML (or the replay file) says about this host. Never raises: no GPUs gives Host(error=...)."""
    source = replay()
    if source is not None:
        return source.host()
    try:
        with nvml() as nv:
            try:
                return nv.host()
            except nv.nv.NVMLError as e:
                return Host(error=f"NVML cannot read the GPUs ({e})", driver_fault=True)
    except NvmlUnavailable as e:
        return Host(error=str(e), driver_fault=e.fault)


def facts() -> tuple[Host, list[Link]]:
    """The host and its links: from the replay file if set, else NVML. Never raises for a host without GPUs."""
    source = replay()
    if source is not None:
        return source.host(), source.links()
    try:
        with nvml() as nv:
            return nv.host(), nv.links()
    except NvmlUnavailable as e:
        return Host(error=str(e), driver_fault=e.fault), []


# "12.8", or "" where NVML could not read it
Version = Annotated[str, StringConstraints(pattern=r"^(\d+\.\d+)?$")]
# what a recording says in words is printed as it is (doctor's table, `auto → ...`): no control characters (an escape
# sequence in a file users send each other cleared the terminal); a driver version is numbers and dots
Words = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]*$",
                                         max_length=200)]  # nor a line or paragraph break, nor bidi/format marks
DriverVersion = Annotated[str, StringConstraints(pattern=r"^([0-9]{1,6}(\.[0-9]{1,6}){0,3})?$")]
# what a recording (a file users send each other) may say, as a real host could: a GPU of -5 bytes planned "fits: no"
# and a run --dry for it; an index past NVML's device count, a utilisation past 100 %
MAX_GPUS = 256
Index = Annotated[int, Field(ge=0, lt=MAX_GPUS)]
Bytes = Annotated[int, Field(ge=0, le=2**50)]
# a GPU's brand in the words of NVIDIA_REQUIRE_CUDA's brand= conditions ("tesla", "geforce", "nvidia"): NVML_BRANDS
Brand = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{0,40}$")]


@with_config(ConfigDict(strict=True, extra="forbid"))  # as strict as Recording, which it is read in
@dataclass(frozen=True)
class Gpu:
    index: Index
    name: Words
    memory_bytes: Bytes  # 0: NVML could not read it (the recorder writes that)
    uuid: str = ""
    capability: Version = ""  # CUDA compute capability, "7.5" on a T4: decides bf16 or fp16
    mig: bool = False     # MIG mode on: NVML counts the physical GPU, utilisation reads are not supported
    brand: Brand = ""     # NVML's product brand (NVML_BRANDS); "" where unread (recordings made before it was read)


@dataclass(frozen=True)
class Host:
    """What NVML says about this host. `cuda` is the highest CUDA the driver supports, e.g. "12.8" ("" where NVML
    could not read it: variants.driver_runs then goes by the driver version)."""

    driver: DriverVersion = ""
    cuda: Version = ""
    gpus: list[Gpu] = field(default_factory=list)
    # why NVML could not be read (no driver, no library): not an error on a CPU host; a recording's, read as Words
    # are (an escape sequence in it reached the terminal)
    error: Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f-\x9f]*$", max_length=2000)] = ""
    visible: str = ""  # the devices chosen by --gpus or CUDA_VISIBLE_DEVICES, "0,2"; "" is all of them
    # NVML's library is here and failed (a driver upgraded without a reboot: "Driver/library version mismatch"): a
    # GPU host whose driver is broken, not a CPU host; `error` says how
    driver_fault: bool = False

    @property
    def count(self) -> int:
        return len(self.gpus)


@with_config(ConfigDict(strict=True, extra="forbid"))  # as strict as Recording, which it is read in
@dataclass(frozen=True)
class Link:
    """How two GPUs reach each other: `path` in words, whether P2P reads work, whether that is over NVLink."""

    a: Index
    b: Index
    path: Words
    p2p: bool
    nvlink: bool = False


@dataclass(frozen=True)
class Reading:
    """One device at one moment: percent busy, memory used, and the processes using it.

    For GPUs `util` is NVML's SM utilisation, None where NVML cannot read it (a MIG device): unknown, not idle. The
    monitor uses the same shape for CPU ranks (CPU % of the rank process, RSS), so the verdict and the plots work on
    both.
    """

    device: Index
    util: Annotated[float, Field(ge=0)] | None  # a CPU rank's may pass 100: a process of several threads
    mem: Bytes
    mem_total: Bytes = 0
    pids: tuple[int, ...] = ()


class Sample(BaseModel):
    devices: list[Reading]


class Recording(BaseModel):
    """A recorded host (`invoke doctor --record`, tests/fixtures/nvml/): users send these to each other, so every
    field is read strictly as its type ("capability": 7.5 or "memory_bytes": "lots" is refused, naming the field).
    `samples` has the shape of the monitor's own monitor.jsonl lines, so a real run can be replayed."""

    model_config = ConfigDict(strict=True, extra="forbid")  # `hots` for host: "no GPU on this host" was all it got

    note: str = ""  # what the recording is of, in words (the fixtures')
    kind: Literal["gpu", "cpu"] = "gpu"
    host: Host
    links: list[Link] = []
    samples: list[Sample] = []

    @field_validator("host")
    @classmethod
    def _one_gpu_per_index(cls, host: Host) -> Host:
        indexes = [g.index for g in host.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"each GPU's index once in gpus (found {sorted(indexes)[:16]})")
        # the devices a run is given (docker's --gpus "device=0,2", written into run.sh): indexes of its GPUs alone
        chosen = host.visible.split(",") if host.visible else []
        if not all(gpu_index(i) in indexes for i in chosen) or len(set(chosen)) < len(chosen):
            raise ValueError(f"visible is {host.visible[:40]!r}: it lists indexes of the recording's GPUs ({indexes[:16]}) "
                             "once each, comma-separated, or is \"\" for all of them")
        return host


class Source(Protocol):
    kind: str  # "gpu" or "cpu"

    def sample(self) -> list[Reading]: ...


# NVML's nvmlDeviceGetTopologyCommonAncestor levels, in the words `nvidia-smi topo -m` uses
ACROSS_SOCKETS = "across CPU sockets"  # where PCIe has no peer-to-peer, whatever the BIOS says
_PATHS = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches", 30: "PCIe host bridge",
          40: "same NUMA node", 50: ACROSS_SOCKETS}


# nvml.h's nvmlBrandType_t, named as nvidia/cuda images' NVIDIA_REQUIRE_CUDA names them (brand=tesla, brand=nvidiartx,
# brand=vapps): an NVML of more brands than these says "unknown" here, as the NVIDIA toolkit says it
NVML_BRANDS = {0: "unknown", 1: "quadro", 2: "tesla", 3: "nvs", 4: "grid", 5: "geforce", 6: "titan", 7: "vapps",
               8: "vpc", 9: "vcs", 10: "vws", 11: "cloudgaming", 12: "quadrortx", 13: "nvidiartx", 14: "nvidia",
               15: "geforcertx", 16: "titanrtx"}


def cuda_from_int(v: int) -> str:
    """NVML's cudaDriverVersion (12080) as "12.8"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


REPLAY_ENV = "DOCKYARD_NVML_REPLAY"


def _index(constant) -> int:
    """nvidia-ml-py 13.615.71 defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,); ctypes wants the int."""
    return int(constant[0]) if isinstance(constant, tuple) else int(constant)


def _read(nv, fn, *args, default=None):
    """One NVML field, or `default` where this device or binding cannot say (MIG, old driver, a binding bug):
    one missing fact must not hide the others."""
    try:
        return fn(*args)
    except (nv.NVMLError, ctypes.ArgumentError, TypeError, AttributeError):
        return default


class NvmlUnavailable(Exception):
    """No NVIDIA driver or library on this host: normal on a CPU host. `fault`: the library is here and failed, a
    GPU host's driver that does not answer, which no CPU host has."""

    def __init__(self, message: str, fault: bool = False):
        super().__init__(message)
        self.fault = fault


# How a driver that is there and fails is said: nvidia-smi fails the same way, and a reboot fixes the commonest
DRIVER_FAULT_FIX = ("`nvidia-smi` says the same; after a driver upgrade, reboot (or reload the nvidia kernel modules), "
                    "or train on CPU anyway with --variant=cpu")


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
        if e.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:  # no driver installed: a CPU host
            raise NvmlUnavailable(f"no NVIDIA driver on this host (NVML: {e})") from None
        if e.value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:  # a CPU VM of an image that ships the driver, or a GPU
            # host whose module did not load (a new kernel): the first trains on CPU, the second is told where to look
            raise NvmlUnavailable(f"no NVIDIA driver loaded on this host (NVML: {e}; on a GPU host, `nvidia-smi` says "
                                  "why)") from None
        raise NvmlUnavailable(f"the NVIDIA driver does not answer (NVML: {e})", fault=True) from None
    try:
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML cannot list the GPUs ({e})", fault=True) from None
        yield Nvml(pynvml, handles)
    finally:
        pynvml.nvmlShutdown()


class Nvml:
    """The real NVML, open while `nvml()`'s block runs."""

    kind = "gpu"

    def __init__(self, nv, handles: list):
        self.nv, self.handles = nv, handles

    def _gpu(self, i: int, h) -> Gpu:
        nv = self.nv
        mem = _read(nv, nv.nvmlDeviceGetMemoryInfo, h)
        cc = _read(nv, nv.nvmlDeviceGetCudaComputeCapability, h)
        mig = _read(nv, nv.nvmlDeviceGetMigMode, h)
        brand = _read(nv, nv.nvmlDeviceGetBrand, h)
        return Gpu(i, _text(_read(nv, nv.nvmlDeviceGetName, h, default="unknown GPU")),
                   int(mem.total) if mem is not None else 0, _text(_read(nv, nv.nvmlDeviceGetUUID, h, default="")),
                   f"{cc[0]}.{cc[1]}" if cc else "", bool(mig and mig[0] == nv.NVML_DEVICE_MIG_ENABLE),
                   "" if brand is None else NVML_BRANDS.get(int(brand), "unknown"))

    def host(self) -> Host:
        nv = self.nv
        cuda = _read(nv, nv.nvmlSystemGetCudaDriverVersion)
        return Host(driver=_text(_read(nv, nv.nvmlSystemGetDriverVersion, default="")),
                    cuda=cuda_from_int(cuda) if cuda else "",
                    gpus=[self._gpu(i, h) for i, h in enumerate(self.handles)])

    def links(self) -> list[Link]:
        nv, out = self.nv, []
        for a, ha in enumerate(self.handles):
            for b in range(a + 1, len(self.handles)):
                hb = self.handles[b]
                ok = nv.NVML_P2P_STATUS_OK
                p2p = _read(nv, nv.nvmlDeviceGetP2PStatus, ha, hb, _index(nv.NVML_P2P_CAPS_INDEX_READ)) == ok
                nvlink = _read(nv, nv.nvmlDeviceGetP2PStatus, ha, hb, _index(nv.NVML_P2P_CAPS_INDEX_NVLINK)) == ok
                path = _PATHS.get(_read(nv, nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb), "unknown")
                out.append(Link(a, b, "NVLink" if nvlink else path, p2p, nvlink))
        return out

    def sample(self) -> list[Reading]:
        nv, out = self.nv, []
        for i, h in enumerate(self.handles):
            # each field on its own: on a MIG device utilisation raises NOT_SUPPORTED, memory still reads
            mem = _read(nv, nv.nvmlDeviceGetMemoryInfo, h)
            util = _read(nv, nv.nvmlDeviceGetUtilizationRates, h)
            procs = _read(nv, nv.nvmlDeviceGetComputeRunningProcesses, h, default=[])
            out.append(Reading(i, float(util.gpu) if util is not None else None,
                               int(mem.used) if mem is not None else 0, int(mem.total) if mem is not None else 0,
                               tuple(sorted(p.pid for p in procs))))
        return out


class Recorded:
    """Readings recorded earlier (a `Recording`), replayed one sample per call (then no readings: the recording is
    over)."""

    def __init__(self, recording: Recording):
        self.kind = recording.kind
        self.recording = recording
        self._next = 0

    @classmethod
    def from_file(cls, path: Path | str) -> Recorded:
        return cls(Recording.model_validate_json(read_bounded(Path(path), 64 * MiB, "NVML recording")))

    def host(self) -> Host:
        return self.recording.host

    def links(self) -> list[Link]:
        return self.recording.links

    def sample(self) -> list[Reading]:
        samples = self.recording.samples
        if self._next >= len(samples):
            return []
        self._next += 1
        return samples[self._next - 1].devices


def reading_to_dict(r: Reading) -> dict:
    return {**asdict(r), "pids": list(r.pids)}


def replay() -> Recorded | None:
    """The recorded host named by DOCKYARD_NVML_REPLAY, read in place of NVML (a user's `doctor --record` file)."""
    path = os.environ.get(REPLAY_ENV)
    if not path:
        return None
    try:
        data = json_object(Path(path), "recorded NVML readings (`invoke doctor --record=FILE`)")
        # as JSON: strict Python mode would want Host and Gpu instances, not the objects the file holds
        source = Recorded(Recording.model_validate_json(json.dumps(data)))
    except OSError as e:
        raise DockyardError(f"{REPLAY_ENV}={path}: cannot read the recorded host ({e})") from None
    except ValidationError as e:
        raise DockyardError(f"{REPLAY_ENV}={path}: not a recorded host as `invoke doctor --record` writes it "
                            f"({problems(e)})") from None
    return source


def record(path: Path | str) -> dict:
    """Write what NVML reports now (host, links, one sample) in the fixtures' format; returns it."""
    locks.check_named_output(path, "--record")  # as written: `DIR/` names a folder
    locks.check_ours(path, "--record", b'"kind": "gpu"', "a recording of this command's")
    try:
        with nvml() as nv:
            data = {"kind": "gpu", "host": asdict(nv.host()), "links": [asdict(x) for x in nv.links()],
                    "samples": [{"devices": [reading_to_dict(r) for r in nv.sample()]}]}
    except NvmlUnavailable as e:
        data = {"kind": "gpu", "host": asdict(Host(error=str(e))), "links": [], "samples": []}
    try:
        locks.replace_file(Path(path), json.dumps(data, indent=1) + "\n")  # never through a link under its name
    except OSError as e:
        raise DockyardError(f"--record={path}: cannot write it ({e.strerror}); name a file in a folder you can "
                            "write to") from None
    return data


def gpu_index(token: str) -> int | None:
    """A GPU index as CUDA_VISIBLE_DEVICES and --gpus write it (ASCII digits: `²` is a digit to Python, not to
    int(); a 5,000-digit one is beyond int()'s limit), else None."""
    return int(token) if token.isascii() and token.isdigit() and len(token) <= 6 else None


def mig_advice(host: Host) -> tuple[str, str]:
    """(which GPUs have MIG mode on, what to do), or ("", "") where none has: said by doctor and by `invoke run`."""
    mig = [str(g.index) for g in host.gpus if g.mig]
    if not mig:
        return "", ""
    return (f"MIG mode on GPU {', '.join(mig)}",
            "dockyard trains on whole GPUs: NVML gives the GPU's memory, not a MIG slice's, so plan and the autos "
            f"would size the batch for memory a slice lacks; turn MIG off for training (`sudo nvidia-smi -i "
            f"{','.join(mig)} -mig 0`)")


def select(host: Host, spec: str = "") -> Host:
    """`host` limited to the GPUs of `spec` (`--gpus=0,2`) or else of CUDA_VISIBLE_DEVICES: indices or UUIDs.
    The process count follows what is left; docker gets the same list (`--gpus '"device=0,2"'`)."""
    if spec.strip() and not host.gpus:  # CUDA_VISIBLE_DEVICES left set on a host without GPUs is no request
        raise DockyardError(f"--gpus={cut(spec, 60)}, but {host.error or 'NVML sees no GPU on this host'}: leave --gpus out to "
                            "train on CPU")
    if spec.strip() and not spec.replace(",", "").strip():  # `--gpus=$A,$B` with both empty: no GPU named
        raise DockyardError(f"--gpus={short(spec)} names no GPU: give indices or UUIDs, as in --gpus=0,2 (leave it out for "
                            "all of them; --cpu trains on CPU)")
    flag = spec.strip()
    if flag.lower() == "all":  # docker's word for every GPU: as leaving --gpus out
        return host
    if not host.gpus or (not flag and os.environ.get("CUDA_VISIBLE_DEVICES") is None):
        return host
    if flag:
        source, tokens = f"--gpus={cut(flag, 60)}", [t.strip() for t in flag.split(",") if t.strip()]
    else:
        spec = os.environ["CUDA_VISIBLE_DEVICES"].strip()
        source, tokens = f"CUDA_VISIBLE_DEVICES={cut(spec, 60) or repr(spec)}", cuda_reads(spec)[0]
    if said := not_ascii(flag or spec):  # as run.sh refuses it; CUDA reads no GPU there
        raise DockyardError(f"{source} holds {said}: name a GPU by its index in the digits 0-9 (as in 0,2) or by its "
                            "UUID (nvidia-smi -L lists them)")
    if not flag and not tokens:  # CUDA sees no GPU (-1, an empty value), and the run trains on CPU as CUDA would
        return replace(host, gpus=[], visible="", error=f"{source} hides every GPU")
    chosen, seen = [], set()
    for token in tokens:
        if token.startswith("MIG-"):
            raise DockyardError(f"{cut(token, 60)} (from {source}) is a MIG device: runs take whole "
                                "GPUs; name the GPU, or turn MIG off (`invoke doctor` says how)")
        found = [g for g in host.gpus if (gpu_index(token) == g.index) or g.uuid == token]
        # or the start of one GPU's UUID, as CUDA takes it (GPU-5d5b)
        found = found or [g for g in host.gpus if len(token) > 4 and token.startswith("GPU-") and g.uuid.startswith(token)]
        if len(found) > 1:
            raise DockyardError(f"{cut(token, 60)} (from {source}) starts the UUID of several GPUs: "
                                "give more of it")
        if not found:
            count = (f"; --gpus takes GPUs by index, not a count: --gpus={','.join(map(str, range(len(host.gpus))))} "
                     f"for {flag} of them" if gpu_index(flag) == len(host.gpus) else "")
            raise DockyardError(f"GPU {short(token)} (from {source}) is not on this host: "
                                f"it has {', '.join(str(g.index) for g in host.gpus)}{count}")
        if flag and token in seen:  # typed twice (0,0 for 0,1?): CUDA_VISIBLE_DEVICES's repeat is one GPU, as
            # CUDA sees it (and run.sh takes it)
            raise DockyardError(f"--gpus={cut(flag, 60)}: GPU {cut(token, 60)} is named twice; one process per GPU, so "
                                "name each GPU once")
        seen.add(token)
        if found[0] not in chosen:
            chosen.append(found[0])
    return replace(host, gpus=chosen, visible=",".join(str(g.index) for g in chosen))


def not_ascii(spec: str) -> str:
    """The first character of a GPU list that is not ASCII, in words (a fullwidth `０`, an Arabic `٣`), "" where there
    is none: Python's isdigit() takes them, CUDA and run.sh do not, and `０,１` was "GPU '０' is not on this host: it has
    0, 1"."""
    odd = next((c for c in spec if not c.isascii()), "")
    return f"{odd!r} (U+{ord(odd):04X}), which is no ASCII character" if odd else ""


def cuda_reads(spec: str) -> tuple[list[str], str]:
    """The entries of CUDA_VISIBLE_DEVICES that CUDA reads, and where it stopped reading with entries left, in words
    ("" where it read them all). CUDA reads the list up to its first entry that names no device (an empty one, as in
    `0,,1`; -1; Slurm's NoDevFiles for a job given none; a word) and sees no GPU after it: `0,,1` is GPU 0 alone."""
    entries = [t.strip() for t in spec.split(",")]
    for n, token in enumerate(entries):
        if not ((token.isascii() and token.isdigit()) or token.startswith(("GPU-", "MIG-"))):
            left = any(entries[n + 1:])
            return entries[:n], (f"CUDA reads no further than its {f'entry {short(token)}' if token else 'empty entry'}"
                                 if left else "")
    return entries, ""


def hidden_by_environment(every: Host, kept: Host) -> str:
    """Where CUDA_VISIBLE_DEVICES (not --gpus) left fewer of the host's GPUs than it has, which it leaves, in words;
    "" otherwise. A value left in a shell (`export CUDA_VISIBLE_DEVICES=0` from an earlier test) trained on one of
    two GPUs with no word of the other: "DDP uses only one of my GPUs"."""
    if not every.gpus or len(kept.gpus) >= len(every.gpus):
        return ""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    _, stopped = cuda_reads(spec.strip())
    return (f"CUDA_VISIBLE_DEVICES={cut(spec, 60)} leaves GPU {', '.join(str(g.index) for g in kept.gpus) or 'none'} of "
            f"the {every.count}{f' ({stopped})' if stopped else ''}")


def docker_gpus(host: Host) -> str:
    """docker's --gpus value: a device list needs the inner quotes, or docker splits it at the comma."""
    return f'"device={host.visible}"' if host.visible else "all"
