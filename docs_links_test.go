package allot_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestMarkdownLinks walks every Markdown file of the repository (tracked by
// git, or new and not ignored) and checks every relative link: its target
// must exist inside the repository, with the exact case of its name, and
// an anchor into a Markdown file (or into the same file) must name one of
// its headings as GitHub slugs them. Only http, https and mailto links
// leave the repository; a link or a mention of "../shared" is an error,
// since no clone has that folder.
func TestMarkdownLinks(t *testing.T) {
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	if !slices.Contains(files, "README.md") {
		t.Fatalf("README.md is not among the Markdown files found (%d): the walk is broken", len(files))
	}
	c := &linkChecker{root: root, anchors: map[string]map[string]bool{}, dirs: map[string][]string{}}
	links := 0
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Error(err)
			continue
		}
		for i, line := range strings.Split(string(src), "\n") {
			if strings.Contains(line, "../shared") {
				t.Errorf("%s:%d: mentions ../shared, a folder outside the repository that no clone has", f, i+1)
			}
		}
		for _, l := range markdownLinks(src) {
			links++
			if err := c.check(f, l.dest); err != nil {
				t.Errorf("%s:%d: link %q: %v", f, l.line, l.dest, err)
			}
		}
	}
	if links == 0 {
		t.Fatalf("no link found in %d Markdown files: the parser is broken", len(files))
	}
	t.Logf("%d links in %d Markdown files", links, len(files))
}

// markdownFiles lists the repository's Markdown files, slash-separated and
// relative to root: git's tracked files and its untracked, not ignored ones
// (a new document is checked before it is committed), or, without git, a
// walk that skips .git, vendored code and generated output.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.md")
	cmd.Dir = root
	out, err := cmd.Output()
	var files []string
	if err == nil {
		for _, f := range strings.Split(string(out), "\x00") {
			if f == "" || skippedPath(f) {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(f))); err != nil {
				continue // deleted in the working tree
			}
			files = append(files, f)
		}
	} else {
		t.Logf("git ls-files: %v; walking the folder instead", err)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				switch d.Name() {
				case ".git", "testdata", "out", "vendor", "third_party", "node_modules", "allot-cluster":
					if rel != "." {
						return filepath.SkipDir
					}
				}
				return nil
			}
			if strings.HasSuffix(d.Name(), ".md") && !skippedPath(rel) {
				files = append(files, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(files)
	return files
}

// skippedPath says whether a file is vendored or third-party text, or a
// test fixture, whose links are not the project's documentation.
func skippedPath(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		switch seg {
		case "vendor", "third_party", "node_modules", "testdata":
			return true
		}
	}
	return false
}

type mdLink struct {
	line int
	dest string
}

var (
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(`)
	refDef     = regexp.MustCompile(`^ {0,3}\[([^\]]+)\]:[ \t]*(<[^>]*>|\S+)`)
	htmlAttr   = regexp.MustCompile(`(?i)<(?:a|img|source)\b[^>]*?\s(?:href|src)\s*=\s*("[^"]*"|'[^']*')`)
	fenceOpen  = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$`)
	htmlAnchor = regexp.MustCompile(`(?i)<a\b[^>]*?\s(?:name|id)\s*=\s*("[^"]*"|'[^']*')`)
	setextLine = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
)

// markdownLinks returns the link destinations of a Markdown document:
// inline links and images, reference definitions, and href/src of HTML
// tags, outside fenced code blocks and code spans.
func markdownLinks(src []byte) []mdLink {
	var links []mdLink
	forEachProseLine(src, func(n int, line string) {
		if m := refDef.FindStringSubmatch(line); m != nil {
			links = append(links, mdLink{n, strings.Trim(m[2], "<>")})
			return
		}
		for _, loc := range inlineLink.FindAllStringIndex(line, -1) {
			if loc[0] > 0 && line[loc[0]-1] == '\\' {
				continue // an escaped bracket
			}
			if d, ok := linkDestination(line[loc[1]:]); ok {
				links = append(links, mdLink{n, d})
			}
		}
		for _, m := range htmlAttr.FindAllStringSubmatch(line, -1) {
			links = append(links, mdLink{n, m[1][1 : len(m[1])-1]})
		}
	})
	return links
}

// forEachProseLine calls fn with every line outside fenced code blocks
// (1-based numbers), its code spans blanked out.
func forEachProseLine(src []byte, fn func(n int, line string)) {
	fence := ""
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if fence != "" {
			if t := strings.TrimSpace(line); strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if m := fenceOpen.FindStringSubmatch(line); m != nil {
			fence = m[1]
			continue
		}
		fn(n, blankCodeSpans(line))
	}
}

// blankCodeSpans replaces the content of `code spans` with spaces.
func blankCodeSpans(line string) string {
	b := []byte(line)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		j := i
		for j < len(b) && b[j] == '`' {
			j++
		}
		run := j - i
		end := -1
		for k := j; k < len(b); {
			if b[k] != '`' {
				k++
				continue
			}
			l := k
			for l < len(b) && b[l] == '`' {
				l++
			}
			if l-k == run {
				end = k
				break
			}
			k = l
		}
		if end < 0 {
			i = j // no closing run: literal backticks
			continue
		}
		for k := j; k < end; k++ {
			b[k] = ' '
		}
		i = end + run
	}
	return string(b)
}

// linkDestination parses the destination at the start of s, which follows
// "](": <dest> or dest with balanced parentheses, then an optional title.
func linkDestination(s string) (string, bool) {
	s = strings.TrimLeft(s, " \t")
	if strings.HasPrefix(s, "<") {
		end := strings.IndexByte(s, '>')
		if end < 0 {
			return "", false
		}
		return s[1:end], true
	}
	depth := 0
	for i, r := range s {
		switch {
		case r == '\\':
			continue
		case r == '(':
			depth++
		case r == ')':
			if depth == 0 {
				return s[:i], i > 0
			}
			depth--
		case r == ' ' || r == '\t':
			return s[:i], i > 0 && depth == 0
		}
	}
	return "", false
}

type linkChecker struct {
	root    string
	anchors map[string]map[string]bool // Markdown file → its anchors
	dirs    map[string][]string        // folder → its entries' names
}

var urlScheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// check checks the destination dest of a link in file from (relative to
// the repository root, slash-separated).
func (c *linkChecker) check(from, dest string) error {
	if dest == "" {
		return errors.New("empty destination")
	}
	if strings.Contains(dest, "../shared") {
		return errors.New("points at ../shared, outside the repository")
	}
	if scheme := urlScheme.FindString(dest); scheme != "" {
		switch strings.ToLower(scheme) {
		case "http:", "https:", "mailto:":
			return nil
		}
		return fmt.Errorf("scheme %s: only http, https and mailto links may leave the repository", scheme)
	}
	if strings.HasPrefix(dest, "//") {
		return errors.New("a protocol-relative URL: write https://")
	}
	p, frag, _ := strings.Cut(dest, "#")
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	p, err := url.PathUnescape(p)
	if err != nil {
		return err
	}
	frag, err = url.PathUnescape(frag)
	if err != nil {
		return err
	}
	target := from // a pure in-page anchor
	if p != "" {
		if strings.HasPrefix(p, "/") {
			target = path.Clean(strings.TrimPrefix(p, "/")) // GitHub: from the repository root
		} else {
			target = path.Join(path.Dir(from), p)
		}
		if target == ".." || strings.HasPrefix(target, "../") {
			return errors.New("resolves outside the repository")
		}
		if err := c.exists(target); err != nil {
			return err
		}
	}
	if frag == "" || !strings.HasSuffix(strings.ToLower(target), ".md") {
		return nil // no anchor, or one into a file GitHub renders otherwise (#L10 of code)
	}
	anchors, err := c.anchorsOf(target)
	if err != nil {
		return err
	}
	if !anchors[frag] {
		return fmt.Errorf("%s has no heading whose anchor is #%s", target, frag)
	}
	return nil
}

// exists says whether target (a clean, slash-separated path relative to the
// root) exists with exactly that case, and stays inside the repository
// once symbolic links are followed.
func (c *linkChecker) exists(target string) error {
	if target == "." {
		return nil
	}
	dir := "."
	for _, name := range strings.Split(target, "/") {
		names, ok := c.dirs[dir]
		if !ok {
			entries, _ := os.ReadDir(filepath.Join(c.root, filepath.FromSlash(dir))) // not a folder: no entries
			for _, e := range entries {
				names = append(names, e.Name())
			}
			c.dirs[dir] = names
		}
		if !slices.Contains(names, name) {
			return fmt.Errorf("%s does not exist in the repository", target)
		}
		dir = path.Join(dir, name)
	}
	real, err := filepath.EvalSymlinks(filepath.Join(c.root, filepath.FromSlash(target)))
	if err != nil {
		return err
	}
	rootReal, err := filepath.EvalSymlinks(c.root)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(rootReal, real); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("%s is a symbolic link out of the repository", target)
	}
	return nil
}

// anchorsOf returns the anchors of a Markdown file: its headings' GitHub
// slugs (repeats numbered -1, -2, …) and explicit <a name|id="…">.
func (c *linkChecker) anchorsOf(file string) (map[string]bool, error) {
	if a, ok := c.anchors[file]; ok {
		return a, nil
	}
	src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(file)))
	if err != nil {
		return nil, err
	}
	a := markdownAnchors(src)
	c.anchors[file] = a
	return a, nil
}

// markdownAnchors returns the anchors GitHub gives a document's headings
// (ATX and setext), and explicit HTML anchors.
func markdownAnchors(src []byte) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	add := func(text string) {
		s := githubSlug(text)
		if n := seen[s]; n > 0 {
			seen[s]++
			s = fmt.Sprintf("%s-%d", s, n)
		} else {
			seen[s] = 1
		}
		anchors[s] = true
	}
	prev, prevN := "", 0
	forEachProseLine(src, func(n int, line string) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1][1:len(m[1])-1]] = true
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			text := m[2]
			if t := strings.TrimRight(text, "#"); t == "" || strings.HasSuffix(t, " ") || strings.HasSuffix(t, "\t") {
				text = t // a closing sequence; a # glued to a word is text
			}
			text = strings.TrimSpace(text)
			add(text)
			prev = ""
			return
		}
		if setextLine.MatchString(line) && prevN == n-1 && strings.TrimSpace(prev) != "" &&
			!strings.HasPrefix(strings.TrimSpace(prev), "|") && !strings.HasPrefix(strings.TrimSpace(prev), "-") {
			add(strings.TrimSpace(prev))
			prev = ""
			return
		}
		prev, prevN = line, n
	})
	return anchors
}

var (
	mdLinkText  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	mdHTMLTag   = regexp.MustCompile(`<[^>]+>`)
	mdEmphasis  = regexp.MustCompile(`[*~]+`)
	underscores = regexp.MustCompile(`(^|[^\p{L}\p{N}])_+|_+($|[^\p{L}\p{N}])`)
)

// githubSlug is GitHub's anchor for a heading: the rendered text, lowercase,
// with every character other than letters, digits, spaces, '-' and '_'
// dropped, and spaces turned into '-'.
func githubSlug(heading string) string {
	s := mdLinkText.ReplaceAllString(heading, "$1")
	s = mdHTMLTag.ReplaceAllString(s, "")
	// Emphasis marks go, outside code spans only; the backticks go too.
	var text strings.Builder
	for i, part := range strings.Split(s, "`") {
		if i%2 == 0 {
			part = mdEmphasis.ReplaceAllString(part, "")
			part = underscores.ReplaceAllString(part, "$1$2") // _emphasis_, not snake_case
		}
		text.WriteString(part)
	}
	var b strings.Builder
	for _, r := range strings.ToLower(text.String()) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestMarkdownLinksSlug pins githubSlug to GitHub's anchors.
func TestMarkdownLinksSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Quick start":                         "quick-start",
		"4. Sharing one limit across regions": "4-sharing-one-limit-across-regions",
		"Guarantees as they hold today":       "guarantees-as-they-hold-today",
		"split mode (default; hard limits)":   "split-mode-default-hard-limits",
		"`regional/` — the engine":            "regional--the-engine",
		"on_failure: local":                   "on_failure-local",
		"*Emphasis* and _more_":               "emphasis-and-more",
		"A [link](x.md) in a heading":         "a-link-in-a-heading",
		"Über-Größe":                          "über-größe",
		"What it checks?":                     "what-it-checks",
		"`_private` field":                    "_private-field",
		"C# notes":                            "c-notes",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
	a := markdownAnchors([]byte("# Title\n\n## Usage\n\n```\n# not a heading\n```\n\n## Usage\n\nSetext\n------\n<a name=\"here\"></a>\n" +
		"### Closed ###\n#### C# notes\n"))
	for _, want := range []string{"title", "usage", "usage-1", "setext", "here", "closed", "c-notes"} {
		if !a[want] {
			t.Errorf("anchor %q missing from %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a line in a code block was taken for a heading")
	}
}

// TestMarkdownLinksExtract pins what markdownLinks finds and skips, and
// what the checker refuses.
func TestMarkdownLinksExtract(t *testing.T) {
	src := "See [a](docs/a.md#x), ![i](<img 1.png>) and [t](b.md \"title\").\n" +
		"Not `[code](c.md)`, not \\[escaped](d.md).\n" +
		"```\n[fenced](e.md)\n```\n" +
		"[ref]: ./f.md\n" +
		"<a href=\"g.md\">g</a> [p](h_(x).md)\n"
	var got []string
	for _, l := range markdownLinks([]byte(src)) {
		got = append(got, fmt.Sprintf("%d:%s", l.line, l.dest))
	}
	want := []string{"1:docs/a.md#x", "1:img 1.png", "1:b.md", "6:./f.md", "7:h_(x).md", "7:g.md"}
	if !slices.Equal(got, want) {
		t.Errorf("markdownLinks = %q, want %q", got, want)
	}

	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	c := &linkChecker{root: root, anchors: map[string]map[string]bool{}, dirs: map[string][]string{}}
	for _, bad := range []string{"../shared/DESIGN.md", "../../x.md", "nope.md", "readme.md", "README.md#no-such-heading",
		"#no-such-heading", "file:///etc/passwd", "//example.com/x"} {
		if err := c.check("README.md", bad); err == nil {
			t.Errorf("check(README.md, %q) passed, want an error", bad)
		}
	}
	for _, good := range []string{"README.md", "./README.md#quick-start", "#quick-start", "docs", "/go.mod",
		"https://example.com/x#y", "mailto:someone@example.com"} {
		if err := c.check("README.md", good); err != nil {
			t.Errorf("check(README.md, %q): %v", good, err)
		}
	}
}
