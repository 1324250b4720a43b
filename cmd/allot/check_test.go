package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeCheckArgs are the arguments of the README's allot check example.
func readmeCheckArgs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go run \./cmd/allot (check [^#\n]*)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md: no `go run ./cmd/allot check ...` line")
	}
	return strings.Fields(string(m[1]))
}

// TestCheckOutput: allot check names the limits it runs and where (the
// built-in example or --config, locally on a virtual clock, not a running
// allot dev), says what each number means, and the README's example
// shows a rejection.
func TestCheckOutput(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 3/1h, burst: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	local := []string{"run locally in one in-memory engine", "on a virtual clock", "A running allot dev is not asked"}
	columns := []string{"Columns: at = virtual time since the first request; retry_after = when the same request would pass;",
		"LIMIT left/N = what LIMIT has left after the request, of N"}
	builtIn := "against the built-in example limits (deploy/examples/limits.yaml)"
	for _, c := range []struct {
		name   string
		args   []string
		want   []string
		reject bool // at least one row is a rejection
	}{
		{
			name: "the README's example", args: readmeCheckArgs(t), reject: true,
			want: append([]string{builtIn, "#   at     decision      retry_after  per-user left/15",
				`per-user: 30/s, burst 15, token_bucket: "left" is the tokens in the bucket after the request, of 15 (refilled at 30/s)`,
				"20 requests: 17 admitted, 3 rejected (429)"}, columns...),
		},
		{
			name: "the README's former example: 20/s under a limit of 30/s", args: []string{"check", "--descriptor", "user=1", "--count", "20", "--interval", "50ms"},
			want: append([]string{builtIn, "per-user left/15", "20 requests: 20 admitted, 0 rejected (429)"}, columns...),
		},
		{
			name: "the defaults: two limits, all at once", args: []string{"check"},
			want: []string{builtIn, "8 requests for tenant=globex,user=42 in domain api (1 hit each), all at once",
				"per-user left/15  per-tenant left/1000", "per-tenant: 1000/m, burst 1000, token_bucket"},
		},
		{
			name: "a plan and an override scale the burst", args: []string{"check", "--descriptor", "tenant=acme,user=vip", "--count", "1"},
			want: []string{"per-user: 1500/s, burst 750, token_bucket", "per-user left/750"},
		},
		{
			name: "a sliding window", args: []string{"check", "--descriptor", "route=/login,ip=1", "--count", "6", "--interval", "1s"}, reject: true,
			want: []string{`login-attempts: 5/m, sliding_window: "left" is what the current window of 1m still admits after the request, of 5`,
				"login-attempts left/5", "6 requests: 5 admitted, 1 rejected (429)"},
		},
		{
			name: "--config", args: []string{"check", "--config", cfg, "--descriptor", "user=1", "--count", "3", "--interval", "1s"}, reject: true,
			want: append([]string{"against the limits in " + cfg + " (--config)", "per-user: 3/h, burst 2, token_bucket", "per-user left/2",
				"3 requests: 2 admitted, 1 rejected (429)"}, columns...),
		},
		{
			name: "no limit matches", args: []string{"check", "--descriptor", "x=1", "--count", "2"},
			want: []string{builtIn, "No limit of domain api matches x=1: every request is admitted.", "no limit matches", "2 requests: 2 admitted, 0 rejected (429)"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if err := run(t.Context(), c.args, &out, &errb); err != nil {
				t.Fatalf("allot %s: %v\n%s", strings.Join(c.args, " "), err, errb.String())
			}
			got := out.String()
			for _, want := range append(c.want, local...) {
				if !strings.Contains(got, want) {
					t.Errorf("output lacks %q", want)
				}
			}
			if rejected := regexp.MustCompile(`(?m)^\d+\s+\+\S+\s+REJECT \(429\)\s+\d\S*\s+.*✗`).MatchString(got); rejected != c.reject {
				t.Errorf("a row rejected with a retry_after and ✗: %v, want %v", rejected, c.reject)
			}
			if t.Failed() {
				t.Logf("allot %s:\n%s", strings.Join(c.args, " "), got)
			}
		})
	}
}
