"""Torch-free modules read by both worlds: the host tasks and the trainer in the image. They import nothing of
dockyard but each other (tests/unit/test_layers.py holds that).

  errors        DockyardError, the one error type: a short message that says how to fix it
  recipes       the recipe registry: what each strategy is (engine, stage, offload, adapters)
  run_settings  a run's settings: recipes/defaults.yaml + the recipe's file + the trainer overrides, merged into
                the project's own (RunSettings) and TrainingArguments'; which keys a run takes; what a resume keeps
  overrides     the trainer overrides after `--` read as YAML scalars (and `1e-3` as a number, in the files too)
  training_args TrainingArguments' values checked without transformers: types, ranges, the names a field takes
  passthrough   the TrainingArguments handed to the Trainer as given, checked as the pinned transformers reads them
  batch         a step's examples split (global_batch, micro-batch, accumulation) and the auto settings' values,
                checked alike by the host and the trainer
  model_config  a model folder's config.json -> its shape (no weights read)
  precision     which 16-bit type a run trains in, by the GPU's compute capability unless bf16/fp16 say
  archs         which GPUs a CUDA build has code for (an image's archs, or the trainer's torch, against the GPU)
  memory        the memory model: a model's shape, a recipe's GPU and host bytes, the auto micro-batch's fit
  autos         what the `auto` settings become on a GPU (micro-batch, checkpointing, compile, Liger, packing):
                the trainer runs it, `invoke plan` shows it
  disk          what a run writes (checkpoints, the final model) and whether the runs folder has room
  data_files    what the trainer reads as data (file kinds, hub ids), so `invoke run --dry` checks it the same way
  runfolder     the run folder's contract: its file names, and reading and writing them without following a link
  tree          folders read as untrusted input, walked without recursion and without following a link
  locks         one process at a time on files in folders others may write; this user's private folder
  kernels       GPU kernels in a torch.profiler trace: how long the GPU was busy, with what kind of work
  envvars       the DOCKYARD_* variables host and image exchange
  cores         the cores a process may use (affinity, physical cores, the cgroup's quota)
  units         GIB
"""
