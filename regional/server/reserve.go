package server

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/internal/wirejson"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/sketch"
)

// DefaultReservationTick is how often RunReservations settles expired
// reservations.
const DefaultReservationTick = 250 * time.Millisecond

// reserveState is the service's LLM token reservations and their metrics.
type reserveState struct {
	rs       *regional.Reservations
	estError prometheus.Histogram // settled − reserved, per settle
}

func newReserveState(s *Service, opts Options) *reserveState {
	ro := opts.Reservations
	if ro.NewSketch == nil {
		ro.NewSketch = sketch.New
	}
	rs := regional.NewReservations(s.engine, opts.Enforcer, ro)
	st := &reserveState{rs: rs}
	var buckets []float64
	for b := 8192.0; b >= 1; b /= 4 {
		buckets = append(buckets, -b)
	}
	buckets = append(buckets, 0)
	for b := 1.0; b <= 8192; b *= 4 {
		buckets = append(buckets, b)
	}
	st.estError = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "allot_regional_reservation_estimate_error_tokens",
		Help:    "Settled minus reserved tokens per settled reservation: positive when the estimate was short.",
		Buckets: buckets,
	})
	if opts.Registry == nil {
		return st
	}
	counter := func(name, help string, labels prometheus.Labels, f func(regional.ReservationStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f(rs.Stats())) })
	}
	const tokensHelp = "LLM tokens of reservations: reserved at admission, settled in the end (usage and billing), refunded by settlements, overcharged above reservations."
	const resHelp = "Reserve calls by result: admitted, rejected by a limit, rejected by a concurrency cap."
	opts.Registry.MustRegister(st.estError,
		counter("allot_regional_reservation_tokens_total", tokensHelp, prometheus.Labels{"kind": "reserved"},
			func(s regional.ReservationStats) uint64 { return s.ReservedTokens }),
		counter("allot_regional_reservation_tokens_total", tokensHelp, prometheus.Labels{"kind": "settled"},
			func(s regional.ReservationStats) uint64 { return s.SettledTokens }),
		counter("allot_regional_reservation_tokens_total", tokensHelp, prometheus.Labels{"kind": "refunded"},
			func(s regional.ReservationStats) uint64 { return s.RefundedTokens }),
		counter("allot_regional_reservation_tokens_total", tokensHelp, prometheus.Labels{"kind": "overcharged"},
			func(s regional.ReservationStats) uint64 { return s.OverchargedTokens }),
		counter("allot_regional_reservations_total", resHelp, prometheus.Labels{"result": "admitted"},
			func(s regional.ReservationStats) uint64 { return s.Reservations }),
		counter("allot_regional_reservations_total", resHelp, prometheus.Labels{"result": "rejected"},
			func(s regional.ReservationStats) uint64 { return s.Rejections - s.ConcurrencyRejections }),
		counter("allot_regional_reservations_total", resHelp, prometheus.Labels{"result": "concurrency_rejected"},
			func(s regional.ReservationStats) uint64 { return s.ConcurrencyRejections }),
		counter("allot_regional_reservations_expired_total", "Reservations not settled within their TTL: settled at their reserved amount, their concurrency slot freed.", nil,
			func(s regional.ReservationStats) uint64 { return s.Expired }),
		counter("allot_regional_reservations_late_settles_total", "Settles that corrected an expired reservation within the grace period.", nil,
			func(s regional.ReservationStats) uint64 { return s.LateSettles }),
		counter("allot_regional_reservation_store_failures_total", "Settlement charges or slot frees the regional store did not take.", nil,
			func(s regional.ReservationStats) uint64 { return s.StoreFailures }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "allot_regional_reservations_active", Help: "Reservations in flight."},
			func() float64 { return float64(rs.Stats().Active) }),
	)
	return st
}

// Reservations returns the service's LLM token reservations.
func (s *Service) Reservations() *regional.Reservations { return s.rsv.rs }

// RunReservations settles, at their reserved amount, the reservations not
// settled within their TTL, every `every` (0: DefaultReservationTick),
// until ctx ends. Reserve does it too, before deciding.
func (s *Service) RunReservations(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultReservationTick
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.rsv.rs.Tick(ctx, s.now())
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// grpcCaller names a gRPC call's caller for the ownership of its
// reservations: the URI of its certificate's allot identity; a hash of a
// verified certificate without one; "" (the anonymous caller) without a
// certificate: plain text (loopback only) or TLS without a client
// certificate.
func grpcCaller(ctx context.Context) string {
	id, secured, err := tlsx.Caller(ctx)
	if !secured {
		return ""
	}
	if err == nil {
		return id.URI
	}
	c, cerr := tlsx.PeerCertificate(ctx)
	return certCaller(c, cerr)
}

// httpCaller is grpcCaller for an HTTP request.
func httpCaller(r *http.Request) string {
	if r.TLS == nil {
		return ""
	}
	if id, err := tlsx.RequestIdentity(r); err == nil {
		return id.URI
	}
	c, err := tlsx.RequestCertificate(r)
	return certCaller(c, err)
}

// certCaller names a verified certificate without an allot identity by
// its hash; no certificate is the anonymous caller.
func certCaller(c *x509.Certificate, err error) string {
	if err != nil || c == nil {
		return ""
	}
	h := sha256.Sum256(c.Raw)
	return "cert:sha256:" + hex.EncodeToString(h[:])
}

// reserveRequest converts a ReserveRequest from the wire. A TTL above
// maxTTL is cut to maxTTL (the answer says the TTL given).
func reserveRequest(req *allotv1.ReserveRequest, maxTTL time.Duration) (regional.ReserveRequest, error) {
	out := regional.ReserveRequest{Domain: req.GetDomain(), PromptTokens: req.GetPromptTokens(),
		MaxTokens: req.GetMaxTokens(), Model: req.GetModel()}
	if req.Estimate != nil {
		if req.GetEstimate() < 1 {
			return out, fmt.Errorf("%w: estimate %d, want 1 to max_tokens (or none)", regional.ErrBadReservation, req.GetEstimate())
		}
		out.Estimate = req.GetEstimate()
	}
	if req.Ttl != nil {
		if err := req.Ttl.CheckValid(); err != nil || req.Ttl.AsDuration() <= 0 {
			return out, fmt.Errorf("%w: ttl %v, want a positive duration (or none)", regional.ErrBadReservation, req.Ttl.AsDuration())
		}
		out.TTL = min(req.Ttl.AsDuration(), maxTTL) // AsDuration saturates: no overflow
	}
	out.Descriptors = descriptors(req.GetDescriptors())
	return out, nil
}

func (s *Service) reserve(ctx context.Context, caller string, req *allotv1.ReserveRequest) (*allotv1.ReserveResponse, *allot.Decision, error) {
	r, err := reserveRequest(req, s.rsv.rs.Options().MaxTTL)
	r.Caller = caller
	var res regional.Reservation
	if err == nil {
		res, err = s.rsv.rs.Reserve(ctx, s.now(), r)
	}
	if err != nil {
		s.metrics.errors.WithLabelValues(reason(err)).Inc()
		s.log.Debug("reserve refused", "domain", r.Domain, "err", err)
		return nil, nil, err
	}
	resp := &allotv1.ReserveResponse{
		Allowed: res.Allowed, ReservationId: res.ID, ReservedTokens: res.Reserved,
		EstimatedOutputTokens: res.Estimate, EstimateLearned: res.Learned,
		RetryAfter: durationpb.New(res.RetryAfter), ConcurrencyLimit: res.ConcurrencyLimit, ConcurrencyCap: res.ConcurrencyCap,
		Limits: checkResult(&res.Decision).Limits,
	}
	if res.Allowed {
		resp.Ttl = durationpb.New(res.TTL)
	}
	return resp, &res.Decision, nil
}

func settlement(st regional.Settlement) *allotv1.Settlement {
	return &allotv1.Settlement{
		ReservationId: st.ID, State: st.State.String(), ReservedTokens: st.Reserved, SettledTokens: st.Settled,
		RefundedTokens: st.Refunded, OverchargedTokens: st.Overcharged, Late: st.Late, Repeat: st.Repeat,
		Limits: checkResult(&st.Decision).Limits,
	}
}

func (s *Service) settle(ctx context.Context, caller, id string, input, output int64) (*allotv1.Settlement, *allot.Decision, error) {
	st, err := s.rsv.rs.SettleAs(ctx, s.now(), caller, id, input, output)
	if err != nil {
		s.metrics.errors.WithLabelValues(reason(err)).Inc()
		return nil, nil, err
	}
	if !st.Repeat {
		s.rsv.estError.Observe(float64(st.Settled - st.Reserved))
	}
	return settlement(st), &st.Decision, nil
}

func (s *Service) release(ctx context.Context, caller, id string, used int64) (*allotv1.Settlement, *allot.Decision, error) {
	st, err := s.rsv.rs.ReleaseAs(ctx, s.now(), caller, id, used)
	if err != nil {
		s.metrics.errors.WithLabelValues(reason(err)).Inc()
		return nil, nil, err
	}
	return settlement(st), &st.Decision, nil
}

// Reserve implements allot.v1.RateLimiter.
func (r rateLimiter) Reserve(ctx context.Context, req *allotv1.ReserveRequest) (*allotv1.ReserveResponse, error) {
	resp, _, err := r.s.reserve(ctx, grpcCaller(ctx), req)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// Settle implements allot.v1.RateLimiter.
func (r rateLimiter) Settle(ctx context.Context, req *allotv1.SettleRequest) (*allotv1.SettleResponse, error) {
	st, _, err := r.s.settle(ctx, grpcCaller(ctx), req.GetReservationId(), req.GetInputTokens(), req.GetOutputTokens())
	if err != nil {
		return nil, grpcError(err)
	}
	return &allotv1.SettleResponse{Settlement: st}, nil
}

// Release implements allot.v1.RateLimiter.
func (r rateLimiter) Release(ctx context.Context, req *allotv1.ReleaseRequest) (*allotv1.ReleaseResponse, error) {
	st, _, err := r.s.release(ctx, grpcCaller(ctx), req.GetReservationId(), req.GetUsedTokens())
	if err != nil {
		return nil, grpcError(err)
	}
	return &allotv1.ReleaseResponse{Settlement: st}, nil
}

// reserveBody is the JSON body of POST /v1/reserve. Descriptors are
// objects, as in /v1/check.
type reserveBody struct {
	Domain       string              `json:"domain"`
	Descriptors  []map[string]string `json:"descriptors"`
	PromptTokens int64               `json:"prompt_tokens"`
	MaxTokens    int64               `json:"max_tokens"`
	Model        string              `json:"model"`
	Estimate     *int64              `json:"estimate"`
	TTLMillis    *int64              `json:"ttl_ms"`
}

// settleBody is the JSON body of POST /v1/settle and /v1/release.
type settleBody struct {
	ReservationID string `json:"reservation_id"`
	InputTokens   int64  `json:"input_tokens"`
	OutputTokens  int64  `json:"output_tokens"`
}

type releaseBody struct {
	ReservationID string `json:"reservation_id"`
	UsedTokens    int64  `json:"used_tokens"`
}

// readJSON decodes one JSON value of at most maxBody bytes, refusing
// unknown fields; it writes the error response and returns false on
// failure.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q, want application/json", ct))
			return false
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		code := http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			code = http.StatusRequestEntityTooLarge
		}
		writeError(w, code, fmt.Errorf("body: %v", err))
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, errors.New("body: more than one JSON value"))
		return false
	}
	return true
}

// writeProto writes m as the HTTP API's JSON: the proto3 JSON mapping
// with the .proto field names and every field, except that integers are
// JSON numbers (internal/wirejson).
func writeProto(w http.ResponseWriter, code int, m proto.Message) {
	out, err := wirejson.Marshal(m, wirejson.Options{EmitUnpopulated: true, Round: wirejson.Shares})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(out)
	w.Write([]byte("\n"))
}

// ttlMillis converts ttl_ms: at least 1, cut to maxTTL, compared before
// it is multiplied so that no value overflows into a short TTL.
func ttlMillis(ms int64, maxTTL time.Duration) (time.Duration, error) {
	if ms < 1 {
		return 0, fmt.Errorf("%w: ttl_ms %d, want at least 1 (or none)", regional.ErrBadReservation, ms)
	}
	if ms >= int64(maxTTL/time.Millisecond) {
		return maxTTL, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func (s *Service) httpReserve(w http.ResponseWriter, r *http.Request) {
	var body reserveBody
	if !readJSON(w, r, &body) {
		return
	}
	req := &allotv1.ReserveRequest{Domain: body.Domain, PromptTokens: body.PromptTokens, MaxTokens: body.MaxTokens,
		Model: body.Model, Estimate: body.Estimate}
	if body.TTLMillis != nil {
		ttl, err := ttlMillis(*body.TTLMillis, s.rsv.rs.Options().MaxTTL)
		if err != nil {
			writeError(w, httpStatus(err), err)
			return
		}
		req.Ttl = durationpb.New(ttl)
	}
	for _, m := range body.Descriptors {
		d := &allotv1.Descriptor{}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			d.Entries = append(d.Entries, &allotv1.Entry{Key: k, Value: m[k]})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	resp, dec, err := s.reserve(r.Context(), httpCaller(r), req)
	if err != nil {
		writeError(w, httpStatus(err), err)
		return
	}
	ps := s.policies(body.Domain, descriptors(req.GetDescriptors()), dec)
	setRateLimitHeaders(w.Header(), ps, dec)
	s.setUnitHeaders(w.Header(), body.Domain, ps, true)
	code := http.StatusOK
	if !resp.Allowed {
		code = http.StatusTooManyRequests
	}
	writeProto(w, code, resp)
}

func (s *Service) httpSettle(w http.ResponseWriter, r *http.Request) {
	var body settleBody
	if !readJSON(w, r, &body) {
		return
	}
	st, dec, err := s.settle(r.Context(), httpCaller(r), body.ReservationID, body.InputTokens, body.OutputTokens)
	s.writeSettlement(w, st, dec, err)
}

func (s *Service) httpRelease(w http.ResponseWriter, r *http.Request) {
	var body releaseBody
	if !readJSON(w, r, &body) {
		return
	}
	st, dec, err := s.release(r.Context(), httpCaller(r), body.ReservationID, body.UsedTokens)
	s.writeSettlement(w, st, dec, err)
}

func (s *Service) writeSettlement(w http.ResponseWriter, st *allotv1.Settlement, dec *allot.Decision, err error) {
	if err != nil {
		writeError(w, httpStatus(err), err)
		return
	}
	if len(dec.Statuses) > 0 {
		s.setUnitHeaders(w.Header(), "", s.policies("", nil, dec), false)
	}
	writeProto(w, http.StatusOK, st)
}

// setUnitHeaders sets OpenAI's rate limit headers from a decision's
// policies ps (Service.policies) in domain, per unit, for the most
// constraining limit of each (as setRateLimitHeaders picks it, with its
// numbers; withLimit false leaves out the limit headers):
//
//	x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens
//	x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests
//
// Limits are what this instance enforces for the key (see policy).
// Resets are durations as OpenAI writes them ("6m0s", "1.5s", "20ms"). A
// status's unit comes from its limit in domain's configuration (domain ""
// means every status is a token limit's: a settlement's, whose
// descriptors are not known here, so that its quota is not either: it
// gets remaining and reset only).
func (s *Service) setUnitHeaders(h http.Header, domain string, ps []policy, withLimit bool) {
	var d *allot.Domain
	if domain != "" {
		d = s.engine.Config().Domain(domain)
	}
	top := map[allot.Unit]*policy{}
	for i := range ps {
		p := &ps[i]
		unit := allot.Tokens
		if domain != "" {
			unit = allot.Requests
			if d != nil {
				if l := d.Limit(p.st.Name); l != nil {
					unit = l.Unit
				}
			}
		}
		top[unit] = mostConstraining(top[unit], p)
	}
	for unit, p := range top {
		name := "tokens"
		if unit == allot.Requests {
			name = "requests"
		}
		if withLimit {
			h.Set("x-ratelimit-limit-"+name, strconv.FormatInt(p.quota, 10))
		}
		h.Set("x-ratelimit-remaining-"+name, strconv.FormatInt(p.remaining, 10))
		h.Set("x-ratelimit-reset-"+name, p.st.ResetAfter.Round(time.Millisecond).String())
	}
}
