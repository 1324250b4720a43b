package demo

import (
	"bytes"
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/server"
)

// startRegion serves one region of the example limits, alone (no
// coordinator: it holds whole limits), on a free loopback port.
func startRegion(t *testing.T, name string) (Region, *server.Service) {
	cfg, err := allot.ParseConfig(examples.LimitsName, examples.LimitsYAML)
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(regional.New(cfg, regional.Options{}), server.Options{Region: name})
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	svc.RegisterAdmin(gs, server.AdminOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	ctx, cancel := context.WithCancel(context.Background())
	go svc.RunReservations(ctx, 0)
	t.Cleanup(func() { cancel(); gs.Stop() })
	return Region{Name: name, Addr: ln.Addr().String()}, svc
}

// cuts records Cut and Heal calls.
type cuts struct {
	mu    sync.Mutex
	calls []string
}

func (c *cuts) Cut(r string)  { c.mu.Lock(); c.calls = append(c.calls, "cut "+r); c.mu.Unlock() }
func (c *cuts) Heal(r string) { c.mu.Lock(); c.calls = append(c.calls, "heal "+r); c.mu.Unlock() }

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestRunPlaysAStory(t *testing.T) {
	east, eastSvc := startRegion(t, "us-east")
	west, _ := startRegion(t, "eu-west")
	hot := Flow{Name: "user 42", Domain: "api", Descriptor: allot.Descriptor{{Key: "user", Value: "42"}}, Watch: true,
		Rates: map[string]float64{"us-east": 200, "eu-west": 20}} // 30/s burst 15: us-east rejects
	llm := Flow{Name: "llm", Domain: "llm", Descriptor: allot.Descriptor{{Key: "tenant", Value: "acme"}},
		Rates: map[string]float64{"us-east": 40},
		LLM:   &LLM{Model: "m", PromptTokens: 100, MaxTokens: 500, OutMin: 10, OutMax: 400, Hold: 100 * time.Millisecond}}
	story := Story{Chapters: []Chapter{
		{Title: "Both", Duration: 400 * time.Millisecond, Flows: []Flow{hot, llm}},
		{Title: "West cut off", Duration: 400 * time.Millisecond, Cut: []string{"eu-west"}, Flows: []Flow{hot}},
		{Title: "Quiet", Duration: 200 * time.Millisecond},
	}}
	var out lockedBuffer
	c := &cuts{}
	series := NewSeries([]string{"us-east", "eu-west"}, story, 100*time.Millisecond, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, Options{Story: story, Regions: []Region{east, west}, Links: c, Series: series, Out: &out,
		Interval: 100 * time.Millisecond, Once: true, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run did not return at the end of the story")
	}
	if want := []string{"cut eu-west", "heal eu-west"}; !slices.Equal(c.calls, want) {
		t.Errorf("cuts %v, want %v", c.calls, want)
	}
	if st := eastSvc.Reservations().Stats(); st.Active != 0 || st.Reservations == 0 {
		t.Errorf("reservations: %d admitted, %d still active; want some, all settled", st.Reservations, st.Active)
	}

	snap := series.Snapshot()
	for _, want := range []string{"api/per-user", "api/per-user{user=42}", "llm/per-tenant-tokens"} {
		if !slices.Contains(snap.Limits, want) {
			t.Errorf("rows %v lack %s", snap.Limits, want)
		}
	}
	if len(snap.Samples) == 0 {
		t.Fatal("no sample")
	}
	var admitted, rejected, tokens float64
	var cut bool
	// us-east's figure of a row; a sample taken before the row's first
	// answer has none.
	first := func(m map[string][]float64, row string) float64 {
		if v := m[row]; len(v) > 0 {
			return v[0]
		}
		return 0
	}
	for _, s := range snap.Samples {
		admitted += first(s.Admitted, "api/per-user{user=42}")
		rejected += first(s.Rejected, "api/per-user{user=42}")
		tokens += first(s.Admitted, "llm/per-tenant-tokens")
		cut = cut || slices.Contains(s.Cut, "eu-west")
		if sh := s.Shares["api/per-user"]; len(sh) > 0 && (sh[0] == nil || *sh[0] != 1) {
			t.Errorf("t=%v: us-east's share of per-user %v, want 1 (a region alone holds whole limits)", s.T, sh)
		}
	}
	if admitted == 0 || rejected == 0 || tokens == 0 || !cut {
		t.Errorf("user 42 in us-east: %v admitted/s, %v rejected/s summed; reservations %v/s; a sample with eu-west cut: %v",
			admitted, rejected, tokens, cut)
	}
	view := out.String()
	for _, want := range []string{"Chapter 1 of 3: Both", "Chapter 2 of 3: West cut off", "eu-west CUT OFF", "Chapter 3 of 3: Quiet (the end)"} {
		if !strings.Contains(view, want) {
			t.Errorf("view lacks %q", want)
		}
	}
}

func TestRunStopsWithItsContext(t *testing.T) {
	east, svc := startRegion(t, "us-east")
	story := Story{Chapters: []Chapter{{Title: "Long", Duration: time.Hour, Flows: []Flow{{Name: "llm", Domain: "llm",
		Descriptor: allot.Descriptor{{Key: "tenant", Value: "acme"}}, Rates: map[string]float64{"us-east": 50},
		LLM: &LLM{PromptTokens: 10, MaxTokens: 100, Hold: time.Hour}}}}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Story: story, Regions: []Region{east}, Interval: 50 * time.Millisecond})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for svc.Reservations().Stats().Active == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no reservation held after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run still running 20s after its context ended")
	}
	if st := svc.Reservations().Stats(); st.Active != 0 {
		t.Errorf("%d reservations still active after Run returned; want every one settled", st.Active)
	}
}

func TestRunRefusesABadStart(t *testing.T) {
	if err := Run(context.Background(), Options{Story: threeChapters()}); err == nil {
		t.Error("no region: want an error")
	}
	bad := Story{Chapters: []Chapter{{Title: "c", Duration: time.Second, Cut: []string{"nowhere"}}}}
	if err := Run(context.Background(), Options{Story: bad, Regions: []Region{{Name: "x", Addr: "127.0.0.1:1"}}}); err == nil {
		t.Error("a story that cuts an unknown region: want an error")
	}
}
