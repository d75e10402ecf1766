"""Counters and histograms rendered in the Prometheus text exposition format (version 0.0.4).

Small on purpose: a counter family keyed by label values and a fixed-bucket histogram are
all ``/metrics`` needs, so no client library is pulled in. Instances live on the objects that
own what they count (the HTTP app's request metrics, the engine's latency histograms); they
are updated from one thread each and read by the ``/metrics`` handler.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["Counter", "Histogram", "render", "gauge", "LATENCY_BUCKETS"]

#: Seconds: from a few milliseconds (a cached TTFT) to minutes (a long CPU generation).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    def esc(v: str) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{n}="{esc(v)}"' for n, v in zip(names, values, strict=True)) + "}"


class Counter:
    """A counter family: one monotonically increasing value per label combination."""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, *labels: str, by: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + by

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.label_names:
            items = [((), 0.0)]
        for labels, value in items:
            yield f"{self.name}{_labels(self.label_names, labels)} {_num(value)}"


class Histogram:
    """Observations counted into cumulative ``le`` buckets, with their sum and count."""

    def __init__(self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.name, self.help = name, help_text
        self.buckets = tuple(sorted(buckets))
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._sum += value
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    self._counts[i] += 1
                    break
            else:
                self._counts[-1] += 1

    @property
    def count(self) -> int:
        return sum(self._counts)

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        with self._lock:
            counts, total = list(self._counts), self._sum
        running = 0
        for bound, n in zip(self.buckets, counts, strict=False):
            running += n
            yield f'{self.name}_bucket{{le="{_num(bound)}"}} {running}'
        running += counts[-1]
        yield f'{self.name}_bucket{{le="+Inf"}} {running}'
        yield f"{self.name}_sum {_num(total)}"
        yield f"{self.name}_count {running}"


def gauge(name: str, help_text: str, value: float | None,
          labelled: Mapping[tuple[str, ...], float] | None = None, labels: Sequence[str] = ()) -> list[str]:
    """The lines of one gauge (a single value, or one per label combination)."""
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    if labelled is not None:
        out += [f"{name}{_labels(labels, k)} {_num(v)}" for k, v in sorted(labelled.items())]
    elif value is not None:
        out.append(f"{name} {_num(value)}")
    return out


def _num(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(families: Iterable[Iterable[str]]) -> str:
    """The exposition text of ``families`` (each an iterable of lines)."""
    return "\n".join(line for family in families for line in family) + "\n"
