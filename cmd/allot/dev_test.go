package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/internal/testdep"
)

// devRun is allot dev running in-process.
type devRun struct {
	out, errs demoOutput
	stop      context.CancelFunc
	finished  chan struct{}
	err       error
}

// startDevRun runs allot dev on free ports with args until it has
// printed its banner. end stops it (the test's cleanup does too).
func startDevRun(t *testing.T, args ...string) *devRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &devRun{stop: cancel, finished: make(chan struct{})}
	args = append([]string{"dev", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--coordinator-addr", "127.0.0.1:0", "--etcd-addr", "127.0.0.1:0", "--rebalance-period", "250ms", "--report-interval", "250ms"}, args...)
	go func() {
		d.err = run(ctx, args, &d.out, &d.errs)
		close(d.finished)
	}()
	t.Cleanup(func() { d.end(t) })
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(d.out.String(), "Stop with Ctrl-C.") {
		select {
		case <-d.finished:
			t.Fatalf("allot %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), d.err, d.out.String(), d.errs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("allot %s: no banner after 30s\nstderr:\n%s", strings.Join(args, " "), d.errs.String())
		}
	}
	return d
}

// end stops allot dev and waits until it has returned.
func (d *devRun) end(t *testing.T) {
	t.Helper()
	d.stop()
	select {
	case <-d.finished:
		if d.err != nil {
			t.Errorf("allot dev: %v", d.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("allot dev still running 30s after it was stopped")
	}
}

// banner returns the address after label in d's banner.
func (d *devRun) banner(t *testing.T, label string) string {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(label) + `\s+(\S+)`).FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("banner lacks %q:\n%s", label, d.out.String())
	}
	return m[1]
}

// devStore connects to the embedded etcd of d.
func devStore(t *testing.T, d *devRun) *etcdstore.Store {
	t.Helper()
	cli, err := etcdClient(d.banner(t, "etcd (embedded)"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return etcdstore.New(cli, "")
}

// TestDevDataDirKeepsTheConfiguration: allot dev --data-dir D, restarted,
// keeps the configuration version in force in D (one applied after the
// first start, not the built-in example seeded again) and its overrides;
// --config FILE still stores FILE as a new version; without --data-dir
// the banner says that nothing is kept.
func TestDevDataDirKeepsTheConfiguration(t *testing.T) {
	testdep.Long(t, "starts allot dev three times")
	dir := filepath.Join(t.TempDir(), "etcd")
	changed := strings.Replace(string(examples.LimitsYAML), "burst: 15", "burst: 16", 1)

	first := startDevRun(t, "--data-dir", dir)
	for _, want := range []string{"configuration version 1 in etcd", "state kept in " + dir + " (--data-dir)", "Try it: user 42"} {
		if !strings.Contains(first.out.String(), want) {
			t.Errorf("first start: banner lacks %q:\n%s", want, first.out.String())
		}
	}
	store := devStore(t, first)
	ctx := t.Context()
	if _, err := store.ApplyConfig(ctx, 1, etcdstore.ConfigVersion{Time: time.Now(), Author: "test", YAML: changed}); err != nil {
		t.Fatal(err)
	}
	o := etcdstore.Override{Domain: "api", Override: allot.Override{Match: allot.Match{{Key: "user", Value: "42"}}, Multiplier: 5,
		Expires: time.Now().Add(time.Hour)}, Author: "test", Created: time.Now()}
	if err := store.PutOverride(ctx, o, time.Hour); err != nil {
		t.Fatal(err)
	}
	first.end(t)

	second := startDevRun(t, "--data-dir", dir)
	for _, want := range []string{"enforcing etcd:config@2, configuration version 2 in etcd",
		"state kept in " + dir + " (--data-dir): version 2 is the configuration an earlier run left in force",
		"The configuration kept in " + dir + " is in force"} {
		if !strings.Contains(second.out.String(), want) {
			t.Errorf("restart: banner lacks %q:\n%s", want, second.out.String())
		}
	}
	store = devStore(t, second)
	cur, err := store.Version(ctx, 0)
	if err != nil || cur.Version != 2 || cur.YAML != changed {
		t.Errorf("restart: current version %d (%v), YAML kept %v: want version 2, the applied YAML", cur.Version, err, cur.YAML == changed)
	}
	if ovs, err := store.Overrides(ctx, "api"); err != nil || len(ovs) != 1 || ovs[0].Multiplier != 5 {
		t.Errorf("restart: overrides %+v (%v), want user=42 ×5", ovs, err)
	}
	// The regions enforce version 2.
	us := strings.TrimPrefix(second.banner(t, "HTTP"), "http://")
	waitFor(t, 10*time.Second, "region at config v2", func() bool { return configVersionOf(t, us) == "2" })
	second.end(t)

	// --config names a file: it is stored as a new version, as before.
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, examples.LimitsYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	third := startDevRun(t, "--data-dir", dir, "--config", file)
	if want := "enforcing " + file + ", configuration version 3 in etcd"; !strings.Contains(third.out.String(), want) {
		t.Errorf("restart with --config: banner lacks %q:\n%s", want, third.out.String())
	}
	third.end(t)
}

// configVersionOf reads the configuration version a region's status page
// at addr shows, or "".
func configVersionOf(t *testing.T, addr string) string {
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`configuration version (\d+)`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// TestDevBanner: the banner says whether allot dev keeps its state.
func TestDevBanner(t *testing.T) {
	cfg, err := loadConfig("")
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*regionNode{{name: "us-east", grpcAddr: "127.0.0.1:8081", httpAddr: "127.0.0.1:8080"}}
	for _, c := range []struct {
		name    string
		c       devCluster
		want    []string
		notWant []string
	}{
		{"ephemeral", devCluster{cfg: cfg, nodes: nodes, version: 1},
			[]string{"configuration version 1 in etcd", "ephemeral: etcd's data (configuration versions, overrides, plans, shares) is removed at exit",
				"the next start is back at version 1. --data-dir DIR keeps it across restarts.", "Try it: user 42"}, []string{"state kept"}},
		{"a new data dir", devCluster{cfg: cfg, nodes: nodes, version: 1, dataDir: "/d"},
			[]string{"state kept in /d (--data-dir): configuration versions, overrides, plans and shares survive a restart", "Try it: user 42"},
			[]string{"ephemeral"}},
		{"the example kept", devCluster{cfg: cfg, nodes: nodes, version: 1, dataDir: "/d", kept: true},
			[]string{"state kept in /d (--data-dir): version 1 is the configuration an earlier run left in force", "Try it: user 42"},
			[]string{"ephemeral"}},
		{"another configuration kept", devCluster{cfg: &allot.Config{Source: "etcd:config@4"}, nodes: nodes, version: 4, dataDir: "/d", kept: true},
			[]string{"enforcing etcd:config@4, configuration version 4", "The configuration kept in /d is in force"},
			[]string{"ephemeral", "Try it"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			printDev(&b, &c.c)
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("banner lacks %q", w)
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(b.String(), w) {
					t.Errorf("banner has %q", w)
				}
			}
			if t.Failed() {
				t.Logf("banner:\n%s", b.String())
			}
		})
	}
}

// TestRegionOnceInLogLines: every log line of a region names it once,
// though the server and the Enforcer add the region to their logger too.
func TestRegionOnceInLogLines(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 3/1h}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs demoOutput
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"regional", "--insecure", "--config", cfg, "--region", "us-east", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--log-level", "debug"}, &out, &errs)
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(15 * time.Second):
			t.Error("allot regional still running 15s after it was stopped")
		}
	}()
	var addr string
	waitFor(t, 10*time.Second, "HTTP address", func() bool {
		m := regexp.MustCompile(`HTTP\s+http://(\S+)`).FindStringSubmatch(out.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	// The server logs an unknown domain at debug level.
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(`{"domain":"nope","descriptors":[{"user":"1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, 5*time.Second, `"check refused" log line`, func() bool { return strings.Contains(errs.String(), `msg="check refused"`) })
	lines := strings.Split(strings.TrimSpace(errs.String()), "\n")
	for _, msg := range []string{`msg=serving`, `msg="check refused"`} {
		found := false
		for _, l := range lines {
			if strings.Contains(l, msg) {
				found = true
				if n := strings.Count(l, "region=us-east"); n != 1 {
					t.Errorf("%d region=us-east in %q, want 1", n, l)
				}
			}
		}
		if !found {
			t.Errorf("no %s line in:\n%s", msg, errs.String())
		}
	}
	for _, l := range lines {
		if strings.Count(l, "region=") > 1 {
			t.Errorf("region more than once: %q", l)
		}
	}
}
