package server

import (
	"context"
	"fmt"
	"html/template"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
)

// StatusHandler returns the region's status page: server-rendered HTML
// with no external assets that reloads itself every opts.Refresh. Per
// domain it shows each limit with its rate, mode, enforcement, shadow and
// fallback state, this region's share and the fleet's (opts.Shares), and
// its current decisions per second (allowed, rejected, and rejections a
// shadow limit would have made), measured between two loads of the page.
// Keys never appear: usage per key is in the Admin API (allotctl usage).
func (s *Service) StatusHandler(opts AdminOptions) http.Handler {
	if opts.Refresh <= 0 {
		opts.Refresh = 5 * time.Second
	}
	return &statusPage{s: s, opts: opts}
}

type statusPage struct {
	s    *Service
	opts AdminOptions

	mu     sync.Mutex
	last   map[[2]string]decisionCount // at the previous load, for rates
	lastAt time.Time
}

// statusView is what the template renders.
type statusView struct {
	Region, Addr string
	Refresh      int // seconds
	Now          string
	Config       string
	ConfigError  string
	Domains      []domainView
}

type domainView struct {
	Name, Assignment, SharesError string
	Limits                        []limitView
}

type limitView struct {
	Name, Rate, Mode, Enforcement  string
	Burst                          int64
	Shadow, Fallback               bool
	Share                          string
	Fleet                          []string // "region share", one a line
	Allowed, Rejected, WouldReject string   // per second
	Total                          []string // since start, one count a line
}

// statusTemplate fits 1,280 px and less: only numbers and tags keep to
// one line; the shares per region and the counts since start take a line
// each, and headers wrap.
var statusTemplate = template.Must(template.New("status").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>allot · {{.Region}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
.meta{color:#666}.err{color:#b00020;font-weight:600}.meta,.err{overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%}th,td{padding:.3em .5em;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}
th{background:#f4f4f4;font-weight:600}td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.name{overflow-wrap:anywhere;min-width:6em}td.line span{display:block;white-space:nowrap}
.tag{padding:0 .4em;border-radius:3px;font-size:.85em;white-space:nowrap}.shadow{background:#fff3cd}.fallback{background:#f8d7da}.ok{color:#2e7d32}
</style></head><body>
<h1>allot · region {{.Region}}</h1>
<div class="meta">{{if .Addr}}gRPC {{.Addr}} · {{end}}configuration {{.Config}} · {{.Now}} · reloads every {{.Refresh}} s</div>
{{if .ConfigError}}<p class="err">Configuration refused, the last good one stays in force: {{.ConfigError}}</p>{{end}}
{{range .Domains}}
<h2>domain {{.Name}} <span class="meta">{{.Assignment}}</span></h2>
{{if .SharesError}}<p class="err">fleet shares unavailable: {{.SharesError}}</p>{{end}}
<table><tr><th>limit</th><th>rate</th><th>burst</th><th>mode</th><th>enforcement</th><th>state</th><th>share here</th><th>shares per region</th>
<th>allowed/s</th><th>rejected/s</th><th>would reject/s</th><th>since start</th></tr>
{{range .Limits}}<tr><td class="name">{{.Name}}</td><td>{{.Rate}}</td><td class="n">{{.Burst}}</td><td>{{.Mode}}</td><td>{{.Enforcement}}</td>
<td>{{if .Shadow}}<span class="tag shadow">shadow</span> {{end}}{{if .Fallback}}<span class="tag fallback">fallback</span>{{else if not .Shadow}}<span class="ok">enforcing</span>{{end}}</td>
<td class="n">{{.Share}}</td><td class="line">{{range .Fleet}}<span>{{.}}</span>{{end}}</td><td class="n">{{.Allowed}}</td><td class="n">{{.Rejected}}</td><td class="n">{{.WouldReject}}</td><td class="line">{{range .Total}}<span>{{.}}</span>{{end}}</td></tr>
{{end}}</table>
{{else}}<p>No domain configured.</p>{{end}}
</body></html>
`))

func (p *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var buf strings.Builder
	if err := statusTemplate.Execute(&buf, p.view(r.Context())); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	io.WriteString(w, buf.String())
}

func (p *statusPage) view(ctx context.Context) statusView {
	now := p.s.now()
	cfg := p.s.engine.Config()
	rs := p.s.regionStatus(cfg, p.opts)
	v := statusView{Region: rs.GetRegion(), Addr: p.opts.Addr, Refresh: int(max(p.opts.Refresh/time.Second, 1)),
		Now: now.UTC().Format(time.RFC3339), Config: "from a file", ConfigError: rs.GetConfigError()}
	if rs.GetConfigVersion() > 0 {
		v.Config = fmt.Sprintf("version %d", rs.GetConfigVersion())
	}
	counts := p.s.decisionCounts()
	p.mu.Lock()
	last, dt := p.last, now.Sub(p.lastAt)
	p.last, p.lastAt = counts, now
	p.mu.Unlock()
	rate := func(cur, prev uint64) string {
		if last == nil || dt <= 0 || dt > 5*time.Minute || cur < prev {
			return "–"
		}
		return fmt.Sprintf("%.1f", float64(cur-prev)/dt.Seconds())
	}
	for i, rd := range rs.GetDomains() {
		d := cfg.Domains[i]
		dv := domainView{Name: rd.GetName()}
		if rd.GetTerm() > 0 {
			dv.Assignment = fmt.Sprintf("assignment term %d version %d", rd.GetTerm(), rd.GetVersion())
		}
		var fleet map[string]map[string]float64
		fleetKnown := false // the fleet's shares were read: a limit absent never had any
		if p.opts.Shares != nil && len(d.Regions) > 0 {
			names := make([]string, len(d.Limits))
			for j, l := range d.Limits {
				names[j] = l.Name
			}
			var err error
			if fleet, err = p.opts.Shares(ctx, d.Name, names); err != nil {
				dv.SharesError = err.Error()
			} else {
				fleetKnown = true
			}
		}
		for j, rl := range rd.GetLimits() {
			l := d.Limits[j]
			id := [2]string{d.Name, l.Name}
			c, prev := counts[id], last[id]
			dv.Limits = append(dv.Limits, limitView{
				Name: l.Name, Rate: rateText(l), Mode: l.Mode.String(), Enforcement: l.Enforcement.String(), Burst: l.Burst,
				Shadow: rl.GetShadow(), Fallback: rl.GetFallback(),
				Share:       fmt.Sprintf("%.3f", rl.GetShare()),
				Fleet:       fleetShares(d, l, fleet[l.Name], fleetKnown, rs.GetRegion(), rl.GetShare()),
				Allowed:     rate(c.allowed, prev.allowed),
				Rejected:    rate(c.rejected, prev.rejected),
				WouldReject: rate(c.shadowRejected, prev.shadowRejected),
				Total:       []string{fmt.Sprintf("%d allowed", c.allowed), fmt.Sprintf("%d rejected", c.rejected), fmt.Sprintf("%d would reject", c.shadowRejected)},
			})
		}
		v.Domains = append(v.Domains, dv)
	}
	return v
}

// fleetShares lists the shares of limit l per region, as allotctl
// status shows them (coordinator/admin): the fleet's persisted shares,
// or the initial split of d's regions for a limit that was never
// assigned (known says the fleet's shares were read, so that its
// absence means that), with this region's share in force in place of
// the persisted one. Without the fleet's, this region's alone.
func fleetShares(d *allot.Domain, l *allot.Limit, shares map[string]float64, known bool, region string, here float64) []string {
	if len(shares) == 0 && known && len(d.Regions) > 0 {
		shares = map[string]float64{}
		for i, v := range coordinator.InitialShares(l.Floors, d.Regions) {
			shares[d.Regions[i]] = v
		}
	}
	if len(shares) == 0 {
		return []string{fmt.Sprintf("%s %.3f", region, here)}
	}
	shares = maps.Clone(shares)
	shares[region] = here
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(shares)) {
		parts = append(parts, fmt.Sprintf("%s %.3f", r, shares[r]))
	}
	return parts
}
