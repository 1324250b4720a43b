package coordinator

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// Allowance moving within a window (docs/adr/0005), the coordinator's
// half: what instances release of a window (Ack.Released) pools, per
// limit, key and window, and goes out as extras (Grant.Extras) to the
// instances that want some of the same window (Ack.Wanted), never more
// than was released nor than each wanted.

const poolConfig = `
domain: api
regions: [us, eu]
limits:
  - {name: sw, match: {user: "*"}, rate: 600/1m, algorithm: sliding_window}
  - {name: tb, match: {user: "*"}, rate: 10/1s}
  - {name: sw1, match: {user: "*"}, rate: 10/1s, algorithm: sliding_window}
`

// poolWorld is a Fleet and its instances (real Instances), whose acks a
// test fills with releases and wants as an engine would.
type poolWorld struct {
	t     *testing.T
	now   time.Time
	f     *Fleet
	term  int64
	ids   []string
	inst  map[string]*Instance
	inbox map[string][]Assignment
	// extras are what the Fleet handed out, by instance.
	extras map[string][]Moved
}

func newPoolWorld(t *testing.T) *poolWorld {
	w := &poolWorld{t: t, now: time.Unix(6000, 0), term: 3, ids: []string{"us-1", "us-2", "eu-1"}}
	w.leader(nil)
	return w
}

// leader starts a Fleet of the next term (continuing prev, if not nil)
// and connects every instance to it.
func (w *poolWorld) leader(prev *Fleet) {
	cfg, err := allot.ParseConfig("pool.yaml", []byte(poolConfig))
	if err != nil {
		w.t.Fatal(err)
	}
	w.term++
	f, err := NewFleet(w.now, FleetConfig{Coordinator: Config{Domain: cfg.Domain("api"), Term: w.term, Period: 2 * time.Second, DeadAfter: time.Hour},
		GrantTTL: time.Hour, MaxSkew: 100 * time.Millisecond}, Snapshot{}, prev)
	if err != nil {
		w.t.Fatal(err)
	}
	w.f, w.inbox, w.extras = f, map[string][]Assignment{}, map[string][]Moved{}
	if w.inst == nil {
		w.inst = map[string]*Instance{}
		for _, id := range w.ids {
			x, err := NewInstance(cfg.Domain("api"), id[:2], id)
			if err != nil {
				w.t.Fatal(err)
			}
			w.inst[id] = x
		}
	}
	for _, id := range w.ids {
		x := w.inst[id]
		x.Reconnect()
		hello, ws := x.Hello()
		rd, err := f.Attach(w.now, id[:2], id, false, hello, ws)
		if err != nil {
			w.t.Fatal(err)
		}
		w.out(rd)
	}
}

func (w *poolWorld) out(rd Ready) {
	for _, a := range rd.Send {
		w.inbox[a.Instance] = append(w.inbox[a.Instance], a)
		if a.Grant != nil {
			w.extras[a.Instance] = append(w.extras[a.Instance], a.Grant.Extras...)
		}
	}
}

// deliver applies id's pending assignments; the last one's ack carries
// released and wanted. It returns the last ack sent (zero: none); what
// the acks bring waits for the next delivery.
func (w *poolWorld) deliver(id string, released, wanted []Moved) Ack {
	var last Ack
	pending := w.inbox[id]
	w.inbox[id] = nil // what the acks bring waits for the next delivery
	for i, a := range pending {
		_, ack, err := w.inst[id].Apply(w.now, a)
		if err != nil {
			continue
		}
		if i == len(pending)-1 {
			ack.Released, ack.Wanted = released, wanted
		}
		rd, err := w.f.Step(w.now, ack)
		if err != nil {
			w.t.Fatalf("ack of %s refused: %v", id, err)
		}
		w.out(rd)
		last = ack
	}
	return last
}

// tick renews every grant, a rebalance period on.
func (w *poolWorld) tick() {
	w.now = w.now.Add(2 * time.Second)
	w.out(w.f.Tick(w.now))
}

func (w *poolWorld) window() time.Time { return w.now.Truncate(time.Minute) }

func (w *poolWorld) moved(key string, v float64) []Moved {
	return []Moved{{Limit: "sw", Key: key, Window: w.window(), Value: v}}
}

func sumMoved(ms []Moved, key string, window time.Time) float64 {
	s := 0.0
	for _, m := range ms {
		if m.Key == key && m.Window.Equal(window) {
			s += m.Value
		}
	}
	return s
}

// TestFleetHandsOutWhatWasReleased: eu-1 wants 0.3 of a hot key's window;
// us-1 releases 0.2 of it, which goes to eu-1 at once; us-2 releases 0.5
// more, of which eu-1 gets the 0.1 it still wants. A replayed ack, or a
// release of a window that is over or of a bucket, moves nothing; a value
// outside [0, 1] is refused and changes nothing; a new leader pools
// nothing of what the old one held, and no default vector's release in
// the window it began in.
func TestFleetHandsOutWhatWasReleased(t *testing.T) {
	w := newPoolWorld(t)
	w.now = w.now.Add(70 * time.Second) // a window after the Fleet began
	for _, id := range w.ids {
		w.deliver(id, nil, nil)
	}
	const k = "sw:user=1"
	g := w.f.Tick(w.now)
	w.out(g)
	for _, a := range g.Send {
		if !equalStrings(a.Grant.PooledKeys, []string{"sw"}) || !equalStrings(a.Grant.Pooled, []string{"sw"}) {
			t.Fatalf("grant to %s pools keys of %v and defaults of %v, want the long sliding window's both (not a bucket's, nor a window no longer than the period)", a.Instance, a.Grant.PooledKeys, a.Grant.Pooled)
		}
	}
	w.deliver("eu-1", nil, w.moved(k, 0.3))
	w.deliver("us-2", nil, nil)
	if got := sumMoved(w.extras["eu-1"], k, w.window()); got != 0 {
		t.Fatalf("eu-1 got %v with nothing released", got)
	}
	ack := w.deliver("us-1", w.moved(k, 0.2), nil)
	if got := sumMoved(w.extras["eu-1"], k, w.window()); math.Abs(got-0.2) > 1e-12 {
		t.Fatalf("eu-1 got %v of key 1's window after us-1 released 0.2", got)
	}
	w.deliver("eu-1", nil, nil) // the grant with the extra
	// Replayed, the ack credits nothing again.
	if rd, err := w.f.Step(w.now, ack); err != nil || len(rd.Send) != 0 {
		t.Fatalf("a replayed ack: %v, %d assignments", err, len(rd.Send))
	}
	w.tick()
	w.deliver("us-1", nil, nil)
	w.deliver("eu-1", nil, nil)
	// A bad value is refused, and its good release is not taken either.
	w.tick()
	a := w.inbox["us-2"][0]
	w.inbox["us-2"] = nil
	_, bad, err := w.inst["us-2"].Apply(w.now, a)
	if err != nil {
		t.Fatal(err)
	}
	bad.Released = append(w.moved(k, 0.5), Moved{Limit: "sw", Key: k, Window: w.window(), Value: math.NaN()})
	if _, err := w.f.Step(w.now, bad); !errors.Is(err, ErrBadValue) {
		t.Fatalf("a release of NaN: %v, want ErrBadValue", err)
	}
	if got := sumMoved(w.extras["eu-1"], k, w.window()); math.Abs(got-0.2) > 1e-12 {
		t.Fatalf("a refused ack moved allowance: eu-1 has %v", got)
	}
	// Of a window that is over, or of a bucket: nothing; then a good one.
	bad.Released = []Moved{
		{Limit: "sw", Key: k, Window: w.window().Add(-time.Minute), Value: 0.5},
		{Limit: "tb", Key: k, Window: w.window(), Value: 0.5},
		{Limit: "sw", Key: k, Window: w.window(), Value: 0.5},
	}
	rd, err := w.f.Step(w.now, bad)
	if err != nil {
		t.Fatal(err)
	}
	w.out(rd)
	if got := sumMoved(w.extras["eu-1"], k, w.window()); math.Abs(got-0.3) > 1e-12 {
		t.Fatalf("eu-1 got %v in all, want what it wanted, 0.3", got)
	}
	for id, xs := range w.extras {
		for _, x := range xs {
			if x.Limit != "sw" || !x.Window.Equal(w.window()) || id != "eu-1" {
				t.Fatalf("an extra %+v to %s", x, id)
			}
		}
	}
	// The pool keeps 0.4 of the window; a new leader keeps none of it.
	prev := w.f
	w.leader(prev)
	for _, id := range w.ids {
		w.deliver(id, nil, nil)
	}
	w.tick()
	w.deliver("eu-1", nil, w.moved(k, 0.3))
	for _, id := range w.ids {
		w.deliver(id, nil, nil)
	}
	if got := sumMoved(w.extras["eu-1"], k, w.window()); got != 0 {
		t.Fatalf("a new leader handed out %v it was not released", got)
	}
	// Nor does it pool the default vector's releases in the window it
	// began in: an earlier leader's hot keys may have had shares of their
	// own in it.
	w.now = w.now.Add(2 * time.Second)
	for _, a := range w.f.Tick(w.now).Send {
		if len(a.Grant.Pooled) != 0 {
			t.Fatalf("a new leader pools the default's releases of the window it began in: %v", a.Grant.Pooled)
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFleetNeverHandsOutMoreThanReleased: random acks of three instances
// release and want random parts of three keys' (and the default's)
// windows, of the current window or an earlier one, replayed at times,
// across window boundaries and leaders. Per leader, limit, key and
// window, the extras handed out never sum above what new acks released,
// and each instance's never above what it said it wanted.
func TestFleetNeverHandsOutMoreThanReleased(t *testing.T) {
	keys := []string{"", "sw:user=1", "sw:user=2"}
	handed := 0
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		w := newPoolWorld(t)
		type acct struct {
			term   int64
			key    string
			window int64
			id     string // "" for releases
		}
		released, wanted := map[acct]float64{}, map[acct]float64{}
		seen := map[string]uint64{} // latest grant seq acked, by instance
		last := map[string]Ack{}
		for range 300 {
			switch r.IntN(6) {
			case 0:
				w.now = w.now.Add(time.Duration(r.Int64N(int64(20 * time.Second))))
				w.out(w.f.Tick(w.now))
			case 1:
				if r.IntN(20) == 0 {
					w.leader(w.f)
					seen = map[string]uint64{}
				}
			case 2: // a replay
				id := w.ids[r.IntN(len(w.ids))]
				if a, ok := last[id]; ok {
					if rd, err := w.f.Step(w.now, a); err == nil {
						w.out(rd)
					}
				}
			default:
				id := w.ids[r.IntN(len(w.ids))]
				var rel, want []Moved
				for range r.IntN(3) {
					win := w.window()
					if r.IntN(5) == 0 {
						win = win.Add(-time.Minute)
					}
					m := Moved{Limit: "sw", Key: keys[r.IntN(len(keys))], Window: win, Value: r.Float64() * 0.6}
					if r.IntN(2) == 0 {
						rel = append(rel, m)
					} else {
						want = append(want, m)
					}
				}
				if len(w.inbox[id]) == 0 {
					continue
				}
				a := w.deliver(id, rel, want)
				if a.Term == w.term && a.Seq > seen[id] {
					seen[id] = a.Seq
					for _, m := range rel {
						released[acct{w.term, m.Key, m.Window.UnixNano(), ""}] += m.Value
					}
					for _, m := range want {
						wanted[acct{w.term, m.Key, m.Window.UnixNano(), id}] += m.Value
					}
				}
				last[id] = a
			}
			// Every extra of this term's grants so far.
			got, gotBy := map[acct]float64{}, map[acct]float64{}
			for id, xs := range w.extras {
				for _, x := range xs {
					got[acct{w.term, x.Key, x.Window.UnixNano(), ""}] += x.Value
					gotBy[acct{w.term, x.Key, x.Window.UnixNano(), id}] += x.Value
				}
			}
			handed = max(handed, len(got))
			for a, v := range got {
				if v > released[a]+1e-9 {
					t.Fatalf("seed %d: %v handed out of %+v, %v released", seed, v, a, released[a])
				}
			}
			for a, v := range gotBy {
				if v > wanted[a]+1e-9 {
					t.Fatalf("seed %d: %v handed out to %+v, which wanted %v", seed, v, a, wanted[a])
				}
			}
		}
	}
	if handed == 0 {
		t.Fatal("no run handed anything out: the test tests nothing")
	}
}
