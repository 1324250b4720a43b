package regional

import (
	"errors"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

func entries(kv ...string) allot.Descriptor {
	var d allot.Descriptor
	for i := 0; i < len(kv); i += 2 {
		d = append(d, allot.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestCheckItemsAddUpOnOneKey(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{})
	var dec allot.Decision
	items := []Item{{Descriptor: user("1"), Hits: 6}, {Descriptor: user("1"), Hits: 5}}
	if err := e.CheckItems(t0, "api", items, &dec); err != nil || dec.Allowed {
		t.Fatalf("6+5 on a burst of 10: allowed=%v err=%v", dec.Allowed, err)
	}
	if st := dec.Statuses; len(st) != 2 || st[0].Descriptor != 0 || st[1].Descriptor != 1 || !st[0].Allowed || st[1].Allowed {
		t.Fatalf("statuses: %+v", st)
	}
	items[1].Hits = 4
	if err := e.CheckItems(t0, "api", items, &dec); err != nil || !dec.Allowed || dec.Statuses[1].Remaining != 0 {
		t.Fatalf("6+4: allowed=%v statuses=%+v err=%v", dec.Allowed, dec.Statuses, err)
	}
	if err := e.Check(t0, "api", user("1"), 1, &dec); err != nil || dec.Allowed {
		t.Fatalf("after 10 charged: allowed=%v err=%v", dec.Allowed, err)
	}
}

func TestCheckItemsBadInputChargesNothing(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{})
	var dec allot.Decision
	bad := allot.Rate{Amount: 0, Period: time.Second}
	for _, items := range [][]Item{
		{{Descriptor: user("1"), Hits: 1}, {Descriptor: user("2"), Hits: -1}},
		{{Descriptor: user("1"), Hits: 1}, {Descriptor: user("2"), Hits: 1, Limit: &bad}},
		make([]Item, MaxItems+1),
	} {
		if err := e.CheckItems(t0, "api", items, &dec); err == nil {
			t.Fatalf("CheckItems(%v): no error", items)
		}
	}
	if n := e.Stats().Keys; n != 0 {
		t.Fatalf("a refused request created %d keys", n)
	}
}

func TestReplacesAndUnlimited(t *testing.T) {
	cfg := mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1/s}
  - {name: vip, match: {user: "vip*"}, rate: 100/s}
  - {name: internal, match: {user: "svc"}, rate: 1/s}
`)
	d := cfg.Domains[0]
	d.Limits[1].Replaces = []string{"per-user"}
	d.Limits[2].Unlimited = true
	d.Limits[2].Replaces = []string{"per-user"}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	e := New(cfg, Options{})
	var dec allot.Decision
	for range 5 {
		if err := e.Check(t0, "api", user("vip-1"), 1, &dec); err != nil || !dec.Allowed || len(dec.Statuses) != 1 || dec.Statuses[0].Name != "vip" {
			t.Fatalf("vip: allowed=%v statuses=%+v err=%v", dec.Allowed, dec.Statuses, err)
		}
		if err := e.Check(t0, "api", user("svc"), 1, &dec); err != nil || !dec.Allowed || len(dec.Statuses) != 1 || dec.Statuses[0].Name != "internal" {
			t.Fatalf("svc: allowed=%v statuses=%+v err=%v", dec.Allowed, dec.Statuses, err)
		}
	}
	if n := e.Stats().Keys; n != 1 {
		t.Fatalf("keys: got %d, want 1 (unlimited limits keep no state)", n)
	}
}

func TestEnvoyPathsPickOneLimit(t *testing.T) {
	cfg := mustConfig(t, `
domain: envoy
limits:
  - {name: remote, match: {remote_address: "*"}, rate: 2/s, algorithm: sliding_window}
  - {name: remote-local, match: {remote_address: "127.0.0.1"}, rate: 5/s, algorithm: sliding_window}
  - {name: path, match: {remote_address: "*", path: "/api*"}, rate: 1/s, algorithm: sliding_window}
`)
	cfg.Domains[0].EnvoyPaths = true
	e := New(cfg, Options{})
	var dec allot.Decision
	check := func(d allot.Descriptor) string {
		t.Helper()
		if err := e.CheckItems(t0, "envoy", []Item{{Descriptor: d, Hits: 1}}, &dec); err != nil {
			t.Fatal(err)
		}
		if len(dec.Statuses) == 0 {
			return ""
		}
		return dec.Statuses[0].Name
	}
	cases := []struct {
		d    allot.Descriptor
		want string
	}{
		{entries("remote_address", "10.0.0.1"), "remote"},
		{entries("remote_address", "127.0.0.1"), "remote-local"},
		{entries("remote_address", "10.0.0.1", "path", "/api/x"), "path"},
		{entries("remote_address", "10.0.0.1", "path", "/web"), ""},
		{entries("path", "/api/x", "remote_address", "10.0.0.1"), ""}, // order matters
		{entries("remote_address", "10.0.0.1", "path", "/api/x", "x", "y"), ""},
	}
	for _, c := range cases {
		if got := check(c.d); got != c.want {
			t.Errorf("%v: got limit %q, want %q", c.d, got, c.want)
		}
	}
}

func TestDescriptorLimit(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/s}\n"), Options{})
	three := allot.Rate{Amount: 3, Period: time.Second}
	var dec allot.Decision
	got := []bool{}
	for _, d := range []allot.Descriptor{user("1"), user("1"), user("1"), user("1"), entries("ip", "1.2.3.4"), entries("ip", "1.2.3.4"), entries("ip", "1.2.3.4"), entries("ip", "1.2.3.4")} {
		if err := e.CheckItems(t0, "api", []Item{{Descriptor: d, Hits: 1, Limit: &three}}, &dec); err != nil {
			t.Fatal(err)
		}
		got = append(got, dec.Allowed)
		if dec.Statuses[0].Limit != 3 {
			t.Fatalf("limit reported: %d, want 3", dec.Statuses[0].Limit)
		}
	}
	want := []bool{true, true, true, false, true, true, true, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("verdicts: got %v, want %v", got, want)
		}
	}
	if dec.Statuses[0].Name != adhocName {
		t.Fatalf("name of a descriptor's own limit: %q", dec.Statuses[0].Name)
	}
}

func TestRefundItems(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{})
	var dec allot.Decision
	if err := e.Check(t0, "api", user("1"), 10, &dec); err != nil || !dec.Allowed {
		t.Fatal(err)
	}
	if err := e.RefundItems(t0, "api", []Item{{Descriptor: user("1"), Hits: 4}}, &dec); err != nil || dec.Statuses[0].Remaining != 4 {
		t.Fatalf("refund 4: remaining=%d err=%v", dec.Statuses[0].Remaining, err)
	}
	if err := e.RefundItems(t0, "nope", []Item{{Descriptor: user("1"), Hits: 4}}, &dec); !errors.Is(err, ErrUnknownDomain) {
		t.Fatalf("unknown domain: %v", err)
	}
}

func TestCheckItemsManyKeys(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{})
	items := make([]Item, MaxItems)
	for i := range items {
		items[i] = Item{Descriptor: user(string(rune('A' + i))), Hits: 1}
	}
	var dec allot.Decision
	if err := e.CheckItems(t0, "api", items, &dec); err != nil || !dec.Allowed || len(dec.Statuses) != MaxItems {
		t.Fatalf("%d keys in one request: allowed=%v statuses=%d err=%v", MaxItems, dec.Allowed, len(dec.Statuses), err)
	}
}
