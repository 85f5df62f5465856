"""How the command line writes a count and an amount of money: one way for
every command (``1 branch``, ``2 branches``; ``$0.000273``)."""

from __future__ import annotations

__all__ = ["money", "plural"]

_MONEY_PLACES = 8  # a single token of a cheap model costs about 1e-7 dollars


def plural(count: float, singular: str, many: str | None = None) -> str:
    """``count`` and the noun it takes: ``1 call``, ``0 calls``, ``3 branches``
    (``many`` for a plural that is not ``singular`` + s). A count with a
    fraction is written as Python's ``g`` format writes it."""
    shown = f"{int(count)}" if float(count).is_integer() else f"{count:g}"
    return f"{shown} {singular if count == 1 else (many or singular + 's')}"


def money(cost: float) -> str:
    """An amount in dollars, never in exponent notation: at least two places
    and as many more as it takes, up to eight (``$0.50``, ``$0.000273``,
    ``$12.00``, ``$0.00000015``)."""
    whole, _, places = f"{cost:.{_MONEY_PLACES}f}".partition(".")
    return f"${whole}.{places.rstrip('0').ljust(2, '0')}"
