package client

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
)

// InterceptorOptions configure UnaryServerInterceptor and
// StreamServerInterceptor. Descriptors is required; every other field has
// a default.
type InterceptorOptions struct {
	// Domain is the limits' domain.
	Domain string
	// Descriptors returns a call's descriptors and how many hits it costs,
	// from its context (metadata.FromIncomingContext, peer.FromContext),
	// its full method ("/pkg.Service/Method") and, for unary calls, its
	// request; req is nil for streams, which are checked once, when they
	// open. No descriptors (nil or empty) means no limit applies: the call
	// runs unchecked. An error ends the call with it if it is a gRPC
	// status, else with InvalidArgument, and nothing is charged.
	Descriptors func(ctx context.Context, fullMethod string, req any) ([]allot.Descriptor, int64, error)
	// OnReject returns the error a rejected call ends with. The header
	// metadata (x-ratelimit-*, retry-after) is already set. nil:
	// RejectionStatus(d).Err().
	OnReject func(ctx context.Context, fullMethod string, d Decision) error
	// OnError sees every decision with Err set and returns the decision to
	// follow, as MiddlewareOptions.OnError. nil: follow d as it is. A
	// rejection whose Err is ErrBadRequest or ErrClosed ends the call with
	// InvalidArgument or Unavailable instead of OnReject's error.
	OnError func(ctx context.Context, fullMethod string, d Decision) Decision
	// Logger logs decisions with Err set (Warn) and failures to set header
	// metadata (Debug). nil: discard.
	Logger *slog.Logger
}

// UnaryServerInterceptor returns a gRPC interceptor that asks l about
// every unary call before its handler runs. Both allowed and rejected
// calls get header metadata with the headers of SetRateLimitHeaders in
// lower case (ratelimit-policy, ratelimit, x-ratelimit-limit,
// x-ratelimit-remaining, x-ratelimit-reset, and retry-after when
// rejected); a rejected call ends with opts.OnReject's error, by default
// ResourceExhausted with RetryInfo and QuotaFailure details
// (RejectionStatus). It panics if l or opts.Descriptors is nil. The
// interceptor is safe for concurrent use if l and the hooks are.
func UnaryServerInterceptor(l Limiter, opts InterceptorOptions) grpc.UnaryServerInterceptor {
	ic := newInterceptor(l, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := ic.decide(ctx, info.FullMethod, req)
		if md != nil {
			if serr := grpc.SetHeader(ctx, md); serr != nil {
				ic.log.LogAttrs(ctx, slog.LevelDebug, "rate limit header metadata not set",
					slog.String("method", info.FullMethod), slog.Any("err", serr))
			}
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: a stream
// is checked once, when it opens, and a rejected stream ends before its
// handler runs.
func StreamServerInterceptor(l Limiter, opts InterceptorOptions) grpc.StreamServerInterceptor {
	ic := newInterceptor(l, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		md, err := ic.decide(ctx, info.FullMethod, nil)
		if md != nil {
			if serr := ss.SetHeader(md); serr != nil {
				ic.log.LogAttrs(ctx, slog.LevelDebug, "rate limit header metadata not set",
					slog.String("method", info.FullMethod), slog.Any("err", serr))
			}
		}
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

type limitInterceptor struct {
	l        Limiter
	opts     InterceptorOptions
	log      *slog.Logger
	onReject func(ctx context.Context, fullMethod string, d Decision) error
}

func newInterceptor(l Limiter, opts InterceptorOptions) *limitInterceptor {
	if l == nil {
		panic("client: interceptor with a nil Limiter")
	}
	if opts.Descriptors == nil {
		panic("client: InterceptorOptions.Descriptors is nil")
	}
	ic := &limitInterceptor{l: l, opts: opts, log: opts.Logger, onReject: opts.OnReject}
	if ic.log == nil {
		ic.log = slog.New(slog.DiscardHandler)
	}
	if ic.onReject == nil {
		ic.onReject = func(_ context.Context, _ string, d Decision) error { return RejectionStatus(d).Err() }
	}
	return ic
}

// decide asks the limiter about a call. It returns the header metadata to
// set (nil: none) and the error to end the call with (nil: run it).
func (ic *limitInterceptor) decide(ctx context.Context, method string, req any) (metadata.MD, error) {
	descs, hits, err := ic.opts.Descriptors(ctx, method, req)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.InvalidArgument, "rate limit descriptors: %v", err)
	}
	if len(descs) == 0 {
		return nil, nil
	}
	d := ic.l.Allow(ctx, ic.opts.Domain, descs, hits)
	if d.Err != nil {
		ic.log.LogAttrs(ctx, slog.LevelWarn, "rate limit decision with error",
			slog.String("domain", ic.opts.Domain), slog.String("limit", d.Limit), slog.String("method", method),
			slog.String("source", d.Source.String()), slog.Bool("allowed", d.Allowed), slog.Any("err", d.Err))
		if ic.opts.OnError != nil {
			d = ic.opts.OnError(ctx, method, d)
		}
	}
	if _, code, ok := refusal(d); ok {
		return nil, status.Error(code, "rate limit: "+d.Err.Error())
	}
	var md metadata.MD
	if fs := rateLimitFields(d); len(fs) > 0 {
		md = metadata.MD{}
		for _, f := range fs {
			md.Set(f.key, f.value) // Set lowercases the key
		}
	}
	if !d.Allowed {
		return md, ic.onReject(ctx, method, d)
	}
	return md, nil
}

// RejectionStatus is the status a rejected call ends with by default:
// ResourceExhausted, with details
//
//   - errdetails.RetryInfo: RetryDelay is d.RetryAfter, or 1s if that is
//     not positive (gRPC clients get the exact wait; the retry-after
//     metadata rounds it up to whole seconds);
//   - errdetails.QuotaFailure: one violation whose Subject and QuotaId
//     are the limit's name and QuotaValue its amount per window.
func RejectionStatus(d Decision) *status.Status {
	msg := "rate limit exceeded"
	desc := msg
	if d.Limit != "" {
		msg += ": " + d.Limit
		desc = fmt.Sprintf("limit %q exceeded", d.Limit)
		if d.Amount > 0 && d.Window > 0 {
			desc = fmt.Sprintf("limit %q of %d per %v exceeded", d.Limit, d.Amount, d.Window)
		}
	}
	delay := d.RetryAfter
	if delay <= 0 {
		delay = time.Second
	}
	st := status.New(codes.ResourceExhausted, msg)
	withDetails, err := st.WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     d.Limit,
			Description: desc,
			QuotaId:     d.Limit,
			QuotaValue:  d.Amount,
		}}},
	)
	if err != nil { // only if the details do not marshal
		return st
	}
	return withDetails
}
