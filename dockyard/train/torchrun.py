"""torchrun, without its traceback when a worker fails: `python -m dockyard.train.torchrun ARGS` is `torchrun ARGS`.

A trainer that refuses a setting says why in one line and exits 1; torchrun then raised ChildFailedError out of its
own main, and Python printed forty lines of traceback and a table under that line. Here the failure is one line too:
which rank failed first, how, where its reason is. The exit status is torchrun's (1). The images' `torchrun` is this
(images/Dockerfile), so every launcher that starts torchrun in an image (invoke run, run.sh, Slurm, Kubernetes,
compose) gets it; native runs start it by name (dockyard.launch.run.native_command).

It also makes restarts (--max-restarts) work. By default torchrun's agent keeps one TCPStore for every attempt and
the workers' process group uses it without a per-attempt prefix, so a restarted worker can read the address its
dead predecessor published (pytorch/pytorch#135712, #167288): gloo then fails with "connection refused" and NCCL
connects to a stale port, or both ranks wait in init_process_group for ever. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
gives each attempt a store of its own, hosted by its rank 0 (torchrun's behaviour before torch 2.5); a user who
sets the variable keeps their value.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # a store per attempt: see above
    try:
        torchrun(argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit {failure.exitcode}"
        print(f"torchrun: {e.name} failed: rank {rank} (local rank {failure.local_rank}) first, {how}; its reason is "
              "above (and in the run's train.log)", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
