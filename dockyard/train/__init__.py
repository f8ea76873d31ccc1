"""The image side: the trainer `invoke run` starts in the container (`python -m dockyard.train`).

Needs the training stack (torch, transformers, DeepSpeed, PEFT); the host side of the project never imports
it. What it shares with the host is torch-free, and all of it in dockyard.common: the recipe registry, the run
settings, the run folder's contract, DockyardError, model_config, units, the memory model (its prediction goes
next to the measured peak), the `auto` settings' rules (autos) and the disk estimate. It imports no host
module of dockyard (tests/unit/test_layers.py holds that).

  __main__   main: open the run folder, training arguments, data, model, fit, measure, write the manifest
  opening    the run folder opened: the recipe and settings checked, a resume's lock, settings and checkpoint
  arguments  transformers.TrainingArguments from the recipe and settings (forms the process group)
  logs       train.log and the console: which lines go where
  trainer_errors  the Trainer's errors in fit, in one line (out of memory, stopped before its first step)
  environment  what the `auto` settings (dockyard.common.autos) are resolved against: the GPUs torch sees, Liger
  data       the user's data: formats detected, tokenised, eval split
  model      the model: made or loaded, precision, adapters, quantisation
  guards     what is refused before training (one process per GPU, host memory for offload, ...)
  strategy   the engine really in effect after the Trainer wrapped the model
  callbacks  metrics per logging window (tokens/s, MFU), checkpoints published, the strategy check
  checkpoints  what a resume may unpickle (weights only, an allow-list)
  mfu        FLOPs per token and GPU peaks: the one MFU formula
  nodes      several nodes: shared storage, a lost node named
  manifest   manifest.json and the checkpoint a resume continues from
  precision  bf16/fp16/fp32 from the GPU's compute capability
  torchrun   torchrun, saying a failed worker in one line instead of its own traceback (the images' torchrun)
  cpus       the CPUs each process runs on: bound to its GPU's NUMA node, its share of the cores as threads
  export     a run's model as a plain Hugging Face folder
"""

import os
import signal

# The process that started this one, read before the trainer imports torch (seconds in which it could die): a
# worker of torchrun's agent dies with it (environment.die_with_launcher)
LAUNCHER = os.getppid()

if "TORCHELASTIC_RUN_ID" in os.environ:
    # Ctrl-C while a worker still imports torch and transformers (seconds): KeyboardInterrupt's traceback from deep in
    # an import, from every worker. Until main() takes over (and says it in one line), it ends the worker quietly.
    signal.signal(signal.SIGINT, lambda _signum, _frame: os._exit(128 + signal.SIGINT))
