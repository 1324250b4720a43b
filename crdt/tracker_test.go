package crdt

import "testing"

func TestTrackerObserve(t *testing.T) {
	type step struct {
		origin string
		seq    uint64
		want   Verdict
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"new origin from the start", []step{{"a", 1, Next}, {"a", 2, Next}, {"a", 3, Next}}},
		{"new origin mid-stream", []step{{"a", 4, Gap}, {"a", 5, Next}}},
		{"seq 0 from a new origin", []step{{"a", 0, Duplicate}, {"a", 1, Next}}},
		{"last=5", []step{
			{"a", 5, Gap},
			{"a", 5, Duplicate},
			{"a", 3, Old},
			{"a", 6, Next},
			{"a", 8, Gap},
			{"a", 9, Next}, // a gap is reported once
			{"a", 7, Old},  // the missing delta, late
		}},
		{"origins are independent", []step{{"a", 1, Next}, {"b", 1, Next}, {"b", 3, Gap}, {"a", 2, Next}, {"b", 2, Old}}},
	}
	for _, tt := range tests {
		var tr Tracker
		for i, s := range tt.steps {
			if got := tr.Observe(s.origin, s.seq); got != s.want {
				t.Errorf("%s: step %d: Observe(%q, %d) = %v, want %v", tt.name, i, s.origin, s.seq, got, s.want)
			}
		}
	}
}

func TestTrackerReset(t *testing.T) {
	tests := []struct {
		name     string
		last     uint64 // observed before Reset; 0: none
		reset    uint64
		seq      uint64
		want     Verdict
		wantLast uint64
	}{
		{"resync of a new origin", 0, 20, 21, Next, 21},
		{"resync after a gap", 8, 12, 13, Next, 13},
		{"reset lower, origin restarted", 50, 0, 1, Next, 1},
		{"delta covered by the full state", 8, 12, 11, Old, 12},
	}
	for _, tt := range tests {
		var tr Tracker
		if tt.last > 0 {
			tr.Observe("a", tt.last)
		}
		tr.Reset("a", tt.reset)
		if got := tr.Observe("a", tt.seq); got != tt.want || tr.Last("a") != tt.wantLast {
			t.Errorf("%s: Observe(%d) = %v, last %d; want %v, %d", tt.name, tt.seq, got, tr.Last("a"), tt.want, tt.wantLast)
		}
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{Duplicate: "Duplicate", Old: "Old", Next: "Next", Gap: "Gap", 9: "Verdict(9)"} {
		if got := v.String(); got != want {
			t.Errorf("Verdict(%d).String() = %q, want %q", v, got, want)
		}
	}
}
