package wire

import (
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/coordinator"
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
