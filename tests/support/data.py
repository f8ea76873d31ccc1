"""Data files for tests of other things than the data's size: a step's worth of examples, so that `invoke run` (which
refuses data of fewer examples than one optimizer step takes) gets on to what the test is about."""

# examples: a step of any run these tests start, or more (8 per process: 2 CPU processes, 4 on two nodes, a
# Slurm job's nodes × their processes)
STEP = 64


def a_step_of(*lines: str) -> str:
    """The text of a data file of `lines` (each one example, a .csv's rows without their header), repeated to make
    STEP examples."""
    return "".join(f"{line}\n" for line in lines) * -(-STEP // len(lines))
