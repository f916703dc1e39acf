"""How perdure writes a duration for people (ETA basis, budget amounts, watchdog
findings): whole seconds below two minutes, whole minutes below two hours, then
hours to a tenth, and days past two days where a text may span that long. Pure."""

from __future__ import annotations


def duration_text(seconds: float, *, days: bool = False) -> str:
    """45 s, 30 min, 2.5 h; with `days`, 3.0 d from two days on."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if not days or seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
