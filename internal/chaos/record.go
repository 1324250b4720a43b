package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Kinds of Record.
const (
	KindCheck   = "check"   // allot.v1.RateLimiter/Check of one item
	KindReserve = "reserve" // Reserve
	KindSettle  = "settle"  // Settle of a reservation the client settled
	KindRelease = "release" // Release of a reservation the client cancelled
	// KindProbe is a Settle, at the reserved amount, of a reservation the
	// client abandoned, sent after its TTL: the answer says whether it had
	// expired (late) by then.
	KindProbe = "probe"
)

// Record is one decision as the load client saw it: one line of the
// decision log (JSON).
type Record struct {
	Kind string `json:"kind"`
	// At and Done: when the request was sent and when its answer (or
	// error) came, unix ns. The server decided in between.
	At   int64 `json:"at"`
	Done int64 `json:"done"`
	// Region and Instance answered (Instance is the process's name in the
	// cluster, e.g. us-east-2); Life counts its starts (1: the first), so
	// that a restarted instance's counters are compared per lifetime.
	Region   string `json:"region"`
	Instance string `json:"instance"`
	Life     int    `json:"life"`
	Domain   string `json:"domain"`
	// Limit is the one limit the request matched (the test's descriptors
	// each match one), Key its key (e.g. user=u1).
	Limit   string `json:"limit"`
	Key     string `json:"key"`
	Hits    int64  `json:"hits"`
	Allowed bool   `json:"allowed"`
	// Err is empty when the request was answered, else its gRPC code
	// (DeadlineExceeded, Unavailable…).
	Err         string `json:"err,omitempty"`
	Latency     int64  `json:"latency_ns"`
	Deadline    int64  `json:"deadline_ns"`
	DeadlineMet bool   `json:"deadline_met"`
	// Reservations: the id, the tokens reserved (reserve) or settled,
	// the state the server answered (settled, released, expired) and
	// whether it had expired before (late).
	ID     string `json:"id,omitempty"`
	Tokens int64  `json:"tokens,omitempty"`
	State  string `json:"state,omitempty"`
	Late   bool   `json:"late,omitempty"`
}

// Answered reports whether the request got an answer.
func (r *Record) Answered() bool { return r.Err == "" }

// Event is one action of the chaos schedule and what it measured.
type Event struct {
	At     int64  `json:"at"` // unix ns
	Name   string `json:"name"`
	Target string `json:"target,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Took is what the event measured (time to a new leader, to leave
	// fallback…), 0 when nothing.
	Took time.Duration `json:"took_ns,omitempty"`
	// Failed says what did not recover in time (the run goes on; the
	// checker reports it).
	Failed string `json:"failed,omitempty"`
}

// Event names the checker summarises.
const (
	EventLeaderKilled  = "leader_killed"  // Took: until etcd named another leader
	EventFallbackLeft  = "fallback_left"  // Took: from Redis answering again to no limit in fallback
	EventPartitionHeal = "partition_heal" // Took: until the region's peers are linked and out of fallback
)

// Log writes JSON lines, one value each. Safe for concurrent use.
type Log struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	err error
}

// CreateLog creates (or truncates) the file at path.
func CreateLog(path string) (*Log, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(f, 1<<16)
	return &Log{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

// Write appends v.
func (l *Log) Write(v any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.enc.Encode(v); err != nil && l.err == nil {
		l.err = err
	}
}

// Close flushes and closes the file; it returns the first error.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.w.Flush(); err != nil && l.err == nil {
		l.err = err
	}
	if err := l.f.Close(); err != nil && l.err == nil {
		l.err = err
	}
	return l.err
}

// ReadJSONLines decodes every line of r as a T.
func ReadJSONLines[T any](r io.Reader) ([]T, error) {
	var out []T
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}

// ReadFile decodes the JSON lines of the file at path.
func ReadFile[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out, err := ReadJSONLines[T](f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
