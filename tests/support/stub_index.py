"""A package index of the test's own, on 127.0.0.1: stub wheels (metadata only, no code) in a PEP 503 "simple"
folder, served by http.server in a thread. A real resolver (uv, pip) pointed at it resolves for real, from the
Requires-Dist lines the test wrote, and reaches nothing else.

    wheels = [stub_wheel(tmp_path / "files", "torch", "2.15.0", requires=['triton==3.9.0; platform_system == "Linux"'])]
    with serve_index(tmp_path, wheels) as index:
        ...  # index.url is http://127.0.0.1:PORT/simple; index.requested lists the paths asked for

`loopback_only_env()` is the environment that keeps such a resolver on loopback even where a command forgot the index:
every proxy variable names a closed loopback port, and only 127.0.0.1 and ::1 are reached directly.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import http.server
import re
import threading
import zipfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tests.support.ports import held_port


def normalized(name: str) -> str:
    """The PEP 503 name ("Nvidia_ML.py" → "nvidia-ml-py"): the simple index's folder of a project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def stub_wheel(folder: Path, name: str, version: str, requires: list[str] | tuple[str, ...] = (),
               tag: str = "py3-none-any") -> Path:
    """A valid wheel of `name` `version` holding only its .dist-info (METADATA with `requires` as Requires-Dist
    lines, WHEEL, RECORD), for the wheel tag `tag` (compressed tag sets, a.b-c-d.e, as in real file names)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{normalized(name).replace('-', '_')}-{version}"
    python, abi, platform = tag.split("-")
    tags = [f"{p}-{a}-{pl}" for p in python.split(".") for a in abi.split(".") for pl in platform.split(".")]
    files = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                      + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: dockyard-tests\n"
                                   f"Root-Is-Purelib: {'true' if tag == 'py3-none-any' else 'false'}\n"
                                   + "".join(f"Tag: {t}\n" for t in tags),
    }
    record = "".join(f"{path},sha256={_b64(hashlib.sha256(text.encode()).digest())},{len(text.encode())}\n"
                     for path, text in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    files[f"{dist}.dist-info/RECORD"] = record
    wheel = folder / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Index:
    url: str  # the simple index: http://127.0.0.1:PORT/simple
    requested: list[str] = field(default_factory=list)  # every path a client asked for, in order


@contextlib.contextmanager
def serve_index(root: Path, wheels: list[Path]):
    """Writes root/simple/ (a page per project, linking its wheels with their sha256) for `wheels` (which must lie
    under `root`) and serves `root` on 127.0.0.1 at a free port until the block ends; yields an Index."""
    by_project: dict[str, list[Path]] = {}
    for w in wheels:
        by_project.setdefault(normalized(w.name.split("-")[0]), []).append(w)
    simple = root / "simple"
    simple.mkdir(parents=True, exist_ok=True)
    (simple / "index.html").write_text(_page("".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(by_project))))
    for project, files in by_project.items():
        (simple / project).mkdir(exist_ok=True)
        links = "".join(f'<a href="/{html.escape(w.relative_to(root).as_posix())}#sha256={sha256(w)}">{w.name}</a>\n'
                        for w in files)
        (simple / project / "index.html").write_text(_page(links))
    requested: list[str] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, requested, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="stub-index", daemon=True)
    thread.start()
    try:
        yield Index(f"http://127.0.0.1:{server.server_address[1]}/simple", requested)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def loopback_only_env():
    """Proxy variables that send whatever is not for 127.0.0.1 or ::1 to a loopback port that refuses it (bound,
    never listening): a resolver given no index of ours fails at once instead of asking DNS for pypi.org."""
    with held_port() as port:
        proxy = f"http://127.0.0.1:{port}"
        env = {k: proxy for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")}
        yield env | {"NO_PROXY": "127.0.0.1,::1", "no_proxy": "127.0.0.1,::1"}


class _Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, requested: list[str], *args, **kwargs):
        self._requested = requested
        super().__init__(*args, **kwargs)

    def do_GET(self):
        self._requested.append(self.path)
        super().do_GET()

    def log_message(self, *args):  # not a line on stderr per request
        pass


def _page(body: str) -> str:
    return f"<!DOCTYPE html>\n<html><body>\n{body}</body></html>\n"


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
