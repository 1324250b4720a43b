package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/demo"
	"github.com/allot-dev/allot/internal/testdep"
)

// demoOutput is a bytes.Buffer safe for concurrent use: the demo writes
// its view from its own goroutine while the test reads.
type demoOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *demoOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *demoOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// demoArgs are allot demo's flags on free ports, with quick rebalancing.
func demoArgs(extra ...string) []string {
	return append([]string{"demo", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--coordinator-addr", "127.0.0.1:0", "--etcd-addr", "127.0.0.1:0", "--dashboard-addr", "127.0.0.1:0",
		"--rebalance-period", "250ms", "--report-interval", "250ms"}, extra...)
}

// demoRun is allot demo running in-process.
type demoRun struct {
	out, errs demoOutput
	stop      context.CancelFunc
	finished  chan struct{}
	err       error // run's result, once finished
}

// wait waits up to timeout for run to return, and reports its result.
func (d *demoRun) wait(timeout time.Duration) (err error, returned bool) {
	select {
	case <-d.finished:
		return d.err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// startDemo runs allot demo in-process until the test ends.
func startDemo(t *testing.T, args ...string) *demoRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &demoRun{stop: cancel, finished: make(chan struct{})}
	go func() {
		d.err = run(ctx, demoArgs(args...), &d.out, &d.errs)
		close(d.finished)
	}()
	t.Cleanup(func() {
		cancel()
		if _, ok := d.wait(30 * time.Second); !ok {
			t.Error("allot demo still running 30s after it was stopped")
		}
		if t.Failed() {
			t.Logf("stderr:\n%s", d.errs.String())
		}
	})
	return d
}

var dashboardLine = regexp.MustCompile(`dashboard\s+(http://\S+/)`)

// waitFor polls cond every 50ms until it holds, or fails the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDemoOncePlaysTheStoryAndExits(t *testing.T) {
	t.Parallel()
	d := startDemo(t, "--once", "--speed", "40", "--interval", "100ms")
	err, returned := d.wait(50 * time.Second)
	switch {
	case !returned:
		t.Fatalf("allot demo --once --speed 40 (a 3 s story) still running after 50s:\n%s", d.out.String())
	case err != nil:
		t.Fatalf("allot demo --once: %v\n%s", err, d.out.String())
	}
	view := d.out.String()
	for _, want := range []string{"allot demo: 3 regions", "region ap-south", "dashboard        http://127.0.0.1:",
		"Playing a story of 3s (--speed 40).", "Chapter 1 of 6: Steady traffic", "api/per-user{user=42}",
		"llm/per-tenant-tokens", "Chapter 6 of 6: Calm (the end)"} {
		if !strings.Contains(view, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(view, "\x1b[") {
		t.Error("ANSI sequences written to a buffer; want plain lines when stdout is not a terminal")
	}
	if t.Failed() {
		t.Logf("output:\n%s", view)
	}
}

func TestDemoFlags(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--speed", "0"},
		{"demo", "--speed", "-1"},
		{"demo", "--interval", "1ms"},
		{"demo", "extra"},
		{"demo", "--dashboard-addr", "nowhere"},
	} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%v: want an error", args)
		}
	}
}

// chromium returns the path of a Chromium that can run headless, or
// skips the test (fails it under CI=true).
func chromium(t *testing.T) string {
	t.Helper()
	return testdep.LookPath(t, "chromium", "Debian: apt-get install -y chromium; the dashboard is not loaded in a browser",
		"chromium-browser", "google-chrome")
}

func TestDemoDashboardRendersInChromium(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	d := startDemo(t, "--speed", "8", "--interval", "250ms")
	var url string
	waitFor(t, 40*time.Second, "dashboard address in the output", func() bool {
		m := dashboardLine.FindStringSubmatch(d.out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})
	// Wait until the series has traffic, so that the charts have lines.
	waitFor(t, 30*time.Second, "sample with admitted requests", func() bool {
		resp, err := http.Get(url + "api/series")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var snap demo.Snapshot
		if json.NewDecoder(resp.Body).Decode(&snap) != nil {
			return false
		}
		for _, s := range snap.Samples {
			for _, v := range s.Admitted["api/per-user"] {
				if v > 0 {
					return true
				}
			}
		}
		return false
	})

	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=3000", "--dump-dom", url)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s --dump-dom: %v\n%s", browser, err, stderr.String())
	}
	page := string(dom)

	// The page drew every limit's charts from the series: polylines with
	// points, and each chart's point count.
	samples := regexp.MustCompile(`id="charts" data-samples="(\d+)"`).FindStringSubmatch(page)
	if samples == nil || samples[1] == "0" {
		t.Errorf("charts drew no sample (data-samples %v)", samples)
	}
	points := 0
	for _, m := range regexp.MustCompile(`<svg[^>]*data-points="(\d+)"`).FindAllStringSubmatch(page, -1) {
		n, _ := strconv.Atoi(m[1])
		points += n
	}
	lines := regexp.MustCompile(`<polyline[^>]*points="[-0-9.]+,[-0-9.]+ `).FindAllString(page, -1)
	if points == 0 || len(lines) == 0 {
		t.Errorf("charts: %d points, %d polylines with points; want some", points, len(lines))
	}
	for _, limit := range []string{"api/per-user", "api/per-user{user=42}", "llm/per-tenant-tokens"} {
		if !strings.Contains(page, `data-limit="`+limit+`"`) {
			t.Errorf("no charts for %s", limit)
		}
	}
	if t.Failed() {
		t.Logf("DOM (%d bytes): %.3000s", len(dom), page)
	}

	d.stop() // Ctrl-C
	if err, returned := d.wait(30 * time.Second); !returned || err != nil {
		t.Errorf("allot demo after Ctrl-C: returned %v, err %v; want nil", returned, err)
	}
}
