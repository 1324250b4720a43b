package validate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	Line int
	Cmd  string // upper case: FROM, RUN, ...
	Args string
}

// parseDockerfile reads instructions the way Docker does for what is
// checked here: comments and blank lines dropped, lines ending in a
// backslash continued (comment lines inside a continuation skipped).
func parseDockerfile(t *testing.T, b []byte) []instruction {
	t.Helper()
	var out []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" && cur.Len() == 0 {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, instruction{start, strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	if cur.Len() > 0 {
		t.Fatalf("Dockerfile: line %d: continuation at the end of the file", start)
	}
	return out
}

// stage is one FROM and what follows it.
type stage struct {
	From, Name, Platform string
	Body                 []instruction
}

func stages(t *testing.T, ins []instruction) (args map[string]string, out []stage) {
	t.Helper()
	args = map[string]string{}
	for _, in := range ins {
		switch {
		case in.Cmd == "FROM":
			f := strings.Fields(in.Args)
			var s stage
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				if p, ok := strings.CutPrefix(f[0], "--platform="); ok {
					s.Platform = p
				}
				f = f[1:]
			}
			if len(f) != 1 && !(len(f) == 3 && strings.EqualFold(f[1], "AS")) {
				t.Fatalf("Dockerfile: line %d: FROM %s", in.Line, in.Args)
			}
			s.From = f[0]
			if len(f) == 3 {
				s.Name = f[2]
			}
			out = append(out, s)
		case len(out) == 0 && in.Cmd == "ARG":
			k, v, _ := strings.Cut(in.Args, "=")
			args[k] = v
		case len(out) == 0:
			t.Fatalf("Dockerfile: line %d: %s before the first FROM", in.Line, in.Cmd)
		default:
			out[len(out)-1].Body = append(out[len(out)-1].Body, in)
		}
	}
	return args, out
}

func TestDockerfile(t *testing.T) {
	ins := parseDockerfile(t, readRepoFile(t, "Dockerfile"))
	args, st := stages(t, ins)
	if len(st) < 2 {
		t.Fatalf("Dockerfile: %d stage(s), want a build stage and a runtime stage", len(st))
	}
	// No download through ADD, in any stage.
	for _, in := range ins {
		if in.Cmd == "ADD" && regexp.MustCompile(`(?i)(https?|ftp)://|git@|\.git\b`).MatchString(in.Args) {
			t.Errorf("Dockerfile: line %d: ADD of a URL: %s", in.Line, in.Args)
		}
	}

	// The build stage: Go of go.mod's version, static binaries of both commands.
	build := st[0]
	img := os.Expand(build.From, func(k string) string { return args[k] })
	goMod := string(readRepoFile(t, "go.mod"))
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(goMod)
	if m == nil {
		t.Fatal("go.mod: no go line")
	}
	if !strings.HasPrefix(img, "golang:"+m[1]) {
		t.Errorf("Dockerfile: build stage FROM %s (%s), want golang:%s as go.mod says", build.From, img, m[1])
	}
	if build.Name == "" {
		t.Error("Dockerfile: the build stage has no name (FROM ... AS build)")
	}
	var goBuild string
	for _, in := range build.Body {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "go build") {
			goBuild = in.Args
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/allot", "./cmd/allotctl", "-o /out/"} {
		if !strings.Contains(goBuild, want) {
			t.Errorf("Dockerfile: the go build RUN has no %q: %q", want, goBuild)
		}
	}

	// The runtime stage: static base, binaries from the build stage, non-root.
	final := st[len(st)-1]
	if final.From != "scratch" && !strings.HasPrefix(final.From, "gcr.io/distroless/static") {
		t.Errorf("Dockerfile: final stage FROM %s, want scratch or gcr.io/distroless/static*", final.From)
	}
	var user string
	var entrypoint []string
	copied := map[string]bool{}
	for _, in := range final.Body {
		switch in.Cmd {
		case "USER":
			user = in.Args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.Args), &entrypoint); err != nil {
				t.Errorf("Dockerfile: line %d: ENTRYPOINT is not in exec (JSON) form: %v", in.Line, err)
			}
		case "COPY":
			f := strings.Fields(in.Args)
			if len(f) >= 3 && f[0] == "--from="+build.Name && f[len(f)-1] == "/usr/local/bin/" {
				for _, src := range f[1 : len(f)-1] {
					copied[filepath.Base(src)] = true
				}
			}
		case "RUN":
			t.Errorf("Dockerfile: line %d: RUN in the runtime stage (it has no shell)", in.Line)
		case "ADD":
			t.Errorf("Dockerfile: line %d: ADD in the runtime stage", in.Line)
		}
	}
	if uid, _, _ := strings.Cut(user, ":"); uid != "65532" {
		t.Errorf("Dockerfile: final stage USER %q, want 65532 (non-root)", user)
	}
	for _, bin := range []string{"allot", "allotctl"} {
		if !copied[bin] {
			t.Errorf("Dockerfile: %s is not copied from the %s stage to /usr/local/bin/", bin, build.Name)
		}
	}
	if len(entrypoint) == 0 || entrypoint[0] != "/usr/local/bin/allot" {
		t.Errorf("Dockerfile: ENTRYPOINT %q, want [\"/usr/local/bin/allot\"]", entrypoint)
	}
}

// ignoreRule is one line of .dockerignore as a regular expression.
type ignoreRule struct {
	re     *regexp.Regexp
	negate bool
}

func parseDockerignore(b []byte) []ignoreRule {
	var rules []ignoreRule
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		neg := strings.HasPrefix(line, "!")
		line = strings.Trim(strings.TrimPrefix(line, "!"), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(".*")
				i++
			case c == '*':
				re.WriteString("[^/]*")
			case c == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(string(c)))
			}
		}
		re.WriteString("$")
		rules = append(rules, ignoreRule{regexp.MustCompile(re.String()), neg})
	}
	return rules
}

// ignored reports whether Docker leaves p (slash-separated, relative to the
// context) out of the context: a rule matches p or one of its parents; the
// last matching rule wins.
func ignored(rules []ignoreRule, p string) bool {
	out := false
	for _, r := range rules {
		parts := strings.Split(p, "/")
		for i := 1; i <= len(parts); i++ {
			if r.re.MatchString(strings.Join(parts[:i], "/")) {
				out = !r.negate
				break
			}
		}
	}
	return out
}

func TestDockerignoreKeepsTheBuildInputs(t *testing.T) {
	rules := parseDockerignore(readRepoFile(t, ".dockerignore"))
	for _, p := range []string{".git", "bin/allot", "deploy/kubernetes/base/regional.yaml"} {
		if !ignored(rules, p) {
			t.Errorf(".dockerignore: %s is sent to the build", p)
		}
	}
	// What the build reads: go.mod, go.sum, and the Go and embedded files of
	// every package of this module that the two commands import.
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if eq .Module.Path "github.com/allot-dev/allot"}}{{.Dir}}|{{join .GoFiles ","}}|{{join .EmbedFiles ","}}{{end}}{{end}}`,
		"./cmd/allot", "./cmd/allotctl")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr // "go: downloading ..." on a new machine
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", root, err, stderr.String())
	}
	needed := []string{"go.mod", "go.sum"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "|")
		rel, err := filepath.Rel(root, f[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, list := range f[1:] {
			for _, name := range strings.Split(list, ",") {
				if name != "" {
					needed = append(needed, filepath.ToSlash(filepath.Join(rel, name)))
				}
			}
		}
	}
	if len(needed) < 20 {
		t.Fatalf("only %d build inputs found: %v", len(needed), needed)
	}
	embedded := 0
	for _, p := range needed {
		if !strings.HasSuffix(p, ".go") {
			embedded++
		}
		if ignored(rules, p) {
			t.Errorf(".dockerignore leaves out %s, which the build reads", p)
		}
	}
	t.Logf("%d build inputs kept (%d of them go.mod, go.sum and embedded files)", len(needed), embedded)
}

func TestDockerignoreMatching(t *testing.T) {
	rules := parseDockerignore([]byte("# c\n.git\nbin/\n**/*.test\ndeploy/kubernetes/\n*.prof\n!keep.prof\n"))
	for p, want := range map[string]bool{
		".git/config": true, "bin/allot": true, "a/b/x.test": true, "x.test": true,
		"deploy/kubernetes/validate/go.mod": true, "deploy/examples/limits.yaml": false,
		"cpu.prof": true, "keep.prof": false, "sub/cpu.prof": false, "binary/x": false,
	} {
		if got := ignored(rules, p); got != want {
			t.Errorf("ignored(%s) = %v, want %v", p, got, want)
		}
	}
}
