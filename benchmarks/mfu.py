"""Model FLOPs utilisation, as the benchmarks report it: the trainer's own formula and peak table
(dockyard/train/mfu.py), so a benchmark's MFU and a run's manifest agree."""

from dockyard.train.mfu import PEAK, attention_length, flops_per_token, mfu, peak_flops

__all__ = ["PEAK", "attention_length", "flops_per_token", "mfu", "peak_flops"]
