// Command testsummary runs go test -json and writes what go test writes
// without -v (build errors, failing tests' output, each package's ok or
// FAIL line), then a summary:
//
//	412 passed, 0 failed, 9 skipped
//	skipped for missing dependencies: 3 (redis-server: 2, chromium: 1)
//
// The second line is there only when tests skipped because a program they
// need is missing (internal/testdep; under CI=true such tests fail instead).
// Counts include subtests. The exit status is 1 when a test, a build or a
// go test run failed.
//
// Usage:
//
//	go run ./internal/testsummary [go test flags] [packages] [--- [go test flags] [packages]]...
//
// Each group between "---" is one go test -json run, in order, with one
// summary over all; a group may start with -C dir, as go test's own. The
// environment variable GO names the go command (default go). With no
// arguments it reads a go test -json stream from its standard input.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// sep separates the arguments of successive go test runs.
const sep = "---"

func main() {
	s := NewSummarizer(os.Stdout)
	args := os.Args[1:]
	if len(args) == 0 {
		if err := s.Read(os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			s.RunsFailed++
		}
	}
	for _, group := range groups(args) {
		run(s, group)
	}
	s.Finish()
	for _, l := range s.Lines() {
		fmt.Println(l)
	}
	if !s.OK() {
		os.Exit(1)
	}
}

// groups splits args at each sep.
func groups(args []string) [][]string {
	if len(args) == 0 {
		return nil
	}
	var gs [][]string
	start := 0
	for i, a := range args {
		if a == sep {
			gs = append(gs, args[start:i])
			start = i + 1
		}
	}
	return append(gs, args[start:])
}

// testArgs are go's arguments for one group: test, then -C dir when the
// group starts with it (go wants it first), then -json and the rest.
func testArgs(group []string) []string {
	out := []string{"test"}
	switch {
	case len(group) >= 2 && (group[0] == "-C" || group[0] == "--C"):
		out, group = append(out, group[:2]...), group[2:]
	case len(group) >= 1 && (strings.HasPrefix(group[0], "-C=") || strings.HasPrefix(group[0], "--C=")):
		out, group = append(out, group[0]), group[1:]
	}
	return append(append(out, "-json"), group...)
}

// run runs one go test -json and reads its output. When go test fails
// with no test or package failing in its output (go itself failed: its
// message is on standard error), the summary counts a failed run.
func run(s *Summarizer, group []string) {
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	args := testArgs(group)
	before := s.failures()
	cmd := exec.Command(goCmd, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err == nil {
		if rerr := s.Read(out); rerr != nil {
			fmt.Fprintln(os.Stderr, "testsummary: reading go test's output:", rerr)
			s.RunsFailed++
			before = -1
		}
		err = cmd.Wait()
	}
	if err != nil && s.failures() == before {
		fmt.Fprintf(os.Stderr, "testsummary: %s %s: %v\n", goCmd, strings.Join(args, " "), err)
		s.RunsFailed++
	}
}
