// Package chromiumtest loads pages in headless Chromium for tests, as
// allot demo's dashboard test does (cmd/allot/demo_test.go): Debian's
// chromium, run with --dump-dom, which prints the DOM once the page's
// scripts have run for a budget of virtual time. A machine without
// Chromium skips the test (fails it under CI=true, internal/testdep).
package chromiumtest

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testdep"
)

// Hint says how to install Chromium, in the skip message.
const Hint = "Debian: apt-get install -y chromium; .ci/run installs it"

// Path returns the path of a Chromium that can run headless, or skips the
// test (fails it under CI=true).
func Path(t testing.TB) string {
	t.Helper()
	return testdep.LookPath(t, "chromium", Hint, "chromium-browser", "google-chrome")
}

// DumpDOM loads url in headless Chromium (Path) with a window of width ×
// height pixels, lets its scripts run for budget of virtual time, and
// returns the DOM it then holds. It fails t if Chromium fails or takes
// more than a minute.
func DumpDOM(t testing.TB, url string, width, height int, budget time.Duration) string {
	t.Helper()
	browser := Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(),
		"--window-size="+strconv.Itoa(width)+","+strconv.Itoa(height),
		"--virtual-time-budget="+strconv.FormatInt(budget.Milliseconds(), 10), "--dump-dom", url)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s --dump-dom %s: %v\n%s", browser, url, err, stderr.String())
	}
	return string(dom)
}
