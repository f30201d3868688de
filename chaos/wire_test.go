package chaos

import (
	"bufio"
	"encoding/json"
	"net"
	"sync"
	"time"
)

// Workers talk to the test process over one loopback TCP connection each:
// JSON lines, one request and one reply at a time. The test process
// timestamps every request when it reads it, so intervals are measured on one
// clock. The resources a critical section writes (an unfenced counter and a
// fenced register) are served on the same connection.
//
// Requests, in the order a critical section sends them:
//
//	hello     -> the worker's configuration
//	next      -> stop or go on with attempt Seq
//	acquired  the lease of attempt Seq was obtained with Fence
//	ubegin    unfenced resource: the section starts; reply: the counter's value
//	          (and, if the test chooses, how long this section holds)
//	commit    the section is about to write (the test may SIGSTOP the worker
//	          before replying)
//	fwrite    fenced resource: write Fence; reply: accepted or rejected
//	uend      unfenced resource: the section ends, writing Value if Wrote
//	cancel    the work's context was cancelled (sent as soon as seen)
//	done      RunWithLock returned
//	bye       the worker is exiting
type request struct {
	Op    string `json:"op"`
	W     int    `json:"w"`
	Seq   int    `json:"seq,omitempty"`
	Fence int64  `json:"fence,omitempty"`

	Value  int64 `json:"value,omitempty"`  // uend: the counter value written
	Wrote  bool  `json:"wrote,omitempty"`  // uend: the unfenced write was made
	FWrote bool  `json:"fwrote,omitempty"` // uend: a fenced write was made
	Acked  bool  `json:"acked,omitempty"`  // uend: the fenced write's reply, as the worker saw it

	Wall     int64  `json:"wall,omitempty"`     // the worker's wall clock at the event, µs since the epoch
	Deadline int64  `json:"deadline,omitempty"` // acquired, cancel: the lease's Deadline in real wall µs
	Granted  int64  `json:"granted,omitempty"`  // acquired, ubegin, commit, Redlock: when a quorum held the lock (the q-th earliest grant's server TIME, µs)
	LagUS    int64  `json:"lag,omitempty"`      // cancel: real µs from the lease's Deadline to the cancellation
	Cause    string `json:"cause,omitempty"`    // cancel: context.Cause
	Lost     bool   `json:"lost,omitempty"`     // cancel: the cause matches ErrLost; done: the error does

	Err         string `json:"err,omitempty"`         // done: RunWithLock's error
	NotObtained bool   `json:"notobtained,omitempty"` // done: the error matches ErrNotObtained
	Unavailable bool   `json:"unavailable,omitempty"` // done: the error matches ErrUnavailable
	WorkEnd     int64  `json:"workend,omitempty"`     // done: wall µs when the work returned
	RenewOK     int    `json:"renewok,omitempty"`     // done: renewals of the lease that succeeded (Redlock: calls on nodes)
	RenewFail   int    `json:"renewfail,omitempty"`   // done: renewals that failed or found it not held (Redlock: calls on nodes)
	Repairs     int    `json:"repairs,omitempty"`     // done, Redlock: repairs sent to nodes that had lost the lock
	Repaired    int    `json:"repaired,omitempty"`    // done, Redlock: repairs that put the lock back

	AfterRelease        int64 `json:"afterrelease,omitempty"`        // next, bye: renewals sent for a lease after its Release
	RepairsAfterRelease int64 `json:"repairsafterrelease,omitempty"` // next, bye, Redlock: repairs sent for a lease after its Release
}

type reply struct {
	Stop     bool          `json:"stop,omitempty"`
	Value    int64         `json:"value,omitempty"`
	Accepted bool          `json:"accepted,omitempty"`
	Hold     time.Duration `json:"hold,omitempty"` // ubegin: hold this long instead of the configured Hold
	Config   *workerConfig `json:"config,omitempty"`
}

// workerConfig is what a worker runs: the lock, its options and the shape of
// a critical section.
type workerConfig struct {
	Client        string   // the Redis client: "" or "go-redis", "rueidis" (fencerueidis), "valkey-go" (fencevalkey)
	Addr          string   // Redis, or this worker's proxy to it
	SentinelAddrs []string // instead of Addr: a Sentinel client (go-redis's failover client, rueidis's or valkey-go's Sentinel option)
	MasterName    string
	RedlockAddrs  []string // instead of Addr: NewRedlock over these independent nodes (this worker's proxies to them)

	Lock           string
	Permits        int // > 0: a permit of the semaphore Lock with this many (fencelock.Semaphore) instead of the lock
	TTL            time.Duration
	Wait           time.Duration // WithWait for each attempt
	Fair           bool          // WithFair too: wait in the lock's line (see variant)
	Hold           time.Duration // the section's sleep between its read and its writes
	Linger         time.Duration // how long the section stays after its writes (or until cancelled)
	StopDelay      time.Duration // how long an aborted section takes to return after it saw the cancellation (it writes nothing meanwhile)
	MaxHold        time.Duration
	MinBackoff     time.Duration
	MaxBackoff     time.Duration
	ReleaseTimeout time.Duration
	Replicas       int           // fencelock.Options.Replicas (WAIT)
	ReplicaTimeout time.Duration // fencelock.Options.ReplicaTimeout
	IOTimeout      time.Duration // the client's dial, read and write timeouts
	ClockRate      float64       // the lock's clock runs at this rate; 0 means the system clock
	ClockSince     time.Duration // the clock has been running at ClockRate for this long when the worker starts
}

// link is a worker's connection to the test process.
type link struct {
	mu   sync.Mutex
	conn net.Conn
	enc  *json.Encoder
	dec  *json.Decoder
}

func newLink(conn net.Conn) *link {
	return &link{conn: conn, enc: json.NewEncoder(conn), dec: json.NewDecoder(bufio.NewReader(conn))}
}

// call sends req and returns the reply.
func (l *link) call(req request) (reply, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var r reply
	if err := l.enc.Encode(req); err != nil {
		return r, err
	}
	err := l.dec.Decode(&r)
	return r, err
}

// wallMicros returns t on the wall clock in µs since the Unix epoch. Every
// process of the suite runs on one host, so this is the same clock as the
// Redis server's TIME, which the fencing token is floored by.
func wallMicros(t time.Time) int64 { return t.UnixMicro() }
