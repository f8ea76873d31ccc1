"""A stand-in Docker engine behind dockyard.engine's one runner, for unit tests of the host code around the
engine (what `invoke run` keeps after a failed container, what a refused load puts back). The integration tests
run the same paths against a real engine; this one only answers the docker CLI calls that host code makes.

It holds tags (ref → image id) and image ids, records every argv it is given, and answers `info`,
`image ls`, `image inspect`, `tag`, `rmi` as docker does; `run` is handed to `container`, a function of the
argv that plays the container (writes what it would write into the mounted folders) and returns its exit code.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

from dockyard import engine


class FakeEngine:
    def __init__(self, tags: dict[str, str] | None = None, images: set[str] | None = None,
                 container: Callable[[list[str]], int] | None = None, configs: dict[str, dict] | None = None,
                 root: str = ""):
        self.root = root  # `docker info`'s DockerRootDir, where docker load unpacks; "" for none said
        self.tags = dict(tags or {})
        self.configs = dict(configs or {})  # image id → its inspect's Config (Env, Labels)
        self.images = set(images or ()) | set(self.tags.values())
        self.container = container
        self.calls: list[list[str]] = []

    def install(self, monkeypatch, settings):
        """Route dockyard.engine's runner (engine_info and image_inspect call it too) here; returns the settings
        with the docker client named `docker`, so that no client on PATH is looked for or run."""
        self.host_run = engine.run  # what is not docker (`ip addr` for a run of several nodes) runs on this host
        monkeypatch.setattr(engine, "run", self.run)
        return settings.model_copy(update={"docker": "docker"})

    def run(self, argv, *, capture=False, check=True, quiet=False, input=None, env=None, **kw):
        argv = [str(a) for a in argv]
        if argv[0] != "docker":
            return self.host_run(argv, capture=capture, check=check, quiet=quiet, input=input, env=env, **kw)
        self.calls.append(argv)
        code, out = self._answer(argv[1:])
        if check and code:
            raise engine.failure(argv, code, [out])
        return subprocess.CompletedProcess(argv, code, out if capture else "", "" if code == 0 else out)

    def docker_calls(self, *first: str) -> list[list[str]]:
        """The argvs (without the client) that start with `first`."""
        return [a[1:] for a in self.calls if a[1:1 + len(first)] == list(first)]

    def _id(self, ref: str) -> str | None:
        return ref if ref in self.images else self.tags.get(ref)

    def _answer(self, args: list[str]) -> tuple[int, str]:
        match args:
            case ["info", *_]:
                return 0, json.dumps({"Runtimes": {"runc": {}}, "DriverStatus": [], "ServerErrors": None,
                                      **({"DockerRootDir": self.root} if self.root else {})})
            case ["image", "ls", *_]:
                named = {i: [r for r, t in self.tags.items() if t == i] for i in self.images}
                return 0, "".join(f"{i} {ref}\n" for i in sorted(self.images) for ref in named[i] or ["<none>:<none>"])
            case ["image", "inspect", ref]:
                image_id = self._id(ref)
                if image_id is None:
                    return 1, f"Error response from daemon: No such image: {ref}"
                return 0, json.dumps([{"Id": image_id, "RepoTags": sorted(r for r, t in self.tags.items()
                                                                         if t == image_id),
                                       "Config": self.configs.get(image_id, {"Labels": {}})}])
            case ["tag", source, target]:
                image_id = self._id(source)
                if image_id is None:
                    return 1, f"Error response from daemon: No such image: {source}"
                self.tags[target] = image_id
                return 0, ""
            case ["rmi", "--no-prune", ref] if ref in self.tags:
                del self.tags[ref]  # the untag alone: the image stays
                return 0, f"Untagged: {ref}"
            case ["rmi", image_id] if image_id in self.images:
                if image_id in self.tags.values():  # without -f docker keeps an image something still names
                    return 1, f"Error response from daemon: conflict: unable to delete {image_id[7:19]}"
                self.images.remove(image_id)
                return 0, f"Deleted: {image_id}"
            case ["run", *_] if self.container is not None:  # the container's exit code, or (code, what docker said)
                got = self.container(args)
                return got if isinstance(got, tuple) else (got, "")
        return 1, f"FakeEngine: no answer for docker {' '.join(args)}"
