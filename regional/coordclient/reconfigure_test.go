package coordclient

import (
	"context"
	"testing"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// A limit added by a new configuration starts at the region's initial
// split, never at the whole limit, and its assignments are accepted once
// the client is reconfigured.
func TestReconfigureAddsLimits(t *testing.T) {
	const base = "domain: api\nregions: [a, b, c]\nlimits:\n  - {name: x, match: {u: \"*\"}, rate: 30/s}\n"
	cfg, err := allot.ParseConfig("t.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	e := regional.New(cfg, regional.Options{})
	empty := func(context.Context, string) (coordinator.Snapshot, error) { return coordinator.Snapshot{}, nil }
	c, err := New(Options{Region: "a", Engine: e, Addrs: []string{"127.0.0.1:1"}, Snapshot: empty})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	next, err := allot.ParseConfig("t.yaml", []byte(base+"  - {name: y, match: {u: \"*\"}, rate: 30/s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e.SetConfig(next)
	if got := e.Share("api", "y", ""); got < 0.33 || got > 0.34 {
		t.Fatalf("share of a limit added at runtime: %v, want the initial split 1/3", got)
	}
	assign := &allotv1.ShareAssignment{Domain: "api", Region: "a", Term: 1, Version: 1,
		Shares: []*allotv1.Share{{Limit: "x", Value: 0.2}, {Limit: "y", Value: 0.25}}}
	c.mu.Lock()
	l := c.domains["api"]
	c.mu.Unlock()
	if _, ok := c.apply(l, assign); ok {
		t.Fatal("an assignment naming a limit the applier does not know was applied")
	}
	if err := c.Reconfigure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.apply(l, assign); !ok {
		t.Fatal("after Reconfigure, the assignment of the new limit was refused")
	}
	if x, y := e.Share("api", "x", ""), e.Share("api", "y", ""); x != 0.2 || y != 0.25 {
		t.Fatalf("shares after the assignment: x=%v y=%v", x, y)
	}
}
