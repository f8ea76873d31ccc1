"""The machine: is this host ready (doctor), what fits on it (plan), how busy it is while a run lasts (monitor).

Host side, except plan.py, which the trainer also imports inside the image (standard library at import time).
"""
