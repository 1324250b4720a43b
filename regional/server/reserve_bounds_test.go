package server

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// The reservations in flight of one caller, and of one key, are capped:
// past the cap Reserve is RESOURCE_EXHAUSTED (503 over HTTP) and charges
// nothing; other callers and keys are not affected.
func TestGRPCReserveCapsPerCaller(t *testing.T) {
	cfg, err := allot.ParseConfig("test.yaml", []byte(reserveTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: t0}
	s := New(regional.New(cfg, regional.Options{}), Options{Region: "test", Now: c.now,
		Reservations: regional.ReservationOptions{TTL: time.Minute, MaxPerCaller: 2, MaxPerKey: 1}})
	const gw1, gw2 = "spiffe://allot/gateway/gw1", "spiffe://allot/gateway/gw2"
	cls := tlsReserve(t, s, gw1, gw2)
	ctx := context.Background()
	req := func(who string) *allotv1.ReserveRequest {
		return &allotv1.ReserveRequest{Domain: "llm", Descriptors: []*allotv1.Descriptor{desc("tenant", who)}, PromptTokens: 10, MaxTokens: 10}
	}
	for _, who := range []string{"a", "b"} {
		if r, err := cls[gw1].Reserve(ctx, req(who)); err != nil || !r.Allowed {
			t.Fatalf("reserve %s: %v %v", who, r, err)
		}
	}
	if _, err := cls[gw1].Reserve(ctx, req("c")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third of gw1: %v, want ResourceExhausted", err)
	}
	if _, err := cls[gw2].Reserve(ctx, req("a")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second on key a: %v, want ResourceExhausted", err)
	}
	if r, err := cls[gw2].Reserve(ctx, req("c")); err != nil || !r.Allowed {
		t.Fatalf("gw2 on key c: %v %v", r, err)
	}
	// Plain text over HTTP is the anonymous caller, with its own count.
	h := s.HTTPHandler(HTTPOptions{})
	body := `{"domain":"llm","descriptors":[{"tenant":"d"}],"max_tokens":10}`
	if w := postTo(t, h, "/v1/reserve", body); w.Code != http.StatusOK {
		t.Fatalf("anonymous reserve: %d %s", w.Code, w.Body)
	}
	if w := postTo(t, h, "/v1/reserve", body); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("second anonymous on key d: %d %s, want 503", w.Code, w.Body)
	}
	if st := s.Reservations().Stats(); st.Active != 4 || st.ReservedTokens != 3*15+5 {
		t.Fatalf("stats: %+v", st)
	}
}
