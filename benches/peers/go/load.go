package main

// load is the open-loop load generator of benches/compare's overload and
// failover scenarios:
//
//	benchpeers load -url URL -rate 240 -duration 15s -timeout 5s -out FILE
//
// It sends GET URL at a fixed arrival rate (request i is due at start +
// i/rate), each request on its own goroutine, whatever the server's answers
// take: a slow server does not slow the senders down (wrk and oha, closed
// loop, send the next request on a connection only when the previous one is
// answered, so an overloaded server is offered less). A request needs a
// connection of its own while it is in flight; idle ones are kept and reused.
//
// Latency runs from when the request was due, not from when it went out, so
// any lag of the generator counts against the server (no coordinated
// omission), and ends when the whole response body has been read. The lag
// (due to handed to the HTTP client) is written too, to tell the
// generator's own delays from the server's.
//
// Output: a header line, then one tab-separated line per request:
//
//	# start_unix_ns=N rate=R duration_s=D timeout_s=T url=U
//	sent_us  latency_us  status  error  lag_us
//
// sent_us is when the request was due, from the start; status is 0 when no
// full response came; error is "-" or one word: timeout, refused, reset, eof,
// other.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
)

type outcome struct {
	sent    time.Duration
	latency time.Duration
	lag     time.Duration
	status  int
	err     string
}

func loadMain(args []string) int {
	flags := flag.NewFlagSet("load", flag.ExitOnError)
	target := flags.String("url", "", "the URL to GET")
	rate := flags.Float64("rate", 100, "requests per second, evenly spaced")
	duration := flags.Duration("duration", 10*time.Second, "how long to send; the answers still due are then awaited")
	timeout := flags.Duration("timeout", 5*time.Second, "per request, from when it was due to the end of the body")
	out := flags.String("out", "", "where the per-request lines go (default: stdout)")
	flags.Parse(args)
	if *target == "" || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "load: -url and a positive -rate are required")
		return 2
	}

	transport := &http.Transport{
		Proxy:               nil, // loopback only, never an http_proxy from the environment
		DialContext:         (&net.Dialer{Timeout: *timeout}).DialContext,
		MaxIdleConns:        0, // no limit
		MaxIdleConnsPerHost: 100000,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	client := &http.Client{
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}

	count := int(*rate * duration.Seconds())
	outcomes := make([]outcome, count)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < count; i++ {
		due := start.Add(time.Duration(float64(i) * float64(time.Second) / *rate))
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func(o *outcome, due time.Time) {
			defer wg.Done()
			o.sent = due.Sub(start)
			o.lag = time.Since(due)
			o.status, o.err = get(client, *target, due.Add(*timeout))
			o.latency = time.Since(due)
		}(&outcomes[i], due)
	}
	wg.Wait()
	transport.CloseIdleConnections()

	var w io.Writer = os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
			return 1
		}
		defer f.Close()
		w = f
	}
	buf := bufio.NewWriter(w)
	fmt.Fprintf(buf, "# start_unix_ns=%d rate=%g duration_s=%g timeout_s=%g url=%s\n",
		start.UnixNano(), *rate, duration.Seconds(), timeout.Seconds(), *target)
	ok, failed := 0, 0
	for _, o := range outcomes {
		fmt.Fprintf(buf, "%d\t%d\t%d\t%s\t%d\n",
			o.sent.Microseconds(), o.latency.Microseconds(), o.status, o.err, o.lag.Microseconds())
		if o.status >= 200 && o.status < 300 {
			ok++
		} else {
			failed++
		}
	}
	if err := buf.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "load: %d requests in %s (%d 2xx, %d other or failed)\n",
		count, time.Since(start).Round(time.Millisecond), ok, failed)
	return 0
}

// get sends one GET and reads the whole body before the deadline: the
// status, or 0 and what went wrong.
func get(client *http.Client, url string, deadline time.Time) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "other"
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		return 0, classify(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, classify(err)
	}
	return resp.StatusCode, "-"
}

func classify(err error) string {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	}
	return "other"
}
