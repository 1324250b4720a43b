package coordinator

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// A fleet's first moments: a long window's allowance may move between
// instances from their first grants, so that a region's second instance,
// granted nothing of the window its first one may have spent, gets what
// the first gives up when the two are divided.

// startFleet is a Fleet of poolConfig starting at now, from snap.
func startFleet(t *testing.T, now time.Time, snap Snapshot) *Fleet {
	t.Helper()
	cfg, err := allot.ParseConfig("pool.yaml", []byte(poolConfig))
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFleet(now, FleetConfig{Coordinator: Config{Domain: cfg.Domain("api"), Term: 3, Period: 2 * time.Second, DeadAfter: time.Hour},
		GrantTTL: time.Hour, MaxSkew: 100 * time.Millisecond}, snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFullGrantEchoesTheHello: the full grant that answers a hello echoes
// it (ClockEcho), so that the instance knows its clock from its first
// grant on, before its first report; the instance's ClockSync takes it.
func TestFullGrantEchoesTheHello(t *testing.T) {
	now := time.Unix(6000, 0)
	f := startFleet(t, now, Snapshot{})
	x, err := NewInstance(f.dom, "us", "us-1")
	if err != nil {
		t.Fatal(err)
	}
	x.Reconnect()
	hello, ws := x.Hello()
	hello.SentAt = now.Add(-40 * time.Millisecond) // the instance's clock, 40 ms one way
	rd, err := f.Attach(now, "us", "us-1", false, hello, ws)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(rd.Send, func(a Assignment) bool { return a.Instance == "us-1" && a.Grant != nil && a.Grant.Full })
	if i < 0 {
		t.Fatal("no full grant")
	}
	e := rd.Send[i].Clock
	if e == nil || !e.ReportAt.Equal(hello.SentAt) || !e.Received.Equal(now) {
		t.Fatalf("full grant's echo %+v, want the hello's (sent %v, taken %v)", e, hello.SentAt, now)
	}
	var c ClockSync
	if !c.Sample(now.Add(40*time.Millisecond), *e) {
		t.Fatal("the hello's echo was refused")
	}
	if off, err, ok := c.Offset(now.Add(40 * time.Millisecond)); !ok || off.Abs() > err || err > 41*time.Millisecond {
		t.Fatalf("offset %v ± %v (%v), want 0 within 40 ms", off, err, ok)
	}
}

// TestFirstLeaderPoolsFromItsStart: the first leader of a fleet pools
// what its instances release of a long window from its start (nothing
// was granted before it); a leader after another pools from the next
// window only, as it does not know what the other granted of this one.
func TestFirstLeaderPoolsFromItsStart(t *testing.T) {
	now := time.Unix(6000, 0)
	for _, c := range []struct {
		name string
		snap Snapshot
		want bool
	}{
		{"first leader", Snapshot{}, true},
		{"after another", Snapshot{Term: 2, Version: 1}, false},
	} {
		f := startFleet(t, now, c.snap)
		x, err := NewInstance(f.dom, "us", "us-1")
		if err != nil {
			t.Fatal(err)
		}
		x.Reconnect()
		hello, ws := x.Hello()
		rd, err := f.Attach(now, "us", "us-1", false, hello, ws)
		if err != nil {
			t.Fatal(err)
		}
		var g *Grant
		for _, a := range rd.Send {
			if a.Instance == "us-1" && a.Grant != nil {
				g = a.Grant
			}
		}
		if g == nil {
			t.Fatalf("%s: no grant", c.name)
		}
		if got := slices.Contains(g.Pooled, "sw"); got != c.want {
			t.Fatalf("%s: the first grant pools sw: %v, want %v (Pooled %v)", c.name, got, c.want, g.Pooled)
		}
	}
}

// TestInstanceAppliesAGrantThatCameEarly: a region's first instance is
// granted the region's whole share, then lowered to half as soon as its
// second attaches. A stream that does not keep its messages in order
// (the simulator's) may bring the lowering first: it is refused before
// the full grant, kept, and applied right after it (TakeEarly), so that
// the instance holds half, as the coordinator counts it, and acks it.
func TestInstanceAppliesAGrantThatCameEarly(t *testing.T) {
	now := time.Unix(6000, 0)
	f := startFleet(t, now, Snapshot{})
	xs := map[string]*Instance{}
	var to []Assignment
	for _, id := range []string{"us-1", "us-2"} {
		x, err := NewInstance(f.dom, "us", id)
		if err != nil {
			t.Fatal(err)
		}
		xs[id] = x
		x.Reconnect()
		hello, ws := x.Hello()
		rd, err := f.Attach(now, "us", id, false, hello, ws)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range rd.Send {
			if a.Instance == "us-1" {
				to = append(to, a)
			}
		}
	}
	if len(to) != 2 || !to[0].Grant.Full || to[1].Grant.Full {
		t.Fatalf("us-1 got %d assignments, want its full grant and a lowering", len(to))
	}
	x := xs["us-1"]
	if _, _, err := x.Apply(now, to[1]); !errors.Is(err, ErrStale) {
		t.Fatalf("the lowering before the full grant: %v, want ErrStale", err)
	}
	if _, ack, err := x.Apply(now, to[0]); err != nil || ack.Seq != to[0].Grant.Seq {
		t.Fatalf("full grant: ack %+v, %v", ack, err)
	}
	e := x.TakeEarly()
	if e == nil || e.Grant.Seq != to[1].Grant.Seq {
		t.Fatalf("TakeEarly: %+v, want the lowering", e)
	}
	if x.TakeEarly() != nil {
		t.Fatal("TakeEarly gave it twice")
	}
	if _, ack, err := x.Apply(now, *e); err != nil || ack.Seq != to[1].Grant.Seq {
		t.Fatalf("the lowering after the full grant: ack %+v, %v", ack, err)
	}
	if w := x.weights["sw"]; w != 0.5 {
		t.Fatalf("us-1's weight of sw %v, want 0.5", w)
	}
}
