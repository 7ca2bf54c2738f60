"""Transcendentals that decide, computed the same on every platform (DESIGN §3).

`math.log`, `math.exp` and `math.cos` are the platform's libm: glibc, musl, macOS and Windows disagree in
the last bit for some arguments, and an Evo-MedAgent utility, a SkeMex strength or a BM25 idf that differs
in its last bit can flip a ranking and so the bytes of a run. Python's `decimal` is a software
implementation (libmpdec) whose `ln` and `exp` are correctly rounded at the context's precision; computed
at 40 significant digits and rounded once to the nearest float, the result is the correctly rounded float
except where the true value lies within 1e-40 (relative) of a midpoint between two floats, and in every
case it is the same float everywhere. (`math.sqrt` needs nothing: IEEE 754 requires it to be correctly
rounded, as +, −, ×, ÷ are.)

The arguments these functions see repeat (counts, half-integers, a few windows), so results are memoised.
"""

from __future__ import annotations

from decimal import Context, Decimal
from functools import lru_cache

_CTX = Context(prec=40)
_PI = Decimal("3.141592653589793238462643383279502884197169399375105820974944")


@lru_cache(maxsize=65536)
def ln(x: float) -> float:
    """Natural logarithm, the same float on every platform (x > 0)."""
    if x <= 0:
        raise ValueError(f"ln of {x!r}")
    return float(_CTX.ln(Decimal(x)))


@lru_cache(maxsize=65536)
def exp(x: float) -> float:
    """e**x, the same float on every platform."""
    return float(_CTX.exp(Decimal(x)))


def _cos_decimal(x: Decimal) -> Decimal:
    """cos by its Taylor series at 60 digits, for |x| ≤ 2π (the series converges fast there)."""
    ctx = Context(prec=60)
    term, total, x2, k = Decimal(1), Decimal(1), ctx.multiply(x, x), 0
    while True:
        k += 2
        term = ctx.divide(ctx.multiply(ctx.minus(term), x2), Decimal(k * (k - 1)))
        if term.is_zero() or term.copy_abs() < Decimal("1e-58"):
            return total
        total = ctx.add(total, term)


@lru_cache(maxsize=4096)
def cos_pi_fraction(num: int, den: int) -> float:
    """cos(π·num/den) for integers with 0 ≤ num ≤ 2·den: the argument is formed in decimal too, so no
    float product π·num/den (itself rounded) comes first."""
    if den <= 0 or not 0 <= num <= 2 * den:
        raise ValueError(f"cos(pi*{num}/{den}) is outside [0, 2pi]")
    ctx = Context(prec=60)
    x = ctx.divide(ctx.multiply(_PI, Decimal(num)), Decimal(den))
    return float(Context(prec=40).plus(_cos_decimal(x)))
