package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// tokenAPI is the external API the instances call, served on loopback: an
// authorization endpoint that issues access tokens and a quotes endpoint
// that accepts only the current one. Like many providers, it keeps one
// token per client: issuing a token revokes the previous one.
//
// Its time is the story's (setTime): the time of the instances' tick, not
// the machine's clock. A token lives from the tick it was issued in, and
// is judged at the tick of each call: a machine too busy to keep up with
// the ticks runs the story slower, not differently.
type tokenAPI struct {
	*demo.HTTPServer // its URL, and Close

	lifetime time.Duration // how long a token is accepted
	latency  time.Duration // how long issuing a token takes

	mu      sync.Mutex
	now     time.Time       // guarded by mu; the story's time (setTime)
	issued  map[string]bool // guarded by mu; every token issued
	current string          // guarded by mu; the one token accepted, until expires
	expires time.Time       // guarded by mu
	calls   int             // guarded by mu; quote requests
	refused map[string]int  // guarded by mu; quote requests refused, by reason
}

// tokenResponse is the authorization endpoint's answer (OAuth 2.0 style).
type tokenResponse struct {
	AccessToken string `json:"access_token"`
	ExpiresInMS int64  `json:"expires_in_ms"`
}

// startTokenAPI serves a tokenAPI on a free loopback port until Close.
func startTokenAPI(lifetime, latency time.Duration) (*tokenAPI, error) {
	a := &tokenAPI{lifetime: lifetime, latency: latency, issued: make(map[string]bool), refused: make(map[string]int)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /oauth/token", a.issue)
	mux.HandleFunc("GET /v1/quote", a.quote)
	var err error
	if a.HTTPServer, err = demo.StartHTTP("token API", mux); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *tokenAPI) issue(w http.ResponseWriter, r *http.Request) {
	select { // a real authorization server takes a while
	case <-time.After(a.latency):
	case <-r.Context().Done():
		return
	}
	a.mu.Lock()
	tok := "tok-" + strconv.Itoa(len(a.issued)+1)
	a.issued[tok] = true
	a.current, a.expires = tok, a.now.Add(a.lifetime) // the previous token is revoked
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(tokenResponse{AccessToken: tok, ExpiresInMS: a.lifetime.Milliseconds()})
}

func (a *tokenAPI) quote(w http.ResponseWriter, r *http.Request) {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	a.mu.Lock()
	a.calls++
	var reason string
	switch {
	case !a.issued[tok]:
		reason = "unknown token"
	case tok != a.current:
		reason = "revoked"
	case !a.now.Before(a.expires):
		reason = "expired"
	}
	if reason != "" {
		a.refused[reason]++
	}
	a.mu.Unlock()
	if reason != "" {
		http.Error(w, reason, http.StatusUnauthorized)
		return
	}
	_, _ = w.Write([]byte(`{"quote": 42}`))
}

// APIStats is what the token API counted.
type APIStats struct {
	Issued  int            // tokens issued
	Calls   int            // quote requests
	Refused map[string]int // quote requests refused (401), by reason
}

// String describes the refusals: "0 refused", "25 refused (revoked 25)".
func (s APIStats) String() string {
	if s.Failed() == 0 {
		return "0 refused"
	}
	reasons := slices.Sorted(maps.Keys(s.Refused))
	for i, r := range reasons {
		reasons[i] = fmt.Sprintf("%s %d", r, s.Refused[r])
	}
	return fmt.Sprintf("%d refused (%s)", s.Failed(), strings.Join(reasons, ", "))
}

// Failed returns the number of refused quote requests.
func (s APIStats) Failed() int {
	n := 0
	for _, c := range s.Refused {
		n += c
	}
	return n
}

// setTime sets the API's time to now, the time of the instances' tick.
func (a *tokenAPI) setTime(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.now = now
}

// stats returns the counts so far.
func (a *tokenAPI) stats() APIStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return APIStats{Issued: len(a.issued), Calls: a.calls, Refused: maps.Clone(a.refused)}
}

// apiClient is one instance's client of the token API.
type apiClient struct {
	base string
	http *http.Client
}

func newAPIClient(base string) *apiClient {
	return &apiClient{base: base, http: &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}}
}

// close closes the client's idle connections.
func (c *apiClient) close() { c.http.CloseIdleConnections() }

// token asks the authorization endpoint for a new token, which revokes the
// previous one. Its expiry counts from asked, when it was asked for.
func (c *apiClient) token(ctx context.Context, asked time.Time) (tok string, expires time.Time, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/oauth/token", nil)
	if err != nil {
		return "", time.Time{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("token API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", time.Time{}, fmt.Errorf("token API: %s", resp.Status)
	}
	var tr tokenResponse
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		return "", time.Time{}, fmt.Errorf("token API: %w", err)
	}
	// The provider's clock is not ours: count the lifetime from the
	// request, which comes before the provider's count starts.
	return tr.AccessToken, asked.Add(time.Duration(tr.ExpiresInMS) * time.Millisecond), nil
}

// errRefused is a quote request refused with 401: the token was revoked or
// has expired.
var errRefused = errors.New("401 unauthorized")

// quote calls the API with tok. It returns an error wrapping errRefused,
// with the reason, when the API refuses the token.
func (c *apiClient) quote(ctx context.Context, tok string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/quote", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("quote API: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return fmt.Errorf("quote API: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusUnauthorized:
		return fmt.Errorf("%w: %s", errRefused, strings.TrimSpace(string(body)))
	default:
		return fmt.Errorf("quote API: %s", resp.Status)
	}
}
