"""Units shared by the planner, doctor and the trainer's guards: memory is counted in GiB (2^30 bytes)."""

GIB = 2**30
