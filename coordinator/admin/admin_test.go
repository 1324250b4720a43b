package admin_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/fleettest"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

var regions = []string{"us-east", "eu-west", "ap-south"}

// limitsYAML is the fleet's first configuration. per-user refills so
// slowly (60/1h) that a test sees exactly its burst admitted.
const limitsYAML = `domain: api
regions: [us-east, eu-west, ap-south]
plans:
  free: {multiplier: 1}
  pro: {multiplier: 10, floors: {per-tenant: 5000/1h}}
limits:
  - name: per-user
    match: {user: "*"}
    rate: 60/1h
    burst: 5
  - name: per-tenant
    match: {tenant: "*"}
    rate: 1000/1h
`

// withBurst is limitsYAML with per-user's burst set to b.
func withBurst(b int) string {
	return strings.Replace(limitsYAML, "burst: 5", fmt.Sprintf("burst: %d", b), 1)
}

// admitted sends n checks of desc to r and counts those allowed.
func admitted(t *testing.T, r *fleettest.Region, n int, desc ...string) int {
	t.Helper()
	d := &allotv1.Descriptor{}
	for i := 0; i < len(desc); i += 2 {
		d.Entries = append(d.Entries, &allotv1.Entry{Key: desc[i], Value: desc[i+1]})
	}
	ok := 0
	for range n {
		resp, err := r.Limiter.Check(t.Context(), &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: "api", Descriptors: []*allotv1.Descriptor{d}}}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetResults()[0].GetAllowed() {
			ok++
		}
	}
	return ok
}

func key(kv ...string) []*allotv1.Entry {
	var es []*allotv1.Entry
	for i := 0; i < len(kv); i += 2 {
		es = append(es, &allotv1.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// burst is per-user's burst in force in r.
func burst(r *fleettest.Region) int64 { return r.Engine.Config().Domain("api").Limit("per-user").Burst }

// waitVersion waits until every region has version v in force.
func waitVersion(t *testing.T, f *fleettest.Fleet, v int64) {
	t.Helper()
	for _, r := range f.Regions {
		fleettest.Poll(t, 5*time.Second, fmt.Sprintf("%s on version %d", r.Name, v), func() bool { return r.Follower.State().Version == v })
	}
}

func apply(t *testing.T, f *fleettest.Fleet, yaml string) *allotv1.ApplyConfigResponse {
	t.Helper()
	resp, err := f.Client.ApplyConfig(t.Context(), &allotv1.ApplyConfigRequest{Yaml: yaml, File: "limits.yaml", Author: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestApplyPropagates measures the figure: the time from an apply
// to its enforcement in every region, over 100 changes.
func TestApplyPropagates(t *testing.T) {
	f := fleettest.Start(t, limitsYAML, regions...)
	var took []time.Duration
	for i := range 100 {
		b := 10 + i
		start := time.Now()
		resp := apply(t, f, withBurst(b))
		if v := resp.GetVersion().GetVersion(); !resp.GetApplied() || v != int64(i+2) {
			t.Fatalf("change %d: applied %v as version %d", i, resp.GetApplied(), v)
		}
		fleettest.Poll(t, time.Second, fmt.Sprintf("burst %d in every region", b), func() bool {
			for _, r := range f.Regions {
				if burst(r) != int64(b) {
					return false
				}
			}
			return true
		})
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("apply → enforced in 3 regions, over %d changes: p50 %v, p99 %v, max %v", len(took), took[49], took[98], took[99])
	for _, r := range f.Regions {
		if got := admitted(t, r, 120, "user", "u-"+r.Name); got != 109 {
			t.Errorf("%s admitted %d of 120, want the last burst, 109", r.Name, got)
		}
	}
}

func TestRollback(t *testing.T) {
	f := fleettest.Start(t, limitsYAML, regions...)
	us := f.Regions[0]
	apply(t, f, withBurst(2))
	waitVersion(t, f, 2)
	if got := admitted(t, us, 6, "user", "a"); got != 2 {
		t.Fatalf("version 2 admitted %d, want 2", got)
	}
	resp, err := f.Client.Rollback(t.Context(), &allotv1.RollbackRequest{Author: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if v := resp.GetVersion(); !resp.GetApplied() || v.GetVersion() != 3 || v.GetRollbackOf() != 1 {
		t.Fatalf("rollback = %v", resp)
	}
	if c := resp.GetChanges(); len(c) != 1 || c[0].GetPath() != "limits/per-user.burst" || c[0].GetOld() != "2" || c[0].GetNew() != "5" {
		t.Errorf("rollback changes %v, want per-user.burst 2 → 5", c)
	}
	waitVersion(t, f, 3)
	for _, r := range f.Regions {
		if got := admitted(t, r, 6, "user", "b"); got != 5 {
			t.Errorf("%s admitted %d after the rollback, want 5 as in version 1", r.Name, got)
		}
	}
	h, err := f.Client.History(t.Context(), &allotv1.HistoryRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if vs := h.GetVersions(); len(vs) != 3 || vs[0].GetSummary() != "rollback to version 1" || vs[1].GetSummary() != "~ api limits/per-user.burst: 5 → 2" {
		t.Errorf("history %v", vs)
	}
	if _, err := f.Client.Rollback(t.Context(), &allotv1.RollbackRequest{Version: 9}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("rollback to a missing version: %v, want INVALID_ARGUMENT", err)
	}
}

// userBurst is per-user's burst that r's engine applies to user u now,
// overrides included: what r's next check of the key is decided by.
// Reading it touches no key, unlike Usage (see TestOverrideExpires).
func userBurst(r *fleettest.Region, u string) int64 {
	d := r.Engine.Config().Domain("api")
	return d.Effective(d.Limit("per-user"), allot.Descriptor{{Key: "user", Value: u}}, time.Now()).Burst
}

// TestOverrideExpires raises a user's limit for two seconds.
//
// It waits for the override in the regions' engines, never by polling
// Usage: a region answers Usage with a check that charges nothing but
// creates the key's bucket, full at the burst in force. Asked before the
// override reaches it, a region would keep user 42's bucket at 5 tokens,
// and a token bucket does not grow when its burst is raised: it would
// then admit 5, not 20, refilling at 240/h (one token in 15s) within
// the override's two seconds.
func TestOverrideExpires(t *testing.T) {
	f := fleettest.Start(t, limitsYAML, regions...)
	o, err := f.Client.SetOverride(t.Context(), &allotv1.SetOverrideRequest{Ttl: durationpb.New(2 * time.Second),
		Override: &allotv1.Override{Domain: "api", Limit: "per-user", Match: key("user", "42"), Multiplier: 4, Reason: "incident"}})
	if err != nil {
		t.Fatal(err)
	}
	expires := o.GetExpires().AsTime()
	amount := func() int64 {
		t.Helper()
		resp, err := f.Client.Usage(t.Context(), &allotv1.UsageRequest{Domain: "api", Descriptor_: key("user", "42")})
		if err != nil || len(resp.GetGlobal()) != 1 {
			t.Fatalf("usage: %v, %v", resp, err)
		}
		return resp.GetGlobal()[0].GetAmount()
	}
	for _, r := range f.Regions {
		fleettest.Poll(t, time.Second, r.Name+" enforcing the override", func() bool { return userBurst(r, "42") == 20 })
	}
	if got := amount(); got != 240 {
		t.Errorf("usage with the override in every region: %d/h, want 4 × 60", got)
	}
	for _, r := range f.Regions {
		if got := admitted(t, r, 25, "user", "42"); got != 20 {
			t.Errorf("%s admitted %d with the override, want 4 × 5", r.Name, got)
		}
	}
	list, err := f.Client.ListOverrides(t.Context(), &allotv1.ListOverridesRequest{Domain: "api"})
	if err != nil || len(list.GetOverrides()) != 1 || list.GetOverrides()[0].GetReason() != "incident" {
		t.Fatalf("ListOverrides = %v, %v", list, err)
	}

	for _, r := range f.Regions {
		fleettest.Poll(t, 5*time.Second, r.Name+" back to the limit", func() bool { return userBurst(r, "42") == 5 })
	}
	t.Logf("engines back to the limit %v after the expiry", time.Since(expires).Round(time.Millisecond))
	if got := amount(); got != 60 {
		t.Errorf("usage after the expiry in every region: %d/h, want 60", got)
	}
	fleettest.Poll(t, 10*time.Second, "the override's key gone from etcd", func() bool {
		os, err := f.Store.Overrides(t.Context(), "api")
		return err == nil && len(os) == 0
	})
	t.Logf("override's etcd key gone %v after the expiry (its lease)", time.Since(expires).Round(time.Millisecond))
	for _, r := range f.Regions {
		if got := admitted(t, r, 6, "user", "43"); got != 5 {
			t.Errorf("%s admitted %d after the expiry, want 5", r.Name, got)
		}
	}
}

func TestShadowMode(t *testing.T) {
	f := fleettest.Start(t, limitsYAML, regions...)
	us := f.Regions[0]
	resp, err := f.Client.UpdateLimit(t.Context(), &allotv1.UpdateLimitRequest{Limit: "per-user", Shadow: new(true)})
	if err != nil {
		t.Fatal(err)
	}
	if v := resp.GetVersion(); v.GetVersion() != 2 || v.GetSummary() != "limits shadow per-user on" {
		t.Fatalf("shadow on: %v", resp)
	}
	waitVersion(t, f, 2)
	if got := admitted(t, us, 12, "user", "s"); got != 12 {
		t.Errorf("shadow mode admitted %d of 12, want all", got)
	}
	st, err := us.Limiter.Check(t.Context(), &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: "api",
		Descriptors: []*allotv1.Descriptor{{Entries: key("user", "s")}}}}})
	if err != nil || !st.GetResults()[0].GetAllowed() || !st.GetResults()[0].GetLimits()[0].GetShadow() {
		t.Fatalf("check in shadow mode: %v, %v", st, err)
	}
	fleet, err := f.Client.Status(t.Context(), &allotv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rs := range fleet.GetRegions() {
		if rs.GetRegion() != us.Name {
			continue
		}
		if l := rs.GetDomains()[0].GetLimits()[0]; !l.GetShadow() || l.GetShadowRejected() != 8 || l.GetAllowed() != 5 {
			t.Errorf("%s status of per-user: %v; want shadow, 5 allowed, 8 would-be rejections", rs.GetRegion(), l)
		}
	}

	if _, err := f.Client.UpdateLimit(t.Context(), &allotv1.UpdateLimitRequest{Domain: "api", Limit: "per-user", Shadow: new(false)}); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, f, 3)
	if got := admitted(t, us, 12, "user", "t"); got != 5 {
		t.Errorf("shadow off admitted %d of 12, want 5", got)
	}
	if _, err := f.Client.UpdateLimit(t.Context(), &allotv1.UpdateLimitRequest{Limit: "per-user", Mode: new("shared")}); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, f, 4)
	if m := us.Engine.Config().Domain("api").Limit("per-user").Mode.String(); m != "shared" {
		t.Errorf("mode %s after limits mode shared", m)
	}
	if _, err := f.Client.UpdateLimit(t.Context(), &allotv1.UpdateLimitRequest{Limit: "nope", Shadow: new(true)}); status.Code(err) != codes.NotFound {
		t.Errorf("shadow of an unknown limit: %v, want NOT_FOUND", err)
	}
}

func TestInvalidRefused(t *testing.T) {
	f := fleettest.Start(t, limitsYAML, regions...)
	ctx := t.Context()
	refused := func(what, yaml string, want ...string) {
		t.Helper()
		_, err := f.Client.ApplyConfig(ctx, &allotv1.ApplyConfigRequest{Yaml: yaml, File: "bad.yaml"})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want INVALID_ARGUMENT", what, err)
		}
		for _, w := range want {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: message\n%s\nwant it to hold\n%s", what, status.Convert(err).Message(), w)
			}
		}
	}
	refused("bad fields", strings.Replace(strings.Replace(limitsYAML, "burst: 5", "burst: 0", 1), "rate: 1000/1h", "rate: lots", 1),
		"bad.yaml:10: limits[0].burst: want an integer in [1, 1125899906842624], got 0",
		`bad.yaml:13: limits[1].rate: bad rate "lots": want AMOUNT/PERIOD such as 1000/1m`)
	refused("below a plan floor", strings.Replace(limitsYAML, "rate: 1000/1h", "rate: 100/1h", 1),
		"bad.yaml:5: plans.pro.floors.per-tenant: plan pro sets per-tenant to 1000/h (100/h × 10), below the plan's floor 5000/h")

	if _, err := f.Client.AssignPlan(ctx, &allotv1.AssignPlanRequest{Assignment: &allotv1.PlanAssignment{Domain: "api", Match: key("tenant", "acme"), Plan: "pro"}}); err != nil {
		t.Fatal(err)
	}
	noPro := strings.Replace(limitsYAML, "  pro: {multiplier: 10, floors: {per-tenant: 5000/1h}}\n", "", 1)
	refused("an assignment to a removed plan", noPro, `api: plan assignment tenant=acme → pro: plan: unknown plan "pro", want one of free`)
	if _, err := f.Client.SetOverride(ctx, &allotv1.SetOverrideRequest{Ttl: durationpb.New(time.Minute),
		Override: &allotv1.Override{Domain: "api", Limit: "per-team", Match: key("user", "1"), Multiplier: 2}}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), `api: override user=1 on per-team: limit: unknown limit "per-team"`) {
		t.Errorf("override on an unknown limit: %v", err)
	}

	h, err := f.Client.History(ctx, &allotv1.HistoryRequest{})
	if err != nil || len(h.GetVersions()) != 1 {
		t.Fatalf("history after refusals: %v, %v; want version 1 only", h, err)
	}
	// A bad file put into etcd behind the Admin API's back never reaches
	// the engines: they keep version 1 and say why.
	if err := f.Store.PutConfig(ctx, []byte("domain: [api\n")); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Regions {
		fleettest.Poll(t, 5*time.Second, r.Name+" refusing", func() bool { return r.Follower.State().Refused != nil })
		if st := r.Follower.State(); st.Version != 1 || burst(r) != 5 {
			t.Errorf("%s: version %d, burst %d after a bad config; want 1 and 5", r.Name, st.Version, burst(r))
		}
	}
	st, err := f.Client.Status(ctx, &allotv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.GetConfigError(), "does not parse") {
		t.Errorf("status config error %q", st.GetConfigError())
	}
	for _, rs := range st.GetRegions() {
		if !strings.Contains(rs.GetConfigError(), "malformed YAML") || rs.GetConfigVersion() != 1 {
			t.Errorf("%s status: config %d, error %q", rs.GetRegion(), rs.GetConfigVersion(), rs.GetConfigError())
		}
	}
	apply(t, f, withBurst(7))
	waitVersion(t, f, 2)
	for _, r := range f.Regions {
		if st := r.Follower.State(); st.Refused != nil || burst(r) != 7 {
			t.Errorf("%s after a good version: %v, burst %d", r.Name, st.Refused, burst(r))
		}
	}
}

func TestUsageAndStatus(t *testing.T) {
	f := fleettest.Start(t, limitsYAML, regions...)
	ctx := t.Context()
	if _, err := f.Client.AssignPlan(ctx, &allotv1.AssignPlanRequest{Assignment: &allotv1.PlanAssignment{Domain: "api", Match: key("tenant", "acme"), Plan: "pro"}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Regions {
		fleettest.Poll(t, 5*time.Second, r.Name+" has the assignment", func() bool { return len(r.Engine.Config().Domain("api").Assignments) == 1 })
	}
	admitted(t, f.Regions[0], 4, "tenant", "acme")
	admitted(t, f.Regions[1], 2, "tenant", "acme")
	resp, err := f.Client.Usage(ctx, &allotv1.UsageRequest{Domain: "api", Descriptor_: key("tenant", "acme")})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]int64{}
	for _, r := range resp.GetRegions() {
		if r.GetError() != "" || len(r.GetLimits()) != 1 {
			t.Fatalf("region %s: %v", r.GetRegion(), r)
		}
		used[r.GetRegion()] = r.GetLimits()[0].GetUsed()
	}
	want := map[string]int64{"us-east": 4, "eu-west": 2, "ap-south": 0}
	if fmt.Sprint(used) != fmt.Sprint(want) {
		t.Errorf("used per region %v, want %v", used, want)
	}
	g := resp.GetGlobal()
	if len(g) != 1 || g[0].GetKey() != "per-tenant:tenant=acme" || g[0].GetUsed() != 6 || g[0].GetAmount() != 10000 || g[0].GetRemaining() != 3*10000-6 {
		t.Errorf("global usage %v: want per-tenant:tenant=acme, 6 used of the pro plan's 10000 in each of 3 regions", g)
	}

	st, err := f.Client.Status(ctx, &allotv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetConfig().GetVersion() != 1 || len(st.GetDomains()) != 1 || len(st.GetRegions()) != 3 {
		t.Fatalf("status %v", st)
	}
	pu := st.GetDomains()[0].GetLimits()[0]
	if pu.GetName() != "per-user" || len(pu.GetShares()) != 3 || pu.GetShares()["us-east"] < 0.33 {
		t.Errorf("per-user status %v: want the initial split over 3 regions", pu)
	}
	for _, rs := range st.GetRegions() {
		if rs.GetError() != "" || rs.GetConfigVersion() != 1 || len(rs.GetDomains()) != 1 {
			t.Errorf("region status %v", rs)
		}
	}
}
