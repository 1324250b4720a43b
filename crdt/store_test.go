package crdt

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

var (
	keyGen    = rapid.SampledFrom([]string{"user=1", "user=2", "tenant=acme"})
	windowGen = rapid.Uint64Range(0, 8)
)

// snapshot flattens every slot of s into "key/window/region" → value.
func snapshot(s *Store) map[string]uint64 {
	m := make(map[string]uint64)
	for _, w := range s.windows {
		for key, e := range w.keys {
			for _, sl := range e.c.slots {
				m[fmt.Sprintf("%s/%d/%s", key, w.id, sl.region)] = sl.n
			}
		}
	}
	return m
}

func TestStoreDeltasSince(t *testing.T) {
	s := NewStore("us-east", 0)
	s.Inc("a", 10, 1)
	s.Inc("a", 10, 2)
	s.Inc("b", 10, 5)
	ds, v := s.DeltasSince(0)
	want := []Delta{
		{Key: "a", Window: 10, Origin: "us-east", Seq: 1, Value: 3},
		{Key: "b", Window: 10, Origin: "us-east", Seq: 2, Value: 5},
	}
	if !slices.Equal(ds, want) || v != 3 {
		t.Fatalf("DeltasSince(0) = %v, %d; want %v, 3", ds, v, want)
	}
	if ds, v2 := s.DeltasSince(v); len(ds) != 0 || v2 != v {
		t.Fatalf("DeltasSince(%d) with no change = %v, %d; want none, %d", v, ds, v2, v)
	}
	s.Inc("a", 10, 4)
	s.Apply(Delta{Key: "c", Window: 10, Origin: "eu-west", Seq: 9, Value: 7}) // not ours: not reported
	ds, _ = s.DeltasSince(v)
	want = []Delta{{Key: "a", Window: 10, Origin: "us-east", Seq: 3, Value: 7}}
	if !slices.Equal(ds, want) {
		t.Fatalf("DeltasSince(%d) = %v, want %v", v, ds, want)
	}
	full, seq := s.FullState()
	want = []Delta{
		{Key: "b", Window: 10, Origin: "us-east", Seq: 3, Value: 5},
		{Key: "a", Window: 10, Origin: "us-east", Seq: 3, Value: 7},
	}
	if !slices.Equal(full, want) || seq != 3 {
		t.Fatalf("FullState() = %v, %d; want %v, 3", full, seq, want)
	}
}

func TestStoreRetention(t *testing.T) {
	tests := []struct {
		name   string
		window uint64
		err    error
	}{
		{"first window", 10, nil},
		{"previous window", 9, nil},
		{"older than retention", 8, ErrOldWindow},
		{"next window", 11, nil},
		{"dropped window", 9, ErrOldWindow},
	}
	s := NewStore("us-east", 2)
	for _, tt := range tests {
		if err := s.Inc("k", tt.window, 1); !errors.Is(err, tt.err) {
			t.Fatalf("%s: Inc(window %d) = %v, want %v", tt.name, tt.window, err, tt.err)
		}
		if err := s.Apply(Delta{Key: "k", Window: tt.window, Origin: "eu-west", Value: 1}); !errors.Is(err, tt.err) {
			t.Fatalf("%s: Apply(window %d) = %v, want %v", tt.name, tt.window, err, tt.err)
		}
	}
	if s.Value("k", 9) != 0 || s.Value("k", 10) != 2 || s.Value("k", 11) != 2 {
		t.Fatalf("values 9, 10, 11 = %d, %d, %d; want 0, 2, 2", s.Value("k", 9), s.Value("k", 10), s.Value("k", 11))
	}
	s.Advance(20)
	if len(s.windows) != 0 || s.Value("k", 11) != 0 {
		t.Fatalf("Advance(20) kept %d windows", len(s.windows))
	}
}

// TestStoreRetentionModel runs random operations on a store and on a
// model of one map per window, dropping windows the same way.
func TestStoreRetentionModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		retention := rapid.IntRange(1, 4).Draw(t, "retention")
		s := NewStore("us-east", retention)
		model := make(map[uint64]map[string]*GCounter) // window → key → counter
		var newest uint64
		isOld := func(w uint64) bool { return w+uint64(retention) <= newest }
		advance := func(w uint64) {
			newest = max(newest, w)
			maps.DeleteFunc(model, func(w uint64, _ map[string]*GCounter) bool { return isOld(w) })
		}
		counter := func(key string, w uint64) *GCounter {
			advance(w)
			if model[w] == nil {
				model[w] = make(map[string]*GCounter)
			}
			if model[w][key] == nil {
				model[w][key] = new(GCounter)
			}
			return model[w][key]
		}
		checkErr := func(t *rapid.T, w uint64, err error) {
			if wantOld := isOld(w); errors.Is(err, ErrOldWindow) != wantOld {
				t.Fatalf("window %d (newest %d): err %v, want old=%v", w, newest, err, wantOld)
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"inc": func(t *rapid.T) {
				key, w, n := keyGen.Draw(t, "key"), windowGen.Draw(t, "window"), rapid.Uint64Range(1, 10).Draw(t, "n")
				err := s.Inc(key, w, n)
				checkErr(t, w, err)
				if err == nil {
					counter(key, w).Inc("us-east", n)
				}
			},
			"apply": func(t *rapid.T) {
				d := Delta{Key: keyGen.Draw(t, "key"), Window: windowGen.Draw(t, "window"), Origin: regionGen.Draw(t, "origin"), Value: rapid.Uint64Range(1, 50).Draw(t, "value")}
				err := s.Apply(d)
				checkErr(t, d.Window, err)
				if err == nil {
					counter(d.Key, d.Window).raise(d.Origin, d.Value)
				}
			},
			"advance": func(t *rapid.T) {
				w := windowGen.Draw(t, "window")
				s.Advance(w)
				advance(w)
			},
			"": func(t *rapid.T) {
				if len(s.windows) > retention {
					t.Fatalf("store holds %d windows, retention %d", len(s.windows), retention)
				}
				for _, w := range s.windows {
					if isOld(w.id) {
						t.Fatalf("store holds window %d, newest %d, retention %d", w.id, newest, retention)
					}
				}
				for w := range uint64(9) {
					for _, key := range []string{"user=1", "user=2", "tenant=acme"} {
						c := model[w][key]
						if c == nil {
							c = new(GCounter)
						}
						if s.Value(key, w) != c.Value() {
							t.Fatalf("Value(%s, %d) = %d, want %d", key, w, s.Value(key, w), c.Value())
						}
						for _, r := range regions {
							if s.Slot(key, w, r) != c.Slot(r) {
								t.Fatalf("Slot(%s, %d, %s) = %d, want %d", key, w, r, s.Slot(key, w, r), c.Slot(r))
							}
						}
					}
				}
			},
		})
	})
}

// TestDeltaMergeEqualsFullStateMerge: regions count and ship deltas; a
// receiver that applies any permutation of all the deltas, with duplicates,
// ends in the state of one that merged every region's full state.
func TestDeltaMergeEqualsFullStateMerge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		retention := rapid.IntRange(1, 3).Draw(t, "retention")
		stores := make([]*Store, len(regions))
		versions := make([]uint64, len(regions))
		lastSeq := make([]uint64, len(regions))
		for i, r := range regions {
			stores[i] = NewStore(r, retention)
		}
		var stream []Delta
		flush := func(t *rapid.T, i int) {
			var ds []Delta
			ds, versions[i] = stores[i].DeltasSince(versions[i])
			type slotID struct {
				key    string
				window uint64
			}
			seen := make(map[slotID]bool)
			for _, d := range ds {
				if d.Seq != lastSeq[i]+1 {
					t.Fatalf("%s: seq %d after %d", regions[i], d.Seq, lastSeq[i])
				}
				lastSeq[i] = d.Seq
				if id := (slotID{d.Key, d.Window}); seen[id] {
					t.Fatalf("%s: slot %v twice in one batch", regions[i], id)
				} else {
					seen[id] = true
				}
			}
			stream = append(stream, ds...)
		}
		t.Repeat(map[string]func(*rapid.T){
			"inc": func(t *rapid.T) {
				i := rapid.IntRange(0, len(stores)-1).Draw(t, "region")
				stores[i].Inc(keyGen.Draw(t, "key"), windowGen.Draw(t, "window"), rapid.Uint64Range(1, 10).Draw(t, "n"))
			},
			"flush": func(t *rapid.T) { flush(t, rapid.IntRange(0, len(stores)-1).Draw(t, "region")) },
		})
		for i := range stores {
			flush(t, i)
		}

		all := slices.Clone(stream)
		if len(stream) > 0 {
			for _, i := range rapid.SliceOf(rapid.IntRange(0, len(stream)-1)).Draw(t, "duplicates") {
				all = append(all, stream[i])
			}
		}
		byDelta := NewStore("observer", retention)
		for _, d := range rapid.Permutation(all).Draw(t, "order") {
			byDelta.Apply(d)
		}
		byState := NewStore("observer", retention)
		for _, s := range stores {
			full, _ := s.FullState()
			for _, d := range full {
				byState.Apply(d)
			}
		}
		if got, want := snapshot(byDelta), snapshot(byState); !maps.Equal(got, want) {
			t.Fatalf("delta merge %v != full-state merge %v", got, want)
		}
	})
}

// TestResyncAfterGap: a receiver that loses a batch sees a gap, resyncs from
// the origin's full state and then follows the stream again.
func TestResyncAfterGap(t *testing.T) {
	origin, receiver := NewStore("us-east", 0), NewStore("eu-west", 0)
	var tracker Tracker
	var version uint64
	send := func(lost bool) []Verdict {
		var ds []Delta
		ds, version = origin.DeltasSince(version)
		if lost {
			return nil
		}
		var vs []Verdict
		for _, d := range ds {
			vs = append(vs, tracker.Observe(d.Origin, d.Seq))
			receiver.Apply(d)
		}
		return vs
	}
	origin.Inc("a", 1, 1)
	origin.Inc("b", 1, 1)
	if vs := send(false); !slices.Equal(vs, []Verdict{Next, Next}) {
		t.Fatalf("first batch: %v, want [Next Next]", vs)
	}
	origin.Inc("c", 1, 1)
	send(true)
	origin.Inc("a", 1, 1)
	if vs := send(false); !slices.Equal(vs, []Verdict{Gap}) {
		t.Fatalf("batch after a lost one: %v, want [Gap]", vs)
	}
	if receiver.Slot("c", 1, "us-east") != 0 {
		t.Fatalf("receiver has the lost delta")
	}
	full, seq := origin.FullState()
	for _, d := range full {
		receiver.Apply(d)
	}
	tracker.Reset("us-east", seq)
	for _, key := range []string{"a", "b", "c"} {
		if got, want := receiver.Slot(key, 1, "us-east"), origin.Slot(key, 1, "us-east"); got != want {
			t.Fatalf("after resync, slot of %s = %d, want %d", key, got, want)
		}
	}
	origin.Inc("b", 1, 1)
	if vs := send(false); !slices.Equal(vs, []Verdict{Next}) {
		t.Fatalf("batch after resync: %v, want [Next]", vs)
	}
}
