package client

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/allot-dev/allot"
)

// MiddlewareOptions configure Middleware. Descriptors is required; every
// other field has a default.
type MiddlewareOptions struct {
	// Domain is the limits' domain ("api" in deploy/examples/limits.yaml).
	Domain string
	// Descriptors returns a request's descriptors and how many hits it
	// costs. No descriptors (nil or empty) means no limit applies: the
	// request passes unchecked. An error is answered 400 with the error's
	// text, and nothing is charged.
	Descriptors func(r *http.Request) ([]allot.Descriptor, int64, error)
	// OnReject writes the answer to a rejected request. The middleware
	// has already set the rate limit headers (SetRateLimitHeaders) on w;
	// the hook writes the status and body and may change the headers.
	// nil: WriteRejection (429, JSON body).
	OnReject func(w http.ResponseWriter, r *http.Request, d Decision)
	// OnError sees every decision with Err set (a malformed request, or
	// no enforcer answered and the limit's on_failure policy decided) and
	// returns the decision to follow, e.g. with Allowed changed. nil:
	// follow d as it is, since the SDK has already applied on_failure.
	// A rejection whose Err is ErrBadRequest or ErrClosed is no limit's
	// answer and gets 400 or 503 instead of OnReject (see refusal).
	OnError func(r *http.Request, d Decision) Decision
	// Logger logs decisions with Err set (Warn) and descriptor errors
	// (Debug). nil: discard.
	Logger *slog.Logger
}

// Middleware returns net/http middleware that asks l about every request
// before next sees it. A request l allows passes to next with the rate
// limit headers of the limit that constrains it most (SetRateLimitHeaders);
// a rejected request gets the same headers and opts.OnReject's answer,
// by default 429 with Retry-After, RateLimit-Policy, RateLimit and
// X-RateLimit-Limit/Remaining/Reset, as the regional enforcer's own HTTP
// API answers. A rejection the SDK made before any limit saw the request
// (Err is ErrBadRequest or ErrClosed) gets 400 or 503 and a JSON error
// instead. It panics if l or opts.Descriptors is nil. The returned
// handlers are safe for concurrent use if l and the hooks are.
func Middleware(l Limiter, opts MiddlewareOptions) func(http.Handler) http.Handler {
	if l == nil {
		panic("client: Middleware with a nil Limiter")
	}
	if opts.Descriptors == nil {
		panic("client: MiddlewareOptions.Descriptors is nil")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	onReject := opts.OnReject
	if onReject == nil {
		onReject = WriteRejection
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			descs, hits, err := opts.Descriptors(r)
			if err != nil {
				log.LogAttrs(r.Context(), slog.LevelDebug, "rate limit descriptors refused",
					slog.String("domain", opts.Domain), slog.String("path", r.URL.Path), slog.Any("err", err))
				writeJSONResponse(w, http.StatusBadRequest, map[string]any{"error": "rate limit descriptors: " + err.Error()})
				return
			}
			if len(descs) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			d := l.Allow(r.Context(), opts.Domain, descs, hits)
			if d.Err != nil {
				log.LogAttrs(r.Context(), slog.LevelWarn, "rate limit decision with error",
					slog.String("domain", opts.Domain), slog.String("limit", d.Limit),
					slog.String("source", d.Source.String()), slog.Bool("allowed", d.Allowed), slog.Any("err", d.Err))
				if opts.OnError != nil {
					d = opts.OnError(r, d)
				}
			}
			if code, _, ok := refusal(d); ok {
				writeJSONResponse(w, code, map[string]any{"error": "rate limit: " + d.Err.Error()})
				return
			}
			SetRateLimitHeaders(w.Header(), d)
			if !d.Allowed {
				onReject(w, r, d)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// refusals are the rejections that are no limit's answer: the SDK refused
// the request before any limit saw it, so a 429 and its Retry-After would
// tell the caller to retry what cannot pass. First match wins.
var refusals = []struct {
	err  error
	http int
	grpc codes.Code
}{
	{ErrBadRequest, http.StatusBadRequest, codes.InvalidArgument}, // malformed; nothing charged
	{ErrClosed, http.StatusServiceUnavailable, codes.Unavailable}, // the gateway is shutting down
}

// refusal returns the HTTP status and gRPC code of a rejection d that is
// in refusals, and false for every other decision.
func refusal(d Decision) (int, codes.Code, bool) {
	if d.Allowed || d.Err == nil {
		return 0, codes.OK, false
	}
	for _, r := range refusals {
		if errors.Is(d.Err, r.err) {
			return r.http, r.grpc, true
		}
	}
	return 0, codes.OK, false
}

// WriteRejection is Middleware's default OnReject: 429 Too Many Requests
// with a JSON body naming the limit and the wait in seconds,
//
//	{"error":"rate limit exceeded","limit":"per-user","retry_after":1}
//
// It sets the rate limit headers itself (SetRateLimitHeaders), so a custom
// hook may delegate to it.
func WriteRejection(w http.ResponseWriter, _ *http.Request, d Decision) {
	SetRateLimitHeaders(w.Header(), d)
	body := map[string]any{"error": "rate limit exceeded", "retry_after": retryAfterSeconds(d.RetryAfter)}
	if d.Limit != "" {
		body["limit"] = d.Limit
	}
	writeJSONResponse(w, http.StatusTooManyRequests, body)
}

func writeJSONResponse(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// SetRateLimitHeaders sets on h the headers regional/server's HTTP API
// sets, from the one limit d describes, with the same numbers: what the
// enforcing region admits for the key (d.Quota), not the limit over all
// regions (d.Amount). For a per-user limit of 30/s with a burst of 15, of
// which us-east holds a third:
//
//	RateLimit-Policy: "per-user";q=5;w=1;pk=:dXMtZWFzdA==:   (quota; refill in seconds, at least 1; partition)
//	RateLimit: "per-user";r=4;t=1;pk=:dXMtZWFzdA==:          (remaining; reset in seconds, rounded up)
//	X-RateLimit-Limit: 5                                     (quota)
//	X-RateLimit-Remaining: 4
//	X-RateLimit-Reset: 1
//	Retry-After: 1                                           (when rejected: seconds, rounded up, at least 1)
//
// q is d.Quota, w d.QuotaWindow, pk d.Partition in base64 (the IETF
// draft's byte sequence; left out when the quota is the whole limit's,
// a shared-mode limit in sync with its peers). A Decision without a quota
// (made by hand, or before these fields) falls back to Amount per Window
// with no pk. Remaining is shown between 0 and the quota, so that a
// remaining of N is never more than a full budget admits. The first five
// only when d names a limit with a positive amount (the enforcer, too,
// leaves out limits whose amount is 0). Headers it does not set are left
// as they are.
func SetRateLimitHeaders(h http.Header, d Decision) {
	for _, f := range rateLimitFields(d) {
		h.Set(f.key, f.value)
	}
}

// headerField is one rate limit header; its key is in HTTP's canonical case
// (gRPC metadata lowercases it).
type headerField struct{ key, value string }

// rateLimitFields are the rate limit headers of d, for HTTP headers and
// gRPC metadata alike.
func rateLimitFields(d Decision) []headerField {
	var fs []headerField
	if d.Limit != "" && d.Amount > 0 {
		q, w, pk := d.Quota, d.QuotaWindow, ""
		if q <= 0 {
			q, w = d.Amount, d.Window
		} else if d.Partition != "" {
			pk = ";pk=:" + base64.StdEncoding.EncodeToString([]byte(d.Partition)) + ":"
		}
		// A gateway's view of what is left may run below zero between
		// syncs; the draft's r is non-negative.
		rem := min(max(d.Remaining, 0), q)
		reset := strconv.FormatInt(ceilSeconds(d.ResetAfter), 10)
		fs = append(fs,
			headerField{"RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d%s", d.Limit, q, max(ceilSeconds(w), 1), pk)},
			headerField{"RateLimit", fmt.Sprintf("%q;r=%d;t=%s%s", d.Limit, rem, reset, pk)},
			headerField{"X-RateLimit-Limit", strconv.FormatInt(q, 10)},
			headerField{"X-RateLimit-Remaining", strconv.FormatInt(rem, 10)},
			headerField{"X-RateLimit-Reset", reset},
		)
	}
	if !d.Allowed {
		fs = append(fs, headerField{"Retry-After", strconv.FormatInt(retryAfterSeconds(d.RetryAfter), 10)})
	}
	return fs
}

// ceilSeconds rounds d up to whole seconds, as regional/server does.
func ceilSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// retryAfterSeconds is Retry-After's value: d in whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }
