package etcdstore_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
)

func TestVersions(t *testing.T) {
	ctx := testCtx(t)
	s := etcdstore.New(newClient(t, startEtcd(t)), "")
	if _, err := s.Version(ctx, 0); !errors.Is(err, etcdstore.ErrNoConfig) {
		t.Fatalf("Version(0) of an empty store: %v, want ErrNoConfig", err)
	}
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	v1, err := s.ApplyConfig(ctx, 0, etcdstore.ConfigVersion{Time: at, Author: "ann", Summary: "first", YAML: "domain: a\n"})
	if err != nil || v1.Version != 1 {
		t.Fatalf("ApplyConfig = %+v, %v; want version 1", v1, err)
	}
	if _, err := s.ApplyConfig(ctx, 0, etcdstore.ConfigVersion{YAML: "domain: b\n"}); !errors.Is(err, etcdstore.ErrConflict) {
		t.Fatalf("ApplyConfig on a stale base: %v, want ErrConflict", err)
	}
	if _, err := s.ApplyConfig(ctx, 5, etcdstore.ConfigVersion{YAML: "domain: b\n"}); !errors.Is(err, etcdstore.ErrConflict) {
		t.Fatalf("ApplyConfig on a future base: %v, want ErrConflict", err)
	}
	v2, err := s.ApplyConfig(ctx, 1, etcdstore.ConfigVersion{Time: at, Summary: "back", RollbackOf: 1, YAML: "domain: a\n"})
	if err != nil || v2.Version != 2 {
		t.Fatalf("ApplyConfig = %+v, %v; want version 2", v2, err)
	}
	if cur, err := s.Version(ctx, 0); err != nil || !reflect.DeepEqual(cur, v2) {
		t.Errorf("Version(0) = %+v, %v; want %+v", cur, err, v2)
	}
	if got, err := s.Version(ctx, 1); err != nil || !reflect.DeepEqual(got, v1) {
		t.Errorf("Version(1) = %+v, %v; want %+v", got, err, v1)
	}
	if _, err := s.Version(ctx, 9); !errors.Is(err, etcdstore.ErrNoVersion) {
		t.Errorf("Version(9): %v, want ErrNoVersion", err)
	}
	if h, err := s.History(ctx, 0); err != nil || !reflect.DeepEqual(h, []etcdstore.ConfigVersion{v2, v1}) {
		t.Errorf("History = %+v, %v; want v2, v1", h, err)
	}
	if h, err := s.History(ctx, 1); err != nil || len(h) != 1 || h[0].Version != 2 {
		t.Errorf("History(1) = %+v, %v; want v2", h, err)
	}
	// The fleet's config is the latest version's YAML, for WatchConfig.
	if yaml, _, err := s.Config(ctx); err != nil || string(yaml) != "domain: a\n" {
		t.Errorf("Config = %q, %v", yaml, err)
	}
}

// TestWatchFleet follows versions, overrides (replaced, expiring) and
// plan assignments through WatchFleet.
func TestWatchFleet(t *testing.T) {
	ctx := testCtx(t)
	s := etcdstore.New(newClient(t, startEtcd(t)), "")
	fleets := make(chan etcdstore.Fleet, 100)
	go s.WatchFleet(ctx, func(f etcdstore.Fleet) { fleets <- f })
	next := func(what string, ok func(etcdstore.Fleet) bool) etcdstore.Fleet {
		t.Helper()
		for deadline := time.After(10 * time.Second); ; {
			select {
			case f := <-fleets:
				if ok(f) {
					return f
				}
			case <-deadline:
				t.Fatalf("%s: not seen within 10s", what)
			}
		}
	}
	next("empty fleet", func(f etcdstore.Fleet) bool { return f.YAML == nil && f.Version == 0 })

	if _, err := s.ApplyConfig(ctx, 0, etcdstore.ConfigVersion{YAML: "v1"}); err != nil {
		t.Fatal(err)
	}
	next("version 1", func(f etcdstore.Fleet) bool { return f.Version == 1 && string(f.YAML) == "v1" })

	now := time.Now()
	u42 := allot.Match{{Key: "user", Value: "42"}}
	o := etcdstore.Override{Domain: "api", Override: allot.Override{Limit: "per-user", Match: u42, Multiplier: 2, Expires: now.Add(time.Hour)},
		Reason: "r", Author: "ann", Created: now.UTC().Truncate(time.Second)}
	if err := s.PutOverride(ctx, o, time.Hour); err != nil {
		t.Fatal(err)
	}
	o.Multiplier, o.Expires = 5, now.Add(time.Second) // replaces it, expiring soon
	o.Expires = o.Expires.Round(0)
	if err := s.PutOverride(ctx, o, time.Second); err != nil {
		t.Fatal(err)
	}
	f := next("the replaced override", func(f etcdstore.Fleet) bool { return len(f.Overrides) == 1 && f.Overrides[0].Multiplier == 5 })
	if got := f.Overrides[0]; !reflect.DeepEqual(got.Match, o.Match) || !got.Expires.Equal(o.Expires) || got.Reason != "r" || got.Limit != "per-user" {
		t.Errorf("override %+v, want %+v", got, o)
	}
	if f.Version != 1 {
		t.Errorf("version %d after an override, want 1", f.Version)
	}

	acme := allot.Match{{Key: "tenant", Value: "acme"}}
	if err := s.PutPlanAssignment(ctx, etcdstore.PlanAssignment{Domain: "api", PlanAssignment: allot.PlanAssignment{Match: acme, Plan: "pro"}}); err != nil {
		t.Fatal(err)
	}
	f = next("the plan assignment", func(f etcdstore.Fleet) bool { return len(f.Assignments) == 1 })
	dyn := f.Dynamic()
	if a := dyn.Assignments["api"]; len(a) != 1 || a[0].Plan != "pro" || len(dyn.Overrides["api"]) != 1 {
		t.Errorf("Dynamic() = %+v", dyn)
	}
	if ok, err := s.DeletePlanAssignment(ctx, "api", acme); !ok || err != nil {
		t.Fatalf("DeletePlanAssignment = %v, %v", ok, err)
	}
	next("the assignment deleted", func(f etcdstore.Fleet) bool { return len(f.Assignments) == 0 })

	// The lease ends (etcd's minimum TTL is 2s here): the override goes.
	next("the override expired", func(f etcdstore.Fleet) bool { return len(f.Overrides) == 0 })
	t.Logf("override gone from etcd %v after its expiry", time.Since(o.Expires).Round(time.Millisecond))

	// A config put without ApplyConfig has no version.
	if err := s.PutConfig(ctx, []byte("raw")); err != nil {
		t.Fatal(err)
	}
	next("unversioned config", func(f etcdstore.Fleet) bool { return string(f.YAML) == "raw" && f.Version == 0 })
	if got, err := s.Fleet(ctx); err != nil || string(got.YAML) != "raw" || got.Version != 0 {
		t.Errorf("Fleet = %+v, %v", got, err)
	}
}

func TestOverridesDelete(t *testing.T) {
	ctx := testCtx(t)
	s := etcdstore.New(newClient(t, startEtcd(t)), "")
	m := allot.Match{{Key: "user", Value: "a,b=c"}, {Key: "tenant", Value: "x"}}
	for _, limit := range []string{"", "per-user"} {
		o := etcdstore.Override{Domain: "api", Override: allot.Override{Limit: limit, Match: m, Rate: allot.Rate{Amount: 5, Period: time.Second}}}
		if err := s.PutOverride(ctx, o, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Overrides(ctx, "api")
	if err != nil || len(got) != 2 {
		t.Fatalf("Overrides = %+v, %v; want 2", got, err)
	}
	// The match comes back sorted: its order does not change what it selects.
	if want := (allot.Match{m[1], m[0]}); !reflect.DeepEqual(got[0].Match, want) || got[0].Rate.Amount != 5 {
		t.Errorf("override %+v", got[0])
	}
	if ok, err := s.DeleteOverride(ctx, "api", "", allot.Match{m[1], m[0]}); !ok || err != nil {
		t.Fatalf("DeleteOverride = %v, %v", ok, err)
	}
	if ok, err := s.DeleteOverride(ctx, "api", "", m); ok || err != nil {
		t.Fatalf("DeleteOverride again = %v, %v; want false", ok, err)
	}
	if got, _ := s.Overrides(ctx, ""); len(got) != 1 || got[0].Limit != "per-user" {
		t.Errorf("after delete: %+v", got)
	}
}

func TestRegister(t *testing.T) {
	ctx := testCtx(t)
	s := etcdstore.New(newClient(t, startEtcd(t)), "", etcdstore.WithSessionTTL(ttl))
	a, err := s.Register(ctx, etcdstore.Region{Region: "us-east", Addr: "127.0.0.1:1", HTTP: "127.0.0.1:2"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Register(ctx, etcdstore.Region{Region: "eu-west", Addr: "127.0.0.1:3"})
	if err != nil {
		t.Fatal(err)
	}
	want := []etcdstore.Region{{Region: "eu-west", Addr: "127.0.0.1:3"}, {Region: "us-east", Addr: "127.0.0.1:1", HTTP: "127.0.0.1:2"}}
	if rs, err := s.Regions(ctx); err != nil || !reflect.DeepEqual(rs, want) {
		t.Fatalf("Regions = %+v, %v; want %+v", rs, err, want)
	}
	b.Close() // deregisters at once
	if rs, err := s.Regions(ctx); err != nil || !reflect.DeepEqual(rs, want[1:]) {
		t.Fatalf("Regions after Close = %+v, %v; want %+v", rs, err, want[1:])
	}
	a.Close()
}

func TestShares(t *testing.T) {
	ctx := testCtx(t)
	s := etcdstore.New(newClient(t, startEtcd(t)), "")
	if term, version, got, err := s.Shares(ctx, "api", []string{"a"}); err != nil || term != 0 || version != 0 || got["a"].Shares != nil {
		t.Fatalf("Shares before any assignment = %d, %d, %+v, %v", term, version, got, err)
	}
	l, err := s.Campaign(ctx, "api", "c:1")
	if err != nil {
		t.Fatal(err)
	}
	cells := []coordinator.Cell{{Region: "us-east", Share: 0.6, Bound: 0.6}, {Region: "eu-west", Share: 0.4, Bound: 0.4}}
	rd := coordinator.Ready{Term: l.Term, Version: 7, Persist: []coordinator.Record{
		{Limit: "a", Cells: cells}, {Limit: "a", Key: "user=1", Cells: cells}, {Limit: "a", Key: "user=2", Cells: cells},
		{Limit: "ab", Key: "user=1", Cells: cells},
	}}
	if err := s.Persist(ctx, l, "api", rd); err != nil {
		t.Fatal(err)
	}
	term, version, got, err := s.Shares(ctx, "api", []string{"a", "ab"})
	if err != nil || term != l.Term || version != 7 {
		t.Fatalf("Shares = %d, %d, %v", term, version, err)
	}
	want := map[string]etcdstore.LimitShares{"a": {Shares: map[string]float64{"us-east": 0.6, "eu-west": 0.4}, HotKeys: 2}, "ab": {HotKeys: 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Shares = %+v, want %+v", got, want)
	}
	def, err := s.DefaultShares(ctx, "api", []string{"a", "ab"})
	if err != nil || !reflect.DeepEqual(def, map[string]map[string]float64{"a": want["a"].Shares}) {
		t.Errorf("DefaultShares = %+v, %v", def, err)
	}
}
