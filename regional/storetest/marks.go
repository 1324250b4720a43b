package storetest

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/allot-dev/allot/regional"
)

// RunMarks checks what the persistence of long windows needs of s: the
// records of one instance, limit and window, field by field, apart from
// other instances' and windows', and expired at the window's end. It uses
// an instance of its own, so s may be shared.
func RunMarks(t *testing.T, s regional.MarkStore) {
	instance := fmt.Sprintf("storetest-%x", rand.Uint64())
	now := time.Now()
	win := now.UnixNano() / int64(time.Hour)
	rec := func(limit string, window int64) regional.Marks {
		return regional.Marks{Domain: "api", Limit: limit, Period: time.Hour, Window: window}
	}
	want := []regional.Marks{rec("per-user", win), rec("per-org", win)}
	if got, err := s.LoadMarks(ctx(t), instance, want); err != nil || len(got) != 0 {
		t.Fatalf("load before any save: %+v, %v", got, err)
	}
	a := rec("per-user", win)
	a.Low, a.Floor = 0.5, 3
	a.Keys = []regional.KeyMark{{Key: "per-user:user=1", Mark: 10}, {Key: "per-user:user=2", Mark: 4}}
	if err := s.SaveMarks(ctx(t), now, instance, []regional.Marks{a}); err != nil {
		t.Fatal(err)
	}
	// A later save replaces what it names and keeps the rest.
	b := rec("per-user", win)
	b.Low, b.Floor = 0.25, 5
	b.Keys = []regional.KeyMark{{Key: "per-user:user=1", Mark: 15}, {Key: "per-user:user=3", Mark: 5}}
	if err := s.SaveMarks(ctx(t), now, instance, []regional.Marks{b}); err != nil {
		t.Fatal(err)
	}
	// Another instance's, and the previous window's (expired), are apart.
	other := rec("per-user", win)
	other.Low, other.Floor, other.Keys = 1, 1, []regional.KeyMark{{Key: "per-user:user=1", Mark: 99}}
	if err := s.SaveMarks(ctx(t), now, instance+"-other", []regional.Marks{other}); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveMarks(ctx(t), now, instance, []regional.Marks{{Domain: "api", Limit: "per-user", Period: time.Hour, Window: win - 1, Low: 1, Floor: 1}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadMarks(ctx(t), instance, append(want, rec("per-user", win-1)))
	if err != nil {
		t.Fatal(err)
	}
	exp := []regional.Marks{{Domain: "api", Limit: "per-user", Period: time.Hour, Window: win, Low: 0.25, Floor: 5,
		Keys: []regional.KeyMark{{Key: "per-user:user=1", Mark: 15}, {Key: "per-user:user=2", Mark: 4}, {Key: "per-user:user=3", Mark: 5}}}}
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("load:\n got %+v\nwant %+v", got, exp)
	}
	// Many keys in one record.
	big := rec("per-org", win)
	big.Low, big.Floor = 1, 2
	for i := range 2000 {
		big.Keys = append(big.Keys, regional.KeyMark{Key: fmt.Sprintf("per-org:org=%04d", i), Mark: float64(i)})
	}
	if err := s.SaveMarks(ctx(t), now, instance, []regional.Marks{big}); err != nil {
		t.Fatal(err)
	}
	got, err = s.LoadMarks(ctx(t), instance, []regional.Marks{rec("per-org", win)})
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], big) {
		t.Fatalf("a record of 2000 keys: %d records, %v", len(got), err)
	}
}
