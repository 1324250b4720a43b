// Package httpx builds the HTTP servers of allot's commands, with the
// timeouts that keep a slow or idle client from holding a connection (and
// its goroutine and buffers) for ever. Every command's server goes through
// Server, so that the timeouts live here and nowhere else.
//
//	hs := httpx.Server(handler, httpx.Default)
//	go hs.Serve(listener)
package httpx

import (
	"net/http"
	"time"
)

// Timeouts are an HTTP server's timeouts; a zero field means none.
type Timeouts struct {
	// ReadHeader bounds reading a request's headers.
	ReadHeader time.Duration
	// Read bounds reading a whole request, headers and body: a client
	// that sends headers and then no body is disconnected after it.
	Read time.Duration
	// Write bounds the time from the end of reading a request's headers
	// to the end of writing its response. Leave it 0 for a handler whose
	// responses stream (a proxy of model output).
	Write time.Duration
	// Idle bounds how long a keep-alive connection waits for its next
	// request.
	Idle time.Duration
}

// Default is for allot's own servers, whose requests are small JSON
// bodies and whose responses do not stream.
var Default = Timeouts{
	ReadHeader: 5 * time.Second,
	Read:       15 * time.Second,
	Write:      30 * time.Second,
	Idle:       2 * time.Minute,
}

// Proxy is Default without a write timeout, for a server that forwards
// requests to an upstream whose responses may stream.
var Proxy = Timeouts{ReadHeader: Default.ReadHeader, Read: Default.Read, Idle: Default.Idle}

// Server returns a server of h with the timeouts t.
func Server(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
	}
}
