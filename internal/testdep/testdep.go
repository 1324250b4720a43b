// Package testdep decides what a test does when something it needs from the
// machine (a program such as redis-server, promtool or chromium) is missing:
// it skips, with a message that starts with Prefix so that the skips can be
// counted (internal/testsummary does), or, when the environment variable CI
// is "true", it fails, since CI is expected to install everything.
package testdep

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Prefix starts every skip and failure message for a missing dependency;
// the dependency's name follows, then a colon.
const Prefix = "missing dependency: "

// CI reports whether the environment variable CI is "true" (in any case),
// as CI services set it.
func CI() bool { return strings.EqualFold(os.Getenv("CI"), "true") }

// Require does nothing when ok. Otherwise it skips the test, or fails it
// when CI is "true", with "missing dependency: what: hint"; hint says how
// to install what.
func Require(t testing.TB, what, hint string, ok bool) {
	t.Helper()
	if ok {
		return
	}
	msg := Message(what, hint)
	if CI() {
		t.Fatalf("%s (CI=true: a missing dependency fails the run)", msg)
		return
	}
	t.Skip(msg)
}

// LookPath returns the path of the program name, or of the first of
// alternatives found when name is not in PATH; when none is, it Requires
// name (skips or, under CI, fails).
func LookPath(t testing.TB, name, hint string, alternatives ...string) string {
	t.Helper()
	for _, n := range append([]string{name}, alternatives...) {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	Require(t, name, hint, false)
	return ""
}

// Message is the text of a missing dependency's skip.
func Message(what, hint string) string {
	if hint == "" {
		return Prefix + what
	}
	return Prefix + what + ": " + hint
}

// Parse returns the dependency named by a skip message that starts with
// Prefix (its text up to the first colon), and whether it does.
func Parse(msg string) (what string, ok bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(msg), Prefix)
	if !ok {
		return "", false
	}
	what, _, _ = strings.Cut(rest, ":")
	what = strings.TrimSpace(what)
	return what, what != ""
}

// Long skips a slow test (real processes, several builds) under
// go test -short, with why; under CI=true it runs whatever the flags, so
// that CI never skips it.
func Long(t testing.TB, why string) {
	t.Helper()
	if testing.Short() && !CI() {
		t.Skip(why)
	}
}
