"""Rate profiles of synthetic sources: constant, `steps`, a `csv` of rates, or a named preset.

The presets reproduce the shape of AUTOSCALE's input streams (Kotto Kombi, Lumineau, Lamarre; the paper's
Fig. 7 and Fig. 8, docs/papers.md), scaled to the source's `rate` (the high rate):

- ``autoscale-3-step``: a low constant rate, a progressive increase to the high rate, a long plateau there,
  a marked decrease back to the low rate, which holds: low (25 %) 2 steps, ramp over 2 steps, high 3
  steps, fall within half a step, low 2 steps.
- ``autoscale-5-step``: sudden jumps without transitions: low (20 %), very high (100 %), lower (40 %),
  very high again, low; one step each.

A step lasts `stepSeconds` (60 by default). Like the paper's streams they carry small irregular
fluctuations, `fluctuation` (5 % by default, 0 for none) of the rate, changing every second and the same on
every run. Profiles repeat after their last step.
"""

from __future__ import annotations

import bisect
import itertools
import math
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: preset name -> segments (share of the high rate at the start, at the end, length in steps); a segment
#: whose two shares differ is a ramp
PRESETS: Mapping[str, tuple[tuple[float, float, float], ...]] = {
    "autoscale-3-step": (
        (0.25, 0.25, 2.0),
        (0.25, 1.0, 2.0),
        (1.0, 1.0, 3.0),
        (1.0, 0.25, 0.5),
        (0.25, 0.25, 2.0),
    ),
    "autoscale-5-step": (
        (0.2, 0.2, 1.0),
        (1.0, 1.0, 1.0),
        (0.4, 0.4, 1.0),
        (1.0, 1.0, 1.0),
        (0.2, 0.2, 1.0),
    ),
}
DEFAULT_STEP_SECONDS = 60.0
DEFAULT_FLUCTUATION = 0.05
#: the highest rate a source may offer, in events per second (a step's, a csv line's, a profile's high rate)
MAX_RATE = 10_000_000
#: the longest step of `steps` and the longest `stepSeconds` of a profile: a day
MAX_STEP_SECONDS = 86_400
#: the most entries of `steps` (the CRD's maxItems) and lines of rates a `csv` file may hold (a day's seconds)
MAX_STEPS = 10_000
MAX_CSV_RATES = 86_400
#: keys of a synthetic source's block that choose its rate over time (at most one of them)
PROFILE_KEYS = ("steps", "csv", "profile")


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple, _REPR.maxset = 2, 4, 4, 4, 4


def shown(value: Any) -> str:
    """`value` as a message may show it: its repr, cut short (a long string, a big list, an integer of
    thousands of digits), on one line. Never raises."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        return _REPR.repr(value)
    except Exception:  # a huge integer nested in a container, an object whose repr fails
        return f"a {type(value).__name__}"


def _jitter(second: int) -> float:
    """A deterministic value in [-1, 1) for one second of a profile."""
    return ((second * 2654435761 + 12345) & 0xFFFF) / 32768.0 - 1.0


def preset_steps(
    name: str, rate: float, step_seconds: float = DEFAULT_STEP_SECONDS, fluctuation: float = DEFAULT_FLUCTUATION
) -> list[tuple[float, float]]:
    """The preset as (rate, seconds) pieces: a piece per second of ramps and of fluctuating plateaus."""
    pieces: list[tuple[float, float]] = []
    second = 0
    for start, end, steps in PRESETS[name]:
        length = steps * step_seconds
        if start == end and fluctuation == 0.0:
            pieces.append((start * rate, length))
            second += math.ceil(length)
            continue
        whole, elapsed = math.ceil(length), 0.0
        for i in range(whole):
            duration = min(1.0, length - elapsed)
            share = start + (end - start) * (i + 0.5) / whole
            pieces.append((max(0.0, share * rate * (1.0 + fluctuation * _jitter(second))), duration))
            elapsed += duration
            second += 1
    return pieces


def parse_rates(lines: Iterable[str]) -> list[float]:
    """Rates from a CSV's lines (the first column; blank lines and lines starting with # skipped).
    Raises ValueError naming the line of a bad value."""
    rates: list[float] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        cell = text.split(",")[0].strip()
        # the file's content is never echoed: the message goes to logs and status, the file may be anything
        try:
            value = float(cell)
        except ValueError:
            raise ValueError(f"line {number}: the first column is not a number") from None
        if not math.isfinite(value) or not 0 <= value <= MAX_RATE:
            raise ValueError(f"line {number}: the rate is not a finite number in [0, {MAX_RATE:g}] events/s")
        if len(rates) == MAX_CSV_RATES:
            raise ValueError(f"holds more than {MAX_CSV_RATES} rates (a day of seconds); shorten it")
        rates.append(value)
    if not rates:
        raise ValueError("holds no rate (one number per line, one line per second)")
    return rates


def is_finite_number(value: Any) -> bool:
    """An int or a finite float (not a bool, NaN or an infinity). Never raises, whatever the integer's size."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


def csv_path_problem(csv: str) -> str | None:
    """Why a `csv:` path may not be used, or None: it must stay inside the rate directory (relative, no
    `..`, no `~`, no NUL), whatever the file system holds; `worker_inputs.rate_files.resolve_rate_file` also checks
    where its links lead."""
    if "\x00" in csv:
        return "holds a NUL character"
    if csv.startswith("~"):
        return "starts with ~ (a home directory)"
    if csv.startswith("/"):
        return "is an absolute path"
    if ".." in csv.replace("\\", "/").split("/"):
        return "climbs out with .."
    return None


def rate_config_problems(config: Mapping[str, Any], path: str) -> list[str]:
    """What the CRD does not say of a synthetic source's `steps`, `csv` or `profile` (`path` names the block, e.g.
    ``spec.vertices[0].source``), one line each, naming the field and the fix: at most one of the three, a csv path
    inside the rate directory, a profile's `rate` above 0 and its whole period within a day. Their types, ranges
    and the preset names are the CRD's; a CSV's content is checked where the file is read."""
    chosen = [k for k in PROFILE_KEYS if k in config]
    if len(chosen) > 1:
        return [f"{path}: has {' and '.join(chosen)}; give at most one of steps, csv, profile"]
    problems: list[str] = []
    csv = config.get("csv")
    if isinstance(csv, str) and (why := csv_path_problem(csv)) is not None:
        problems.append(
            f"{path}.csv: {shown(csv)} {why}; give a path relative to the rate directory "
            "(ELASTREAM_RATE_DIR, else the manifest's directory), e.g. csv: rates.csv"
        )
    name = config.get("profile")
    if isinstance(name, str) and name in PRESETS:
        rate = config.get("rate")
        if rate is None or rate == 0:
            problems.append(f"{path}.rate: {shown(rate)} is not a number > 0; a profile scales to rate (its high rate)")
        step = config.get("stepSeconds", DEFAULT_STEP_SECONDS)
        steps_long = sum(length for _, _, length in PRESETS[name])
        if is_finite_number(step) and step * steps_long > MAX_STEP_SECONDS:
            # a preset is built second by second: its whole period, not one step, is held to a day
            most = int(MAX_STEP_SECONDS // steps_long)
            problems.append(
                f"{path}.stepSeconds: {shown(step)} makes {name} {step * steps_long:g} s long, more than a day "
                f"({MAX_STEP_SECONDS} s); set it to at most {most}"
            )
    return problems


class RateProfile:
    """Offered rate over time: `rate` (constant), `steps` ([{rate, seconds}], repeated), `csv` (one rate
    per line, one line per second, repeated) or `profile` (a preset, e.g. AUTOSCALE's ``autoscale-3-step``
    and ``autoscale-5-step`` streams, scaled to `rate`).
    `due(t)` is the number of events offered in the first t seconds (the integral of the rate). A `csv`
    needs `read_csv` (path -> rates): this module does no I/O. No `rate`: unbounded (`due` is infinite)."""

    def __init__(self, config: Mapping[str, Any], read_csv: Callable[[str], list[float]] | None = None) -> None:
        steps: list[tuple[float, float]]
        if "steps" in config:
            steps = [(float(s["rate"]), float(s["seconds"])) for s in config["steps"]]
        elif "csv" in config:
            if read_csv is None:
                raise ValueError(f"csv: {shown(config['csv'])} needs reading a file; pass its rates as steps")
            steps = [(r, 1.0) for r in read_csv(str(config["csv"]))]
        elif "profile" in config:
            steps = preset_steps(
                str(config["profile"]),
                float(config["rate"]),
                float(config.get("stepSeconds", DEFAULT_STEP_SECONDS)),
                float(config.get("fluctuation", DEFAULT_FLUCTUATION)),
            )
        else:
            rate = config.get("rate")
            steps = [(math.inf if rate is None else float(rate), 1.0)]
        self.steps = steps
        self.period = sum(d for _, d in self.steps)
        self.per_period = sum(r * d for r, d in self.steps)
        self.unbounded = any(math.isinf(r) for r, _ in self.steps)
        #: start time and events offered before each step, for a bisection instead of a walk
        self.starts = list(itertools.accumulate((d for _, d in self.steps), initial=0.0))[:-1]
        self.before = list(itertools.accumulate((r * d for r, d in self.steps), initial=0.0))[:-1]

    @property
    def peak(self) -> float:
        return max(r for r, _ in self.steps)

    def _step(self, t: float) -> int:
        return max(0, min(len(self.steps) - 1, bisect.bisect_right(self.starts, t) - 1))

    def rate_at(self, t: float) -> float:
        return self.steps[self._step(t % self.period)][0]

    def due(self, t: float) -> float:
        if self.unbounded:
            return math.inf
        periods, rest = divmod(t, self.period)
        i = self._step(rest)
        rate, duration = self.steps[i]
        return periods * self.per_period + self.before[i] + rate * min(rest - self.starts[i], duration)
