package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// fakeLimiter answers every Allow with decision and records the calls.
// It tests the middleware and interceptors, not the SDK.
type fakeLimiter struct {
	decision Decision

	mu    sync.Mutex
	calls []allowCall
}

type allowCall struct {
	domain string
	descs  []allot.Descriptor
	hits   int64
}

func (f *fakeLimiter) Allow(_ context.Context, domain string, descs []allot.Descriptor, hits int64) Decision {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, allowCall{domain, descs, hits})
	return f.decision
}

func (f *fakeLimiter) Calls() []allowCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]allowCall(nil), f.calls...)
}

var _ Limiter = (*fakeLimiter)(nil)

// lockedBuffer is a bytes.Buffer a server goroutine logs to while a test
// reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var userDescriptors = func(r *http.Request) ([]allot.Descriptor, int64, error) {
	u := r.Header.Get("X-User")
	if u == "" {
		return nil, 0, nil
	}
	if u == "bad" {
		return nil, 0, errors.New("user \"bad\" is not a user")
	}
	return []allot.Descriptor{{{Key: "user", Value: u}}}, 1, nil
}

// rateLimitHeaders are the headers the middleware sets or must leave
// unset.
var rateLimitHeaders = []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"}

// serve runs h behind an httptest server and sends it one GET with the
// given X-User.
func serve(t *testing.T, h http.Handler, user string) (*http.Response, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	req, err := http.NewRequest("GET", srv.URL+"/v1/things", nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.Header.Set("X-User", user)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// okHandler answers 200 "ok" and counts its calls.
type okHandler struct {
	mu sync.Mutex
	n  int
}

func (h *okHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	h.n++
	h.mu.Unlock()
	io.WriteString(w, "ok")
}

func (h *okHandler) Calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func checkHeaders(t *testing.T, h http.Header, want map[string]string) {
	t.Helper()
	for _, k := range rateLimitHeaders {
		w, ok := want[k]
		got, present := h.Get(k), len(h.Values(k)) > 0
		switch {
		case !ok && present:
			t.Errorf("%s: %q, want none", k, got)
		case ok && got != w:
			t.Errorf("%s: %q, want %q", k, got, w)
		}
	}
}

func TestMiddlewareDecisions(t *testing.T) {
	perUser := func(allowed bool, remaining int64, reset, retry time.Duration) Decision {
		return Decision{Allowed: allowed, Limit: "per-user", Amount: 30, Window: time.Second,
			Remaining: remaining, ResetAfter: reset, RetryAfter: retry, Source: SourceLease}
	}
	tests := []struct {
		name     string
		d        Decision
		wantCode int
		want     map[string]string // rate limit headers; absent: must be unset
		wantBody string            // substring
	}{
		{"allowed", perUser(true, 14, 400*time.Millisecond, 0), 200, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=14;t=1`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "14", "X-RateLimit-Reset": "1",
		}, "ok"},
		{"allowed full, reset 0", perUser(true, 30, 0, 0), 200, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=30;t=0`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "30", "X-RateLimit-Reset": "0",
		}, "ok"},
		{"allowed, no limit matched", Decision{Allowed: true, Source: SourceLease}, 200, nil, "ok"},
		{"rejected, retry 100ms rounds up to 1", perUser(false, 0, 500*time.Millisecond, 100*time.Millisecond), 429, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=0;t=1`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1",
			"Retry-After": "1",
		}, `"limit":"per-user"`},
		{"rejected, retry exactly 1s", perUser(false, 0, time.Second, time.Second), 429, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=0;t=1`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1",
			"Retry-After": "1",
		}, `"retry_after":1`},
		{"rejected, retry 1001ms rounds up to 2", perUser(false, 0, 1500*time.Millisecond, 1001*time.Millisecond), 429, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=0;t=2`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2",
			"Retry-After": "2",
		}, `"retry_after":2`},
		{"rejected, retry 0 is at least 1", perUser(false, 0, 0, 0), 429, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=0;t=0`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "0",
			"Retry-After": "1",
		}, "rate limit exceeded"},
		{"rejected, minute window", Decision{Limit: "per-tenant", Amount: 1000, Window: time.Minute,
			Remaining: 0, ResetAfter: 59500 * time.Millisecond, RetryAfter: 2500 * time.Millisecond}, 429, map[string]string{
			"RateLimit-Policy": `"per-tenant";q=1000;w=60`, "RateLimit": `"per-tenant";r=0;t=60`,
			"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60",
			"Retry-After": "3",
		}, `"limit":"per-tenant"`},
		{"sub-second window is w=1", Decision{Allowed: true, Limit: "burst", Amount: 5, Window: 500 * time.Millisecond,
			Remaining: 3, ResetAfter: 200 * time.Millisecond}, 200, map[string]string{
			"RateLimit-Policy": `"burst";q=5;w=1`, "RateLimit": `"burst";r=3;t=1`,
			"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "1",
		}, "ok"},
		{"unknown window is w=1", Decision{Allowed: true, Limit: "burst", Amount: 5, Remaining: 5}, 200, map[string]string{
			"RateLimit-Policy": `"burst";q=5;w=1`, "RateLimit": `"burst";r=5;t=0`,
			"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "0",
		}, "ok"},
		{"negative remaining shows 0", perUser(true, -2, time.Second, 0), 200, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=0;t=1`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1",
		}, "ok"},
		{"rejected, amount 0: Retry-After only", Decision{Limit: "blocked", RetryAfter: 3 * time.Second}, 429,
			map[string]string{"Retry-After": "3"}, `"limit":"blocked"`},
		{"rejected, no limit named", Decision{Source: SourceFallback, Err: fmt.Errorf("%w: dial refused", ErrUnavailable)}, 429,
			map[string]string{"Retry-After": "1"}, "rate limit exceeded"},
		{"malformed: 400, no rate limit headers", Decision{Err: fmt.Errorf("%w: descriptor 0 is empty", ErrBadRequest)}, 400,
			nil, `{"error":"rate limit: client: bad request: descriptor 0 is empty"}`},
		{"client closed: 503", Decision{Err: ErrClosed}, 503, nil, `{"error":"rate limit: client: closed"}`},
		{"error, on_failure open: follows Allowed", Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second,
			Remaining: 7, ResetAfter: time.Second, Source: SourceFallback, Err: errors.New("no enforcer answered")}, 200, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=7;t=1`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1",
		}, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLimiter{decision: tt.d}
			next := &okHandler{}
			h := Middleware(l, MiddlewareOptions{Domain: "api", Descriptors: userDescriptors})(next)
			resp, body := serve(t, h, "42")
			if resp.StatusCode != tt.wantCode {
				t.Fatalf("status %d, want %d; body %q", resp.StatusCode, tt.wantCode, body)
			}
			checkHeaders(t, resp.Header, tt.want)
			if !strings.Contains(body, tt.wantBody) {
				t.Errorf("body %q, want it to contain %q", body, tt.wantBody)
			}
			wantNext := 0
			if tt.d.Allowed {
				wantNext = 1
			} else if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			} else {
				var v map[string]any
				if err := json.Unmarshal([]byte(body), &v); err != nil {
					t.Errorf("body %q: %v", body, err)
				}
			}
			if n := next.Calls(); n != wantNext {
				t.Errorf("next handler ran %d times, want %d", n, wantNext)
			}
			want := []allowCall{{"api", []allot.Descriptor{{{Key: "user", Value: "42"}}}, 1}}
			if got := l.Calls(); !reflect.DeepEqual(got, want) {
				t.Errorf("Allow calls %+v, want %+v", got, want)
			}
		})
	}
}

func TestMiddlewareCustomReject(t *testing.T) {
	l := &fakeLimiter{decision: Decision{Limit: "per-user", Amount: 30, Window: time.Second, RetryAfter: 1500 * time.Millisecond}}
	var hookCalls []Decision
	var mu sync.Mutex
	h := Middleware(l, MiddlewareOptions{
		Domain:      "api",
		Descriptors: userDescriptors,
		OnReject: func(w http.ResponseWriter, r *http.Request, d Decision) {
			mu.Lock()
			hookCalls = append(hookCalls, d)
			mu.Unlock()
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "slow down, "+r.Header.Get("X-User"))
		},
	})(&okHandler{})
	resp, body := serve(t, h, "42")
	if resp.StatusCode != http.StatusServiceUnavailable || body != "slow down, 42" {
		t.Fatalf("got %d %q, want the hook's 503 \"slow down, 42\"", resp.StatusCode, body)
	}
	// The headers are set before the hook runs.
	checkHeaders(t, resp.Header, map[string]string{
		"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=0;t=0`,
		"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "0",
		"Retry-After": "2",
	})
	mu.Lock()
	defer mu.Unlock()
	if len(hookCalls) != 1 || hookCalls[0].Limit != "per-user" {
		t.Errorf("hook calls %+v, want one for per-user", hookCalls)
	}
}

func TestMiddlewareDescriptorError(t *testing.T) {
	l := &fakeLimiter{decision: Decision{Allowed: true}}
	next := &okHandler{}
	h := Middleware(l, MiddlewareOptions{Domain: "api", Descriptors: userDescriptors})(next)
	resp, body := serve(t, h, "bad")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400; body %q", resp.StatusCode, body)
	}
	var v struct{ Error string }
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if want := `rate limit descriptors: user "bad" is not a user`; v.Error != want {
		t.Errorf("error %q, want %q", v.Error, want)
	}
	checkHeaders(t, resp.Header, nil)
	if n := len(l.Calls()); n != 0 {
		t.Errorf("Allow called %d times, want 0: nothing is charged", n)
	}
	if n := next.Calls(); n != 0 {
		t.Errorf("next handler ran %d times, want 0", n)
	}
}

func TestMiddlewareNoDescriptorsSkip(t *testing.T) {
	for _, tt := range []struct {
		name  string
		descs []allot.Descriptor
	}{{"nil", nil}, {"empty", []allot.Descriptor{}}} {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLimiter{decision: Decision{Limit: "per-user", Amount: 1, RetryAfter: time.Second}}
			next := &okHandler{}
			h := Middleware(l, MiddlewareOptions{Domain: "api",
				Descriptors: func(*http.Request) ([]allot.Descriptor, int64, error) { return tt.descs, 1, nil }})(next)
			resp, body := serve(t, h, "42")
			if resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("got %d %q, want 200 ok", resp.StatusCode, body)
			}
			checkHeaders(t, resp.Header, nil)
			if n := len(l.Calls()); n != 0 {
				t.Errorf("Allow called %d times, want 0", n)
			}
			if n := next.Calls(); n != 1 {
				t.Errorf("next handler ran %d times, want 1", n)
			}
		})
	}
}

func TestMiddlewareOnError(t *testing.T) {
	errDown := errors.New("no enforcer answered")
	open := Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second, Remaining: 29,
		Source: SourceFallback, Err: errDown}
	tests := []struct {
		name     string
		d        Decision
		onError  func(*http.Request, Decision) Decision
		wantCode int
		wantLog  bool
	}{
		{"default follows Allowed and logs", open, nil, 200, true},
		{"hook fails closed", open, func(_ *http.Request, d Decision) Decision {
			d.Allowed, d.RetryAfter = false, 5*time.Second
			return d
		}, 429, true},
		{"hook not called without Err", Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second},
			func(*http.Request, Decision) Decision { panic("OnError called for a decision without Err") }, 200, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs lockedBuffer
			h := Middleware(&fakeLimiter{decision: tt.d}, MiddlewareOptions{
				Domain:      "api",
				Descriptors: userDescriptors,
				OnError:     tt.onError,
				Logger:      slog.New(slog.NewTextHandler(&logs, nil)),
			})(&okHandler{})
			resp, body := serve(t, h, "42")
			if resp.StatusCode != tt.wantCode {
				t.Fatalf("status %d, want %d; body %q", resp.StatusCode, tt.wantCode, body)
			}
			if tt.wantCode == 429 && resp.Header.Get("Retry-After") != "5" {
				t.Errorf("Retry-After %q, want the hook's 5", resp.Header.Get("Retry-After"))
			}
			got := logs.String()
			if tt.wantLog {
				for _, s := range []string{"level=WARN", "domain=api", "limit=per-user", "source=fallback", `err="no enforcer answered"`} {
					if !strings.Contains(got, s) {
						t.Errorf("log %q, want it to contain %q", got, s)
					}
				}
			} else if got != "" {
				t.Errorf("log %q, want none", got)
			}
		})
	}
}

func TestMiddlewarePanicsWithoutDescriptors(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Middleware with nil Descriptors did not panic")
		}
	}()
	Middleware(&fakeLimiter{}, MiddlewareOptions{Domain: "api"})
}

// TestSetRateLimitHeadersLeavesOthers: SetRateLimitHeaders only sets, so a
// handler's headers survive.
func TestSetRateLimitHeadersLeavesOthers(t *testing.T) {
	h := http.Header{"Cache-Control": {"no-store"}, "Retry-After": {"9"}}
	SetRateLimitHeaders(h, Decision{Allowed: true})
	if h.Get("Cache-Control") != "no-store" || h.Get("Retry-After") != "9" {
		t.Errorf("headers %v, want them unchanged", h)
	}
}
