package configwatch_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/regional/configwatch"
)

const v1 = `domain: api
limits:
  - name: per-user
    match: {user: "*"}
    rate: 10/1s
`

func loopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// sink records what a Follower applies.
type sink struct {
	mu  sync.Mutex
	cfg *allot.Config
	n   int
}

func (s *sink) apply(cfg *allot.Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg, s.n = cfg, s.n+1
}

func (s *sink) get() (*allot.Config, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg, s.n
}

func poll(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

func rate(cfg *allot.Config) int64 { return cfg.Domain("api").Limit("per-user").Rate.Amount }

// TestFollower follows versions and overrides, refuses a bad file and an
// override that does not fit, and keeps the last good configuration while
// etcd is down.
func TestFollower(t *testing.T) {
	client, peer, dir := loopback(t), loopback(t), t.TempDir()
	etcd, err := etcdstore.StartEmbedded(dir, client, peer)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { etcd.Close() }()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := t.Context()
	store := etcdstore.New(cli, "")
	var got sink
	f := configwatch.New(configwatch.Options{Store: store, Apply: got.apply})
	if _, err := f.Load(ctx); !errors.Is(err, etcdstore.ErrNoConfig) {
		t.Fatalf("Load of an empty etcd: %v, want ErrNoConfig", err)
	}
	if _, err := store.ApplyConfig(ctx, 0, etcdstore.ConfigVersion{YAML: v1}); err != nil {
		t.Fatal(err)
	}
	if cfg, err := f.Load(ctx); err != nil || rate(cfg) != 10 || f.State().Version != 1 {
		t.Fatalf("Load = %v, %v; state %+v", cfg, err, f.State())
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { f.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	poll(t, 5*time.Second, "version 1 applied", func() bool { _, n := got.get(); return n == 1 })

	if _, err := store.ApplyConfig(ctx, 1, etcdstore.ConfigVersion{YAML: strings.Replace(v1, "10/1s", "20/1s", 1)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 5*time.Second, "version 2 applied", func() bool { cfg, _ := got.get(); return rate(cfg) == 20 && f.State().Version == 2 })

	// An override that fits applies; one that does not is left out.
	u := allot.Match{{Key: "user", Value: "1"}}
	for _, limit := range []string{"per-user", "per-team"} {
		o := etcdstore.Override{Domain: "api", Override: allot.Override{Limit: limit, Match: u, Multiplier: 3, Expires: time.Now().Add(time.Hour)}}
		if err := store.PutOverride(ctx, o, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, 5*time.Second, "the override applied", func() bool {
		cfg, _ := got.get()
		return len(cfg.Domain("api").Overrides) == 1 && f.State().Refused != nil
	})
	if err := f.State().Refused; !strings.Contains(err.Error(), `api: override user=1 on per-team: limit: unknown limit "per-team"`) {
		t.Errorf("refused: %v", err)
	}

	// A bad file never reaches the engine; the last good one stays.
	if err := store.PutConfig(ctx, []byte("domain: [")); err != nil {
		t.Fatal(err)
	}
	poll(t, 5*time.Second, "the bad file refused", func() bool {
		err := f.State().Refused
		return err != nil && strings.Contains(err.Error(), "malformed YAML")
	})
	if cfg, _ := got.get(); rate(cfg) != 20 || f.State().Version != 2 {
		t.Errorf("after a bad file: rate %d, version %d; want 20 and 2", rate(cfg), f.State().Version)
	}

	// etcd goes away: the configuration in force stays; when it is back,
	// the follower catches up.
	_, before := got.get()
	etcd.Close()
	poll(t, 5*time.Second, "etcd down", func() bool {
		gctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := cli.Get(gctx, "x")
		return err != nil
	})
	if cfg, n := got.get(); n != before || rate(cfg) != 20 {
		t.Errorf("while etcd is down: %d more applies, rate %d", n-before, rate(cfg))
	}
	if etcd, err = etcdstore.StartEmbedded(dir, client, peer); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ApplyConfig(ctx, 2, etcdstore.ConfigVersion{YAML: strings.Replace(v1, "10/1s", "30/1s", 1)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 15*time.Second, "version 3 after etcd came back", func() bool {
		cfg, _ := got.get()
		return rate(cfg) == 30 && f.State().Version == 3
	})
}
