"""The shapes every part of the benchmark shares: a variant (one server
under test), a closed-loop scenario and an open-loop (fixed-rate) one. Kept
apart from `scenarios` (the data) and `servers` (how each peer starts) so
that both can name them without importing each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .common import parse_seconds

if TYPE_CHECKING:
    from .servers import Ctx, Proc


@dataclass
class Variant:
    name: str
    kind: str
    about: str
    path: str
    # Builds the server under test, or a list of processes whose last one is
    # the server under test and the others what it needs (a Redis), started
    # in order; None: the load goes straight to service A.
    server: Callable[[Ctx], Proc | list] | None
    # Programs it needs beyond the ones every run needs: {program: Debian package}.
    programs: dict = field(default_factory=dict)
    # Said beside its error when it fails, e.g. what it waits for to land.
    requires: str | None = None


@dataclass
class Scenario:
    name: str
    title: str
    connections: list
    duration_s: float
    quick_duration_s: float
    variants: list
    # The variants of --quick; None: all of them.
    quick_variants: set | None = None
    # Service A: None when the scenario needs none.
    a_delay: str | None = None
    a_path: str = "/a"
    # Warm-up connections; None: the run's own connection count.
    warmup_connections: int | None = None
    # A Cache-Control value service A puts on its answers (`gateway upstream
    # --cache-control`); None: it sends none.
    a_cache_control: str | None = None
    # Distinct URLs the load cycles through (path?k=0 ... path?k=N-1, wrk
    # only), with service A's requests counted (its /-/count) and reported
    # per second; None: every request is the same URL, nothing is counted.
    keys: int | None = None
    # Run when --scenarios is not given; False: only when named.
    in_default: bool = True

    @property
    def delay_s(self):
        return parse_seconds(self.a_delay) if self.a_delay else None


@dataclass
class RateScenario(Scenario):
    """A scenario loaded at a fixed arrival rate by `benchpeers load`."""

    # Offered load, requests per second (all of them to the server under test).
    rate: float = 0
    # Service A: workers per process, time per request, processes.
    workers: int = 8
    service_ms: int = 100
    endpoints: int = 1
    # Requests due before this are left out of the figures (the ramp-up).
    settle_s: float = 0
    # Share of the run after which service A's first process gets SIGKILL.
    kill_at: float | None = None
    # The load generator gives up on a request this long after it was due.
    client_timeout_s: float = 5

    @property
    def capacity(self):
        """What one service A process can serve, requests per second."""
        return self.workers * 1000 / self.service_ms

    def describe(self):
        a = f"{self.endpoints} x " if self.endpoints > 1 else ""
        return (
            f"{self.rate:g} req/s offered (open loop) to service A = {a}{self.workers} workers x "
            f"{self.service_ms} ms ({self.capacity:g} req/s each)"
        )
