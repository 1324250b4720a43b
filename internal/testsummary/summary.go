package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/allot-dev/allot/internal/testdep"
)

// event is one line of go test -json (cmd/test2json's TestEvent, plus the
// build events of Go 1.24).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string // build-output, build-fail
	FailedBuild string // a package's fail when its build failed
}

// test is one test or subtest of a package, and its output.
type test struct {
	name     string
	lines    []string // output lines, with their newline
	children []*test  // subtests, in the order they ran
	done     bool
	failed   bool
}

type pkg struct {
	tests map[string]*test
	top   []*test  // top-level tests, in the order they ran
	lines []string // package-level output, shown when the package ends
}

// Summary counts tests (subtests included) over one or more go test runs.
type Summary struct {
	Passed, Failed, Skipped int
	// Missing counts the skips for a missing dependency (see
	// internal/testdep), by dependency.
	Missing map[string]int
	// BuildFailed are the packages whose test binary did not build;
	// PackageFailed those that failed with no test failing (a TestMain,
	// a crash outside a test, go test itself).
	BuildFailed, PackageFailed []string
	// RunsFailed counts the go test runs that failed with nothing failing
	// in their output (go itself failed), or whose output was unreadable.
	RunsFailed int
}

// failures counts every kind of failure.
func (s *Summary) failures() int {
	return s.Failed + len(s.BuildFailed) + len(s.PackageFailed) + s.RunsFailed
}

// OK reports whether nothing failed.
func (s *Summary) OK() bool {
	return s.failures() == 0
}

// Lines are the summary's last lines: "N passed, N failed, N skipped"
// (with the packages that failed to build or failed outside their tests,
// if any), then, when tests skipped for a missing dependency, a line that
// counts them by dependency.
func (s *Summary) Lines() []string {
	line := fmt.Sprintf("%d passed, %d failed, %d skipped", s.Passed, s.Failed, s.Skipped)
	if n := len(s.BuildFailed); n > 0 {
		line += fmt.Sprintf(", %d %s failed to build (%s)", n, plural(n, "package"), strings.Join(s.BuildFailed, ", "))
	}
	if n := len(s.PackageFailed); n > 0 {
		line += fmt.Sprintf(", %d %s failed outside tests (%s)", n, plural(n, "package"), strings.Join(s.PackageFailed, ", "))
	}
	if s.RunsFailed > 0 {
		line += fmt.Sprintf(", %d go test %s failed", s.RunsFailed, plural(s.RunsFailed, "run"))
	}
	lines := []string{line}
	if len(s.Missing) > 0 {
		total, names := 0, make([]string, 0, len(s.Missing))
		for name, n := range s.Missing {
			total += n
			names = append(names, name)
		}
		// the most skipped first, then by name
		slices.SortFunc(names, func(a, b string) int {
			if s.Missing[a] != s.Missing[b] {
				return s.Missing[b] - s.Missing[a]
			}
			return strings.Compare(a, b)
		})
		parts := make([]string, len(names))
		for i, name := range names {
			parts[i] = fmt.Sprintf("%s: %d", name, s.Missing[name])
		}
		lines = append(lines, fmt.Sprintf("skipped for missing dependencies: %d (%s)", total, strings.Join(parts, ", ")))
	}
	return lines
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// Summarizer reads go test -json streams and writes what go test writes
// without -v: build errors, each failing test's output, the packages' ok,
// FAIL and "no test files" lines. It counts into its Summary.
type Summarizer struct {
	w    io.Writer
	pkgs map[string]*pkg
	Summary
}

// NewSummarizer writes to w.
func NewSummarizer(w io.Writer) *Summarizer {
	return &Summarizer{w: w, pkgs: map[string]*pkg{}, Summary: Summary{Missing: map[string]int{}}}
}

// Read consumes one go test -json stream until its end. A line that is not
// JSON (a message of go itself) is written as it is.
func (s *Summarizer) Read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64*1024*1024)
	for sc.Scan() {
		b := sc.Bytes()
		var e event
		if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &e) != nil || e.Action == "" {
			fmt.Fprintf(s.w, "%s\n", b)
			continue
		}
		s.Event(e)
	}
	return sc.Err()
}

// Event handles one event.
func (s *Summarizer) Event(e event) {
	switch e.Action {
	case "build-output":
		io.WriteString(s.w, e.Output)
		return
	case "build-fail":
		return // the package's fail event follows, with FailedBuild
	}
	if e.Package == "" {
		return
	}
	p := s.pkgs[e.Package]
	if p == nil {
		p = &pkg{tests: map[string]*test{}}
		s.pkgs[e.Package] = p
	}
	if e.Test == "" {
		switch e.Action {
		case "output":
			if e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
				p.lines = append(p.lines, e.Output)
			}
		case "pass", "skip", "fail":
			s.endPackage(e.Package, p, e.Action == "fail", e.FailedBuild != "")
		}
		return
	}
	t := p.tests[e.Test]
	if t == nil {
		t = &test{name: e.Test}
		p.tests[e.Test] = t
		if i := strings.LastIndexByte(e.Test, '/'); i >= 0 && p.tests[e.Test[:i]] != nil {
			parent := p.tests[e.Test[:i]]
			parent.children = append(parent.children, t)
		} else {
			p.top = append(p.top, t)
		}
	}
	switch e.Action {
	case "output":
		t.lines = append(t.lines, e.Output)
	case "pass":
		t.done = true
		s.Passed++
	case "skip":
		t.done = true
		s.Skipped++
		if dep, ok := missing(t.lines); ok {
			s.Missing[dep]++
		}
	case "fail":
		t.done, t.failed = true, true
		s.Failed++
		if !strings.Contains(t.name, "/") {
			s.write(t, "")
		}
	}
}

// Finish ends the packages whose stream stopped before their end (go test
// was killed): their unfinished tests count as failed.
func (s *Summarizer) Finish() {
	names := make([]string, 0, len(s.pkgs))
	for name := range s.pkgs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		s.endPackage(name, s.pkgs[name], true, false)
	}
}

func (s *Summarizer) endPackage(name string, p *pkg, failed, buildFailed bool) {
	delete(s.pkgs, name)
	before := s.Failed
	if failed {
		// tests that never ended: a timeout, a crash
		for _, t := range p.top {
			if s.unfinished(t) {
				s.write(t, "")
			}
		}
	}
	for _, l := range p.lines {
		io.WriteString(s.w, l)
	}
	switch {
	case buildFailed:
		s.BuildFailed = append(s.BuildFailed, name)
	case failed && s.Failed == before && !anyFailed(p.top):
		s.PackageFailed = append(s.PackageFailed, name)
	}
}

// unfinished marks t and its subtests that did not end as failed, counts
// them, and reports whether there were any.
func (s *Summarizer) unfinished(t *test) bool {
	found := false
	for _, c := range t.children {
		found = s.unfinished(c) || found
	}
	if !t.done {
		t.done, t.failed = true, true
		s.Failed++
		found = true
	}
	return found
}

func anyFailed(tests []*test) bool {
	for _, t := range tests {
		if t.failed || anyFailed(t.children) {
			return true
		}
	}
	return false
}

// write writes a failed test's output as go test does without -v: its
// "--- FAIL" line, its other lines, then its failed subtests', indented.
func (s *Summarizer) write(t *test, indent string) {
	var head string
	var rest []string
	for _, l := range t.lines {
		switch {
		case strings.HasPrefix(l, "=== "):
		case head == "" && strings.HasPrefix(l, "--- FAIL: "):
			head = l
		default:
			rest = append(rest, l)
		}
	}
	if head != "" {
		io.WriteString(s.w, indent+head)
	} else {
		fmt.Fprintf(s.w, "%s--- FAIL: %s (did not finish)\n", indent, t.name)
	}
	for _, l := range rest {
		io.WriteString(s.w, indent+l)
	}
	for _, c := range t.children {
		if c.failed {
			s.write(c, indent+"    ")
		}
	}
}

// missing returns the dependency that a skipped test's output names, in a
// line "file_test.go:12: missing dependency: NAME: ..." (testdep.Require).
func missing(lines []string) (string, bool) {
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if file, rest, ok := strings.Cut(l, ": "); ok && strings.Contains(file, ".go:") && !strings.Contains(file, " ") {
			l = rest
		}
		if dep, ok := testdep.Parse(l); ok {
			return dep, true
		}
	}
	return "", false
}
