package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// partnerAPI is the external API the instances call, served on loopback.
// Its contract allows limit concurrent requests across all of a client's
// callers: a request that arrives while limit others are in flight is
// refused with 429 Too Many Requests, as rate-limited partners do.
type partnerAPI struct {
	*demo.HTTPServer // its URL, and Close

	limit   int
	latency time.Duration // how long a request takes

	mu       sync.Mutex
	inFlight int // guarded by mu
	most     int // guarded by mu; the most in flight at once
	calls    int // guarded by mu; requests served
	refused  int // guarded by mu; requests refused with 429
}

// startPartnerAPI serves a partnerAPI on a free loopback port until Close.
func startPartnerAPI(limit int, latency time.Duration) (*partnerAPI, error) {
	a := &partnerAPI{limit: limit, latency: latency}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders", a.order)
	var err error
	if a.HTTPServer, err = demo.StartHTTP("partner API", mux); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *partnerAPI) order(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	if a.inFlight >= a.limit {
		a.refused++
		a.mu.Unlock()
		http.Error(w, "too many concurrent requests", http.StatusTooManyRequests)
		return
	}
	a.inFlight++
	a.calls++
	a.most = max(a.most, a.inFlight)
	a.mu.Unlock()
	select { // the partner's work
	case <-time.After(a.latency):
	case <-r.Context().Done():
	}
	// Done before the answer is sent: a caller that has its answer, and
	// gives its permit to another, is no longer in flight.
	a.mu.Lock()
	a.inFlight--
	a.mu.Unlock()
	_, _ = w.Write([]byte(`{"status": "accepted"}`))
}

// APIStats is what the partner API counted.
type APIStats struct {
	Calls   int // requests served
	Refused int // requests refused: limit others were in flight
	Most    int // the most requests in flight at once
}

// stats returns the counts so far.
func (a *partnerAPI) stats() APIStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return APIStats{Calls: a.calls, Refused: a.refused, Most: a.most}
}

// errRefused is a request the partner refused with 429.
var errRefused = errors.New("429 too many requests")

// apiClient is one instance's client of the partner API.
type apiClient struct {
	base string
	http *http.Client
}

func newAPIClient(base string) *apiClient {
	return &apiClient{base: base, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 5 * time.Second}}
}

// close closes the client's idle connections.
func (c *apiClient) close() { c.http.CloseIdleConnections() }

// order sends one request; it returns an error wrapping errRefused when the
// partner refused it.
func (c *apiClient) order(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/orders", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("partner API: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusTooManyRequests:
		return errRefused
	default:
		return fmt.Errorf("partner API: %s", resp.Status)
	}
}
