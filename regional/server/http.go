package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot"
)

// maxBody bounds a request body.
const maxBody = 1 << 20

// HTTPOptions configure the HTTP handler.
type HTTPOptions struct {
	// Gatherer serves /metrics; nil serves no metrics.
	Gatherer prometheus.Gatherer
	// Ready reports whether the region is ready for traffic (/readyz);
	// nil means always.
	Ready func() error
	// Status serves the status page (Service.StatusHandler) at GET / and
	// GET /status; nil serves none.
	Status http.Handler
}

// checkBody is the JSON body of POST /v1/check. Each descriptor is an
// object of attributes; its entries are taken in key order (JSON objects
// have none), so domains that match Envoy's ordered paths are better
// served over gRPC.
type checkBody struct {
	Domain      string              `json:"domain"`
	Descriptors []map[string]string `json:"descriptors"`
	Hits        *int64              `json:"hits"` // absent: 1; 0 checks without charging
}

// HTTPHandler returns the service's HTTP API:
//
//	POST /v1/check   decide one request: 200 allowed, 429 rejected
//	POST /v1/reserve hold an LLM call's tokens: 200 allowed, 429 rejected
//	POST /v1/settle  charge a reservation's real usage
//	POST /v1/release end a cancelled stream's reservation
//
// The /v1 routes need the check role (authz.go): 403 otherwise.
//
//	GET  /healthz    the process is up
//	GET  /readyz     the region is ready for traffic
//	GET  /metrics    Prometheus metrics
//	GET  /status     the status page (also at /), when HTTPOptions.Status is set
func (s *Service) HTTPHandler(opts HTTPOptions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(s.httpAuthorized("POST /v1/check", s.httpCheck))     // authz.go
	mux.HandleFunc(s.httpAuthorized("POST /v1/reserve", s.httpReserve)) // reserve.go
	mux.HandleFunc(s.httpAuthorized("POST /v1/settle", s.httpSettle))
	mux.HandleFunc(s.httpAuthorized("POST /v1/release", s.httpRelease))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if opts.Ready != nil {
			if err := opts.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		io.WriteString(w, "ready\n")
	})
	if opts.Status != nil {
		mux.Handle("GET /{$}", opts.Status)
		mux.Handle("GET /status", opts.Status)
	}
	if opts.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	}
	return mux
}

func (s *Service) httpCheck(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q, want application/json", ct))
			return
		}
	}
	var body checkBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		code := http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			code = http.StatusRequestEntityTooLarge
		}
		writeError(w, code, fmt.Errorf("body: %v", err))
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, errors.New("body: more than one JSON value"))
		return
	}
	item := CheckItem{Domain: body.Domain, Hits: 1}
	if body.Hits != nil {
		item.Hits = *body.Hits
	}
	for _, m := range body.Descriptors {
		d := make(allot.Descriptor, 0, len(m))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			d = append(d, allot.Entry{Key: k, Value: m[k]})
		}
		item.Descriptors = append(item.Descriptors, d)
	}
	decs := make([]allot.Decision, 1)
	if err := s.checkBatch(r.Context(), []CheckItem{item}, decs); err != nil {
		writeError(w, httpStatus(err), err)
		return
	}
	d := &decs[0]
	setRateLimitHeaders(w.Header(), s.policies(item.Domain, item.Descriptors, d), d)
	code := http.StatusOK
	if !d.Allowed {
		code = http.StatusTooManyRequests
	}
	writeProto(w, code, checkResult(d))
}

func writeError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }
