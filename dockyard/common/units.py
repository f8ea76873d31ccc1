"""Units shared by the planner, doctor and the trainer's guards: memory is counted in GiB (2^30 bytes); sizes said to
users in decimal units (`human`)."""

GIB = 2**30


def human(n: float) -> str:
    """Bytes in decimal units, as `df -H` and transfer tools show them."""
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"


def duration(seconds: float) -> str:
    """A time span as a user reads it in a log: "42 s", "2.5 min", "17 min", "3.3 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 10 * 60:
        return f"{seconds / 60:.1f} min"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
