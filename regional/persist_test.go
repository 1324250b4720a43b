package regional

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// hourCfg is a split-mode local sliding window of 100/1h: persisted
// (slack max(1, 5 % of 100) = 5); minuteCfg's 100/1m is not.
const hourCfg = "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1h, algorithm: sliding_window}\n"
const minuteCfg = "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1m, algorithm: sliding_window}\n"

// th is on a whole hour: the window of an hour starts there.
var th = time.Unix(1_700_000_000-1_700_000_000%3600, 0)

func persisting(t *testing.T, yaml string) *Engine {
	t.Helper()
	e := New(mustConfig(t, yaml), Options{})
	e.EnablePersistence(PersistOptions{})
	return e
}

// burst counts how many of n checks of one hit for id pass at now.
func burst(t *testing.T, e *Engine, now time.Time, id string, n int) int {
	t.Helper()
	var dec allot.Decision
	ok := 0
	for range n {
		if err := e.Check(now, "api", user(id), 1, &dec); err != nil {
			t.Fatal(err)
		}
		if dec.Allowed {
			ok++
		}
	}
	return ok
}

// persistRound is one persistence interval: a burst, then a snapshot
// written and acknowledged. It returns what the burst admitted.
func persistRound(t *testing.T, e *Engine, now time.Time, id string, n int) (int, *Snapshot) {
	t.Helper()
	ok := burst(t, e, now, id, n)
	snap := e.Snapshot(now)
	e.AckSnapshot(snap)
	return ok, snap
}

func TestPersistGateAdmitsWithinTheMark(t *testing.T) {
	e := persisting(t, hourCfg)
	at := th.Add(time.Minute)
	if got := burst(t, e, at, "1", 20); got != 5 {
		t.Fatalf("before any snapshot: admitted %d, want the slack of 5", got)
	}
	var dec allot.Decision
	e.Check(at, "api", user("1"), 1, &dec)
	if dec.Allowed || dec.RetryAfter != DefaultPersistInterval {
		t.Fatalf("held at its mark: allowed=%v retry=%v, want a retry after the interval", dec.Allowed, dec.RetryAfter)
	}
	snap := e.Snapshot(at)
	if snap == nil || len(snap.Marks) != 1 {
		t.Fatalf("snapshot: %+v", snap)
	}
	m := snap.Marks[0]
	if m.Domain != "api" || m.Limit != "per-user" || m.Period != time.Hour || m.Window != at.UnixNano()/int64(time.Hour) ||
		m.Low != 1 || m.Floor != 5 || len(m.Keys) != 1 || m.Keys[0] != (KeyMark{Key: "per-user:user=1", Mark: 10}) {
		t.Fatalf("snapshot marks: %+v", m)
	}
	// Not written yet: the mark is not raised.
	if got := burst(t, e, at, "1", 5); got != 0 {
		t.Fatalf("before the ack: admitted %d more", got)
	}
	e.AckSnapshot(snap)
	if got := burst(t, e, at, "1", 20); got != 5 {
		t.Fatalf("after the ack: admitted %d more, want 5", got)
	}
	// A key checked but not charged beyond its mark's reach is not sent
	// again; nothing changed, nothing to write.
	e.AckSnapshot(e.Snapshot(at))
	if s := e.Snapshot(at); s != nil {
		t.Fatalf("nothing changed, yet a snapshot: %+v", s.Marks)
	}
	// An unacknowledged snapshot's keys come again.
	burst(t, e, at, "1", 1)
	if s1, s2 := e.Snapshot(at), e.Snapshot(at); s1 == nil || s2 == nil || s2.Marks[0].Keys[0].Mark != 16 {
		t.Fatalf("a snapshot not acknowledged is not repeated: %+v then %+v", s1, s2)
	}
	// Over rounds the whole allowance is reached, and no more.
	total := 11 // 5, 5, then 1
	for range 30 {
		n, _ := persistRound(t, e, at, "1", 20)
		total += n
	}
	if total != 100 {
		t.Fatalf("admitted %d in the window over many rounds, want 100", total)
	}
	// A new window (two on: the previous one's count no longer weighs)
	// starts again at the slack, whatever the old marks.
	next := th.Add(2*time.Hour + time.Minute)
	if got := burst(t, e, next, "1", 20); got != 5 {
		t.Fatalf("a new window: admitted %d before any snapshot, want 5", got)
	}
	if s := e.Snapshot(next); s == nil || s.Marks[0].Window != next.UnixNano()/int64(time.Hour) || s.Marks[0].Keys[0].Mark != 10 {
		t.Fatalf("a new window's snapshot: %+v", s)
	}
}

func TestPersistShortWindowsUnchanged(t *testing.T) {
	e := persisting(t, minuteCfg)
	if got := burst(t, e, th, "1", 150); got != 100 {
		t.Fatalf("a window of a minute admitted %d, want 100 (not gated)", got)
	}
	if s := e.Snapshot(th); s != nil {
		t.Fatalf("a window of a minute is persisted: %+v", s.Marks)
	}
	if p := e.Persisted(th); len(p) != 0 {
		t.Fatalf("Persisted: %+v", p)
	}
	// Without EnablePersistence a long window is not gated either.
	e = New(mustConfig(t, hourCfg), Options{})
	if got := burst(t, e, th, "1", 150); got != 100 {
		t.Fatalf("without persistence: admitted %d, want 100", got)
	}
	if s := e.Snapshot(th); s != nil {
		t.Fatal("a snapshot without persistence")
	}
}

// restart is the process after a crash at now: a new engine of the same
// configuration, restored from marks, then granted share from since.
func restart(t *testing.T, marks []Marks, now time.Time, share float64) *Engine {
	t.Helper()
	e := persisting(t, hourCfg)
	if err := e.Restore(now, marks); err != nil {
		t.Fatal(err)
	}
	if err := e.ResetShare("api", "per-user", share, now); err != nil {
		t.Fatal(err)
	}
	return e
}

// drain runs rounds until two in a row admit nothing (a restored key
// starts at its mark: its first round admits nothing) and returns the
// total.
func drain(t *testing.T, e *Engine, now time.Time, id string) int {
	t.Helper()
	total, idle := 0, 0
	for range 200 {
		n, _ := persistRound(t, e, now, id, 50)
		if idle = idle + 1; n > 0 {
			idle = 0
		}
		if idle == 2 {
			return total
		}
		total += n
	}
	t.Fatal("no end")
	return 0
}

func TestPersistRestoreChargesWhatWasStored(t *testing.T) {
	first := persisting(t, hourCfg)
	at := th.Add(10 * time.Minute)
	var stored []Marks // what the store holds: every acknowledged snapshot, merged
	admitted := 0
	for admitted < 60 {
		n, snap := persistRound(t, first, at, "1", 60-admitted)
		admitted += n
		if snap != nil {
			stored = merge(stored, snap.Marks)
		}
	}
	// Keys admitted after the last snapshot: not in the store at all.
	if got := burst(t, first, at, "2", 10); got != 5 {
		t.Fatalf("an unstored key admitted %d, want the floor of 5", got)
	}
	crash := at.Add(time.Second)
	if p := persisting(t, hourCfg).Persisted(crash); len(p) != 1 || p[0].Window != stored[0].Window {
		t.Fatalf("Persisted: %+v", p)
	}
	second := restart(t, stored, crash, 1)
	// Key 1 was stored at its mark, 60 + 5: the new process admits 35;
	// key 2 is charged the floor: 95. Never more than 100 in the window.
	if got := drain(t, second, crash, "1"); got != 35 {
		t.Fatalf("key 1: admitted %d after the restart, want 100 - 65 = 35", got)
	}
	if got := drain(t, second, crash, "2"); got != 95 {
		t.Fatalf("key 2 (never stored): admitted %d after the restart, want 100 - 5 = 95", got)
	}
	if got := drain(t, second, crash, "3"); got != 95 {
		t.Fatalf("key 3 (never seen): admitted %d, want 100 - the floor", got)
	}
	// The next window is a window like any other.
	next := th.Add(2 * time.Hour)
	if got := drain(t, second, next, "4"); got != 100 {
		t.Fatalf("next window: admitted %d, want 100", got)
	}
}

func TestPersistRestoreUsesTheLeastShare(t *testing.T) {
	at := th.Add(10 * time.Minute)
	marks := []Marks{{Domain: "api", Limit: "per-user", Period: time.Hour, Window: at.UnixNano() / int64(time.Hour),
		Low: 0.5, Floor: 3, Keys: []KeyMark{{Key: "per-user:user=1", Mark: 20}}}}
	// Granted 1 after the restart: within the window the instance uses
	// min(ℓ, share) = 0.5 of 100, less what it restored as spent.
	e := restart(t, marks, at, 1)
	if got := drain(t, e, at, "1"); got != 30 {
		t.Fatalf("admitted %d with ℓ 0.5 and 20 stored, want 30", got)
	}
	if got := drain(t, e, at, "2"); got != 47 {
		t.Fatalf("an unstored key: admitted %d with ℓ 0.5 and a floor of 3, want 47", got)
	}
	// Granted less than ℓ: the grant's share.
	e = restart(t, marks, at, 0.3)
	if got := drain(t, e, at, "1"); got != 10 {
		t.Fatalf("admitted %d with share 0.3 and 20 stored, want 10", got)
	}
	// Marks of another window restore nothing: the window starts with
	// nothing, as without persistence.
	old := marks
	old[0].Window--
	e = restart(t, old, at, 1)
	if got := drain(t, e, at, "1"); got != 0 {
		t.Fatalf("marks of an earlier window: admitted %d, want 0 (share from since)", got)
	}
	// Without a restore a restarted instance admits nothing in the window.
	e = restart(t, nil, at, 1)
	if got := drain(t, e, at, "1"); got != 0 {
		t.Fatalf("no restore: admitted %d, want 0", got)
	}
}

func TestPersistSnapshotCarriesTheLowAndFloor(t *testing.T) {
	e := persisting(t, hourCfg)
	at := th.Add(time.Minute)
	burst(t, e, at, "1", 3)
	e.AckSnapshot(e.Snapshot(at))
	if err := e.SetShare(at.Add(time.Second), "api", "per-user", 0.4); err != nil {
		t.Fatal(err)
	}
	// No key changed, but the share in force fell: the low is written.
	s := e.Snapshot(at.Add(2 * time.Second))
	if s == nil || s.Marks[0].Low != 0.4 || len(s.Marks[0].Keys) != 0 || s.Marks[0].Floor != 5 {
		t.Fatalf("after a lowering: %+v", s)
	}
	e.AckSnapshot(s)
	if s := e.Snapshot(at.Add(3 * time.Second)); s != nil {
		t.Fatalf("the low again: %+v", s.Marks)
	}
}

// merge is what MarkStore does with saved marks: the latest of each
// field of each limit and window.
func merge(stored, marks []Marks) []Marks {
	for _, m := range marks {
		i := 0
		for i < len(stored) && (stored[i].Domain != m.Domain || stored[i].Limit != m.Limit || stored[i].Window != m.Window) {
			i++
		}
		if i == len(stored) {
			stored = append(stored, Marks{Domain: m.Domain, Limit: m.Limit, Period: m.Period, Window: m.Window})
		}
		s := &stored[i]
		s.Low, s.Floor = m.Low, m.Floor
	keys:
		for _, k := range m.Keys {
			for j := range s.Keys {
				if s.Keys[j].Key == k.Key {
					s.Keys[j].Mark = k.Mark
					continue keys
				}
			}
			s.Keys = append(s.Keys, k)
		}
	}
	return stored
}

// A key held at its mark is not out of allowance: it asks no peer for a
// loan; one out of allowance still does.
func TestPersistGateAsksNoLoan(t *testing.T) {
	const cfg = "domain: api\nregions: [a, b]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1h, algorithm: sliding_window}\n"
	asks := func(persist bool, n int) int {
		e := New(mustConfig(t, cfg), Options{})
		if persist {
			e.EnablePersistence(PersistOptions{})
		}
		if err := e.SetPeers("a", []string{"b"}); err != nil {
			t.Fatal(err)
		}
		if err := e.ResetShare("api", "per-user", 0.5, time.Time{}); err != nil {
			t.Fatal(err)
		}
		at := th.Add(time.Minute)
		e.Heard(at, "b")
		burst(t, e, at, "1", n)
		return len(e.LoanAsks(at))
	}
	if got := asks(false, 60); got == 0 {
		t.Fatal("a key out of allowance asked no loan: the test shows nothing")
	}
	if got := asks(true, 20); got != 0 {
		t.Fatalf("a key held at its mark asked %d loans", got)
	}
}

// What the gate promises, under concurrent checks and snapshots, some
// written without their acknowledgement (a reply lost) and some not
// written at all: at every snapshot, and at the end, each key's count
// is at most what the store holds for it (its mark, or the floor).
func TestPersistCountsNeverExceedTheStore(t *testing.T) {
	e := persisting(t, hourCfg)
	at := th.Add(time.Minute)
	const keys, workers, checks = 50, 4, 3000
	var counts [keys]atomic.Int64
	stop := make(chan struct{})
	var stored []Marks
	check := func() { // on the snapshots' goroutine, or after it ended
		if len(stored) == 0 {
			return
		}
		held := map[string]float64{}
		for _, k := range stored[0].Keys {
			held[k.Key] = k.Mark
		}
		for i := range keys {
			name := fmt.Sprintf("per-user:user=%d", i)
			// counts lag the engine's (a check is counted once it returns):
			// what they say the engine counted at least.
			if c := float64(counts[i].Load()); c > max(held[name], stored[0].Floor) {
				t.Errorf("key %d counts %.0f, the store holds %.0f (floor %.0f)", i, c, held[name], stored[0].Floor)
			}
		}
	}
	var wg sync.WaitGroup
	snaps := make(chan struct{})
	go func() {
		defer close(snaps)
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			snap := e.Snapshot(at)
			if snap == nil {
				continue
			}
			switch r.IntN(4) {
			case 0: // not written
			case 1: // written, the reply lost
				stored = merge(stored, snap.Marks)
			default:
				stored = merge(stored, snap.Marks)
				e.AckSnapshot(snap)
			}
			check()
		}
	}()
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var dec allot.Decision
			for range checks {
				k := r.IntN(keys)
				if err := e.Check(at, "api", user(fmt.Sprint(k)), 1, &dec); err != nil {
					t.Error(err)
					return
				}
				if dec.Allowed {
					counts[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-snaps
	check()
	total := int64(0)
	for i := range keys {
		total += counts[i].Load()
	}
	if total == 0 {
		t.Fatal("nothing admitted")
	}
	t.Logf("admitted %d of %d checks over %d keys", total, workers*checks, keys)
}

// A key table at its bound: a persisted key evicted comes back at its
// mark (its count is not forgotten), and a key without room for a mark
// of its own is held at the floor.
func TestPersistEvictedKeyComesBackAtItsMark(t *testing.T) {
	e := New(mustConfig(t, hourCfg), Options{MaxKeys: numShards}) // one key a shard
	e.EnablePersistence(PersistOptions{})
	ls, _ := e.limitFor("api", "per-user", 0)
	shardOfUser := func(id string) int {
		h, err := e.keyOf(ls, "per-user:user="+id)
		if err != nil {
			t.Fatal(err)
		}
		return shardOf(h)
	}
	a, b := "1", ""
	for i := 2; b == ""; i++ {
		if id := fmt.Sprint(i); shardOfUser(id) == shardOfUser(a) {
			b = id
		}
	}
	at := th.Add(time.Minute)
	got := 0
	for range 4 {
		n, _ := persistRound(t, e, at, a, 5)
		got += n
	}
	if got != 20 {
		t.Fatalf("key a admitted %d, want 20", got)
	}
	// b takes a's slot; a's mark stays (its count is not in the table).
	if got := drain(t, e, at, b); got != 5 {
		t.Fatalf("key b, without room for a mark: admitted %d, want the floor of 5", got)
	}
	// a comes back at its mark (20 + 5): 75 more at most.
	if got := drain(t, e, at, a); got != 75 {
		t.Fatalf("key a after its eviction: admitted %d more, want 100 - 25 = 75", got)
	}
}
