package etcdstore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
)

const ttl = time.Second // etcd raises it to its minimum lease TTL, 2 s here

// startEtcd starts an embedded etcd in t.TempDir and returns its client URL.
func startEtcd(t *testing.T) string {
	t.Helper()
	client, peer := "http://127.0.0.1:"+freePort(t), "http://127.0.0.1:"+freePort(t)
	e, err := etcdstore.StartEmbedded(t.TempDir(), client, peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return client
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func newClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// within fails t unless ch is closed or receives within d.
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
		panic("unreachable")
	}
}

type result struct {
	l   *etcdstore.Leadership
	err error
}

func campaign(ctx context.Context, s *etcdstore.Store, domain, value string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := s.Campaign(ctx, domain, value)
		ch <- result{l, err}
	}()
	return ch
}

// waitCampaigners polls until domain's election holds n keys.
func waitCampaigners(t *testing.T, ctx context.Context, cli *clientv3.Client, domain string, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := cli.Get(ctx, "/allot/domains/"+domain+"/election/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && resp.Count == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d campaigners of %s, err %v", n, domain, err)
		}
	}
}

func TestElectionTakeover(t *testing.T) {
	ep := startEtcd(t)
	ctx := testCtx(t)
	cliA, cliB := newClient(t, ep), newClient(t, ep)
	a, b := etcdstore.New(cliA, "", etcdstore.WithSessionTTL(ttl)), etcdstore.New(cliB, "", etcdstore.WithSessionTTL(ttl))

	if _, err := b.Leader(ctx, "api"); !errors.Is(err, etcdstore.ErrNoLeader) {
		t.Fatalf("Leader before any campaign: %v, want ErrNoLeader", err)
	}
	la, err := a.Campaign(ctx, "api", "a:1")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := b.Leader(ctx, "api"); v != "a:1" || err != nil {
		t.Fatalf("Leader = %q, %v; want a:1", v, err)
	}
	chB := campaign(ctx, b, "api", "b:1")
	waitCampaigners(t, ctx, cliB, "api", 2)
	select {
	case r := <-chB:
		t.Fatalf("second campaigner elected while the first leads: %+v", r)
	default:
	}

	// The leader's process dies: its client stops keeping the session alive.
	cliA.Close()
	within(t, la.Done(), 5*time.Second, "Done of the closed leader")
	r := within(t, chB, 2*ttl+3*time.Second, "takeover")
	if r.err != nil {
		t.Fatal(r.err)
	}
	lb := r.l
	if lb.Term <= la.Term {
		t.Fatalf("term %d of the new leader not above %d", lb.Term, la.Term)
	}
	if v, err := b.Leader(ctx, "api"); v != "b:1" || err != nil {
		t.Fatalf("Leader = %q, %v; want b:1", v, err)
	}

	if err := lb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	within(t, lb.Done(), time.Second, "Done after Resign")
	if _, err := b.Leader(ctx, "api"); !errors.Is(err, etcdstore.ErrNoLeader) {
		t.Fatalf("Leader after Resign: %v, want ErrNoLeader", err)
	}
	if err := lb.Resign(ctx); err != nil {
		t.Fatalf("second Resign: %v", err)
	}
	lc, err := b.Campaign(ctx, "api", "c:1")
	if err != nil {
		t.Fatal(err)
	}
	if lc.Term <= lb.Term {
		t.Fatalf("term %d of the third leader not above %d", lc.Term, lb.Term)
	}
}

func TestCampaignCanceled(t *testing.T) {
	ep := startEtcd(t)
	ctx := testCtx(t)
	cli := newClient(t, ep)
	s := etcdstore.New(cli, "", etcdstore.WithSessionTTL(ttl))
	if _, err := s.Campaign(ctx, "api", "a:1"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	ch := campaign(cctx, s, "api", "b:1")
	waitCampaigners(t, ctx, cli, "api", 2)
	cancel()
	if r := within(t, ch, 5*time.Second, "canceled campaign"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("canceled Campaign = %+v, want context.Canceled", r)
	}
	waitCampaigners(t, ctx, cli, "api", 1) // the standby's key is gone
}

func records(n int, regions ...string) []coordinator.Record {
	recs := make([]coordinator.Record, 0, n)
	for i := range n {
		rec := coordinator.Record{Limit: "limit-" + strconv.Itoa(i%7), Key: fmt.Sprintf("user=%d/α %%2F?#", i)}
		if i%7 == i {
			rec.Key = "" // the default vectors
		}
		for j, r := range regions {
			share := float64(float32(float64(i%10+j) / 97))
			c := coordinator.Cell{Region: r, Share: share, Bound: share + 1.0/1024}
			if rec.Key != "" && (i+j)%5 == 0 {
				c.Share = coordinator.Follow
			}
			rec.Cells = append(rec.Cells, c)
		}
		recs = append(recs, rec)
	}
	return recs
}

func sorted(recs []coordinator.Record) []coordinator.Record {
	recs = slices.Clone(recs)
	slices.SortFunc(recs, func(a, b coordinator.Record) int {
		return cmp.Or(cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Key, b.Key))
	})
	return recs
}

func TestPersistSnapshot(t *testing.T) {
	ep := startEtcd(t)
	ctx := testCtx(t)
	cli := newClient(t, ep)
	s := etcdstore.New(cli, "/test/")
	l, err := s.Campaign(ctx, "api", "a:1")
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := s.Snapshot(ctx, "unknown"); err != nil || !reflect.DeepEqual(snap, coordinator.Snapshot{}) {
		t.Fatalf("Snapshot of an unknown domain = %+v, %v; want empty", snap, err)
	}

	recs := records(1000, "us-east", "eu-west", "ap-south")
	before, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Persist(ctx, l, "api", coordinator.Ready{Term: l.Term, Version: 3, Persist: recs}); err != nil {
		t.Fatal(err)
	}
	after, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	// 1000 records and the meta, in transactions of ≤ 100 operations.
	if txns := after.Header.Revision - before.Header.Revision; txns != 11 {
		t.Errorf("Persist of 1001 operations took %d transactions, want 11", txns)
	}
	want := coordinator.Snapshot{Term: l.Term, Version: 3, Records: sorted(recs)}
	snap, err := s.Snapshot(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(snap, want) {
		t.Fatalf("Snapshot differs from what was persisted: term %d version %d, %d records", snap.Term, snap.Version, len(snap.Records))
	}

	// Delete every other key record (nil and empty Cells), update the rest;
	// the default vectors stay.
	var next []coordinator.Record
	for i, rec := range recs {
		switch {
		case rec.Key == "":
		case i%4 == 0:
			next = append(next, coordinator.Record{Limit: rec.Limit, Key: rec.Key})
		case i%4 == 2:
			next = append(next, coordinator.Record{Limit: rec.Limit, Key: rec.Key, Cells: []coordinator.Cell{}})
		default:
			rec.Cells = []coordinator.Cell{{Region: "eu-west", Share: 0.25, Bound: 0.5}}
			next = append(next, rec)
		}
	}
	want = coordinator.Snapshot{Term: l.Term, Version: 9}
	for i, rec := range recs {
		switch {
		case rec.Key == "":
			want.Records = append(want.Records, rec)
		case i%2 == 1:
			want.Records = append(want.Records, coordinator.Record{Limit: rec.Limit, Key: rec.Key, Cells: []coordinator.Cell{{Region: "eu-west", Share: 0.25, Bound: 0.5}}})
		}
	}
	want.Records = sorted(want.Records)
	if err := s.Persist(ctx, l, "api", coordinator.Ready{Term: l.Term, Version: 9, Persist: next}); err != nil {
		t.Fatal(err)
	}
	if snap, err = s.Snapshot(ctx, "api"); err != nil || !reflect.DeepEqual(snap, want) {
		t.Fatalf("after deletions: Snapshot = term %d version %d, %d records, %v; want %d records", snap.Term, snap.Version, len(snap.Records), err, len(want.Records))
	}

	// A Ready without records writes nothing; a Ready of another term or
	// domain is refused.
	if err := s.Persist(ctx, l, "api", coordinator.Ready{Term: l.Term, Version: 10}); err != nil {
		t.Fatal(err)
	}
	if snap, _ = s.Snapshot(ctx, "api"); snap.Version != 9 {
		t.Fatalf("a Ready without records changed the version to %d", snap.Version)
	}
	if err := s.Persist(ctx, l, "api", coordinator.Ready{Term: l.Term + 1, Persist: recs[:1]}); !errors.Is(err, etcdstore.ErrNotLeader) {
		t.Fatalf("Persist of another term: %v, want ErrNotLeader", err)
	}
	if err := s.Persist(ctx, l, "llm", coordinator.Ready{Term: l.Term, Persist: recs[:1]}); !errors.Is(err, etcdstore.ErrNotLeader) {
		t.Fatalf("Persist to another domain: %v, want ErrNotLeader", err)
	}
}

func TestPersistFenced(t *testing.T) {
	ep := startEtcd(t)
	ctx := testCtx(t)
	cli := newClient(t, ep)
	s := etcdstore.New(cli, "")
	la, err := s.Campaign(ctx, "api", "a:1")
	if err != nil {
		t.Fatal(err)
	}
	first := records(10, "us-east")
	if err := s.Persist(ctx, la, "api", coordinator.Ready{Term: la.Term, Version: 1, Persist: first}); err != nil {
		t.Fatal(err)
	}
	chB := campaign(ctx, s, "api", "b:1")
	waitCampaigners(t, ctx, cli, "api", 2)

	// The old leader loses its key, as when its lease expires.
	if _, err := cli.Delete(ctx, la.Key()); err != nil {
		t.Fatal(err)
	}
	within(t, la.Done(), 5*time.Second, "Done of the deposed leader")
	r := within(t, chB, 5*time.Second, "takeover")
	if r.err != nil {
		t.Fatal(r.err)
	}
	lb := r.l
	if lb.Term <= la.Term {
		t.Fatalf("term %d of the new leader not above %d", lb.Term, la.Term)
	}
	err = s.Persist(ctx, la, "api", coordinator.Ready{Term: la.Term, Version: 2, Persist: records(500, "us-east", "eu-west")})
	if !errors.Is(err, etcdstore.ErrNotLeader) {
		t.Fatalf("Persist of the deposed leader: %v, want ErrNotLeader", err)
	}
	want := coordinator.Snapshot{Term: la.Term, Version: 1, Records: sorted(first)}
	snap, err := s.Snapshot(ctx, "api")
	if err != nil || !reflect.DeepEqual(snap, want) {
		t.Fatalf("the deposed leader wrote: Snapshot = term %d version %d, %d records, %v", snap.Term, snap.Version, len(snap.Records), err)
	}
	if lb.Term <= snap.Term {
		t.Fatalf("new term %d not above the snapshot's %d", lb.Term, snap.Term)
	}
	if err := s.Persist(ctx, lb, "api", coordinator.Ready{Term: lb.Term, Version: 1, Persist: first[:1]}); err != nil {
		t.Fatal(err)
	}
	if snap, err := s.Snapshot(ctx, "api"); err != nil || snap.Term != lb.Term || snap.Version != 1 {
		t.Fatalf("after the new leader's Persist: term %d version %d, %v", snap.Term, snap.Version, err)
	}
}

func TestConfig(t *testing.T) {
	ep := startEtcd(t)
	ctx := testCtx(t)
	s := etcdstore.New(newClient(t, ep), "")
	if _, _, err := s.Config(ctx); !errors.Is(err, etcdstore.ErrNoConfig) {
		t.Fatalf("Config before any put: %v, want ErrNoConfig", err)
	}
	if err := s.PutConfig(ctx, []byte("domain: api\n")); err != nil {
		t.Fatal(err)
	}
	y, rev1, err := s.Config(ctx)
	if err != nil || string(y) != "domain: api\n" || rev1 <= 0 {
		t.Fatalf("Config = %q, %d, %v", y, rev1, err)
	}

	type change struct {
		yaml string
		rev  int64
	}
	changes, stopped := make(chan change, 10), make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(stopped)
		s.WatchConfig(wctx, func(y []byte, rev int64) { changes <- change{string(y), rev} })
	}()
	if c := within(t, changes, 5*time.Second, "current config"); c != (change{"domain: api\n", rev1}) {
		t.Fatalf("first call %+v, want the current config at %d", c, rev1)
	}
	if err := s.PutConfig(ctx, []byte("domain: llm\n")); err != nil {
		t.Fatal(err)
	}
	_, rev2, _ := s.Config(ctx)
	if c := within(t, changes, 5*time.Second, "changed config"); c != (change{"domain: llm\n", rev2}) || rev2 <= rev1 {
		t.Fatalf("after a put: %+v, want domain: llm at %d > %d", c, rev2, rev1)
	}
	cancel()
	within(t, stopped, 5*time.Second, "WatchConfig returning after cancel")
}

func TestStartEmbeddedLoopbackOnly(t *testing.T) {
	for _, u := range []string{"http://0.0.0.0:2379", "http://10.1.2.3:2379", "https://127.0.0.1:2379", "http://127.0.0.1"} {
		if _, err := etcdstore.StartEmbedded(t.TempDir(), u, "http://127.0.0.1:"+freePort(t)); err == nil {
			t.Errorf("StartEmbedded accepted client URL %s", u)
		}
	}
}
