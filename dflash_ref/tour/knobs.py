"""A notebook's knobs, held to what it offers: a value outside its range is refused in one line that names the
range, in the cell that first uses it, instead of an IndexError three cells later."""

from __future__ import annotations

from collections.abc import Sequence


def described(allowed: Sequence) -> str:
    if isinstance(allowed, range) and allowed.step == 1 and len(allowed) > 2:
        return f"{allowed.start} to {allowed.stop - 1}"
    return ", ".join(map(repr, allowed)) if allowed else "nothing (none to choose from)"


def knob(name: str, value, allowed: Sequence, why: str = "") -> None:
    """Nothing if `value` is one of `allowed`, else a ValueError: "name = value: this run offers name …"."""
    integral = isinstance(allowed, range)
    if (integral and (not isinstance(value, int) or isinstance(value, bool))) or value not in allowed:
        raise ValueError(f"{name} = {value!r}: this run offers {name} {described(allowed)}{f' ({why})' if why else ''}")
