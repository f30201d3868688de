package fencegocron_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startRedis starts a redis-server of its own on a free loopback port, with
// nothing persisted, and returns its address; t.Cleanup kills it. Without a
// redis-server on the PATH the test is skipped, or fails when
// FENCELOCK_REQUIRE_REDIS=1 (as CI sets). The main module's
// internal/redistest does this and much more; it cannot be imported from
// this module.
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("FENCELOCK_REQUIRE_REDIS") == "1" {
			t.Fatalf("redis-server not on PATH and FENCELOCK_REQUIRE_REDIS=1: %v", err)
		}
		t.Skipf("redis-server not on PATH (%v); install it or set FENCELOCK_REQUIRE_REDIS=1 to fail instead", err)
	}
	var lastErr error
	for range 3 { // a free port may be taken between finding it and binding it
		addr, err := tryRedis(t, bin)
		if err == nil {
			return addr
		}
		lastErr = err
	}
	t.Fatalf("start redis-server: %v", lastErr)
	return ""
}

func tryRedis(t *testing.T, bin string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}

	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			t.Cleanup(stop)
			return addr, nil
		}
		select {
		case <-exited:
			return "", fmt.Errorf("redis-server on port %d exited: %v", port, cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Errorf("redis-server on port %d not answering after 5s: %w", port, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
