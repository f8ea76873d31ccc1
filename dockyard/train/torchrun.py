"""torchrun, without its traceback when a worker fails: `python -m dockyard.train.torchrun ARGS` is `torchrun ARGS`.

A trainer that refuses a setting says why in one line and exits 1; torchrun then raised ChildFailedError out of its
own main, and Python printed forty lines of traceback and a table under that line. Here the failure is one line too:
which rank failed first, how, where its reason is. The exit status is torchrun's (1). The images' `torchrun` is this
(images/Dockerfile), so every launcher that starts torchrun in an image (invoke run, run.sh, Slurm, Kubernetes,
compose) gets it; native runs start it by name (dockyard.launch.run.native_command).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

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
