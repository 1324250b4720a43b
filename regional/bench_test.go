package regional

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"golang.org/x/time/rate"
)

const benchKeys = 1_000_000

const benchConfig = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000000/s, burst: 1000}
`

// benchUsers are the descriptors of benchKeys users, built once.
// Entries and their strings are laid out contiguously, as a server's
// request buffers would be, so that reading the input does not dominate.
var benchUsers = sync.OnceValue(func() []allot.Descriptor {
	entries := make([]allot.Entry, benchKeys)
	names := make([]byte, 0, benchKeys*7)
	for i := range entries {
		names = strconv.AppendInt(names, int64(i), 10)
	}
	all := string(names)
	ds := make([]allot.Descriptor, benchKeys)
	off := 0
	for i := range entries {
		n := len(strconv.Itoa(i))
		entries[i] = allot.Entry{Key: "user", Value: all[off : off+n]}
		off += n
		ds[i] = entries[i : i+1 : i+1]
	}
	return ds
})

// benchOrder is a fixed random order of key indexes, so that every
// benchmark draws the same keys without paying for a random source.
var benchOrder = sync.OnceValue(func() []int32 {
	r := rand.New(rand.NewPCG(1, 2))
	o := make([]int32, 1<<22)
	for i := range o {
		o[i] = int32(r.IntN(benchKeys))
	}
	return o
})

func BenchmarkDecideHot(b *testing.B) {
	e := New(mustConfig(b, benchConfig), Options{})
	desc := user("42")
	dec := allot.Decision{Statuses: make([]allot.LimitStatus, 0, 4)}
	now := t0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = e.Check(now.Add(time.Duration(i)*time.Microsecond), "api", desc, 1, &dec)
	}
}

func BenchmarkDecide1MKeys(b *testing.B) {
	e := New(mustConfig(b, benchConfig), Options{})
	users, order := benchUsers(), benchOrder()
	dec := allot.Decision{Statuses: make([]allot.LimitStatus, 0, 4)}
	for i, d := range users { // warm: every key in the table
		_ = e.Check(t0.Add(time.Duration(i)), "api", d, 1, &dec)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = e.Check(t0.Add(time.Second+time.Duration(i)*time.Microsecond), "api", users[order[i&(len(order)-1)]], 1, &dec)
	}
}

func BenchmarkDecideParallel(b *testing.B) {
	e := New(mustConfig(b, benchConfig), Options{})
	users, order := benchUsers(), benchOrder()
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dec := allot.Decision{Statuses: make([]allot.LimitStatus, 0, 4)}
		i := int(worker.Add(1)) * 7919
		for pb.Next() {
			i++
			_ = e.Check(t0.Add(time.Duration(i)*time.Microsecond), "api", users[order[i&(len(order)-1)]], 1, &dec)
		}
	})
}

// BenchmarkEnforcerLeasedHot decides a hot leased key: from the lease, in
// memory, with a store call per lease.
func BenchmarkEnforcerLeasedHot(b *testing.B) {
	cfg := mustConfig(b, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000000/s, burst: 100000, enforcement: leased}
`)
	f := NewEnforcer(New(cfg, Options{}), &MemoryStore{}, EnforcerOptions{})
	items := []Item{{Descriptor: user("42"), Hits: 1}}
	dec := allot.Decision{Statuses: make([]allot.LimitStatus, 0, 4)}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = f.CheckItems(ctx, t0.Add(time.Duration(i)*time.Microsecond), "api", items, &dec)
	}
}

func BenchmarkBaselineXRateHot(b *testing.B) {
	l := rate.NewLimiter(1_000_000, 1000)
	now := t0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = l.AllowN(now.Add(time.Duration(i)*time.Microsecond), 1)
	}
}

func BenchmarkBaselineXRate1MKeys(b *testing.B) {
	var m sync.Map
	users, order := benchUsers(), benchOrder()
	key := func(d allot.Descriptor) string { return d[0].Value }
	for _, d := range users {
		m.Store(key(d), rate.NewLimiter(1_000_000, 1000))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		d := users[order[i&(len(order)-1)]]
		l, ok := m.Load(key(d))
		if !ok {
			l, _ = m.LoadOrStore(key(d), rate.NewLimiter(1_000_000, 1000))
		}
		_ = l.(*rate.Limiter).AllowN(t0.Add(time.Second+time.Duration(i)*time.Microsecond), 1)
	}
}

func BenchmarkKeyTableMemory(b *testing.B) {
	users := benchUsers()
	var dec allot.Decision
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		e := New(mustConfig(b, benchConfig), Options{})
		for i, d := range users {
			_ = e.Check(t0.Add(time.Duration(i)), "api", d, 1, &dec)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if n := e.Stats().Keys; n != benchKeys {
			b.Fatalf("keys: %d", n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/benchKeys, "B/key")
		runtime.KeepAlive(e)
	}
}
