package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// stream is go test -json's output (Go 1.26) for: a package with a
// passing test, a failing subtest, a -short skip and a missing-dependency
// skip; a package whose test binary does not build; one without test
// files; a package with a test that passes and a subtest that skips for
// another missing dependency; and a package whose test timed out.
const stream = `{"ImportPath":"ex/b [ex/b.test]","Action":"build-output","Output":"# ex/b [ex/b.test]\n"}
{"ImportPath":"ex/b [ex/b.test]","Action":"build-output","Output":"b/b_test.go:5:28: undefined: undefined\n"}
{"ImportPath":"ex/b [ex/b.test]","Action":"build-fail"}
{"Action":"start","Package":"ex/a"}
{"Action":"run","Package":"ex/a","Test":"TestPass"}
{"Action":"output","Package":"ex/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"output","Package":"ex/a","Test":"TestPass","Output":"    a_test.go:8: quiet\n"}
{"Action":"output","Package":"ex/a","Test":"TestPass","Output":"--- PASS: TestPass (0.00s)\n"}
{"Action":"pass","Package":"ex/a","Test":"TestPass","Elapsed":0}
{"Action":"run","Package":"ex/a","Test":"TestFail"}
{"Action":"output","Package":"ex/a","Test":"TestFail","Output":"=== RUN   TestFail\n"}
{"Action":"run","Package":"ex/a","Test":"TestFail/sub"}
{"Action":"output","Package":"ex/a","Test":"TestFail/sub","Output":"=== RUN   TestFail/sub\n"}
{"Action":"output","Package":"ex/a","Test":"TestFail/sub","Output":"    a_test.go:10: boom\n"}
{"Action":"output","Package":"ex/a","Test":"TestFail/sub","Output":"        second line\n"}
{"Action":"output","Package":"ex/a","Test":"TestFail/sub","Output":"--- FAIL: TestFail/sub (0.00s)\n"}
{"Action":"fail","Package":"ex/a","Test":"TestFail/sub","Elapsed":0}
{"Action":"run","Package":"ex/a","Test":"TestFail/ok"}
{"Action":"output","Package":"ex/a","Test":"TestFail/ok","Output":"=== RUN   TestFail/ok\n"}
{"Action":"output","Package":"ex/a","Test":"TestFail/ok","Output":"--- PASS: TestFail/ok (0.00s)\n"}
{"Action":"pass","Package":"ex/a","Test":"TestFail/ok","Elapsed":0}
{"Action":"output","Package":"ex/a","Test":"TestFail","Output":"--- FAIL: TestFail (0.00s)\n"}
{"Action":"fail","Package":"ex/a","Test":"TestFail","Elapsed":0}
{"Action":"run","Package":"ex/a","Test":"TestShort"}
{"Action":"output","Package":"ex/a","Test":"TestShort","Output":"=== RUN   TestShort\n"}
{"Action":"output","Package":"ex/a","Test":"TestShort","Output":"    a_test.go:13: runs a cluster\n"}
{"Action":"output","Package":"ex/a","Test":"TestShort","Output":"--- SKIP: TestShort (0.00s)\n"}
{"Action":"skip","Package":"ex/a","Test":"TestShort","Elapsed":0}
{"Action":"run","Package":"ex/a","Test":"TestRedis"}
{"Action":"output","Package":"ex/a","Test":"TestRedis","Output":"=== RUN   TestRedis\n"}
{"Action":"output","Package":"ex/a","Test":"TestRedis","Output":"    a_test.go:14: missing dependency: redis-server: apt-get install redis-server\n"}
{"Action":"output","Package":"ex/a","Test":"TestRedis","Output":"--- SKIP: TestRedis (0.00s)\n"}
{"Action":"skip","Package":"ex/a","Test":"TestRedis","Elapsed":0}
{"Action":"output","Package":"ex/a","Output":"FAIL\n"}
{"Action":"output","Package":"ex/a","Output":"FAIL\tex/a\t0.005s\n"}
{"Action":"fail","Package":"ex/a","Elapsed":0.006}
{"Action":"start","Package":"ex/b"}
{"Action":"output","Package":"ex/b","Output":"FAIL\tex/b [build failed]\n"}
{"Action":"fail","Package":"ex/b","Elapsed":0,"FailedBuild":"ex/b [ex/b.test]"}
{"Action":"start","Package":"ex/c"}
{"Action":"output","Package":"ex/c","Output":"?   \tex/c\t[no test files]\n"}
{"Action":"skip","Package":"ex/c","Elapsed":0}
{"Action":"start","Package":"ex/d"}
{"Action":"run","Package":"ex/d","Test":"TestMetrics"}
{"Action":"output","Package":"ex/d","Test":"TestMetrics","Output":"=== RUN   TestMetrics\n"}
{"Action":"run","Package":"ex/d","Test":"TestMetrics/promtool"}
{"Action":"output","Package":"ex/d","Test":"TestMetrics/promtool","Output":"=== RUN   TestMetrics/promtool\n"}
{"Action":"output","Package":"ex/d","Test":"TestMetrics/promtool","Output":"    d_test.go:30: missing dependency: promtool: apt-get install prometheus\n"}
{"Action":"output","Package":"ex/d","Test":"TestMetrics/promtool","Output":"--- SKIP: TestMetrics/promtool (0.00s)\n"}
{"Action":"skip","Package":"ex/d","Test":"TestMetrics/promtool","Elapsed":0}
{"Action":"output","Package":"ex/d","Test":"TestMetrics","Output":"--- PASS: TestMetrics (0.00s)\n"}
{"Action":"pass","Package":"ex/d","Test":"TestMetrics","Elapsed":0}
{"Action":"output","Package":"ex/d","Output":"PASS\n"}
{"Action":"output","Package":"ex/d","Output":"ok  \tex/d\t0.005s\n"}
{"Action":"pass","Package":"ex/d","Elapsed":0.005}
{"Action":"start","Package":"ex/f"}
{"Action":"run","Package":"ex/f","Test":"TestHang"}
{"Action":"output","Package":"ex/f","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"ex/f","Test":"TestHang","Output":"    f_test.go:5: hanging\n"}
{"Action":"output","Package":"ex/f","Test":"TestHang","Output":"panic: test timed out after 2s\n"}
{"Action":"output","Package":"ex/f","Output":"FAIL\tex/f\t2.004s\n"}
{"Action":"fail","Package":"ex/f","Elapsed":2.004}
`

func TestSummarizer(t *testing.T) {
	var out bytes.Buffer
	s := NewSummarizer(&out)
	if err := s.Read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	s.Finish()
	want := `# ex/b [ex/b.test]
b/b_test.go:5:28: undefined: undefined
--- FAIL: TestFail (0.00s)
    --- FAIL: TestFail/sub (0.00s)
        a_test.go:10: boom
            second line
FAIL
FAIL	ex/a	0.005s
FAIL	ex/b [build failed]
?   	ex/c	[no test files]
ok  	ex/d	0.005s
--- FAIL: TestHang (did not finish)
    f_test.go:5: hanging
panic: test timed out after 2s
FAIL	ex/f	2.004s
`
	if got := out.String(); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
	// passed: TestPass, TestFail/ok, TestMetrics; failed: TestFail/sub,
	// TestFail, TestHang; skipped: TestShort, TestRedis, TestMetrics/promtool
	if s.Passed != 3 || s.Failed != 3 || s.Skipped != 3 {
		t.Errorf("passed, failed, skipped = %d, %d, %d; want 3, 3, 3", s.Passed, s.Failed, s.Skipped)
	}
	if !slices.Equal(s.BuildFailed, []string{"ex/b"}) || len(s.PackageFailed) != 0 {
		t.Errorf("build failed %v, package failed %v", s.BuildFailed, s.PackageFailed)
	}
	if s.OK() {
		t.Error("OK with failures")
	}
	wantLines := []string{
		"3 passed, 3 failed, 3 skipped, 1 package failed to build (ex/b)",
		"skipped for missing dependencies: 2 (promtool: 1, redis-server: 1)",
	}
	if got := s.Lines(); !slices.Equal(got, wantLines) {
		t.Errorf("lines:\n%q\nwant:\n%q", got, wantLines)
	}
}

func TestSummarizerPassing(t *testing.T) {
	var out bytes.Buffer
	s := NewSummarizer(&out)
	in := `go: downloading example.com/x v1.0.0
{"Action":"run","Package":"ex/d","Test":"TestD"}
{"Action":"output","Package":"ex/d","Test":"TestD","Output":"--- PASS: TestD (0.00s)\n"}
{"Action":"pass","Package":"ex/d","Test":"TestD"}
{"Action":"output","Package":"ex/d","Output":"PASS\n"}
{"Action":"output","Package":"ex/d","Output":"ok  \tex/d\t0.005s\n"}
{"Action":"pass","Package":"ex/d"}
`
	if err := s.Read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	s.Finish()
	if want := "go: downloading example.com/x v1.0.0\nok  \tex/d\t0.005s\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	if !s.OK() || !slices.Equal(s.Lines(), []string{"1 passed, 0 failed, 0 skipped"}) {
		t.Errorf("OK %v, lines %q", s.OK(), s.Lines())
	}
}

// A package that fails with no failing test (TestMain, a crash before the
// tests), and a stream cut short, count as failures.
func TestSummarizerPackageFailures(t *testing.T) {
	var out bytes.Buffer
	s := NewSummarizer(&out)
	in := `{"Action":"output","Package":"ex/m","Output":"setup: no database\n"}
{"Action":"output","Package":"ex/m","Output":"FAIL\tex/m\t0.001s\n"}
{"Action":"fail","Package":"ex/m"}
{"Action":"run","Package":"ex/k","Test":"TestK"}
{"Action":"output","Package":"ex/k","Test":"TestK","Output":"    k_test.go:3: working\n"}
`
	if err := s.Read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	s.Finish()
	want := "setup: no database\nFAIL\tex/m\t0.001s\n--- FAIL: TestK (did not finish)\n    k_test.go:3: working\n"
	if out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	if s.OK() || s.Failed != 1 || !slices.Equal(s.PackageFailed, []string{"ex/m"}) {
		t.Errorf("OK %v, failed %d, package failed %v", s.OK(), s.Failed, s.PackageFailed)
	}
	if got, want := s.Lines()[0], "0 passed, 1 failed, 0 skipped, 1 package failed outside tests (ex/m)"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
}

func TestTestArgs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
	}{
		{"-race -count=1 ./...", "test -json -race -count=1 ./..."},
		{"-C deploy/kubernetes/validate -count=1 ./...", "test -C deploy/kubernetes/validate -json -count=1 ./..."},
		{"-C=dir ./...", "test -C=dir -json ./..."},
	} {
		if got := strings.Join(testArgs(strings.Fields(c.in)), " "); got != c.want {
			t.Errorf("testArgs(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	gs := groups(strings.Fields("-race ./... --- -C d ./..."))
	if len(gs) != 2 || strings.Join(gs[0], " ") != "-race ./..." || strings.Join(gs[1], " ") != "-C d ./..." {
		t.Errorf("groups = %q", gs)
	}
}
