package regional

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// admitN checks one request of cost 1 at a time until n are admitted or
// one is rejected, and returns how many were admitted.
func admitN(t *testing.T, e *Engine, now time.Time, who string, n int) int {
	t.Helper()
	var dec allot.Decision
	for i := range n {
		if err := e.Check(now, "api", user(who), 1, &dec); err != nil {
			t.Fatal(err)
		}
		if !dec.Allowed {
			return i
		}
	}
	return n
}

// TestMoveShareMovesWhatIsUnspent: two instances of a 100 per 10 s
// window, all of it at a. Within the window a gives half to b. Before,
// b could use its half only from the next window; now a releases what
// it will not spend of this one and b spends exactly that at once, so
// the window holds L and no more, whether a had spent little or much.
func TestMoveShareMovesWhatIsUnspent(t *testing.T) {
	cfg := mustConfig(t, "domain: api\nregions: [a, b]\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/10s, algorithm: sliding_window}\n")
	for _, spent := range []int{30, 70} {
		a, b := New(cfg, Options{}), New(cfg, Options{})
		if err := a.ResetShare("api", "l", 1, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := b.ResetShare("api", "l", 0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		start := t0.Add(100 * time.Second) // a window's start
		if got := admitN(t, a, start.Add(time.Second), "1", spent); got != spent {
			t.Fatalf("a admitted %d of %d", got, spent)
		}
		now := start.Add(2 * time.Second)
		rel, err := a.MoveShare(now, "api", "l", 0.5)
		if err != nil {
			t.Fatal(err)
		}
		want := 1 - math.Max(0.5, float64(spent)/100)
		if rel.Window != start.UnixNano() || math.Abs(rel.Value-want) > 1e-9 {
			t.Fatalf("spent %d: released %+v, want %.2f of the window at %d", spent, rel, want, start.UnixNano())
		}
		if err := b.SetShare(now, "api", "l", 0.5); err != nil {
			t.Fatal(err)
		}
		if got := admitN(t, b, now, "1", 100); got != 0 {
			t.Fatalf("b admitted %d from a raise without an extra", got)
		}
		x := Extra{Window: rel.Window, Value: rel.Value, From: rel.Window, Until: rel.Window + int64(10*time.Second)}
		if err := b.AddExtra(now, "api", "l", x); err != nil {
			t.Fatal(err)
		}
		later := now.Add(time.Second)
		total := spent + admitN(t, a, later, "1", 100) + admitN(t, b, later, "1", 100)
		if total != 100 {
			t.Fatalf("spent %d first: the window admitted %d over both instances, want L = 100", spent, total)
		}
		// The next window: the extra is gone, the shares are whole.
		next := start.Add(10 * time.Second)
		if got := admitN(t, b, next, "2", 100); got != 50 {
			t.Fatalf("b admitted %d in the next window, want its share of 50", got)
		}
	}
}

// TestMoveShareKeepsWhatWasSpent: a lowering releases nothing of what a
// key already admitted, a raise releases nothing, and an extra cannot
// lift a share above the share in force nor outlive a lowering.
func TestMoveShareKeepsWhatWasSpent(t *testing.T) {
	cfg := mustConfig(t, "domain: api\nregions: [a, b]\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/10s, algorithm: sliding_window}\n")
	e := New(cfg, Options{})
	if err := e.ResetShare("api", "l", 0.6, time.Time{}); err != nil {
		t.Fatal(err)
	}
	start := t0.Add(100 * time.Second)
	if got := admitN(t, e, start, "1", 60); got != 60 {
		t.Fatalf("admitted %d", got)
	}
	if rel, _ := e.MoveShare(start.Add(time.Second), "api", "l", 0.2); rel.Value != 0 {
		t.Fatalf("a key that spent its share released %+v", rel)
	}
	if rel, _ := e.MoveShare(start.Add(2*time.Second), "api", "l", 0.4); rel.Value != 0 {
		t.Fatalf("a raise released %+v", rel)
	}
	x := Extra{Window: start.UnixNano(), Value: 0.5, From: start.UnixNano(), Until: start.Add(10 * time.Second).UnixNano()}
	if err := e.AddExtra(start.Add(2*time.Second), "api", "l", x); err != nil {
		t.Fatal(err)
	}
	// low 0.2 + 0.5, capped at the share in force, 0.4: 40, of which
	// user 2 has spent nothing.
	if got := admitN(t, e, start.Add(3*time.Second), "2", 100); got != 40 {
		t.Fatalf("admitted %d with an extra, want the share in force, 40", got)
	}
	rel, err := e.MoveShare(start.Add(4*time.Second), "api", "l", 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if rel.Value != 0 { // user 1 admitted 60 already
		t.Fatalf("released %+v", rel)
	}
	if err := e.SetShare(start.Add(5*time.Second), "api", "l", 0.4); err != nil {
		t.Fatal(err)
	}
	if got := admitN(t, e, start.Add(5*time.Second), "3", 100); got != 10 {
		t.Fatalf("admitted %d after a lowering and a raise, want the least since the window began, 10: the lowering gave the extra up", got)
	}
}

// TestAddExtraRefusesBadInput: a value outside [0, 1] or NaN is refused
// and changes nothing; an unknown limit is refused.
func TestAddExtraRefusesBadInput(t *testing.T) {
	cfg := mustConfig(t, "domain: api\nregions: [a, b]\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/10s, algorithm: sliding_window}\n")
	e := New(cfg, Options{})
	if err := e.ResetShare("api", "l", 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	start := t0.Add(100 * time.Second)
	if err := e.SetShare(start, "api", "l", 1); err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{-0.1, 1.5, math.NaN(), math.Inf(1)} {
		x := Extra{Window: start.UnixNano(), Value: v, From: start.UnixNano(), Until: start.Add(10 * time.Second).UnixNano()}
		if err := e.AddExtra(start, "api", "l", x); !errors.Is(err, ErrBadShare) {
			t.Fatalf("extra %v: %v, want ErrBadShare", v, err)
		}
	}
	if err := e.AddExtra(start, "api", "nope", Extra{}); !errors.Is(err, ErrUnknownLimit) {
		t.Fatalf("unknown limit: %v", err)
	}
	if got := admitN(t, e, start.Add(time.Second), "1", 100); got != 0 {
		t.Fatalf("admitted %d after refused extras", got)
	}
}

// TestMoveShareReleasesPastTheWindowGuard: in windows of a minute and
// more the window guard keeps a window at the share in force in its first
// 500 ms, so a lowering later in the window would give nothing up and
// allowance could not move until the window ends. MoveShare gives its
// release up at once: the giver stops at the new share, the receiver
// spends exactly the rest.
func TestMoveShareReleasesPastTheWindowGuard(t *testing.T) {
	cfg := mustConfig(t, "domain: api\nregions: [a, b]\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/1m, algorithm: sliding_window}\n")
	a, b := New(cfg, Options{}), New(cfg, Options{})
	for e, s := range map[*Engine]float64{a: 1, b: 0} {
		e.SetWindowGuard(500 * time.Millisecond)
		if err := e.ResetShare("api", "l", s, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	start := t0.Add(10 * time.Minute).Truncate(time.Minute) // a window's start
	if got := admitN(t, a, start.Add(time.Second), "1", 30); got != 30 {
		t.Fatalf("a admitted %d of 30", got)
	}
	now := start.Add(10 * time.Second) // well past the guard
	rel, err := a.MoveShare(now, "api", "l", 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if rel.Window != start.UnixNano() || math.Abs(rel.Value-0.5) > 1e-9 {
		t.Fatalf("released %+v past the guard, want 0.5 of the window at %d", rel, start.UnixNano())
	}
	if err := b.SetShare(now, "api", "l", 0.5); err != nil {
		t.Fatal(err)
	}
	x := Extra{Window: rel.Window, Value: rel.Value, From: rel.Window, Until: rel.Window + int64(time.Minute)}
	if err := b.AddExtra(now, "api", "l", x); err != nil {
		t.Fatal(err)
	}
	later := now.Add(time.Second)
	ga, gb := admitN(t, a, later, "1", 100), admitN(t, b, later, "1", 100)
	if ga != 20 || gb != 50 {
		t.Fatalf("after the move a admitted %d more (want 20) and b %d (want 50): the window holds %d, want L = 100", ga, gb, 30+ga+gb)
	}
}

// TestMoveKeySharesMovesWhatAHotKeyLeftUnspent: the same for a hot key's
// own share. a holds all of key 1 and has spent some of the window; it
// lowers the key to half and releases what the key will not spend; b,
// raised to half, wants the half it may not use before the next window,
// and an extra of what a released makes the window hold exactly L of the
// key, whatever a had spent. Another key, or the default vector, takes
// none of it.
func TestMoveKeySharesMovesWhatAHotKeyLeftUnspent(t *testing.T) {
	cfg := mustConfig(t, "domain: api\nregions: [a, b]\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/10s, algorithm: sliding_window}\n")
	const k1, k2 = "l:user=1", "l:user=2"
	for _, spent := range []int{30, 70} {
		a, b := New(cfg, Options{}), New(cfg, Options{})
		for e, s := range map[*Engine]float64{a: 1, b: 0} {
			if err := e.ResetShare("api", "l", s, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if err := e.SetKeyShares(t0, "api", "l", []KeyShare{{Key: k1, Share: s}, {Key: k2, Share: s}}); err != nil {
				t.Fatal(err)
			}
		}
		start := t0.Add(100 * time.Second)
		if got := admitN(t, a, start.Add(time.Second), "1", spent); got != spent {
			t.Fatalf("a admitted %d of %d", got, spent)
		}
		now := start.Add(2 * time.Second)
		rels, err := a.MoveKeyShares(now, "api", "l", []KeyShare{{Key: k1, Share: 0.5}})
		if err != nil {
			t.Fatal(err)
		}
		want := 1 - math.Max(0.5, float64(spent)/100)
		if len(rels) != 1 || rels[0].Key != k1 || rels[0].Window != start.UnixNano() || math.Abs(rels[0].Value-want) > 1e-9 {
			t.Fatalf("spent %d: released %+v, want %.2f of key 1's window at %d", spent, rels, want, start.UnixNano())
		}
		if err := b.SetKeyShares(now, "api", "l", []KeyShare{{Key: k1, Share: 0.5}, {Key: k2, Share: 0.5}}); err != nil {
			t.Fatal(err)
		}
		w, err := b.Wants(now, "api", "l", k1)
		if err != nil || w.Window != start.UnixNano() || math.Abs(w.Value-0.5) > 1e-9 {
			t.Fatalf("b wants %+v (%v), want 0.5 of the window at %d", w, err, start.UnixNano())
		}
		if w, _ := b.Wants(now, "api", "l", ""); w.Value != 0 {
			t.Fatalf("b's default, not raised, wants %+v", w)
		}
		x := Extra{Key: k1, Window: rels[0].Window, Value: rels[0].Value, From: rels[0].Window, Until: rels[0].Window + int64(10*time.Second)}
		if err := b.AddExtra(now, "api", "l", x); err != nil {
			t.Fatal(err)
		}
		if w, _ := b.Wants(now, "api", "l", k1); math.Abs(w.Value-(0.5-want)) > 1e-9 {
			t.Fatalf("after an extra of %.2f b wants %+v, want %.2f", want, w, 0.5-want)
		}
		later := now.Add(time.Second)
		total := spent + admitN(t, a, later, "1", 100) + admitN(t, b, later, "1", 100)
		if total != 100 {
			t.Fatalf("spent %d first: key 1's window admitted %d over both instances, want L = 100", spent, total)
		}
		if got := admitN(t, b, later, "2", 100); got != 0 {
			t.Fatalf("key 2 admitted %d at b from key 1's extra", got)
		}
		if got := admitN(t, b, later, "3", 100); got != 0 {
			t.Fatalf("a key following the default admitted %d at b from key 1's extra", got)
		}
	}
}

// TestMoveKeySharesKeepsWhatWasSpent: a hot key that spent its share
// releases nothing when lowered, nor does a raise; a key that goes back
// to the default releases what its own share gave up; an extra for a key
// that follows the default is not taken.
func TestMoveKeySharesKeepsWhatWasSpent(t *testing.T) {
	cfg := mustConfig(t, "domain: api\nregions: [a, b]\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/10s, algorithm: sliding_window}\n")
	const k1 = "l:user=1"
	e := New(cfg, Options{})
	if err := e.ResetShare("api", "l", 0.2, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := e.SetKeyShares(t0, "api", "l", []KeyShare{{Key: k1, Share: 0.6}}); err != nil {
		t.Fatal(err)
	}
	start := t0.Add(100 * time.Second)
	if got := admitN(t, e, start, "1", 100); got != 60 {
		t.Fatalf("admitted %d", got)
	}
	if rels, _ := e.MoveKeyShares(start.Add(time.Second), "api", "l", []KeyShare{{Key: k1, Share: 0.3}}); len(rels) != 0 {
		t.Fatalf("a key that spent its share released %+v", rels)
	}
	if rels, _ := e.MoveKeyShares(start.Add(2*time.Second), "api", "l", []KeyShare{{Key: k1, Share: 0.5}}); len(rels) != 0 {
		t.Fatalf("a raise released %+v", rels)
	}
	f := New(cfg, Options{})
	if err := f.ResetShare("api", "l", 0.2, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := f.SetKeyShares(t0, "api", "l", []KeyShare{{Key: k1, Share: 0.6}}); err != nil {
		t.Fatal(err)
	}
	if got := admitN(t, f, start, "1", 10); got != 10 {
		t.Fatalf("admitted %d", got)
	}
	rels, err := f.MoveKeyShares(start.Add(time.Second), "api", "l", []KeyShare{{Key: k1, Share: -1}})
	if err != nil || len(rels) != 1 || math.Abs(rels[0].Value-0.4) > 1e-9 {
		t.Fatalf("a key back to the default (0.2) after 10 of 60 released %+v (%v), want 0.4", rels, err)
	}
	if got := admitN(t, f, start.Add(2*time.Second), "1", 100); got != 10 {
		t.Fatalf("the key admitted %d more, want the default's 20 less the 10 it spent", got)
	}
	x := Extra{Key: k1, Window: start.UnixNano(), Value: 0.5, From: start.UnixNano(), Until: start.Add(10 * time.Second).UnixNano()}
	if err := f.AddExtra(start.Add(2*time.Second), "api", "l", x); err != nil {
		t.Fatal(err)
	}
	if got := admitN(t, f, start.Add(3*time.Second), "1", 100); got != 0 {
		t.Fatalf("a key that follows the default admitted %d from an extra of its own", got)
	}
	if _, err := f.MoveKeyShares(start, "api", "l", []KeyShare{{Key: "l:nouser=1", Share: 0.5}}); !errors.Is(err, ErrBadDescriptor) {
		t.Fatalf("a key of another shape: %v", err)
	}
}
