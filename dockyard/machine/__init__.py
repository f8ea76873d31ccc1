"""The machine: is this host ready (doctor, check, container, peer), what fits on it (planner), how busy it is
while a run lasts (monitor).

Host side, except planner.py, whose memory model the trainer also imports inside the image (standard library at
import time).
"""
