"""Shared fixtures. Integration tests use the real Docker engine that .ci/run starts; nothing is faked
except NVML readings (recorded, fed through dockyard.gpus.Host) where a test needs GPUs this host lacks."""

from __future__ import annotations

import os

import pytest

# Nothing in the tests may reach the Hugging Face Hub (or any address but loopback and the test namespaces):
# set before any test module imports transformers or datasets, which read these once.
os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"

from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from dockyard import ENV_PREFIX, engine
from dockyard import settings as settings_mod
from dockyard.images import variants
from dockyard.settings import ROOT
from tests.support.buildcache import build_image
from tests.support.ports import held_port


def _import_tasks_keeping_the_setting_overrides() -> None:
    """tasks.py, when imported, takes every INVOKE_DOCKYARD_* out of os.environ (dockyard.cli.hold_setting_overrides:
    what Invoke's own process needs) and only a task puts them back. Imported here, once, before any test module
    imports it, and the overrides the suite was started with put back: a module that imports tasks
    (test_docs_commands) took INVOKE_DOCKYARD_COMPOSE and the rest from every test collected after it."""
    started_with = {key: value for key, value in os.environ.items() if key.startswith(ENV_PREFIX)}
    import tasks  # noqa: F401 - its first import is the one that holds the overrides back

    os.environ.update(started_with)


_import_tasks_keeping_the_setting_overrides()

# Property tests are timed by nothing but pytest-timeout: Hypothesis's 200 ms deadline per example failed them on a
# loaded CI host ("Unreliable test timings"), where a test had not set its own. The examples are the same in every run
# (derandomize): a new random example that finds a bug turned a CI red on a change that had nothing to do with it
# (`--run_name ::`, found so). HYPOTHESIS_PROFILE=explore draws new examples each run, to look for more.
hypothesis_settings.register_profile("dockyard", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                                     derandomize=True)
hypothesis_settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dockyard"))


IMAGES = ("cpu_image", "cuda_image", "cuda12_image")  # the order .ci/run builds them in


def pytest_collection_modifyitems(items):
    """Unit tests take seconds (the slowest 52 s on 2 cores beside a CI run): one that hangs costs 5 minutes of CI's 90,
    not the 15 of pyproject's limit for any test.

    Tests run in the order the images they need are built: on a fresh machine the three builds take ~40 minutes of 2
    cores (most of it DeepSpeed's ops, for 7 GPU architectures in cu132), which .ci/run starts in the background (the
    cpu image first, then both CUDA images), below the tests' CPU share, so that they take what the tests leave idle.
    First the tests that need no image (the unit tests among them), then the modules that need the cpu image (whole,
    so a module's fixtures are set up once), then the tests of each CUDA image, and last those that must not share
    the disk with a build under way. A fixture that needs an image waits for its build (tests/support/buildcache.py)."""
    for item in items:
        if item.path.parent.name == "unit" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(300))
    needs = {item: _image_needed(item) for item in items}
    module = {}
    for item, need in needs.items():
        if need <= 1:
            module[item.path] = max(module.get(item.path, 0), need)
    items.sort(key=lambda item: needs[item] if needs[item] > 1 else module[item.path])  # stable within each


def _image_needed(item) -> int:
    """0: none; 1, 2, 3: the images in the order .ci/run builds them (the last one the test needs); 4: a test that
    must not share the disk with a build under way."""
    if item.get_closest_marker("after_every_build"):
        return len(IMAGES) + 1
    callspec = getattr(item, "callspec", None)
    names = set(item.fixturenames) | ({v for v in callspec.params.values() if isinstance(v, str)} if callspec else set())
    return max((i for i, image in enumerate(IMAGES, 1) if image in names), default=0)


@pytest.fixture(scope="session")
def settings():
    import yaml

    # invoke.yaml, and the INVOKE_DOCKYARD_* overrides read by settings.load, as the tasks read them
    return settings_mod.load(yaml.safe_load((ROOT / "invoke.yaml").read_text())["dockyard"])


@pytest.fixture(scope="session", autouse=True)
def private_layer_cache(tmp_path_factory):
    """Saves made by the tests keep their compressed layers in a cache of their own, not the user's, held to 4 GB
    (the default 20 GB would fill with every CUDA image the suite saves, on a disk the node-2 engines share)."""
    os.environ["INVOKE_DOCKYARD_LAYER_CACHE"] = str(tmp_path_factory.mktemp("layer-cache"))
    os.environ["INVOKE_DOCKYARD_LAYER_CACHE_GB"] = "4"


@pytest.fixture(scope="session", autouse=True)
def private_jobs_folder(tmp_path_factory):
    """`invoke slurm` and `invoke k8s` without --out write their files into a folder of the suite's own, not the
    checkout's jobs/."""
    os.environ["INVOKE_DOCKYARD_JOBS_DIR"] = str(tmp_path_factory.mktemp("jobs"))


@pytest.fixture(scope="session", autouse=True)
def private_compile_cache(tmp_path_factory):
    """Runs in the images keep torch.compile's kernels in a cache of the suite's own (made 0700), not the user's."""
    os.environ["INVOKE_DOCKYARD_COMPILE_CACHE"] = str(tmp_path_factory.mktemp("compile-cache"))


@pytest.fixture(autouse=True)
def process_state_as_it_was():
    """What a test changes in this process's environment and signal handlers goes back as it ends. The trainer's
    main(), run in-process by several unit tests, sets DS_ACCELERATOR and OMP_NUM_THREADS, binds SIGTERM and leaves
    SIGINT ignored (its clean-up's guard): every process a later test started inherited SIGINT ignored."""
    import signal

    from dockyard.images import variants

    environ = dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    variants._SAID.clear()  # each test is a command line of its own: it is told how its variant was chosen
    yield
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
    # only what changed, key by key: threads of earlier tests still read the environment (and pytest's own
    # PYTEST_CURRENT_TEST changes with every phase)
    for key in set(os.environ) - set(environ) - {"PYTEST_CURRENT_TEST"}:
        del os.environ[key]
    for key, value in environ.items():
        if key != "PYTEST_CURRENT_TEST" and os.environ.get(key) != value:
            os.environ[key] = value


@pytest.fixture
def loopback_port():
    """A port on 127.0.0.1 that nothing listens on, held for the test (tests/support/ports.py): for torchrun's
    rendezvous or a gloo group the test starts, or a port that must refuse."""
    with held_port() as port:
        yield port


@pytest.fixture(scope="session")
def engine_ready(settings):
    """The real engine must answer: CI starts one. A missing engine is a failure, not a skip."""
    return engine.engine_info(settings)


@pytest.fixture(scope="session")
def cpu_image(settings, engine_ready) -> str:
    """The project's cpu image, built once per session through `invoke build` (cached layers make it quick)."""
    return build_image(settings, variants.resolve(settings, "cpu")[0])


@pytest.fixture(scope="session")
def cuda_image(settings, engine_ready) -> str:
    """The newest CUDA variant's image, built for real once per session through `invoke build` (no GPU needed:
    the toolkit comes from the lock's wheels, the build checks run without one). Cold: see benchmarks/results."""
    return build_image(settings, variants.newest_cuda(settings))


@pytest.fixture(scope="session")
def cuda12_image(settings, engine_ready) -> str:
    """The CUDA 12 variant's image (cu128: older drivers), built the same way from the same Debian base, without
    nvcc (PyPI's CUDA 12 wheels have none): once per session, shared by its tests."""
    return build_image(settings, variants.oldest_cuda(settings))
