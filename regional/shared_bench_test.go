package regional

import (
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// BenchmarkDecideSharedHot: one shared-mode key, peers heard, decided
// from memory with the others' counts put in place.
func BenchmarkDecideSharedHot(b *testing.B) {
	e := New(mustConfig(b, sharedConfig), Options{})
	if err := e.SetPeers("a", []string{"b", "c"}); err != nil {
		b.Fatal(err)
	}
	e.Heard(t0, "b")
	e.Heard(t0, "c")
	d := user("1")
	var dec allot.Decision
	// One hit makes the key: a zero-hit check of a key never seen is
	// decided on a fresh state, with nothing to put in place.
	if err := e.Check(t0, "api", d, 1, &dec); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = e.Check(t0.Add(time.Duration(i)), "api", d, 0, &dec)
	}
}
