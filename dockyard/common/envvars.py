"""The DOCKYARD_* variables that cross the border: set by the host (`invoke run`, run.sh, the sbatch script, the
pods' command, compose) and read by the trainer in the image, or set by a user for the host. One name each."""

# host → trainer
IMAGE_REF = "DOCKYARD_IMAGE_REF"        # the image the run trains in, as the user named it (manifest: image.ref)
IMAGE_ID = "DOCKYARD_IMAGE_ID"          # its id (manifest: image.id)
VARIANT = "DOCKYARD_VARIANT"            # its variant (manifest: variant; "native" without one)
HOST_PATHS = "DOCKYARD_HOST_PATHS"      # JSON {path inside: host path} of the mounted inputs (manifest: inputs) and,
                                        # from run.sh, its other mounts (the paths the trainer's lines name: on_host)
NODE_RANK = "DOCKYARD_NODE_RANK"        # the node's rank as the user numbered it (--node-rank, SLURM_NODEID, ...)
RENDEZVOUS = "DOCKYARD_RENDEZVOUS"      # JSON: how the nodes found each other (endpoint, id, join timeout, ...)
CPU_SHARE = "DOCKYARD_CPU_SHARE"        # the OMP_NUM_THREADS the image's torchrun gave each process (the trainer
                                        # shares its NUMA node's cores out instead where it binds to them)
SUMMARISED = "DOCKYARD_SUMMARISED"      # "1": the command that started the run prints its summary from the manifest
                                        # (`invoke run`); elsewhere (run.sh, sbatch, pods) rank 0 logs one itself
OPS_CACHE = "DOCKYARD_OPS_CACHE"        # the compile cache's folder for the C++ ops torch builds on first use: the
                                        # trainer builds them in a folder of its Python and torch under it
JOIN_TIMEOUT = 120  # its join_timeout where none is given: seconds node 0 waits for the others (torchrun's: 600)
MOST = 4096  # processes of a node, nodes of a run: what invoke run (flags.Count), run.sh and the image's torchrun take
LONGEST_WAIT = 7 * 24 * 3600  # seconds the nodes may wait for each other (--join-timeout, JOIN_TIMEOUT): a week

# user → trainer or host
SHARED_TIMEOUT = "DOCKYARD_SHARED_TIMEOUT"  # seconds the nodes wait to see each other's files on shared storage
MEMLOCK = "DOCKYARD_MEMLOCK"            # bytes of locked memory the engine grants, where the host cannot read it
ATTEMPT = "DOCKYARD_ATTEMPT"            # the workers' attempt (1, then 2 after a restart), as the image's torchrun
#   counts the nodes' meetings: torchrun's own TORCHELASTIC_RESTART_COUNT stays 0 on a node whose workers it restarted
#   because another node's failed and came back (only a node's own failure counts there)
RUN_ID = "DOCKYARD_RUN_ID"              # the run id of an sbatch script's (and compose's) run


def shared_timeout() -> float:
    """DOCKYARD_SHARED_TIMEOUT's seconds (30 where unset), or one error line for a value that is not a number of
    seconds (it was a ValueError traceback as the trainer was imported)."""
    import math
    import os

    from dockyard.common.errors import DockyardError

    raw = os.environ.get(SHARED_TIMEOUT, "30")
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 86400:
        raise DockyardError(f"{SHARED_TIMEOUT}={raw!r}: give the seconds the nodes wait to see each other's files in "
                            "the run folder, e.g. 120 (at most 86400)")
    return value


def host_paths() -> dict | None:
    """DOCKYARD_HOST_PATHS, {path inside: host path}, as invoke run and run.sh set it; None where it is no JSON
    object ({} where it is not set)."""
    import os

    from dockyard.common.errors import loads

    try:
        host = loads(os.environ.get(HOST_PATHS) or "{}")
    except ValueError:
        return None
    return host if isinstance(host, dict) else None
