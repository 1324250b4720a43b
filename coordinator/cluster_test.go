package coordinator

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// t0 is the start of every scenario.
var t0 = time.Unix(1_700_000_000, 0)

type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func mustDomain(t tb, yaml string) *allot.Domain {
	t.Helper()
	cfg, err := allot.ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg.Domains[0]
}

// threeRegions has one limit with floors of 0.05 in each of three regions.
const threeRegions = `
domain: api
regions: [us, eu, ap]
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1s, floors: {us: 0.05, eu: 0.05, ap: 0.05}}
`

// store is an in-memory etcd: the latest record of every vector, and the
// term and version persisted with the latest of them.
type store struct {
	term    int64
	version uint64
	recs    map[keyID]Record
}

func (s *store) persist(rd Ready) {
	if len(rd.Persist) == 0 {
		return
	}
	if rd.Term < s.term {
		panic("persist of an old term: a deposed leader's write must be fenced")
	}
	s.term, s.version = rd.Term, rd.Version
	for _, r := range rd.Persist {
		if r.Cells == nil {
			delete(s.recs, keyID{r.Limit, r.Key})
		} else {
			s.recs[keyID{r.Limit, r.Key}] = r
		}
	}
}

func (s *store) snapshot() Snapshot {
	recs := slices.SortedFunc(maps.Values(s.recs), func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Key, b.Key))
	})
	return Snapshot{Term: s.term, Version: s.version, Records: recs}
}

// envelope is a message in flight: to the coordinator (to < 0) or to
// region to.
type envelope struct {
	to   int
	from int // region that sent it, for partitions
	m    any
}

// cluster runs a Coordinator, its store, one Applier per region and a
// network between them.
type cluster struct {
	t     tb
	d     *allot.Domain
	cfg   Config
	now   time.Time
	c     *Coordinator
	store store
	apps  []*Applier
	net   []envelope
	cut   []bool      // partitioned regions: their messages are lost
	at    []time.Time // At of each region's latest report
	keys  []string    // every key reports may name
}

func newCluster(t tb, yaml string, cfg Config) *cluster {
	t.Helper()
	cl := &cluster{t: t, d: mustDomain(t, yaml), cfg: cfg, now: t0, store: store{recs: map[keyID]Record{}}}
	n := len(cl.d.Regions)
	cl.cut, cl.at = make([]bool, n), make([]time.Time, n)
	cl.cfg.Domain, cl.cfg.Term = cl.d, 1
	var err error
	if cl.c, err = New(cl.now, cl.cfg, Snapshot{}); err != nil {
		t.Fatalf("New: %v", err)
	}
	for r := range cl.d.Regions {
		cl.restart(r)
	}
	return cl
}

func (cl *cluster) region(name string) int { return slices.Index(cl.d.Regions, name) }

// handle persists rd, then puts its assignments on the network.
func (cl *cluster) handle(rd Ready) {
	cl.store.persist(rd)
	for _, a := range rd.Send {
		cl.net = append(cl.net, envelope{to: cl.region(a.Region), from: -1, m: a})
	}
}

func (cl *cluster) tick(dt time.Duration) {
	cl.now = cl.now.Add(dt)
	cl.handle(cl.c.Tick(cl.now))
	cl.check()
}

// report sends region r's demand: per limit, and for each key its
// admitted cost (negative: rejected cost). Keys with rejections or in near
// are reported near their limit.
func (cl *cluster) report(r int, limit float64, keys map[string]float64, near ...string) {
	cl.at[r] = later(cl.now, cl.at[r])
	ld := LimitDemand{Limit: cl.d.Limits[0].Name, Admitted: limit}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		kd := KeyDemand{Key: k, Admitted: keys[k], NearLimit: slices.Contains(near, k)}
		if kd.Admitted < 0 {
			kd.Admitted, kd.Rejected = 0, -kd.Admitted
		}
		ld.Keys = append(ld.Keys, kd)
	}
	rep := Report{Domain: cl.d.Name, Region: cl.d.Regions[r], At: cl.at[r], Limits: []LimitDemand{ld}}
	cl.net = append(cl.net, envelope{to: -1, from: r, m: rep})
}

func later(now, prev time.Time) time.Time {
	if now.After(prev) {
		return now
	}
	return prev.Add(time.Nanosecond)
}

// deliver takes message i off the network (leaving a copy if dup) and
// delivers it, unless its region is cut off.
func (cl *cluster) deliver(i int, dup bool) {
	e := cl.net[i]
	if !dup {
		cl.net = slices.Delete(cl.net, i, i+1)
	}
	r := max(e.to, e.from)
	if cl.cut[r] {
		return
	}
	switch m := e.m.(type) {
	case Assignment:
		_, ack, err := cl.apps[e.to].Apply(m)
		if err == nil {
			cl.net = append(cl.net, envelope{to: -1, from: e.to, m: ack})
		}
	case Report, Ack:
		rd, err := cl.c.Step(cl.now, m.(Message))
		if err != nil && !errors.Is(err, ErrStale) { // late reports, acks of an older term
			cl.t.Fatalf("step %+v: %v", m, err)
		}
		cl.handle(rd)
	}
	cl.check()
}

// settle delivers every message in order until none is left: a reliable
// network.
func (cl *cluster) settle() {
	for len(cl.net) > 0 {
		cl.deliver(0, false)
	}
}

// newLeader replaces the coordinator by one of the next term, starting
// from the store. The old one is dropped: its writes would be fenced.
func (cl *cluster) newLeader() {
	cl.t.Helper()
	cl.cfg.Term = max(cl.cfg.Term, cl.store.term) + 1
	var err error
	if cl.c, err = New(cl.now, cl.cfg, cl.store.snapshot()); err != nil {
		cl.t.Fatalf("New: %v", err)
	}
	cl.check()
}

// restart restarts region r's Applier from the store.
func (cl *cluster) restart(r int) {
	cl.t.Helper()
	a, err := NewApplier(cl.d, cl.d.Regions[r], cl.store.snapshot())
	if err != nil {
		cl.t.Fatalf("NewApplier: %v", err)
	}
	if cl.apps == nil {
		cl.apps = make([]*Applier, len(cl.d.Regions))
	}
	cl.apps[r] = a
}

// share returns the share region r applies for key ("": the default).
func (cl *cluster) share(r int, key string) float64 {
	return cl.apps[r].Share(cl.d.Limits[0].Name, key)
}

// check fails unless, for every limit's default vector and every key, the
// shares the regions apply sum to at most 1, and each is within what the
// coordinator counts as held, which sums to at most 1 too.
func (cl *cluster) check() {
	cl.t.Helper()
	n := len(cl.d.Regions)
	for _, ls := range cl.c.limits {
		sum := 0.0
		for r := range n {
			sum += float64(ls.def[r].bound)
		}
		if sum > 1+1e-9 {
			cl.t.Fatalf("%s: coordinator holds %+v, sum %v > 1", ls.name, ls.def, sum)
		}
		for i, k := range ls.keys {
			// After a failover a key may be counted above 1 until acked (see New).
			sum, unsure := 0.0, false
			for r := range n {
				x := ls.cells[i*n+r]
				sum += float64(x.held(ls.def[r].bound))
				unsure = unsure || x.flags&pending != 0
			}
			if sum > 1+1e-9 && !(unsure && cl.c.term > 1) {
				cl.t.Fatalf("%s %q: coordinator holds %+v (default %+v), sum %v > 1", ls.name, k.name, ls.cells[i*n:i*n+n], ls.def, sum)
			}
		}
		for _, key := range append([]string{""}, cl.keys...) {
			sum, applied := 0.0, make([]float64, n)
			for r := range n {
				s := cl.apps[r].Share(ls.name, key)
				applied[r] = s
				sum += s
				held := ls.def[r].bound
				if i, ok := ls.index[key]; ok && key != "" {
					held = ls.cells[int(i)*n+r].held(held)
				}
				if s > float64(held)+1e-9 {
					cl.t.Fatalf("%s %q: region %s applies %v, coordinator holds %v", ls.name, key, cl.d.Regions[r], s, held)
				}
			}
			if sum > 1+1e-9 {
				cl.t.Fatalf("%s %q: regions apply %v, sum %v > 1", ls.name, key, applied, sum)
			}
		}
	}
}

func (cl *cluster) shares(key string) []float64 {
	s := make([]float64, len(cl.apps))
	for r := range s {
		s[r] = cl.share(r, key)
	}
	return s
}

func TestClusterStore(t *testing.T) {
	// The harness itself: a deleted record is gone from the snapshot.
	s := store{recs: map[keyID]Record{}}
	s.persist(Ready{Term: 1, Version: 3, Persist: []Record{{Limit: "l", Key: "k", Cells: []Cell{{Region: "us"}}}}})
	s.persist(Ready{Term: 1, Version: 4, Persist: []Record{{Limit: "l", Key: "k"}}})
	if got := s.snapshot(); got.Version != 4 || len(got.Records) != 0 {
		t.Fatalf("snapshot = %+v", got)
	}
}
