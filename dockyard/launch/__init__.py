"""Starting training: one node's launch and every way of starting it.

  node       one node's launch, spelled once: torchrun and the trainer's argv, the rendezvous flags, the
             container's environment, the cluster's variant, the node checks (every launcher below uses it)
  multinode  finding the rendezvous: node 0's address, the interface the collectives use, InfiniBand
  inputs     the user's data, model and recipe folders as read-only mounts
  run        `invoke run` and `invoke shell`: the request checked, then the run folder claimed and the command run
  command    the command that trains one node (RunCommand): the one `docker run` builder, or --native's torchrun
  summary    a run's outcome in a few lines, from the manifest the trainer wrote
  preflight  what `invoke run` refuses before anything starts: overrides, inputs, CUDA ops, the disk
  monitor    the GPUs (or CPU ranks) sampled while a run lasts: balance warnings, plots, a verdict
  runscript  run.sh: the same command as POSIX sh, beside load.sh in every archive set
  slurm      `invoke slurm`: an sbatch script
  k8s        `invoke k8s`: an Indexed Job + Service, and a Kubeflow TrainJob
  export     `invoke export`: a run's model as a plain Hugging Face folder
  runs       `invoke runs`: the runs folder, one line per run
"""
