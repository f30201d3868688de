package demo

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// An HTTPServer serves on a free loopback port: the external API that an
// example's instances call.
type HTTPServer struct {
	URL string // http://127.0.0.1:port

	srv    *http.Server
	served chan struct{} // closed when Serve has returned
}

// StartHTTP serves h on a free loopback port until Close. Its error starts
// with name.
func StartHTTP(name string, h http.Handler) (*HTTPServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s := &HTTPServer{
		URL:    "http://" + ln.Addr().String(),
		srv:    &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		served: make(chan struct{}),
	}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln) // ErrServerClosed after Close
	}()
	return s, nil
}

// Close stops the server and waits for it.
func (s *HTTPServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.served
}
