package allot

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Abuse bounds (docs/security.md, Bounds): each hostile input is refused
// with an error that names the file, the field and what was expected.

func TestRateCap(t *testing.T) {
	if got, want := MaxAmountIn(time.Millisecond), int64(1125899906842); got != want {
		t.Errorf("MaxAmountIn(1ms) = %d, want %d", got, want)
	}
	for _, p := range []time.Duration{time.Second, time.Minute, MaxPeriod} {
		if got := MaxAmountIn(p); got != MaxAmount {
			t.Errorf("MaxAmountIn(%v) = %d, want MaxAmount", p, got)
		}
	}
	for _, p := range []time.Duration{0, MinPeriod - 1, MaxPeriod + 1, -time.Second} {
		if got := MaxAmountIn(p); got != 0 {
			t.Errorf("MaxAmountIn(%v) = %d, want 0", p, got)
		}
	}
	if err := MaxRate.Validate(); err != nil {
		t.Errorf("MaxRate.Validate() = %v", err)
	}
	// The fastest rate of each period is valid, one more is not.
	for _, p := range []time.Duration{time.Millisecond, 7 * time.Millisecond, 999 * time.Millisecond, time.Second, time.Hour} {
		r := Rate{Amount: MaxAmountIn(p), Period: p}
		if err := r.Validate(); err != nil {
			t.Errorf("%v: %v", r, err)
		}
		if back, err := ParseRate(r.String()); err != nil || back != r {
			t.Errorf("ParseRate(%q) = %v, %v", r.String(), back, err)
		}
		r.Amount++
		if err := r.Validate(); err == nil {
			t.Errorf("%v: valid, want an error", r)
		}
	}

	bad := []struct{ yaml, want string }{
		{head + "limits: [{name: a, rate: 1125899906842624/1ms}]\n", // 2^50/1ms
			`bad.yaml:3: limits[0].rate: bad rate "1125899906842624/1ms": rate must be at most 1125899906842624 per second, want an amount of at most 1125899906842 per 1ms`},
		{head + "limits: [{name: a, rate: 1125899906843/1ms}]\n",
			`bad.yaml:3: limits[0].rate: bad rate "1125899906843/1ms": rate must be at most 1125899906842624 per second, want an amount of at most 1125899906842 per 1ms`},
		{head + "limits: [{name: a, rate: 10/s}]\noverrides: [{match: {user: x}, rate: 1125899906842624/1ms}]\n",
			`bad.yaml:4: overrides[0].rate: bad rate "1125899906842624/1ms": rate must be at most 1125899906842624 per second, want an amount of at most 1125899906842 per 1ms`},
		{head + "plans: {pro: {multiplier: 1, floors: {a: 1125899906842624/1ms}}}\nlimits: [{name: a, rate: 10/s}]\n",
			`bad.yaml:3: plans.pro.floors.a: bad rate "1125899906842624/1ms": rate must be at most 1125899906842624 per second, want an amount of at most 1125899906842 per 1ms`},
		{limit + "    sync_interval: 9999999999h\n",
			`bad.yaml:6: limits[0].sync_interval: want a duration such as 250ms, got "9999999999h"`},
		{limit + "    stale_after: 2h\n",
			`bad.yaml:6: limits[0].stale_after: want a duration in [sync_interval, 1h0m0s], got 2h0m0s`},
		{limit + "    stale_after: -1s\n",
			`bad.yaml:6: limits[0].stale_after: want at least sync_interval (250ms), got -1s`},
		{limit + "    burst: 99999999999999999999\n",
			`bad.yaml:6: limits[0].burst: want an integer, got "99999999999999999999"`},
		{limit + "    concurrency: 9223372036854775808\n",
			`bad.yaml:6: limits[0].concurrency: want an integer, got "9223372036854775808"`},
	}
	for _, tc := range bad {
		cfg, err := ParseConfig("bad.yaml", []byte(tc.yaml))
		if err == nil || err.Error() != tc.want || cfg != nil {
			t.Errorf("ParseConfig(%q)\n got: %v\nwant: %s", tc.yaml, err, tc.want)
		}
	}

	// A multiplier clamps the rate to MaxRate, not just to MaxAmount.
	d := mustDomain(t, "domain: api\nplans: {big: {multiplier: 1000000}}\nassign: [{match: {tenant: t}, plan: big}]\n"+
		"limits: [{name: fast, rate: 1G/1ms, burst: 1}]\noverrides: [{match: {user: u}, multiplier: 1000000}]\n")
	l := d.Limit("fast")
	for _, desc := range []Descriptor{desc("tenant", "t"), desc("user", "u")} {
		e := d.Effective(l, desc, time.Time{})
		if want := (Rate{Amount: MaxAmountIn(time.Millisecond), Period: time.Millisecond}); e.Rate != want || e.Rate.Validate() != nil {
			t.Errorf("%v: Effective rate %v, want %v", desc, e.Rate, want)
		}
	}
}

// deepLimits nests n limits, each in the one before, in YAML's flow style:
// a small file (166 kB for 3,000).
func deepLimits(n int) string {
	var b strings.Builder
	b.WriteString("domain: api\nlimits: ")
	for i := range n {
		fmt.Fprintf(&b, "[{name: l%d, match: {k%d: v}, rate: 10/s, limits: ", i, i)
	}
	b.WriteString("[]" + strings.Repeat("}]", n) + "\n")
	return b.String()
}

// deepDescriptors is deepLimits for Envoy's format.
func deepDescriptors(n int) string {
	var b strings.Builder
	b.WriteString("domain: api\ndescriptors: ")
	for i := range n {
		fmt.Fprintf(&b, "[{key: k%d, rate_limit: {unit: second, requests_per_unit: 10}, descriptors: ", i)
	}
	b.WriteString("[]" + strings.Repeat("}]", n) + "\n")
	return b.String()
}

// refused parses data, which must fail with an error containing want,
// within most (0: any time) and 64 MiB of allocations.
func refused(t *testing.T, data, want string, most time.Duration) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	cfg, err := ParseConfig("bad.yaml", []byte(data))
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if err == nil || cfg != nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
		msg := fmt.Sprint(err)
		t.Fatalf("got config %v, error %.500s; want one containing %q", cfg != nil, msg, want)
	}
	if len(err.Error()) > 4096 {
		t.Errorf("error of %d bytes, want one short message", len(err.Error()))
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes refused in %v, %d MiB allocated", len(data), took, alloc>>20)
	if most > 0 && took > most || alloc > 64<<20 {
		t.Errorf("took %v and %d MiB, want at most %v and 64 MiB", took, alloc>>20, most)
	}
}

func TestConfigDepth(t *testing.T) {
	// 3,000 levels took 15.8 s and 774 MB before the bounds; now they
	// fail before YAML is decoded, in milliseconds.
	const flow = "bad.yaml:2: [ and { nested more than 64 levels deep, want at most 16 levels of limits or descriptors"
	t.Run("3000 limits deep", func(t *testing.T) { refused(t, deepLimits(3000), flow, 250*time.Millisecond) })
	t.Run("3000 descriptors deep", func(t *testing.T) { refused(t, deepDescriptors(3000), flow, 250*time.Millisecond) })
	t.Run("block style", func(t *testing.T) {
		// Block style is refused by the loader: its size grows with the
		// square of the depth, so the size bound keeps the decoding short.
		var b strings.Builder
		b.WriteString("domain: api\nlimits:\n")
		for i := range 300 {
			ind := strings.Repeat("    ", i)
			fmt.Fprintf(&b, "%s  - name: l%d\n%s    rate: 10/s\n%s    limits:\n", ind, i, ind, ind)
		}
		refused(t, b.String(), "limits: nested more than 16 levels deep, want at most 16 levels of limits", time.Second)
	})
	t.Run("at the bound", func(t *testing.T) {
		for _, src := range []string{deepLimits(maxDepth), deepDescriptors(maxDepth)} {
			if _, err := ParseConfig("ok.yaml", []byte(src)); err != nil {
				t.Errorf("%d levels: %v", maxDepth, err)
			}
		}
	})
	t.Run("flow nesting at the bound", func(t *testing.T) {
		src := head + "limits: [{name: a, rate: 1/s, match: {k: \"" + strings.Repeat("[", 100) + "\"}}] # " + strings.Repeat("{", 100) + "\n"
		if _, err := ParseConfig("ok.yaml", []byte(src)); err != nil {
			t.Errorf("brackets in quotes and comments: %v", err)
		}
		if _, ok := flowNesting([]byte(strings.Repeat("[", maxFlowNesting)+strings.Repeat("]", maxFlowNesting)), maxFlowNesting); !ok {
			t.Errorf("%d levels refused", maxFlowNesting)
		}
	})
	t.Run("one past", func(t *testing.T) {
		want := "bad.yaml:2: limits" + strings.Repeat("[0].limits", maxDepth) +
			": nested more than 16 levels deep, want at most 16 levels of limits"
		if _, err := ParseConfig("bad.yaml", []byte(deepLimits(maxDepth+1))); err == nil || err.Error() != want {
			t.Errorf("got %v\nwant %s", err, want)
		}
	})
}

func TestConfigSize(t *testing.T) {
	var many strings.Builder
	many.WriteString("domain: api\nlimits:\n")
	for i := range maxLimits + 1 {
		fmt.Fprintf(&many, "  - {name: l%d, rate: 1/s}\n", i)
	}
	refused(t, many.String(), "bad.yaml:2: limits: more than 10000 limits, want at most 10000 in a domain", 0)

	var envoy strings.Builder
	envoy.WriteString("domain: api\ndescriptors:\n")
	for i := range maxLimits + 1 {
		fmt.Fprintf(&envoy, "  - {key: k, value: v%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	refused(t, envoy.String(), "bad.yaml:2: descriptors: more than 10000 descriptors, want at most 10000 in a domain", 0)

	refused(t, "domain: api\n#"+strings.Repeat("x", maxConfigBytes)+"\n", "bad.yaml: 16777230 bytes, want at most 16777216 (16 MiB)", 250*time.Millisecond)

	entries := func(n int) string {
		var kv []string
		for i := range n {
			kv = append(kv, fmt.Sprintf("k%d: v", i))
		}
		return "{" + strings.Join(kv, ", ") + "}"
	}
	long := strings.Repeat("x", maxValueLen+1)
	bad := []struct{ yaml, want string }{
		{head + "limits: [{name: a, rate: 1/s, match: " + entries(maxMatchEntries+1) + "}]\n",
			"bad.yaml:3: limits[0].match: 33 entries, want at most 32"},
		{head + "limits: [{name: a, rate: 1/s, match: " + entries(20) + ", limits: [{name: b, rate: 1/s, match: {" +
			strings.ReplaceAll(strings.Trim(entries(13), "{}"), "k", "j") + "}}]}]\n",
			"bad.yaml:3: limits[0].limits[0].match: 33 entries (20 inherited), want at most 32"},
		{head + "limits: [{name: a, rate: 1/s, match: {" + strings.Repeat("k", maxKeyLen+1) + ": v}}]\n",
			"bad.yaml:3: limits[0].match: key of 257 bytes, want at most 256"},
		{head + "limits: [{name: a, rate: 1/s, match: {k: " + long + "}}]\n",
			"bad.yaml:3: limits[0].match.k: value of 1025 bytes, want at most 1024"},
		{head + "limits: [{name: a, rate: 1/s}]\noverrides: [{match: {k: " + long + "}, multiplier: 2}]\n",
			"bad.yaml:4: overrides[0].match.k: value of 1025 bytes, want at most 1024"},
		{head + "plans: {p: {multiplier: 2}}\nassign: [{match: " + entries(maxMatchEntries+1) + ", plan: p}]\nlimits: [{name: a, rate: 1/s}]\n",
			"bad.yaml:4: assign[0].match: 33 entries, want at most 32"},
		{"domain: api\ndescriptors: [{key: k, value: " + long + ", rate_limit: {unit: second, requests_per_unit: 1}}]\n",
			"bad.yaml:2: descriptors[0].rate_limit.match.k: value of 1025 bytes, want at most 1024"},
	}
	for _, tc := range bad {
		if _, err := ParseConfig("bad.yaml", []byte(tc.yaml)); err == nil || err.Error() != tc.want {
			t.Errorf("ParseConfig(%.80q…)\n got: %v\nwant: %s", tc.yaml, err, tc.want)
		}
	}
	// At the bounds.
	ok := head + "limits: [{name: a, rate: 1/s, match: " + entries(maxMatchEntries) + "}, {name: b, rate: 1/s, match: {" +
		strings.Repeat("k", maxKeyLen) + ": " + strings.Repeat("v", maxValueLen) + "}}]\n"
	if _, err := ParseConfig("ok.yaml", []byte(ok)); err != nil {
		t.Errorf("at the bounds: %v", err)
	}
}

// The dynamic path (overrides and plan assignments that coordinator/admin
// writes, checked by Config.WithDynamic and Domain.Validate) keeps the same
// bounds.
func TestDynamicBounds(t *testing.T) {
	cfg, err := ParseConfig("ok.yaml", []byte(head+"plans: {p: {multiplier: 2}}\nlimits: [{name: a, rate: 1/s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	var big Match
	for i := range maxMatchEntries + 1 {
		big = append(big, Entry{Key: fmt.Sprint("k", i), Value: "v"})
	}
	long := Match{{Key: "k", Value: strings.Repeat("x", maxValueLen+1)}}
	dyn := Dynamic{
		Overrides: map[string][]Override{"api": {
			{Match: Match{{Key: "user", Value: "x"}}, Rate: Rate{Amount: MaxAmount, Period: time.Millisecond}},
			{Match: big, Multiplier: 2},
			{Match: long, Multiplier: 2},
			{Match: Match{{Key: "user", Value: "ok"}}, Multiplier: 2},
		}},
		Assignments: map[string][]PlanAssignment{"api": {{Match: big, Plan: "p"}}},
	}
	out, err := cfg.WithDynamic(dyn)
	var ces ConfigErrors
	if !errors.As(err, &ces) || len(ces) != 4 {
		t.Fatalf("got %v, want 4 errors", err)
	}
	for _, want := range []string{
		"rate: rate must be at most 1125899906842624 per second, want an amount of at most 1125899906842 per 1ms",
		"match: 33 entries, want at most 32",
		"match.k: value of 1025 bytes, want at most 1024",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwants %q", err, want)
		}
	}
	if d := out.Domain("api"); len(d.Overrides) != 1 || len(d.Assignments) != 0 {
		t.Errorf("kept %d overrides and %d assignments, want the good override only", len(d.Overrides), len(d.Assignments))
	}
}

// boundsSeeds are fuzz seeds at and past the bounds.
func boundsSeeds() []string {
	return []string{
		deepLimits(maxDepth), deepLimits(maxDepth + 1), deepDescriptors(maxDepth), deepDescriptors(maxDepth + 1),
		head + "limits: [{name: a, rate: 1125899906842/1ms}]\n",
		head + "limits: [{name: a, rate: 1125899906843/1ms}]\n",
		head + "plans: {p: {multiplier: 1000000}}\nassign: [{match: {t: x}, plan: p}]\nlimits: [{name: a, rate: 1G/1ms}]\n",
		limit + "    stale_after: 2h\n",
		head + "limits: [{name: a, rate: 1/s, match: {k: \"[[[[\"}}] # {{{{\n",
	}
}

// checkBounds fails t if an accepted match is past a bound.
func checkBounds(t *testing.T, m Match) {
	t.Helper()
	if len(m) > maxMatchEntries {
		t.Fatalf("match of %d entries accepted", len(m))
	}
	for _, e := range m {
		if len(e.Key) > maxKeyLen || len(e.Value) > maxValueLen {
			t.Fatalf("match entry of %d and %d bytes accepted", len(e.Key), len(e.Value))
		}
	}
}
