package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot"
)

// countingHealth is a health service that counts the calls its handlers
// see: Check answers SERVING, Watch sends SERVING once and ends.
type countingHealth struct {
	healthpb.UnimplementedHealthServer

	mu            sync.Mutex
	checks, watch int
}

func (h *countingHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.mu.Lock()
	h.checks++
	h.mu.Unlock()
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *countingHealth) Watch(_ *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	h.mu.Lock()
	h.watch++
	h.mu.Unlock()
	return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

func (h *countingHealth) Calls() (checks, watch int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.checks, h.watch
}

// serviceDescriptors limits the service named in the request (unary) or
// the caller's x-user metadata (streams): "bad" is refused, "" skips.
func serviceDescriptors(ctx context.Context, method string, req any) ([]allot.Descriptor, int64, error) {
	var who string
	if r, ok := req.(*healthpb.HealthCheckRequest); ok {
		who = r.GetService()
	} else if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("x-user")) > 0 {
		who = md.Get("x-user")[0]
	}
	switch who {
	case "":
		return nil, 0, nil
	case "bad":
		return nil, 0, errors.New("no such user")
	case "unauthenticated":
		return nil, 0, status.Error(codes.Unauthenticated, "who are you")
	}
	return []allot.Descriptor{{{Key: "method", Value: method}, {Key: "user", Value: who}}}, 1, nil
}

// startGRPC serves a countingHealth behind the interceptors on a loopback
// port and returns a client connection to it.
func startGRPC(t *testing.T, l Limiter, opts InterceptorOptions) (healthpb.HealthClient, *countingHealth) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(
		grpc.UnaryInterceptor(UnaryServerInterceptor(l, opts)),
		grpc.StreamInterceptor(StreamServerInterceptor(l, opts)),
	)
	h := &countingHealth{}
	healthpb.RegisterHealthServer(gs, h)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn), h
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkMD compares the rate limit header metadata with want (keys absent
// from want must be absent).
func checkMD(t *testing.T, md metadata.MD, want map[string]string) {
	t.Helper()
	for _, k := range []string{"ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after"} {
		got := md.Get(k)
		w, ok := want[k]
		switch {
		case !ok && len(got) > 0:
			t.Errorf("%s: %q, want none", k, got)
		case ok && (len(got) != 1 || got[0] != w):
			t.Errorf("%s: %q, want %q", k, got, w)
		}
	}
}

// details returns a status's RetryInfo and QuotaFailure details.
func details(t *testing.T, st *status.Status) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	t.Helper()
	var ri *errdetails.RetryInfo
	var qf *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.QuotaFailure:
			qf = d
		case error:
			t.Errorf("detail does not unmarshal: %v", d)
		}
	}
	if ri == nil || qf == nil {
		t.Fatalf("details %v, want RetryInfo and QuotaFailure", st.Details())
	}
	return ri, qf
}

var perUserRejected = Decision{Limit: "per-user", Amount: 30, Window: time.Second, Remaining: 0,
	ResetAfter: 700 * time.Millisecond, RetryAfter: 1200 * time.Millisecond, Source: SourceEnforcer}

var perUserRejectedMD = map[string]string{
	"ratelimit-policy": `"per-user";q=30;w=1`, "ratelimit": `"per-user";r=0;t=1`,
	"x-ratelimit-limit": "30", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1",
	"retry-after": "2",
}

func TestUnaryInterceptor(t *testing.T) {
	tests := []struct {
		name      string
		service   string // the request's service: the user serviceDescriptors limits
		d         Decision
		wantCode  codes.Code
		wantMD    map[string]string
		wantAllow int // Allow calls
	}{
		{"allowed", "42", Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second,
			Remaining: 12, ResetAfter: 1100 * time.Millisecond, Source: SourceLease}, codes.OK, map[string]string{
			"ratelimit-policy": `"per-user";q=30;w=1`, "ratelimit": `"per-user";r=12;t=2`,
			"x-ratelimit-limit": "30", "x-ratelimit-remaining": "12", "x-ratelimit-reset": "2",
		}, 1},
		{"allowed, no limit matched", "42", Decision{Allowed: true}, codes.OK, nil, 1},
		{"rejected", "42", perUserRejected, codes.ResourceExhausted, perUserRejectedMD, 1},
		{"no descriptors skip", "", perUserRejected, codes.OK, nil, 0},
		{"descriptor error", "bad", perUserRejected, codes.InvalidArgument, nil, 0},
		{"malformed for the SDK", "42", Decision{Err: fmt.Errorf("%w: descriptor 0 is empty", ErrBadRequest)}, codes.InvalidArgument, nil, 1},
		{"client closed", "42", Decision{Err: ErrClosed}, codes.Unavailable, nil, 1},
		{"descriptor status error kept", "unauthenticated", perUserRejected, codes.Unauthenticated, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLimiter{decision: tt.d}
			cli, h := startGRPC(t, l, InterceptorOptions{Domain: "api", Descriptors: serviceDescriptors})
			var md metadata.MD
			_, err := cli.Check(testContext(t), &healthpb.HealthCheckRequest{Service: tt.service}, grpc.Header(&md))
			st, _ := status.FromError(err)
			if st.Code() != tt.wantCode {
				t.Fatalf("code %v (%v), want %v", st.Code(), err, tt.wantCode)
			}
			checkMD(t, md, tt.wantMD)
			calls := l.Calls()
			if len(calls) != tt.wantAllow {
				t.Fatalf("Allow called %d times, want %d", len(calls), tt.wantAllow)
			}
			if len(calls) == 1 {
				want := allowCall{"api", []allot.Descriptor{{{Key: "method", Value: "/grpc.health.v1.Health/Check"}, {Key: "user", Value: tt.service}}}, 1}
				if !reflect.DeepEqual(calls[0], want) {
					t.Errorf("Allow call %+v, want %+v", calls[0], want)
				}
			}
			wantChecks := 0
			if tt.wantCode == codes.OK {
				wantChecks = 1
			}
			if n, _ := h.Calls(); n != wantChecks {
				t.Errorf("handler ran %d times, want %d", n, wantChecks)
			}
			switch tt.wantCode {
			case codes.ResourceExhausted:
				if want := "rate limit exceeded: per-user"; st.Message() != want {
					t.Errorf("message %q, want %q", st.Message(), want)
				}
				ri, qf := details(t, st)
				if got := ri.GetRetryDelay().AsDuration(); got != 1200*time.Millisecond {
					t.Errorf("RetryInfo delay %v, want 1.2s", got)
				}
				want := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
					Subject: "per-user", QuotaId: "per-user", QuotaValue: 30,
					Description: `limit "per-user" of 30 per 1s exceeded`,
				}}}
				if !proto.Equal(qf, want) {
					t.Errorf("QuotaFailure %v, want %v", qf, want)
				}
			case codes.InvalidArgument:
				want := "rate limit descriptors: no such user"
				if tt.service != "bad" {
					want = "rate limit: client: bad request: descriptor 0 is empty"
				}
				if st.Message() != want {
					t.Errorf("message %q, want %q", st.Message(), want)
				}
			}
		})
	}
}

func TestStreamInterceptor(t *testing.T) {
	tests := []struct {
		name      string
		user      string // x-user metadata
		d         Decision
		wantCode  codes.Code
		wantMD    map[string]string
		wantAllow int
	}{
		{"allowed", "42", Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second,
			Remaining: 3, ResetAfter: 100 * time.Millisecond}, codes.OK, map[string]string{
			"ratelimit-policy": `"per-user";q=30;w=1`, "ratelimit": `"per-user";r=3;t=1`,
			"x-ratelimit-limit": "30", "x-ratelimit-remaining": "3", "x-ratelimit-reset": "1",
		}, 1},
		{"rejected before the handler runs", "42", perUserRejected, codes.ResourceExhausted, perUserRejectedMD, 1},
		{"no descriptors skip", "", perUserRejected, codes.OK, nil, 0},
		{"descriptor error", "bad", perUserRejected, codes.InvalidArgument, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLimiter{decision: tt.d}
			cli, h := startGRPC(t, l, InterceptorOptions{Domain: "api", Descriptors: serviceDescriptors})
			ctx := testContext(t)
			if tt.user != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-user", tt.user)
			}
			stream, err := cli.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var got []*healthpb.HealthCheckResponse
			for {
				resp, err2 := stream.Recv()
				if err2 != nil {
					if err2 != io.EOF {
						err = err2
					}
					break
				}
				got = append(got, resp)
			}
			st, _ := status.FromError(err)
			if st.Code() != tt.wantCode {
				t.Fatalf("code %v (%v), want %v", st.Code(), err, tt.wantCode)
			}
			md, herr := stream.Header()
			if herr != nil {
				t.Fatalf("header: %v", herr)
			}
			checkMD(t, md, tt.wantMD)
			if n := len(l.Calls()); n != tt.wantAllow {
				t.Errorf("Allow called %d times, want %d", n, tt.wantAllow)
			}
			wantWatch, wantResp := 0, 0
			if tt.wantCode == codes.OK {
				wantWatch, wantResp = 1, 1
			}
			if _, n := h.Calls(); n != wantWatch {
				t.Errorf("handler ran %d times, want %d", n, wantWatch)
			}
			if len(got) != wantResp {
				t.Errorf("%d responses, want %d", len(got), wantResp)
			}
			if tt.wantCode == codes.ResourceExhausted {
				ri, qf := details(t, st)
				if got := ri.GetRetryDelay().AsDuration(); got != 1200*time.Millisecond {
					t.Errorf("RetryInfo delay %v, want 1.2s", got)
				}
				if v := qf.GetViolations(); len(v) != 1 || v[0].GetSubject() != "per-user" || v[0].GetQuotaId() != "per-user" {
					t.Errorf("QuotaFailure %v, want one violation of per-user", qf)
				}
			}
		})
	}
}

func TestInterceptorCustomRejectAndOnError(t *testing.T) {
	errDown := errors.New("no enforcer answered")
	var mu sync.Mutex
	var rejected []string
	opts := InterceptorOptions{
		Domain:      "api",
		Descriptors: serviceDescriptors,
		// Fail closed where the SDK's on_failure let the request through.
		OnError: func(_ context.Context, _ string, d Decision) Decision {
			d.Allowed, d.RetryAfter = false, 0
			return d
		},
		OnReject: func(_ context.Context, method string, d Decision) error {
			mu.Lock()
			rejected = append(rejected, method)
			mu.Unlock()
			return status.Errorf(codes.Unavailable, "limiter down: %v", d.Err)
		},
	}
	l := &fakeLimiter{decision: Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second,
		Remaining: 30, Source: SourceFallback, Err: errDown}}
	cli, h := startGRPC(t, l, opts)
	var md metadata.MD
	_, err := cli.Check(testContext(t), &healthpb.HealthCheckRequest{Service: "42"}, grpc.Header(&md))
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != "limiter down: no enforcer answered" {
		t.Fatalf("error %v, want the hook's Unavailable", err)
	}
	checkMD(t, md, map[string]string{
		"ratelimit-policy": `"per-user";q=30;w=1`, "ratelimit": `"per-user";r=30;t=0`,
		"x-ratelimit-limit": "30", "x-ratelimit-remaining": "30", "x-ratelimit-reset": "0",
		"retry-after": "1", // RetryAfter 0 still says 1
	})
	if n, _ := h.Calls(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"/grpc.health.v1.Health/Check"}; !reflect.DeepEqual(rejected, want) {
		t.Errorf("OnReject calls %q, want %q", rejected, want)
	}
}

func TestRejectionStatusWithoutLimit(t *testing.T) {
	st := RejectionStatus(Decision{Source: SourceFallback})
	if st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded" {
		t.Fatalf("status %v", st)
	}
	ri, qf := details(t, st)
	if got := ri.GetRetryDelay().AsDuration(); got != time.Second {
		t.Errorf("RetryInfo delay %v, want 1s when RetryAfter is 0", got)
	}
	if v := qf.GetViolations(); len(v) != 1 || v[0].GetDescription() != "rate limit exceeded" {
		t.Errorf("QuotaFailure %v", qf)
	}
}

func TestInterceptorPanicsWithoutDescriptors(t *testing.T) {
	for name, f := range map[string]func(){
		"unary":  func() { UnaryServerInterceptor(&fakeLimiter{}, InterceptorOptions{}) },
		"stream": func() { StreamServerInterceptor(&fakeLimiter{}, InterceptorOptions{}) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		})
	}
}
