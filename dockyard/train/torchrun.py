"""torchrun, without its traceback when a worker fails: `python -m dockyard.train.torchrun ARGS` is `torchrun ARGS`.

A trainer that refuses a setting says why in one line and exits 1; torchrun then raised ChildFailedError out of its
own main, and Python printed forty lines of traceback and a table under that line. Here the failure is one line too:
which rank failed first, how, where its reason is. The exit status is torchrun's (1). The images' `torchrun` is this
(images/Dockerfile), so every launcher that starts torchrun in an image (invoke run, run.sh, Slurm, Kubernetes,
compose) gets it; native runs start it by name (dockyard.launch.run.native_command).

It also makes restarts (--max-restarts) work. torchrun's agent holds the store the workers' process group meets
in, and its handler is meant to start a new one for each attempt (pytorch/pytorch#135957); torch 2.10-2.15 start
one for the first attempt only and keep it. A restarted worker could then read the address its dead predecessor had
left there (pytorch/pytorch#135712): gloo failed with "connection refused", NCCL would connect to a stale port, or
every rank waited in init_process_group for ever. Here each rendezvous round starts the handler's store afresh, so
each attempt meets in an empty one, still held by the agent (it outlives the workers: the nodes' heartbeat watches
it, dockyard.train.nodes). A torch without those fields gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 instead (the
store is then held by the first worker).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    fresh_store_per_attempt()
    try:
        torchrun(argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit {failure.exitcode}"
        print(f"torchrun: {e.name} failed: rank {rank} (local rank {failure.local_rank}) first, {how}; its reason is "
              "above (and in the run's train.log)", file=sys.stderr, flush=True)
        return 1
    return 0


def fresh_store_per_attempt() -> None:
    """Each rendezvous round of torchrun's c10d handler starts a new store for the workers (see above)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    first = DynamicRendezvousHandler.next_rendezvous
    if getattr(first, "fresh_store_per_attempt", False):
        return

    def next_rendezvous(self):
        if hasattr(self, "_bootstrap_store_info") and hasattr(self, "_shared_tcp_store_server"):
            self._bootstrap_store_info = None  # rank 0 starts a new server, the others read where from the round
            self._shared_tcp_store_server = None
        else:
            os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        return first(self)

    next_rendezvous.fresh_store_per_attempt = True
    DynamicRendezvousHandler.next_rendezvous = next_rendezvous


if __name__ == "__main__":
    sys.exit(main())
