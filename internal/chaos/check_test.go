package chaos

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// The checker on synthetic logs: a clean log passes, and a log that
// breaks each rule is reported for it and for nothing else.

const sec = int64(time.Second)

// w0 is the start of a window of the test limits (1s periods).
var w0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

var testLimits = []LimitSpec{
	{Domain: "api", Name: "split", Mode: allot.Split, Unit: allot.Requests, Amount: 10, Period: time.Second},
	{Domain: "api", Name: "shared", Mode: allot.Shared, Unit: allot.Requests, Amount: 10, Period: time.Second, Bound: 4},
	{Domain: "llm", Name: "tokens", Mode: allot.Split, Unit: allot.Tokens, Amount: 1000, Period: time.Second},
}

// logBuilder makes records 1ms long, each answered well within its
// deadline unless changed.
type logBuilder struct{ recs []Record }

func (b *logBuilder) add(kind, instance, limit, key string, at int64, allowed bool) *Record {
	domain := "api"
	if limit == "tokens" {
		domain = "llm"
	}
	r := Record{Kind: kind, At: at, Done: at + int64(time.Millisecond), Region: strings.Split(instance, "-")[0], Instance: instance, Life: 1,
		Domain: domain, Limit: limit, Key: key, Hits: 1, Allowed: allowed,
		Latency: int64(time.Millisecond), Deadline: int64(100 * time.Millisecond), DeadlineMet: true}
	b.recs = append(b.recs, r)
	return &b.recs[len(b.recs)-1]
}

// checks adds n checks of key spread over window w (from w0) on
// instance, admitted or not.
func (b *logBuilder) checks(n int, instance, limit, key string, w int64, allowed bool) {
	for i := range n {
		b.add(KindCheck, instance, limit, key, w0+w*sec+int64(i+1)*sec/int64(n+2), allowed)
	}
}

// clean is a log that keeps every rule: two regions share the split
// limit within L, the shared limit goes above L within its bound, and
// three reservations end settled, released and expired.
func clean() *logBuilder {
	b := &logBuilder{}
	b.checks(6, "a-1", "split", "user=1", 0, true)
	b.checks(4, "b-1", "split", "user=1", 0, true)
	b.checks(5, "b-1", "split", "user=1", 0, false)
	b.checks(10, "a-1", "split", "user=1", 1, true)
	b.checks(8, "a-1", "shared", "app=1", 0, true)
	b.checks(5, "b-1", "shared", "app=1", 0, true) // 13: above L, within L + 4
	for i, end := range []string{KindSettle, KindRelease, KindProbe} {
		at := w0 + int64(i)*sec
		r := b.add(KindReserve, "a-1", "tokens", "org=1", at, true)
		r.ID, r.Tokens = "r"+end, 500
		e := b.add(end, "a-1", "tokens", "org=1", at+sec/2, true)
		e.ID, e.State = "r"+end, map[string]string{KindSettle: "settled", KindRelease: "released", KindProbe: "released"}[end]
		e.Late = end == KindProbe
	}
	b.add(KindReserve, "b-1", "tokens", "org=1", w0, false) // rejected
	return b
}

// scrapes are counters that agree with the clean log.
func scrapes() []Scrape {
	dec := func(limit, result string, v float64) Sample {
		domain := "api"
		if limit == "tokens" {
			domain = "llm"
		}
		return Sample{Name: "allot_regional_decisions_total", Labels: map[string]string{"domain": domain, "limit": limit, "result": result, "enforcement": "exact"}, Value: v}
	}
	res := func(result string, v float64) Sample {
		return Sample{Name: "allot_regional_reservations_total", Labels: map[string]string{"result": result}, Value: v}
	}
	return []Scrape{
		{Instance: "a-1", Life: 1, Samples: []Sample{dec("split", "allowed", 16), dec("split", "rejected", 0), dec("shared", "allowed", 8), res("admitted", 3), res("rejected", 0)}},
		{Instance: "b-1", Life: 1, Samples: []Sample{dec("split", "allowed", 4), dec("split", "rejected", 5), dec("shared", "allowed", 5), res("admitted", 0), res("rejected", 1), res("concurrency_rejected", 0)}},
	}
}

func check(b *logBuilder, sc []Scrape) *Report {
	return Check(Input{Limits: testLimits, Records: b.recs, Scrapes: sc,
		Events: []Event{{Name: EventLeaderKilled, Took: 4 * time.Second}, {Name: EventFallbackLeft, Took: 300 * time.Millisecond}}})
}

// want checks that r broke exactly the rules named by prefixes, each at
// least once.
func want(t *testing.T, r *Report, prefixes ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, v := range r.Violations {
		ok := false
		for _, p := range prefixes {
			if strings.HasPrefix(v, p) {
				seen[p], ok = true, true
			}
		}
		if !ok {
			t.Errorf("unexpected violation: %s", v)
		}
	}
	for _, p := range prefixes {
		if !seen[p] {
			t.Errorf("no %q violation; got %q", p, r.Violations)
		}
	}
}

func TestCheckCleanLog(t *testing.T) {
	r := check(clean(), scrapes())
	want(t, r)
	if r.Requests != len(clean().recs) || r.Answered != r.Requests || r.PastDeadline != 0 {
		t.Errorf("requests %d answered %d past deadline %d", r.Requests, r.Answered, r.PastDeadline)
	}
	if len(r.Split) != 1 || r.Split[0].Windows != 2 || r.Split[0].Above != 0 || r.Split[0].Worst != 0 || r.Split[0].Admitted != 20 {
		t.Errorf("split: %+v", r.Split)
	}
	if len(r.Shared) != 1 || r.Shared[0].AboveL != 1 || r.Shared[0].Above != 0 || r.Shared[0].Worst != 3 {
		t.Errorf("shared: %+v", r.Shared)
	}
	rs := r.Reservations
	if rs.Admitted != 3 || rs.Rejected != 1 || rs.Settled != 1 || rs.Released != 1 || rs.Expired != 1 || rs.Unended != 0 {
		t.Errorf("reservations: %+v", rs)
	}
	if r.Metrics.Lifetimes != 2 || r.Metrics.Mismatches != 0 || r.Metrics.Series == 0 {
		t.Errorf("metrics: %+v", r.Metrics)
	}
	table := r.Table()
	for _, s := range []string{"| requests served (answered / sent) | 45 / 45 |", "split-mode windows above L (target 0) | 0 of 2",
		"+3 vs bound 4.0 (75% of it", "1 settled, 1 released, 1 expired", "| time to a new leader | 4s |",
		"| time to leave fallback after Redis returns | 300ms |"} {
		if !strings.Contains(table, s) {
			t.Errorf("table lacks %q:\n%s", s, table)
		}
	}
}

func TestCheckSplitAboveL(t *testing.T) {
	b := clean()
	b.checks(1, "b-1", "split", "user=1", 1, true) // window 1: 11 > 10
	sc := scrapes()
	sc[1].Samples[0].Value++
	r := check(b, sc)
	want(t, r, "split mode: api/split user=1 window")
	if r.Split[0].Above != 1 || r.Split[0].Worst != 1 {
		t.Errorf("split: %+v", r.Split[0])
	}
}

func TestCheckSplitAmbiguousAdmissionIsLeftOut(t *testing.T) {
	b := clean()
	// Sent at the end of window 0, answered in window 1: window 1 has 10
	// for sure, window 0 has 10 for sure; either way one has 11, but the
	// log cannot say which.
	r := b.add(KindCheck, "b-1", "split", "user=1", w0+sec-int64(time.Microsecond), true)
	r.Done = w0 + sec + int64(time.Millisecond)
	sc := scrapes()
	sc[1].Samples[0].Value++
	rep := check(b, sc)
	want(t, rep)
	if rep.Split[0].Ambiguous != 1 {
		t.Errorf("ambiguous: %d, want 1", rep.Split[0].Ambiguous)
	}
}

func TestCheckSharedAboveBound(t *testing.T) {
	b := clean()
	b.checks(2, "b-1", "shared", "app=1", 0, true) // 15 > 10 + 4
	sc := scrapes()
	sc[1].Samples[2].Value += 2
	r := check(b, sc)
	want(t, r, "shared mode: api/shared app=1 window")
	if r.Shared[0].Above != 1 || r.Shared[0].Worst != 5 {
		t.Errorf("shared: %+v", r.Shared[0])
	}
}

func TestCheckDeadlines(t *testing.T) {
	b := clean()
	late := b.add(KindCheck, "a-1", "split", "user=2", w0+5*sec, false)
	late.Latency, late.Done, late.DeadlineMet = int64(150*time.Millisecond), late.At+int64(150*time.Millisecond), false
	lost := b.add(KindCheck, "a-1", "split", "user=2", w0+6*sec, false)
	lost.Err, lost.DeadlineMet = "DeadlineExceeded", false
	// A client that claims the deadline was met is not believed.
	liar := b.add(KindCheck, "a-1", "split", "user=2", w0+7*sec, false)
	liar.Latency = int64(time.Second)
	sc := scrapes()
	sc[0].Samples[1].Value = 3 // rejected: 2 answered (+1 unanswered, which it may or may not count)
	r := check(b, sc)
	want(t, r, "deadline: check api/split user=2")
	if r.PastDeadline != 3 || r.Errors["DeadlineExceeded"] != 1 || r.Answered != r.Requests-1 {
		t.Errorf("past deadline %d, errors %v", r.PastDeadline, r.Errors)
	}
}

func TestCheckReservations(t *testing.T) {
	b := clean()
	add := func(id string, at int64) {
		r := b.add(KindReserve, "a-1", "tokens", "org=1", at, true)
		r.ID, r.Tokens = id, 300
	}
	add("never", w0+3*sec) // no end at all
	add("active", w0+4*sec)
	probe := b.add(KindProbe, "a-1", "tokens", "org=1", w0+7*sec, true) // not late: it had not expired
	probe.ID, probe.State = "active", "released"
	add("lost", w0+5*sec)
	settle := b.add(KindSettle, "a-1", "tokens", "org=1", w0+5*sec, true)
	settle.ID, settle.Err, settle.DeadlineMet = "lost", "Unavailable", false
	add("moved", w0+6*sec)
	moved := b.add(KindRelease, "a-1", "tokens", "org=1", w0+6*sec, true)
	moved.ID, moved.State, moved.Life = "moved", "released", 2
	sc := scrapes()
	sc[0].Samples[3].Value = 7
	r := check(b, sc)
	want(t, r, "reservation: never", "reservation: active", "reservation: lost", "reservation: moved",
		"deadline: settle")
	if r.Reservations.Unended != 4 || r.Reservations.Expired != 1 {
		t.Errorf("reservations: %+v", r.Reservations)
	}
}

func TestCheckMetrics(t *testing.T) {
	t.Run("below the log", func(t *testing.T) {
		sc := scrapes()
		sc[0].Samples[0].Value = 15 // a-1 admitted 16 split checks
		want(t, check(clean(), sc), `metrics: a-1 life 1: allot_regional_decisions_total{domain="api",limit="split",result="allowed"} = 15`)
	})
	t.Run("above the log", func(t *testing.T) {
		sc := scrapes()
		sc[1].Samples[4].Value = 2 // b-1 rejected one reservation
		want(t, check(clean(), sc), `metrics: b-1 life 1: allot_regional_reservations_total{result=~"rejected|concurrency_rejected"} = 2`)
	})
	t.Run("unanswered requests may be counted", func(t *testing.T) {
		b := clean()
		lost := b.add(KindCheck, "b-1", "split", "user=1", w0+9*sec, false)
		lost.Err, lost.DeadlineMet = "DeadlineExceeded", false
		sc := scrapes()
		sc[1].Samples[1].Value = 6 // decided, but answered too late
		want(t, check(b, sc), "deadline:")
	})
	t.Run("lifetimes are counted apart", func(t *testing.T) {
		b := clean()
		b.checks(3, "b-1", "split", "user=9", 4, true)
		for i := range b.recs[len(b.recs)-3:] {
			b.recs[len(b.recs)-3+i].Life = 2
		}
		sc := append(scrapes(), Scrape{Instance: "b-1", Life: 2, Samples: []Sample{{Name: "allot_regional_decisions_total",
			Labels: map[string]string{"domain": "api", "limit": "split", "result": "allowed"}, Value: 3}}})
		want(t, check(b, sc))
		sc[2].Samples[0].Value = 7 // life 2 counted life 1's too: wrong
		want(t, check(b, sc), "metrics: b-1 life 2")
	})
	t.Run("missing scrape", func(t *testing.T) {
		want(t, check(clean(), scrapes()[:1]), "metrics: b-1 life 1 answered requests but was not scraped")
	})
}

func TestCheckRecoveries(t *testing.T) {
	r := Check(Input{Limits: testLimits, Records: clean().recs, Scrapes: scrapes(), Events: []Event{
		{Name: EventPartitionHeal, Target: "c", Took: time.Second},
		{Name: EventPartitionHeal, Target: "a", Took: 30 * time.Second, Failed: "not within 30s: a-1: 1 shared-mode limits in fallback"},
	}})
	want(t, r, "recovery: partition_heal a at")
	if len(r.PartitionHeal) != 1 || r.PartitionHeal[0] != time.Second {
		t.Errorf("heal times %v, want the one that recovered", r.PartitionHeal)
	}
}

func TestSpecsBound(t *testing.T) {
	cfg, err := allot.ParseConfig("limits.yaml", []byte(`
domain: api
regions: [a, b, c]
limits:
  - {name: shared, match: {app: "*"}, rate: 60/1s, mode: shared, sync_interval: 100ms, stale_after: 300ms}
  - {name: split, match: {user: "*"}, rate: 40/1s, algorithm: sliding_window}
`))
	if err != nil {
		t.Fatal(err)
	}
	specs := Specs(cfg, nil)
	// allot.SharedBound through a partition: (3 − 1) regions × max(60/s × 2 × 0.1s, 5 % of 60) × 2
	if len(specs) != 2 || specs[0].Bound < 47.99 || specs[0].Bound > 48.01 || specs[1].Bound != 0 || specs[1].Amount != 40 {
		t.Fatalf("specs: %+v", specs)
	}
	if got := Specs(cfg, map[string]float64{"api/shared": 50})[0].Bound; got != 50 {
		t.Fatalf("with a larger exported bound: %v, want 50", got)
	}
}

func TestParseText(t *testing.T) {
	ss, err := ParseText(strings.NewReader(`# HELP allot_regional_decisions_total Decisions.
# TYPE allot_regional_decisions_total counter
allot_regional_decisions_total{domain="api",enforcement="exact",limit="split-exact",result="allowed"} 42
allot_regional_decisions_total{domain="api",enforcement="exact",limit="split-exact",result="rejected"} 7
weird{a="x\"y\\z",b="line\nnext"} 1.5e+06
go_goroutines 12
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 4 || ss[2].Labels["a"] != `x"y\z` || ss[2].Labels["b"] != "line\nnext" || ss[2].Value != 1.5e6 || ss[3].Value != 12 {
		t.Fatalf("parsed %+v", ss)
	}
	if got := Sum(ss, "allot_regional_decisions_total", map[string]string{"limit": "split-exact"}); got != 49 {
		t.Fatalf("sum %v, want 49", got)
	}
	if got := Sum(ss, "allot_regional_decisions_total", map[string]string{"result": "allowed"}); got != 42 {
		t.Fatalf("sum %v, want 42", got)
	}
	for _, bad := range []string{"name{a=\"x} 1", "name{a=x} 1", "name{a=\"x\"}", "name{a=\"x\"} nope"} {
		if _, err := ParseText(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestLogRoundTrip(t *testing.T) {
	path := t.TempDir() + "/log.jsonl"
	l, err := CreateLog(path)
	if err != nil {
		t.Fatal(err)
	}
	in := clean().recs
	for i := range in {
		l.Write(&in[i])
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := ReadFile[Record](path)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) || out[3] != in[3] {
		t.Fatalf("read %d records, first %+v, want %d, %+v", len(out), out[3], len(in), in[3])
	}
	if _, err := ReadJSONLines[Record](bytes.NewReader([]byte("{\"kind\":\"check\"}\nnot json\n"))); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("bad line: %v", err)
	}
}

func TestDurations(t *testing.T) {
	s := time.Second
	for _, c := range []struct {
		in   []time.Duration
		want string
	}{
		{nil, "-"},
		{[]time.Duration{s, 2 * s}, "1s, 2s"},
		{[]time.Duration{5 * s, s, 3 * s, 2 * s}, "4 times: min 1s, median 3s, max 5s"},
	} {
		if got := durations(c.in); got != c.want {
			t.Errorf("durations(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestClearRunDir(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"decisions.jsonl", "report.md", "cluster/logs/x.log"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := clearRunDir(dir); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
	if err := os.WriteFile(filepath.Join(dir, "thesis.tex"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := clearRunDir(dir); err == nil {
		t.Fatal("a folder with other files: no error")
	}
	if _, err := os.Stat(filepath.Join(dir, "thesis.tex")); err != nil {
		t.Fatal(err)
	}
	if err := clearRunDir(filepath.Join(dir, "new")); err != nil {
		t.Fatal(err)
	}
}
