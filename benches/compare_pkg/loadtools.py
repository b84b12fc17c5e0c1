"""The closed-loop load tools, wrk, oha and h2load: how each is started
(pinned, one thread, the same request timeout) and how its output becomes
one LoadResult, so that the tables do not depend on which tool ran."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
from dataclasses import dataclass

from .common import RUN_DIR, TIMEOUT_S, WRK_CYCLE_SCRIPT, WRK_SCRIPT, find_program


@dataclass
class LoadResult:
    requests: int
    duration_s: float
    non_2xx: int
    timeouts: int
    socket_errors: int
    p50_ms: float | None
    p99_ms: float | None


class LoadTool:
    name = ""
    # Whether it can cycle through N URLs (Scenario.keys).
    cycles_urls = False

    def argv(self, url, connections, duration_s, keys=None):
        raise NotImplementedError

    def parse(self, output):
        raise NotImplementedError

    def before_run(self):
        """Clears what a previous run left."""

    def run(self, url, connections, duration_s, cpu, keys=None):
        """keys: cycle through url?k=0 ... url?k=keys-1 (tools with cycles_urls)."""
        if keys and not self.cycles_urls:
            raise RuntimeError(f"{self.name} cannot cycle through {keys} URLs (wrk can)")
        self.before_run()
        argv = ["taskset", "-c", str(cpu), *map(str, self.argv(url, connections, duration_s, keys))]
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        ) as popen:
            try:
                output, _ = popen.communicate(timeout=duration_s + 30)
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
                raise RuntimeError(f"{self.name} did not finish") from None
        try:
            return self.parse(output)
        except (ValueError, KeyError, IndexError, StopIteration, AttributeError) as err:
            raise RuntimeError(f"could not parse {self.name} output ({err}):\n{output[-2000:]}") from None


class Wrk(LoadTool):
    """wrk with a done() script that prints its summary as JSON."""

    name = "wrk"
    cycles_urls = True

    def argv(self, url, connections, duration_s, keys=None):
        flags = f"-t1 -c{connections} -d{math.ceil(duration_s)}s --timeout {TIMEOUT_S}s"
        if keys:
            # cycle.lua loads report.lua's done() itself.
            return ["wrk", *flags.split(), "-s", WRK_CYCLE_SCRIPT, url, "--", keys]
        return ["wrk", *flags.split(), "-s", WRK_SCRIPT, url]

    def parse(self, output):
        line = next(line for line in output.splitlines() if line.startswith("BENCH-JSON "))
        data = json.loads(line[len("BENCH-JSON ") :])
        # wrk's histogram holds only the responses that came within the timeout.
        in_histogram = data["requests"] > data["timeout"]
        return LoadResult(
            requests=data["requests"],
            duration_s=data["duration_us"] / 1e6,
            non_2xx=data["status"],
            timeouts=data["timeout"],
            socket_errors=data["connect"] + data["read"] + data["write"],
            p50_ms=data["p50_us"] / 1000 if in_histogram else None,
            p99_ms=data["p99_us"] / 1000 if in_histogram else None,
        )


class Oha(LoadTool):
    """oha, JSON output; requests cut off by the deadline are not errors."""

    name = "oha"

    def argv(self, url, connections, duration_s, keys=None):
        flags = f"--no-tui --output-format json -c {connections} -z {round(duration_s * 1000)}ms -t {TIMEOUT_S}s"
        return [find_program("oha"), *flags.split(), url]

    def parse(self, output):
        data = json.loads(output[output.index("{") :])
        statuses = {int(code): n for code, n in data["statusCodeDistribution"].items()}
        errors = data.get("errorDistribution", {})
        timeouts = sum(n for err, n in errors.items() if "timeout" in err.lower())
        aborted = sum(n for err, n in errors.items() if "deadline" in err.lower())
        percentiles = data["latencyPercentiles"]
        return LoadResult(
            requests=sum(statuses.values()),
            duration_s=data["summary"]["total"],
            non_2xx=sum(n for code, n in statuses.items() if not 200 <= code < 300),
            timeouts=timeouts,
            socket_errors=sum(errors.values()) - timeouts - aborted,
            p50_ms=seconds_to_ms(percentiles.get("p50")),
            p99_ms=seconds_to_ms(percentiles.get("p99")),
        )


class H2load(LoadTool):
    """h2load over HTTP/1.1; percentiles come from its per-request log.

    It runs without a request timeout (its -N crashes h2load 1.52 on
    connections that go quiet), so, as in wrk, a timeout is a response
    that came after TIMEOUT_S."""

    name = "h2load"
    log_file = RUN_DIR / "h2load-requests.tsv"

    def argv(self, url, connections, duration_s, keys=None):
        flags = f"--h1 -t1 -c{connections} -D{round(duration_s * 1000)}ms"
        return ["h2load", *flags.split(), f"--log-file={self.log_file}", url]

    def before_run(self):
        # h2load appends to its log file.
        self.log_file.unlink(missing_ok=True)

    def parse(self, output):
        finished = re.search(r"finished in ([\d.]+)(s|ms|us),", output)
        failed = re.search(r"requests: .* (\d+) failed,", output)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", output)
        duration = float(finished.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6}[finished.group(2)]
        two_xx, others = int(codes.group(1)), sum(int(codes.group(i)) for i in (2, 3, 4))
        latencies_us = sorted(int(line.split("\t")[2]) for line in self.log_file.read_text().splitlines() if line)
        return LoadResult(
            requests=two_xx + others,
            duration_s=duration,
            non_2xx=others,
            timeouts=sum(1 for us in latencies_us if us > TIMEOUT_S * 1e6),
            # h2load's "failed" also counts 4xx and 5xx responses.
            socket_errors=int(failed.group(1)) - int(codes.group(3)) - int(codes.group(4)),
            p50_ms=percentile_ms(latencies_us, 50),
            p99_ms=percentile_ms(latencies_us, 99),
        )


def seconds_to_ms(value):
    return None if value is None else value * 1000


def percentile_ms(sorted_us, percent):
    if not sorted_us:
        return None
    return sorted_us[min(len(sorted_us) - 1, len(sorted_us) * percent // 100)] / 1000


TOOLS = {tool.name: tool for tool in (Wrk(), Oha(), H2load())}
