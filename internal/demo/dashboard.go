package demo

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"net/http"
)

//go:embed dashboard.html
var dashboardHTML []byte

// dataMark is where the page gets the series it first draws.
var dataMark = []byte("/*DATA*/")

// Dashboard returns the demo's dashboard over s: GET / is a page that
// draws, per limit, admitted and rejected per second and the shares per
// region over time (inline SVG drawn by inline JavaScript, no external
// asset), and polls GET /api/series, s's Snapshot as JSON, every second.
// The page carries the Snapshot it was served with, so that it draws
// without waiting for its first poll.
func Dashboard(s *Series) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		data, err := json.Marshal(s.Snapshot()) // escapes <, > and &: safe in a script element
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(bytes.Replace(dashboardHTML, dataMark, data, 1))
	})
	mux.HandleFunc("GET /api/series", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(s.Snapshot())
	})
	return mux
}
