package redisstore_test

import (
	"context"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/redisstore"
)

// lateTimeout is the store timeout of the instances of these tests: long
// enough that a loaded machine answers a TLS call within it, short enough
// that a test pauses Redis for a fraction of a second.
const lateTimeout = 100 * time.Millisecond

// tlsRedis starts a redis-server that serves TLS only on loopback and
// requires client certificates, and returns it, the options of a store
// that reaches it (with a registry of its own) and a client for the
// test's own reads.
func tlsRedis(t *testing.T) (*redistest.Server, func() redisstore.Options, *redis.Client) {
	t.Helper()
	pki := testpki.New(t)
	srvFiles := pki.Issue(t, "redis", testpki.Leaf{IPs: testpki.Loopback})
	cli, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "enforcer", testpki.Leaf{URIs: []string{"spiffe://allot/region/r/instance/a"}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartSecure(t, redistest.Secure{CertFile: srvFiles.Cert, KeyFile: srvFiles.Key, CAFile: pki.CAFile, Client: cli.ClientConfig("")})
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, TLSConfig: cli.ClientConfig(""), MaxRetries: -1})
	t.Cleanup(func() { admin.Close() })
	opts := func() redisstore.Options {
		return redisstore.Options{Addrs: []string{srv.Addr}, TLS: cli.ClientConfig(""), Registry: prometheus.NewRegistry()}
	}
	return srv, opts, admin
}

// evalsha is how many EVALSHA calls the server has run.
func evalsha(t *testing.T, admin *redis.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// scriptsSent is how many script calls a store has sent (its
// allot_regional_store_scripts_total).
func scriptsSent(t *testing.T, reg prometheus.Gatherer) int64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "allot_regional_store_scripts_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int64(n)
}

// whilePaused pauses srv (SIGSTOP to the process the test started), runs
// during, whose store calls all pass their deadline, resumes srv and
// waits until Redis has run every script the store sent meanwhile: from
// then on the late calls have done whatever they do.
func whilePaused(t *testing.T, srv *redistest.Server, admin *redis.Client, reg prometheus.Gatherer, during func()) {
	t.Helper()
	ran, sent := evalsha(t, admin), scriptsSent(t, reg)
	srv.Pause()
	during()
	late := scriptsSent(t, reg) - sent
	srv.Resume()
	if late == 0 {
		t.Fatal("no store call was made while Redis was paused")
	}
	waitUntil(t, 10*time.Second, "Redis runs the late calls", func() bool { return evalsha(t, admin) >= ran+late })
}

// tokens is what a token bucket in Redis held at its last change
// (lua/bucket.lua: field a), whole.
func tokens(t *testing.T, admin *redis.Client, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := admin.HGet(ctx, redisstore.DefaultPrefix+"{"+key+"}", "a").Float64()
	if err != nil {
		t.Fatal(err)
	}
	return int64(math.Floor(a))
}

// warmUp waits until f's store answers a request of another key within
// its deadline: the scripts are loaded and the connections open, which a
// loaded machine can stretch past the deadline on the first calls.
func warmUp(t *testing.T, f *regional.Enforcer) {
	t.Helper()
	waitUntil(t, 10*time.Second, "the store answers in time", func() bool {
		return decide(t, f, desc("user", "warm-up")).Allowed && !stats(f, "otp").Fallback
	})
}

// A call that reaches Redis after its deadline charges nothing: under
// on_failure: closed, requests rejected while Redis was paused are not
// charged when it resumes.
func TestLateCallClosedChargesNothing(t *testing.T) {
	srv, opts, admin := tlsRedis(t)
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 10/1h, enforcement: exact, on_failure: closed}
`
	o := opts()
	f, _ := instance(t, cfg, "a", o, lateTimeout)
	user := desc("user", "1")
	warmUp(t, f)
	if dec := decide(t, f, user); !dec.Allowed || stats(f, "otp").Fallback {
		t.Fatalf("before the pause: %+v, %+v", dec, stats(f, "otp"))
	}
	before := stats(f, "otp")
	whilePaused(t, srv, admin, o.Registry.(prometheus.Gatherer), func() {
		for i := range 5 {
			if dec := decide(t, f, user); dec.Allowed {
				t.Fatalf("request %d while Redis is paused: admitted by on_failure: closed", i)
			}
		}
	})
	if st := stats(f, "otp"); st.FallbackRejected-before.FallbackRejected != 5 {
		t.Fatalf("%+v, want the 5 requests rejected by on_failure", st)
	}
	if n := tokens(t, admin, "api/otp:user=1"); n != 9 {
		t.Fatalf("the bucket holds %d of 10 after 1 admitted and 5 rejected: the late calls charged %d", n, 9-n)
	}
}

// Under on_failure: local a request decided in the fallback bucket while
// Redis was paused is charged there only, not by its late call as well.
// The fallback's bucket is empty when it begins (Redis may have spent
// its bucket) and fills at 10/s: the first request in the pause is
// rejected, three more 350 ms later are admitted.
func TestLateCallLocalChargesOnce(t *testing.T) {
	srv, opts, admin := tlsRedis(t)
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 10/1s, enforcement: exact, on_failure: local}
`
	o := opts()
	f, _ := instance(t, cfg, "a", o, lateTimeout)
	user := desc("user", "1")
	warmUp(t, f)
	if dec := decide(t, f, user); !dec.Allowed || stats(f, "otp").Fallback {
		t.Fatalf("before the pause: %+v, %+v", dec, stats(f, "otp"))
	}
	before, held := stats(f, "otp"), bucketState(t, admin, "api/otp:user=1")
	whilePaused(t, srv, admin, o.Registry.(prometheus.Gatherer), func() {
		if dec := decide(t, f, user); dec.Allowed {
			t.Fatal("the first request while Redis is paused: admitted by a fallback bucket that begins empty")
		}
		time.Sleep(350 * time.Millisecond)
		for i := range 3 {
			if dec := decide(t, f, user); !dec.Allowed {
				t.Fatalf("request %d while Redis is paused, 350 ms into the fallback: rejected", i)
			}
		}
	})
	if st := stats(f, "otp"); st.FallbackAllowed-before.FallbackAllowed != 3 || st.FallbackRejected-before.FallbackRejected != 1 {
		t.Fatalf("%+v, want 3 requests admitted and 1 rejected by the fallback", st)
	}
	if now := bucketState(t, admin, "api/otp:user=1"); !maps.Equal(now, held) {
		t.Fatalf("the bucket in Redis changed from %v to %v: a late call charged it", held, now)
	}
}

// bucketState is a bucket's fields in Redis (lua/bucket.lua).
func bucketState(t *testing.T, admin *redis.Client, key string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := admin.HGetAll(ctx, redisstore.DefaultPrefix+"{"+key+"}").Result()
	if err != nil || len(m) == 0 {
		t.Fatalf("bucket %s: %v %v", key, m, err)
	}
	return m
}

// A concurrency slot whose Acquire reaches Redis after its deadline is not
// taken: it does not stay taken until its TTL (an hour here), whether
// on_failure rejected the reservation or counted it in memory.
func TestLateAcquireLeaksNoSlot(t *testing.T) {
	srv, opts, admin := tlsRedis(t)
	for _, policy := range []string{"closed", "local"} {
		t.Run(policy, func(t *testing.T) {
			cfg := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000000/1h, enforcement: exact, concurrency: 1, on_failure: ` + policy + `}
`
			reservations := func(id string) (*regional.Reservations, prometheus.Gatherer) {
				o := opts()
				f, _ := instance(t, cfg, id, o, lateTimeout)
				return regional.NewReservations(f.Engine(), f, regional.ReservationOptions{TTL: time.Hour, Rand: rand.New(rand.NewPCG(rand.Uint64(), 1))}), o.Registry.(prometheus.Gatherer)
			}
			rs, reg := reservations("a")
			// The slot script is loaded and the connections open: a loaded
			// machine can stretch the first calls past the deadline.
			waitUntil(t, 10*time.Second, "a reservation before the pause", func() bool {
				warm, err := reserveOne(rs, "warm-"+policy, 10, 10)
				return err == nil && warm.Allowed
			})
			who := "acme-" + policy
			whilePaused(t, srv, admin, reg, func() {
				r, err := reserveOne(rs, who, 10, 10)
				// local: the fallback's token bucket begins empty and
				// fills at about 28 tokens a millisecond.
				for i := 0; policy == "local" && err == nil && !r.Allowed && i < 20; i++ {
					time.Sleep(5 * time.Millisecond)
					r, err = reserveOne(rs, who, 10, 10)
				}
				if err != nil || r.Allowed != (policy == "local") {
					t.Fatalf("while Redis is paused: %+v %v, want it decided by on_failure: %s", r, err, policy)
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if n, err := admin.ZCard(ctx, redisstore.DefaultPrefix+"{llm/tenant-tokens:tenant="+who+"}:slots").Result(); err != nil || n != 0 {
				t.Fatalf("the slot set holds %d holders (%v) after a late Acquire, want 0", n, err)
			}
			other, _ := reservations("b") // counts only what Redis holds
			if r, err := reserveOne(other, who, 10, 10); err != nil || !r.Allowed {
				t.Fatalf("another instance, after the late Acquire: %+v %v, want admitted (cap 1, none held in Redis)", r, err)
			}
		})
	}
}

// A charging script compares its caller's deadline, less the margin, with
// Redis time: past it the call fails with ErrLate, a timeout, and changes
// nothing; a call without a deadline runs whenever it arrives.
func TestLateAnswerIsATimeout(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr}, LateMargin: -time.Millisecond}); err == nil || !strings.Contains(err.Error(), "LateMargin") {
		t.Fatalf("a negative LateMargin: %v, want an error that names it", err)
	}
	// A margin longer than the call's timeout: the deadline the scripts
	// see has passed before they run, and the answer comes back in time.
	reg := prometheus.NewRegistry()
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, LateMargin: time.Minute, Registry: reg})
	b := regional.Bucket{Key: "api/otp:user=1", Algorithm: allot.TokenBucket, Amount: 10, Burst: 10, Period: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res := make([]regional.TakeResult, 1)
	if err := s.Take(ctx, time.Now(), []regional.TakeOp{{Bucket: b, Cost: 1}}, res); !errors.Is(err, redisstore.ErrLate) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take past its deadline: %v, want ErrLate, a context.DeadlineExceeded", err)
	}
	lres := make([]regional.LeaseResult, 1)
	if err := s.Lease(ctx, time.Now(), []regional.LeaseOp{{Bucket: b, Want: 5}}, lres); !errors.Is(err, redisstore.ErrLate) {
		t.Fatalf("Lease past its deadline: %v, want ErrLate", err)
	}
	if err := s.Charge(ctx, time.Now(), []regional.TakeOp{{Bucket: b, Cost: 1}}, res); !errors.Is(err, redisstore.ErrLate) {
		t.Fatalf("Charge past its deadline: %v, want ErrLate", err)
	}
	slot := regional.SlotOp{Key: "api/otp:user=1", Cap: 1, Holder: "rsv_1", TTL: time.Hour}
	if err := s.Acquire(ctx, time.Now(), []regional.SlotOp{slot}, make([]regional.SlotResult, 1)); !errors.Is(err, redisstore.ErrLate) {
		t.Fatalf("Acquire past its deadline: %v, want ErrLate", err)
	}
	if err := s.Free(ctx, time.Now(), []regional.SlotOp{slot}); err != nil { // idempotent: no deadline
		t.Fatalf("Free: %v", err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	if n, err := admin.Exists(ctx, redisstore.DefaultPrefix+"{api/otp:user=1}", redisstore.DefaultPrefix+"{api/otp:user=1}:slots").Result(); err != nil || n != 0 {
		t.Fatalf("%d keys (%v) after late calls, want none: they changed something", n, err)
	}
	var late float64
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == "allot_regional_store_calls_total" && l.GetName() == "result" && l.GetValue() == "late" {
					late += m.GetCounter().GetValue()
				}
			}
		}
	}
	if late != 4 {
		t.Errorf("%v calls counted as late, want 4", late)
	}
	// Without a deadline the same call runs, late or not.
	if err := s.Take(context.Background(), time.Now(), []regional.TakeOp{{Bucket: b, Cost: 1}}, res); err != nil || !res[0].Allowed || res[0].Remaining != 9 {
		t.Fatalf("Take without a deadline: %+v %v, want admitted with 9 left", res[0], err)
	}
}
