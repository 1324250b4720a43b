package coordinator

import (
	"errors"
	"reflect"
	"testing"
)

// TestApplier feeds one region's Applier a sequence of assignments: it
// applies lowerings first, ignores stale ones, acks repeats again, and
// applies nothing of a malformed one.
func TestApplier(t *testing.T) {
	d := mustDomain(t, threeRegions)
	a, err := NewApplier(d, "us", Snapshot{})
	if err != nil {
		t.Fatal(err)
	}
	third := InitialShares(d.Limits[0].Floors, d.Regions)[0]
	if got := a.Share("per-user", ""); got != third {
		t.Fatalf("initial share %v, want %v", got, third)
	}
	msg := func(term int64, version uint64, shares ...Share) Assignment {
		return Assignment{Domain: "api", Region: "us", Term: term, Version: version, Shares: shares}
	}
	def := func(v float64) Share { return Share{Limit: "per-user", Value: v} }
	key := func(v float64) Share { return Share{Limit: "per-user", Key: key42, Value: v} }
	tests := []struct {
		name     string
		m        Assignment
		apply    []Share // in order
		err      error
		def, key float64 // shares in force afterwards
	}{
		{"raise the default, pin the key lower: the key first", msg(1, 2, def(0.5), key(0.1)),
			[]Share{key(0.1), def(0.5)}, nil, 0.5, 0.1},
		{"older version", msg(1, 1, def(0.9)), nil, ErrStale, 0.5, 0.1},
		{"repeat", msg(1, 2, def(0.5), key(0.1)), nil, nil, 0.5, 0.1},
		{"bad share", msg(1, 3, def(0.2), key(1.5)), nil, ErrBadValue, 0.5, 0.1},
		{"follow for a default", msg(1, 3, def(Follow)), nil, ErrBadValue, 0.5, 0.1},
		{"a bad share of an unknown limit", msg(1, 3, def(0.2), Share{Limit: "nope", Value: 2}), nil, ErrBadValue, 0.5, 0.1},
		{"a limit of a newer configuration: skipped, the rest applied", msg(1, 3, def(0.3), Share{Limit: "nope", Value: 0.1}),
			[]Share{def(0.3)}, nil, 0.3, 0.1},
		{"other region", Assignment{Domain: "api", Region: "eu", Term: 1, Version: 3}, nil, ErrUnknownRegion, 0.3, 0.1},
		{"lower the default, unchanged key resent: only the default", msg(1, 4, def(0.2), key(0.1)),
			[]Share{def(0.2)}, nil, 0.2, 0.1},
		{"new term, lower version; the key follows the default again", msg(2, 1, key(Follow)),
			[]Share{key(Follow)}, nil, 0.2, 0.2},
		{"older term", msg(1, 9, def(0.9)), nil, ErrStale, 0.2, 0.2},
	}
	for _, tt := range tests {
		apply, ack, err := a.Apply(tt.m)
		if !errors.Is(err, tt.err) {
			t.Fatalf("%s: error %v, want %v", tt.name, err, tt.err)
		}
		if !reflect.DeepEqual(apply, tt.apply) && len(apply)+len(tt.apply) > 0 {
			t.Fatalf("%s: apply %v, want %v", tt.name, apply, tt.apply)
		}
		wantAck := Ack{}
		if err == nil {
			wantAck = Ack{Domain: "api", Region: "us", Term: tt.m.Term, Version: tt.m.Version}
		}
		if !reflect.DeepEqual(ack, wantAck) {
			t.Fatalf("%s: ack %+v, want %+v", tt.name, ack, wantAck)
		}
		if got, want := [2]float64{a.Share("per-user", ""), a.Share("per-user", key42)}, [2]float64{tt.def, tt.key}; got != want {
			t.Fatalf("%s: shares (default, key) %v, want %v", tt.name, got, want)
		}
	}
}

// TestApplierRestarts: a region starts from the snapshot, not from
// InitialShares, and ignores assignments the snapshot already covers.
func TestApplierRestarts(t *testing.T) {
	d := mustDomain(t, threeRegions)
	snap := Snapshot{Term: 3, Version: 7, Records: []Record{
		{Limit: "per-user", Cells: []Cell{{Region: "us", Share: 0.7, Bound: 0.8}, {Region: "eu", Share: 0.1, Bound: 0.1}}},
		{Limit: "per-user", Key: key42, Cells: []Cell{{Region: "us", Share: 0.05, Bound: 0.05}, {Region: "eu", Share: Follow}}},
	}}
	for _, tt := range []struct {
		region   string
		def, key float64
	}{
		{"us", 0.7, 0.05},
		{"eu", 0.1, 0.1}, // follows the default for the key
		{"ap", 0, 0},     // missing from the records: nothing
	} {
		a, err := NewApplier(d, tt.region, snap)
		if err != nil {
			t.Fatal(err)
		}
		if got := [2]float64{a.Share("per-user", ""), a.Share("per-user", key42)}; got != [2]float64{tt.def, tt.key} {
			t.Errorf("%s: shares (default, key) %v, want %v", tt.region, got, [2]float64{tt.def, tt.key})
		}
		if _, _, err := a.Apply(Assignment{Domain: "api", Region: tt.region, Term: 3, Version: 6}); !errors.Is(err, ErrStale) {
			t.Errorf("%s: an assignment older than the snapshot: error %v, want ErrStale", tt.region, err)
		}
	}
	if _, err := NewApplier(d, "mars", snap); !errors.Is(err, ErrBadConfig) {
		t.Errorf("unknown region: error %v, want ErrBadConfig", err)
	}
}
