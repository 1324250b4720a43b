package wire

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Weights cross the wire with their key and rest flag, in a grant and in
// a hello.
func TestWeightsRoundTrip(t *testing.T) {
	ws := []coordinator.Weight{
		{Limit: "loc", Value: 0.5},
		{Limit: "loc", Key: "per-user:user=42", Value: 0.75},
		{Limit: "loc", Key: "per-user:user=7", Value: 0.02, Rest: true},
	}
	a := coordinator.Assignment{Domain: "api", Region: "us", Term: 3, Version: 9, Instance: "i1",
		Grant: &coordinator.Grant{Seq: 4, Expires: time.Unix(100, 0).UTC(), Full: true, Weights: ws}}
	got := FromAssignment(Assignment(a).GetAssignment())
	if !slices.Equal(got.Grant.Weights, ws) {
		t.Fatalf("grant weights %+v, want %+v", got.Grant.Weights, ws)
	}
	hello := Hello(coordinator.Ack{Domain: "api", Region: "us", Instance: "i1"}, ws).GetHello()
	if back := FromWeights(hello.GetWeights()); !slices.Equal(back, ws) {
		t.Fatalf("hello weights %+v, want %+v", back, ws)
	}
}

// An assignment's clock echo survives the wire; one without stays without.
func TestClockEchoRoundTrip(t *testing.T) {
	e := &coordinator.ClockEcho{ReportAt: time.Unix(100, 5).UTC(), Received: time.Unix(101, 7).UTC(), Sent: time.Unix(101, 9).UTC()}
	a := coordinator.Assignment{Domain: "api", Region: "us", Term: 3, Version: 9, Instance: "i1", Clock: e}
	if got := FromAssignment(Assignment(a).GetAssignment()).Clock; got == nil || *got != *e {
		t.Fatalf("clock %+v, want %+v", got, e)
	}
	a.Clock = nil
	if got := FromAssignment(Assignment(a).GetAssignment()).Clock; got != nil {
		t.Fatalf("clock %+v, want none", got)
	}
}

// Releases and wants in an ack, extras and the pooled limits in a grant,
// cross the wire with their key and window; a quantity without a window
// names none (the zero time), which every receiver ignores.
func TestMovedRoundTrip(t *testing.T) {
	w := time.Unix(600, 0).UTC()
	ms := []coordinator.Moved{{Limit: "loc", Window: w, Value: 0.25}, {Limit: "loc", Key: "loc:user=42", Window: w, Value: 0.5}}
	a := coordinator.Assignment{Domain: "api", Region: "us", Term: 3, Version: 9, Instance: "i1",
		Grant: &coordinator.Grant{Seq: 4, Expires: time.Unix(100, 0).UTC(), Extras: ms, Pooled: []string{"loc"}, PooledKeys: []string{"loc", "other"}}}
	g := FromAssignment(Assignment(a).GetAssignment()).Grant
	if !slices.Equal(g.Extras, ms) || !slices.Equal(g.Pooled, a.Grant.Pooled) || !slices.Equal(g.PooledKeys, a.Grant.PooledKeys) {
		t.Fatalf("grant extras %+v pooled %v %v, want %+v %v %v", g.Extras, g.Pooled, g.PooledKeys, ms, a.Grant.Pooled, a.Grant.PooledKeys)
	}
	ack := coordinator.Ack{Domain: "api", Region: "us", Term: 3, Version: 9, Seq: 4, Released: ms[:1], Wanted: ms[1:]}
	m, err := FromRegion("api", "us", Ack(ack))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.(coordinator.Ack); !slices.Equal(got.Released, ack.Released) || !slices.Equal(got.Wanted, ack.Wanted) {
		t.Fatalf("ack released %+v wanted %+v, want %+v %+v", got.Released, got.Wanted, ack.Released, ack.Wanted)
	}
	pm := Ack(ack)
	pm.GetAck().GetReleased()[0].Window = nil
	m, _ = FromRegion("api", "us", pm)
	if got := m.(coordinator.Ack).Released[0].Window; !got.IsZero() {
		t.Fatalf("a release without a window decoded with window %v", got)
	}
}

// FuzzFleetAck decodes any bytes as a region's message and steps a Fleet
// with it as an instance's: a bad one is refused, none panics.
func FuzzFleetAck(f *testing.F) {
	w := time.Unix(600, 0).UTC()
	for _, ack := range []coordinator.Ack{
		{Domain: "api", Region: "us", Term: 1, Seq: 1, Released: []coordinator.Moved{{Limit: "loc", Key: "loc:user=1", Window: w, Value: 0.5}}},
		{Domain: "api", Region: "us", Term: 1, Seq: 1, Wanted: []coordinator.Moved{{Limit: "loc", Window: w, Value: 2}}},
	} {
		b, err := proto.Marshal(Ack(ack))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	cfg, err := allot.ParseConfig("f.yaml", []byte("domain: api\nregions: [us, eu]\nlimits:\n  - {name: loc, match: {user: \"*\"}, rate: 100/1m, algorithm: sliding_window}\n"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var pm allotv1.RegionMessage
		if proto.Unmarshal(b, &pm) != nil {
			return
		}
		m, err := FromRegion("api", "us", &pm)
		if err != nil {
			return
		}
		fl, err := coordinator.NewFleet(w.Add(time.Second), coordinator.FleetConfig{Coordinator: coordinator.Config{Domain: cfg.Domain("api"), Term: 1}}, coordinator.Snapshot{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fl.Attach(w.Add(time.Second), "us", "us-1", false, coordinator.Ack{}, []coordinator.Weight{coordinator.KeyAware}); err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case coordinator.Ack:
			m.Instance = "us-1"
			_, _ = fl.Step(w.Add(2*time.Second), m)
		case coordinator.Report:
			m.Instance = "us-1"
			_, _ = fl.Step(w.Add(2*time.Second), m)
		}
	})
}

// A hello's sending time survives the wire; a hello without one, or with
// one that is not a valid time, names none (the zero time): the full
// grant then echoes nothing, and the instance learns its clock from its
// first report's echo.
func TestHelloSentAtRoundTrip(t *testing.T) {
	at := time.Unix(100, 5).UTC()
	h := Hello(coordinator.Ack{Domain: "api", Region: "us", Instance: "i1", SentAt: at}, nil).GetHello()
	if got := HelloSentAt(h); !got.Equal(at) {
		t.Fatalf("sent at %v, want %v", got, at)
	}
	h = Hello(coordinator.Ack{Domain: "api", Region: "us", Instance: "i1"}, nil).GetHello()
	if h.GetSentAt() != nil || !HelloSentAt(h).IsZero() {
		t.Fatalf("a hello without a time: %v", h.GetSentAt())
	}
	h.SentAt = &timestamppb.Timestamp{Seconds: 1, Nanos: -1}
	if got := HelloSentAt(h); !got.IsZero() {
		t.Fatalf("an invalid time read as %v, want none", got)
	}
}
