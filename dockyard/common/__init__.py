"""Torch-free modules read by both worlds: the host tasks and the trainer in the image.

  errors        DockyardError, the one error type: a short message that says how to fix it
  recipes       the recipe registry: what each strategy is (engine, stage, offload, adapters)
  model_config  a model folder's config.json -> its shape (no weights read)
"""
