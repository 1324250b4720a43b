package server

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/chromiumtest"
)

// statusWidths are the widths the status page must fit without
// scrolling sideways: a 1,280 px window less a 16 px scrollbar, 1,280
// and 1,400 px.
var statusWidths = []int{1264, 1280, 1400}

// probePage loads /status in an iframe per width and writes what it
// measured in each into <pre id="result"> as JSON: the document's scroll
// and client widths, the elements that end past the right edge, and the
// regions each limit's "shares per region" cell lists.
const probePage = `<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">
%s<pre id="result">not measured</pre>
<script>
window.addEventListener("load", function () {
  var out = [];
  document.querySelectorAll("iframe").forEach(function (f) {
    var d = f.contentDocument, el = d.documentElement, wide = [], shares = {};
    d.querySelectorAll("body *").forEach(function (e) {
      var r = e.getBoundingClientRect();
      if (r.right > el.clientWidth + 0.5) {
        wide.push(e.tagName + " " + Math.round(r.right) + " " + (e.textContent || "").slice(0, 40));
      }
    });
    d.querySelectorAll("tr").forEach(function (tr) {
      var cells = tr.querySelectorAll("td");
      if (cells.length < 8) return;
      var spans = cells[7].querySelectorAll("span"), regions = [];
      spans.forEach(function (s) { regions.push(s.textContent.split(" ")[0]); });
      shares[cells[0].textContent] = regions;
    });
    out.push({frame: f.clientWidth, scrollWidth: el.scrollWidth, clientWidth: el.clientWidth,
      bodyScrollWidth: d.body.scrollWidth, wide: wide.slice(0, 8), shares: shares});
  });
  document.getElementById("result").textContent = JSON.stringify(out);
});
</script></body></html>`

// statusChromiumConfig is deploy/examples/limits.yaml, with a shadow limit
// so that every state tag shows.
const statusChromiumConfig = exampleConfig + `
  - {name: per-tenant-user-chat, match: {tenant: "*", user: "*", route: /v1/chat}, rate: 60/1m, algorithm: gcra, shadow: true}
---
domain: llm
regions: [us-east, eu-west, ap-south]
limits:
  - {name: per-tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 2M/1m, concurrency: 200}
`

func TestStatusPageFitsInChromium(t *testing.T) {
	chromiumtest.Path(t) // skip early without Chromium
	c := &clock{t: t0}
	s := newRegionService(t, statusChromiumConfig, "us-east", c)
	// Decisions since start as a long-running region has them: wide numbers.
	for _, l := range []string{"per-user", "per-tenant", "login-attempts"} {
		s.metrics.decisions.WithLabelValues("api", l, "allowed", "local").Add(123456789)
		s.metrics.decisions.WithLabelValues("api", l, "rejected", "local").Add(98765432)
	}
	s.metrics.decisions.WithLabelValues("api", "per-tenant-user-chat", "shadow_rejected", "local").Add(4567890)
	status := s.StatusHandler(AdminOptions{Addr: "allot-regional-us-east-0.allot.svc.cluster.local:8081", Refresh: time.Hour,
		ConfigVersion: func() (int64, error) { return 1234, nil },
		Applied:       func(string) (int64, uint64) { return 7654321, 987654 },
		// As etcd holds them in allot dev: only per-user was ever assigned.
		Shares: func(context.Context, string, []string) (map[string]map[string]float64, error) {
			return map[string]map[string]float64{"per-user": {"us-east": 0.6875, "eu-west": 0.2125, "ap-south": 0.1}}, nil
		}})
	var frames strings.Builder
	for _, w := range statusWidths {
		fmt.Fprintf(&frames, `<iframe src="/status" style="display:block;border:0;width:%dpx;height:1400px"></iframe>`+"\n", w)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /status", status)
	mux.HandleFunc("GET /probe", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, fmt.Sprintf(probePage, frames.String()))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// A load before Chromium's, so that the rates per second have numbers.
	status.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/status", nil))
	for _, l := range []string{"per-user", "per-tenant", "login-attempts"} {
		s.metrics.decisions.WithLabelValues("api", l, "allowed", "local").Add(12345)
	}
	c.add(time.Second)

	dom := chromiumtest.DumpDOM(t, srv.URL+"/probe", 1500, 1000, 3*time.Second)
	m := regexp.MustCompile(`(?s)<pre id="result">(.*?)</pre>`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no result in the DOM:\n%.3000s", dom)
	}
	var results []struct {
		Frame, ScrollWidth, ClientWidth, BodyScrollWidth int
		Wide                                             []string
		Shares                                           map[string][]string
	}
	if err := json.Unmarshal([]byte(html.UnescapeString(m[1])), &results); err != nil || len(results) != len(statusWidths) {
		t.Fatalf("result %q: %v", m[1], err)
	}
	conf := s.Engine().Config()
	for i, f := range results {
		if f.Frame != statusWidths[i] || f.ClientWidth == 0 {
			t.Errorf("frame %d: %+v, want one %d px wide", i, f, statusWidths[i])
			continue
		}
		if f.ScrollWidth > f.ClientWidth || f.BodyScrollWidth > f.ClientWidth || len(f.Wide) > 0 {
			t.Errorf("at %d px the page scrolls sideways: scroll width %d (body %d), client width %d; past the edge: %q",
				f.Frame, f.ScrollWidth, f.BodyScrollWidth, f.ClientWidth, f.Wide)
		}
		// Every limit lists the shares of all three regions.
		n := 0
		for _, d := range conf.Domains {
			for _, l := range d.Limits {
				n++
				if got := f.Shares[l.Name]; strings.Join(got, " ") != "ap-south eu-west us-east" {
					t.Errorf("at %d px, %s/%s lists the shares of %q, want ap-south eu-west us-east", f.Frame, d.Name, l.Name, got)
				}
			}
		}
		if len(f.Shares) != n {
			t.Errorf("at %d px: %d rows with shares, want %d: %v", f.Frame, len(f.Shares), n, f.Shares)
		}
	}
	if t.Failed() {
		t.Logf("DOM (%d bytes): %.3000s", len(dom), dom)
	}
}
