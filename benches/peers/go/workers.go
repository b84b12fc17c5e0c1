package main

// workerPool is service A's workers: at most `limit` requests at once, the
// others waiting in a FIFO, and a limit that can change while it runs
// (POST /workers?n=N), for the run where A's capacity changes mid-run.

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
)

type workerPool struct {
	mu      sync.Mutex
	limit   int
	busy    int
	waiting []chan struct{}
}

// newWorkerPool is nil for workers <= 0: no limit.
func newWorkerPool(workers int) *workerPool {
	if workers <= 0 {
		return nil
	}
	return &workerPool{limit: workers}
}

func (p *workerPool) acquire() {
	p.mu.Lock()
	if p.busy < p.limit && len(p.waiting) == 0 {
		p.busy++
		p.mu.Unlock()
		return
	}
	turn := make(chan struct{})
	p.waiting = append(p.waiting, turn)
	p.mu.Unlock()
	<-turn
}

func (p *workerPool) release() {
	p.mu.Lock()
	p.busy--
	p.admit()
	p.mu.Unlock()
}

// admit hands free workers to the first waiters; under p.mu.
func (p *workerPool) admit() {
	for p.busy < p.limit && len(p.waiting) > 0 {
		close(p.waiting[0])
		p.waiting[0] = nil
		p.waiting = p.waiting[1:]
		p.busy++
	}
}

// handleSet is POST /workers?n=N: N workers from now on (fewer: the busy ones
// finish first).
func (p *workerPool) handleSet(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if p == nil || r.Method != http.MethodPost || err != nil || n < 1 || n > 100000 {
		http.Error(w, "POST /workers?n=N, 1 <= N, on a service-a started with -workers", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.limit = n
	p.admit()
	p.mu.Unlock()
	fmt.Fprintf(w, "%d workers\n", n)
}
