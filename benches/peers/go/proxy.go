package main

import (
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

// defaultClientHandler is seed 000's Go service B: http.Get with the default
// client, kept as the article wrote it (its transport keeps 2 idle
// connections per host and 100 in total; no timeout). A failed call answers
// 502 where the article's handler panicked.
func defaultClientHandler(upstream string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		resp, err := http.Get(upstream)
		if err != nil {
			log.Println(err)
			http.Error(w, "upstream request failed", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			log.Println(err)
		}
		w.Write(body)
	}
}

// tunedReverseProxy forwards to the upstream URL (its path replaces the
// request's) through a transport that keeps `pool` idle connections per host.
func tunedReverseProxy(upstream string, pool int) http.Handler {
	target, err := url.Parse(upstream)
	if err != nil {
		log.Fatal(err)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = pool
	transport.MaxIdleConnsPerHost = pool
	transport.ResponseHeaderTimeout = upstreamTimeout
	return &httputil.ReverseProxy{
		Director: func(r *http.Request) {
			r.URL.Scheme = target.Scheme
			r.URL.Host = target.Host
			r.URL.Path = target.Path
		},
		Transport: transport,
	}
}
