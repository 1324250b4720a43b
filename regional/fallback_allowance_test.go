package regional

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// downStore is a Store that fails every call while down.
type downStore struct {
	Store
	down atomic.Bool
}

var errStoreDown = errors.New("store down")

func (s *downStore) Take(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error {
	if s.down.Load() {
		return errStoreDown
	}
	return s.Store.Take(ctx, now, ops, res)
}

func (s *downStore) Lease(ctx context.Context, now time.Time, ops []LeaseOp, res []LeaseResult) error {
	if s.down.Load() {
		return errStoreDown
	}
	return s.Store.Lease(ctx, now, ops, res)
}

// outageRun checks user 1 every 20 ms for 8 s from a window's start,
// the store down from `from` to `to` (offsets), and returns what was
// admitted.
func outageRun(t *testing.T, cfg string, from, to time.Duration) int {
	t.Helper()
	s := &downStore{Store: &MemoryStore{}}
	f := newEnforcer(t, cfg, s, "a")
	start := t0.Truncate(10 * time.Second).Add(10 * time.Second)
	admitted := 0
	for at := time.Duration(0); at < 8*time.Second; at += 20 * time.Millisecond {
		s.down.Store(at >= from && at < to)
		if check(t, f, start.Add(at), user("1"), 1).Allowed {
			admitted++
		}
	}
	return admitted
}

// The local fallback does not know what the store admitted before it
// began: in the window that holds its start it admits nothing more, and
// once it admitted in a window the store is not asked again before the
// window ends (the store does not know what it admitted). Either way a
// window of a region alone admits at most L. Before, 200 of L = 100 in
// both cases.
func TestFallbackSpendsOnlyWhatTheStoreLeft(t *testing.T) {
	for _, enf := range []string{"exact", "leased"} {
		cfg := "domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/10s, algorithm: sliding_window, enforcement: " + enf + ", on_failure: local}\n"
		if got := outageRun(t, cfg, 4*time.Second, time.Hour); got > 100 {
			t.Errorf("%s, the store down from the middle of the window: %d admitted in it, L = 100", enf, got)
		}
		if got := outageRun(t, cfg, 0, 4*time.Second); got > 100 || got < 100 {
			t.Errorf("%s, the store back in the middle of the window: %d admitted in it, want L = 100", enf, got)
		}
	}
}
