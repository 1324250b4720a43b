package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// pageClock is a settable clock for a Service.
type pageClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *pageClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *pageClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClockedService(t *testing.T) (*Service, *pageClock) {
	t.Helper()
	cfg, err := allot.ParseConfig("test.yaml", []byte(strings.Replace(testConfig, "domain: api\n", "domain: api\nregions: [us-east, eu-west]\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	c := &pageClock{t: t0}
	return New(regional.New(cfg, regional.Options{}), Options{Region: "us-east", Now: c.now}), c
}

func decideN(t *testing.T, s *Service, n int, desc ...string) {
	t.Helper()
	d := allot.Descriptor{}
	for i := 0; i < len(desc); i += 2 {
		d = append(d, allot.Entry{Key: desc[i], Value: desc[i+1]})
	}
	for range n {
		if err := s.checkBatch(t.Context(), []CheckItem{{Domain: "api", Descriptors: []allot.Descriptor{d}, Hits: 1}}, make([]allot.Decision, 1)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRegionAdmin(t *testing.T) {
	s, _ := newClockedService(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.RegisterAdmin(gs, AdminOptions{Addr: l.Addr().String(),
		ConfigVersion: func() (int64, error) { return 7, errors.New("version 8 refused") },
		Applied:       func(string) (int64, uint64) { return 3, 41 }})
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	a := allotv1.NewAdminClient(cc)
	ctx := t.Context()

	decideN(t, s, 2, "user", "1")
	u, err := a.Usage(ctx, &allotv1.UsageRequest{Domain: "api", Descriptor_: []*allotv1.Entry{{Key: "user", Value: "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r := u.GetRegions(); len(r) != 1 || r[0].GetRegion() != "us-east" || len(r[0].GetLimits()) != 2 {
		t.Fatalf("usage %v: want us-east with per-user and shadowed", u)
	}
	pu := u.GetRegions()[0].GetLimits()[0]
	if pu.GetKey() != "per-user:user=1" || pu.GetUsed() != 2 || pu.GetRemaining() != 3 || pu.GetAmount() != 10 || pu.GetShare() != 1 {
		t.Errorf("per-user usage %v: want 2 used, 3 remaining of 10/s burst 5", pu)
	}
	if sh := u.GetRegions()[0].GetLimits()[1]; !sh.GetShadow() || sh.GetUsed() != 1 {
		t.Errorf("shadowed usage %v: want shadow, 1 used (its burst)", sh)
	}
	if _, err := a.Usage(ctx, &allotv1.UsageRequest{Domain: "nope", Descriptor_: []*allotv1.Entry{{Key: "user", Value: "1"}}}); status.Code(err) != codes.NotFound {
		t.Errorf("usage in an unknown domain: %v, want NOT_FOUND", err)
	}

	st, err := a.Status(ctx, &allotv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rs := st.GetRegions()[0]
	if rs.GetConfigVersion() != 7 || rs.GetConfigError() != "version 8 refused" || rs.GetAddr() != l.Addr().String() {
		t.Errorf("region status %v", rs)
	}
	d := rs.GetDomains()[0]
	if d.GetTerm() != 3 || d.GetVersion() != 41 || len(d.GetLimits()) != 3 {
		t.Fatalf("domain status %v", d)
	}
	if pu, sh := d.GetLimits()[0], d.GetLimits()[2]; pu.GetAllowed() != 2 || !sh.GetShadow() || sh.GetAllowed() != 1 || sh.GetShadowRejected() != 1 {
		t.Errorf("limits %v, %v: want per-user 2 allowed; shadowed 1 allowed, 1 would-be rejection", pu, sh)
	}
	if _, err := a.ApplyConfig(ctx, &allotv1.ApplyConfigRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("a write to a region: %v, want UNIMPLEMENTED", err)
	}
}

func TestStatusPage(t *testing.T) {
	s, c := newClockedService(t)
	// Shares in force here as a coordinator would set them; the fleet's
	// persisted shares hold per-user only: the other limits were never
	// assigned, so they are on the initial split.
	for limit, share := range map[string]float64{"per-user": 0.25, "per-tenant": 0.5, "shadowed": 0.5} {
		if err := s.Engine().SetShare(c.now(), "api", limit, share); err != nil {
			t.Fatal(err)
		}
	}
	h := s.StatusHandler(AdminOptions{Refresh: 3 * time.Second,
		ConfigVersion: func() (int64, error) { return 4, nil },
		Shares: func(_ context.Context, domain string, limits []string) (map[string]map[string]float64, error) {
			return map[string]map[string]float64{"per-user": {"us-east": 0.3, "eu-west": 0.75}}, nil
		}})
	get := func() string {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
			t.Fatalf("GET: %d %s", rec.Code, rec.Header())
		}
		return rec.Body.String()
	}
	get()
	decideN(t, s, 8, "user", "<b>")
	c.add(2 * time.Second)
	page := get()
	for _, want := range []string{
		`<meta http-equiv="refresh" content="3">`, "region us-east", "configuration version 4",
		`<td class="name">per-user</td>`, `<span class="tag shadow">shadow</span>`,
		// per-user: the fleet's persisted eu-west share, and us-east's in force
		`<td class="line"><span>eu-west 0.750</span><span>us-east 0.250</span></td>`,
		// per-tenant and shadowed: never assigned, the initial split; every region listed
		`<td class="name">per-tenant</td>`, `<td class="line"><span>eu-west 0.500</span><span>us-east 0.500</span></td>`,
		"<td class=\"n\">0.5</td>", // per-user allowed 1 of 8 in 2s (0.25 of burst 5: 1.25 tokens)
		"<td class=\"n\">3.5</td>", // and rejected 7
		"<span>1 allowed</span><span>7 rejected</span><span>0 would reject</span>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if n := strings.Count(page, "<span>eu-west "); n != 3 {
		t.Errorf("eu-west's share shown for %d limits, want 3:\n%s", n, page)
	}
	if strings.Contains(page, "<b>") || strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Errorf("page holds a key or an external asset:\n%s", page)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/status", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", rec.Code)
	}

	// Without the fleet's shares (no etcd), or when they cannot be read,
	// this region's alone.
	for _, shares := range []func(context.Context, string, []string) (map[string]map[string]float64, error){
		nil,
		func(context.Context, string, []string) (map[string]map[string]float64, error) {
			return nil, errors.New("etcd down")
		},
	} {
		rec := httptest.NewRecorder()
		s.StatusHandler(AdminOptions{Shares: shares}).ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
		if page := rec.Body.String(); !strings.Contains(page, `<td class="line"><span>us-east 0.500</span></td>`) || strings.Contains(page, "<span>eu-west") {
			t.Errorf("without the fleet's shares:\n%s", page)
		}
	}
}

func TestShadowLog(t *testing.T) {
	var buf bytes.Buffer
	l := newShadowLog(slog.New(slog.NewTextHandler(&buf, nil)), 1)
	it := CheckItem{Domain: "api", Descriptors: []allot.Descriptor{{{Key: "user", Value: "7"}}}}
	would := &allot.Decision{Allowed: true, Statuses: []allot.LimitStatus{
		{Name: "per-user", Allowed: true}, {Name: "shadowed", Shadow: true, Allowed: false, Limit: 1, Window: time.Second}}}
	for i := range 10 {
		l.observe(t0.Add(time.Duration(i)*50*time.Millisecond), it, would) // 10 in 450ms: one line
	}
	l.observe(t0.Add(time.Second), it, would)
	l.observe(t0.Add(time.Second), it, &allot.Decision{Allowed: true, Statuses: []allot.LimitStatus{{Name: "shadowed", Shadow: true, Allowed: true}}})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{"suppressed=0", "suppressed=9"} {
		if !strings.Contains(lines[i], `msg="shadow limit would reject" domain=api limit=shadowed descriptor="user=7"`) || !strings.Contains(lines[i], want) {
			t.Errorf("line %d: %s; want %s", i, lines[i], want)
		}
	}
}

func TestStatusShowsPeerSyncLag(t *testing.T) {
	cfg, err := allot.ParseConfig("t.yaml", []byte("domain: api\nregions: [us-east, eu-west, ap-south]\nlimits:\n  - {name: g, match: {}, rate: 1000/1s, mode: shared}\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	e := regional.New(cfg, regional.Options{})
	if err := e.SetPeers("us-east", []string{"eu-west", "ap-south"}); err != nil {
		t.Fatal(err)
	}
	e.Heard(now.Add(-300*time.Millisecond), "eu-west")
	s := New(e, Options{Region: "us-east", Now: func() time.Time { return now }})
	rs := s.regionStatus(cfg, AdminOptions{})
	got := map[string]string{}
	for _, p := range rs.GetPeers() {
		got[p.GetRegion()] = "never"
		if p.GetLag() != nil {
			got[p.GetRegion()] = p.GetLag().AsDuration().String()
		}
	}
	if got["eu-west"] != "300ms" || got["ap-south"] != "never" || len(got) != 2 {
		t.Fatalf("peer sync lag: %v, want eu-west 300ms and ap-south never heard", got)
	}
}
