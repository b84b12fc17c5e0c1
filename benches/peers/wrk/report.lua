-- wrk script of benches/compare: prints wrk's summary as one JSON line.
-- errors.status counts responses with a status of 400 or more.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH-JSON {"requests": %d, "duration_us": %d, "p50_us": %.0f, "p99_us": %.0f, '
      .. '"max_us": %.0f, "connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
