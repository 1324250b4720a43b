package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/deploy/local"
	"github.com/allot-dev/allot/internal/testdep"
)

// TestChaos runs the local cluster of real processes under load while
// the chaos schedule kills the leader, partitions a region, kills a
// Redis, slows another and restarts an instance, and checks the
// decision log (see Run and Check).
//
// The short form (45s of load, about two minutes in all) runs in go test
// ./...; ALLOT_CHAOS_DURATION=10m runs the long form (make chaos), and
// ALLOT_CHAOS_SCALE scales the traffic. ALLOT_CHAOS_DIR keeps the run's
// folder (logs, decisions.jsonl, events.jsonl, report.md);
// ALLOT_CHAOS_LOG_LEVEL=debug makes the processes' logs verbose;
// ALLOT_CHAOS_INSTANCES sets the enforcers per region (default 2);
// ALLOT_CHAOS_DEADLINE the requests' deadline (default 1s). Every
// violation fails the test.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of 12 processes for a minute or more")
	}
	testdep.LookPath(t, "redis-server", "apt-get install redis-server; .ci/run installs it")
	d := 45 * time.Second
	if s := os.Getenv("ALLOT_CHAOS_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d < 20*time.Second {
			t.Fatalf("ALLOT_CHAOS_DURATION=%q: want a duration of at least 20s (%v)", s, err)
		}
	}
	scale := 1.0
	if s := os.Getenv("ALLOT_CHAOS_SCALE"); s != "" {
		var err error
		if scale, err = strconv.ParseFloat(s, 64); err != nil || scale <= 0 {
			t.Fatalf("ALLOT_CHAOS_SCALE=%q: want a positive number", s)
		}
	}
	instances := 0
	if s := os.Getenv("ALLOT_CHAOS_INSTANCES"); s != "" {
		var err error
		if instances, err = strconv.Atoi(s); err != nil || instances < 1 {
			t.Fatalf("ALLOT_CHAOS_INSTANCES=%q: want a positive number", s)
		}
	}
	var deadline time.Duration
	if s := os.Getenv("ALLOT_CHAOS_DEADLINE"); s != "" {
		var err error
		if deadline, err = time.ParseDuration(s); err != nil || deadline <= 0 {
			t.Fatalf("ALLOT_CHAOS_DEADLINE=%q: want a positive duration", s)
		}
	}
	dir := os.Getenv("ALLOT_CHAOS_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else if err := clearRunDir(dir); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "allot")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/allot").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), d+4*time.Minute)
	defer cancel()
	var res *Result
	var err error
	for attempt := 1; ; attempt++ {
		// Mutual TLS on every link, as allot cluster up runs; plain text
		// with ALLOT_CHAOS_TLS=0. (It ran plain text by default while the
		// shared-mode bound did not hold for simultaneous bursts, issue
		// 16's item 6, and the store timeout was 40 ms.)
		res, err = Run(ctx, Options{Bin: bin, Config: "testdata/limits.yaml", Dir: dir, Duration: d, Scale: scale, Instances: instances, Deadline: deadline, LogLevel: os.Getenv("ALLOT_CHAOS_LOG_LEVEL"),
			Progress: &testWriter{t: t}, Seed: uint64(time.Now().UnixNano()), Insecure: os.Getenv("ALLOT_CHAOS_TLS") == "0"})
		// The cluster's free ports are chosen before its processes
		// listen; a test running beside this one may take one meanwhile.
		// Nothing has run yet then: start again on other ports.
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || attempt == 3 {
			break
		}
		t.Logf("attempt %d: %v; starting again on other ports", attempt, err)
		if cerr := clearRunDir(dir); cerr != nil {
			t.Fatal(cerr)
		}
	}
	if err != nil {
		logTails(t, filepath.Join(dir, "cluster"))
		t.Fatal(err)
	}
	t.Logf("summary (decision log %s):\n%s", res.Decisions, res.Report.Table())
	if len(res.Report.Violations) > 0 {
		logTails(t, filepath.Join(dir, "cluster"))
	}
	for _, v := range res.Report.Violations {
		t.Error(v)
	}
}

// clearRunDir empties dir of an earlier run's files; it refuses a folder
// that holds anything else.
func clearRunDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	ours := map[string]bool{"cluster": true, "decisions.jsonl": true, "events.jsonl": true, "report.md": true}
	for _, e := range ents {
		if !ours[e.Name()] {
			return fmt.Errorf("ALLOT_CHAOS_DIR=%s holds %s, not a chaos run's file: name a new or empty folder", dir, e.Name())
		}
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// logTails logs the end of every process's log.
func logTails(t *testing.T, clusterDir string) {
	c, err := local.Load(clusterDir)
	if err != nil {
		return
	}
	for _, p := range c.Procs {
		b, err := os.ReadFile(p.Log)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		t.Logf("%s (%s), last lines:\n%s", p.Name, p.Log, strings.Join(lines, "\n"))
	}
}

// testWriter sends each line written to t.Log.
type testWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.t.Log(strings.TrimSuffix(line, "\n"))
	}
}
