"""Starting training: one node's launch and every way of starting it.

  multinode  the rendezvous and one node's torchrun line under a scheduler
  inputs     the user's data, model and recipe folders as read-only mounts
  run        `invoke run`: the docker run of one node (RunCommand), its checks, its summary
  runscript  run.sh: the same command as POSIX sh, beside load.sh in every archive set
  slurm      `invoke slurm`: an sbatch script
  k8s        `invoke k8s`: an Indexed Job + Service, and a Kubeflow TrainJob
  export     `invoke export`: a run's model as a plain Hugging Face folder
"""
