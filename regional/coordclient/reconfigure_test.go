package coordclient

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// An instance starts holding nothing. An assignment naming a limit its
// configuration lacks (the coordinator's is newer) is applied but for
// that limit; once the limit is added it is held at nothing, and the
// instance is behind until a full grant brings its share.
func TestReconfigureAddsLimits(t *testing.T) {
	const base = "domain: api\nregions: [a, b, c]\nlimits:\n  - {name: x, match: {u: \"*\"}, rate: 30/s, enforcement: exact}\n"
	cfg, err := allot.ParseConfig("t.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	e := regional.New(cfg, regional.Options{})
	c, err := New(Options{Region: "a", Instance: "a-1", Engine: e, Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.Share("api", "x", ""); got != 0 {
		t.Fatalf("share before any grant: %v, want 0", got)
	}
	if c.Ready() == nil {
		t.Fatal("ready before any grant")
	}
	next, err := allot.ParseConfig("t.yaml", []byte(base+"  - {name: y, match: {u: \"*\"}, rate: 30/s, enforcement: exact}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e.Reconfigure(time.Now(), next)
	if got := e.Share("api", "y", ""); got != 0 {
		t.Fatalf("share of a limit added at runtime: %v, want 0 until assigned", got)
	}
	expires := timestamppb.New(time.Now().Add(time.Minute))
	assign := &allotv1.ShareAssignment{Domain: "api", Region: "a", Term: 1, Version: 1, Instance: "a-1",
		Grant:  &allotv1.Grant{Seq: 1, Expires: expires, Full: true},
		Shares: []*allotv1.Share{{Limit: "x", Value: 0.2}, {Limit: "y", Value: 0.25}}}
	c.mu.Lock()
	l := c.domains["api"]
	c.mu.Unlock()
	if _, ok := c.assign(l, assign); !ok {
		t.Fatal("an assignment naming a limit the instance does not know was refused")
	}
	if x := e.Share("api", "x", ""); x != 0.2 {
		t.Fatalf("share of x after an assignment that also names y: %v, want 0.2", x)
	}
	if err := c.Reconfigure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if x, y := e.Share("api", "x", ""), e.Share("api", "y", ""); x != 0.2 || y != 0 {
		t.Fatalf("shares after Reconfigure: x=%v y=%v, want 0.2 and 0 until assigned", x, y)
	}
	if !c.node.Behind("api") {
		t.Fatal("not behind after Reconfigure added a limit")
	}
	select {
	case <-l.resync:
	default:
		t.Fatal("Reconfigure added a limit without starting the stream again")
	}
	assign.Version, assign.Grant.Seq = 2, 2
	if _, ok := c.assign(l, assign); !ok {
		t.Fatal("after Reconfigure, the assignment of the new limit was refused")
	}
	if c.node.Behind("api") {
		t.Fatal("still behind after a full grant")
	}
	if x, y := e.Share("api", "x", ""), e.Share("api", "y", ""); x != 0.2 || y != 0.25 {
		t.Fatalf("shares after the assignment: x=%v y=%v", x, y)
	}
	if err := c.Ready(); err != nil {
		t.Fatalf("not ready after a grant: %v", err)
	}
}
