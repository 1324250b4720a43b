package testdep

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		msg, what string
		ok        bool
	}{
		{Message("redis-server", "apt-get install redis-server"), "redis-server", true},
		{Message("chromium", ""), "chromium", true},
		{"missing dependency: promtool: x: y (CI=true)", "promtool", true},
		{"runs a cluster", "", false},
		{"missing dependency: ", "", false},
	} {
		what, ok := Parse(c.msg)
		if what != c.what || ok != c.ok {
			t.Errorf("Parse(%q) = %q, %v; want %q, %v", c.msg, what, ok, c.what, c.ok)
		}
	}
}

// recorder is a testing.TB that records a skip or a failure instead of
// ending the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestRequire(t *testing.T) {
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	Require(r, "promtool", "apt-get install prometheus", true)
	if r.skipped != "" || r.failed != "" {
		t.Fatalf("present: skipped %q, failed %q", r.skipped, r.failed)
	}
	Require(r, "promtool", "apt-get install prometheus", false)
	if r.skipped != "missing dependency: promtool: apt-get install prometheus" || r.failed != "" {
		t.Errorf("missing: skipped %q, failed %q", r.skipped, r.failed)
	}

	t.Setenv("CI", "true")
	r = &recorder{TB: t}
	Require(r, "promtool", "apt-get install prometheus", false)
	if r.skipped != "" || !strings.HasPrefix(r.failed, "missing dependency: promtool: apt-get install prometheus (CI=true") {
		t.Errorf("missing under CI: skipped %q, failed %q", r.skipped, r.failed)
	}
}

func TestLookPath(t *testing.T) {
	t.Setenv("CI", "true")
	sh, err := exec.LookPath("sh")
	Require(t, "sh", "install a POSIX shell", err == nil)
	r := &recorder{TB: t}
	if p := LookPath(r, "no-such-program-allot", "hint", "sh"); p != sh || r.failed != "" {
		t.Errorf("alternative: %q, failed %q", p, r.failed)
	}
	if p := LookPath(r, "no-such-program-allot", "hint"); p != "" || r.failed == "" {
		t.Errorf("missing under CI: %q, failed %q", p, r.failed)
	}
}
