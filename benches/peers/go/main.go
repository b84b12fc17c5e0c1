// Command benchpeers holds the Go peers of benches/compare, one subcommand
// each, with the standard library only:
//
//	benchpeers service-a     -listen ADDR -delay 1s [-workers N]   GET /a waits, then "ok"; GET /hello at once;
//	                         POST /workers?n=N sets the workers while it runs (with -workers > 0)
//	benchpeers client        -listen ADDR -upstream URL   GET /b through http.Get (seed 000's service B)
//	benchpeers reverse-proxy -listen ADDR -upstream URL -pool N   GET /b through httputil.ReverseProxy
//	benchpeers file          -listen ADDR -file PATH   GET /file with http.ServeFile (seed 001)
//	benchpeers hello         -listen ADDR   GET /hello (seed 002; run it with GOMAXPROCS=1)
//	benchpeers load          -url URL -rate R -duration D   open-loop load, one line per request (load.go)
//
// Go has no listen-backlog option: it listens with the kernel's
// net.core.somaxconn, which benches/compare prints.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"
)

// upstreamTimeout is the article's client timeout, used by the tuned proxy.
const upstreamTimeout = 2 * time.Second

const helloBody = "Hello, world"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	if os.Args[1] == "load" {
		os.Exit(loadMain(os.Args[2:]))
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := flags.String("listen", "127.0.0.1:8001", "address to listen on")
	delay := flags.Duration("delay", time.Second, "service-a: how long GET /a waits")
	workers := flags.Int("workers", 0, "service-a: GET /a requests served at once; more wait their turn (FIFO); 0: no limit")
	upstream := flags.String("upstream", "http://127.0.0.1:8000/a", "client, reverse-proxy: the URL that GET /b fetches")
	pool := flags.Int("pool", 2048, "reverse-proxy: idle connections kept per upstream host")
	file := flags.String("file", "demo.txt", "file: the file that GET /file serves")
	flags.Parse(os.Args[2:])

	mux := http.NewServeMux()
	switch os.Args[1] {
	case "service-a":
		pool := newWorkerPool(*workers)
		mux.HandleFunc("/a", slowHandler(*delay, pool))
		mux.HandleFunc("/workers", pool.handleSet)
		mux.HandleFunc("/hello", helloHandler)
	case "client":
		mux.HandleFunc("/b", defaultClientHandler(*upstream))
	case "reverse-proxy":
		mux.Handle("/b", tunedReverseProxy(*upstream, *pool))
	case "file":
		mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, *file) })
	case "hello":
		mux.HandleFunc("/hello", helloHandler)
	default:
		usage()
	}
	log.Printf("%s listening on %s", os.Args[1], *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchpeers service-a|client|reverse-proxy|file|hello|load [flags]")
	os.Exit(2)
}

func helloHandler(w http.ResponseWriter, _ *http.Request) {
	w.Write([]byte(helloBody))
}

// slowHandler is seed 000's service A: it waits, then answers "ok".
//
// With workers (a non-nil pool) it is an app with that many workers (a
// gunicorn app's shape): at most `workers` requests are served at once and
// the others wait inside it, first come first served, with no limit on the
// wait. Like a sync worker it never looks at whether the client is still
// there: a request whose client gave up while it waited is still served, and
// its worker time is lost.
func slowHandler(delay time.Duration, pool *workerPool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if pool != nil {
			pool.acquire()
			defer pool.release()
		}
		time.Sleep(delay)
		w.Write([]byte("ok"))
	}
}
