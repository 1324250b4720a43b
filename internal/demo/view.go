package demo

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// ANSI sequences of the terminal view.
const (
	ansiClear = "\x1b[H\x1b[2J" // cursor home, clear screen
	ansiBold  = "\x1b[1m"
	ansiRed   = "\x1b[31m"
	ansiDim   = "\x1b[2m"
	ansiReset = "\x1b[0m"
)

// frame is one redraw of the terminal view.
type frame struct {
	Header   string // first line, after "allot demo"
	Story    Story
	Once     bool
	Pos      Position
	Regions  []string
	Sample   Sample
	Limits   []string // rows, in order
	Interval time.Duration
	Final    bool // the story ended: the last frame
}

// writeFrame draws f on w in one Write: with ansi, the screen is cleared
// first and the chapter and cut regions stand out; without, it is plain
// lines, one frame after the other.
func writeFrame(w io.Writer, f frame, ansi bool) error {
	var b bytes.Buffer
	style := func(code, s string) string {
		if !ansi {
			return s
		}
		return code + s + ansiReset
	}
	if ansi {
		b.WriteString(ansiClear)
	}
	total := f.Story.Total()
	round := ""
	if !f.Once {
		round = fmt.Sprintf(" · round %d", f.Pos.Round)
	}
	fmt.Fprintf(&b, "%s%s · %s of %s", style(ansiBold, "allot demo"), round, clock(f.Pos.Elapsed), clock(total))
	if f.Header != "" {
		fmt.Fprintf(&b, " · %s", f.Header)
	}
	b.WriteString("\n\n")
	if n := len(f.Story.Chapters); n > 0 {
		c := f.Story.Chapters[f.Pos.Chapter]
		status := ""
		if f.Final {
			status = " (the end)"
		}
		fmt.Fprintf(&b, "Chapter %d of %d: %s%s\n", f.Pos.Chapter+1, n, style(ansiBold, c.Title), status)
		for _, line := range wrap(c.Text, 96) {
			fmt.Fprintf(&b, "  %s\n", line)
		}
		b.WriteString("\n")
	}

	const cellW = 7 // each of share, ok/s, 429/s
	limitW := len("limit")
	for _, l := range f.Limits {
		limitW = max(limitW, len(l))
	}
	blockW := 3 * cellW
	fmt.Fprintf(&b, "%-*s", limitW, "")
	for _, r := range f.Regions {
		name := r
		if slices.Contains(f.Sample.Cut, r) {
			name += " CUT OFF"
			fmt.Fprintf(&b, "  %s%s", style(ansiRed, name), strings.Repeat(" ", max(blockW-len(name), 0)))
			continue
		}
		fmt.Fprintf(&b, "  %-*s", blockW, name)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "%-*s", limitW, "limit")
	for range f.Regions {
		fmt.Fprintf(&b, "  %*s%*s%*s", cellW, "share", cellW, "ok/s", cellW, "429/s")
	}
	b.WriteString("\n")
	for _, l := range f.Limits {
		fmt.Fprintf(&b, "%-*s", limitW, l)
		shares, adm, rej := f.Sample.Shares[l], f.Sample.Admitted[l], f.Sample.Rejected[l]
		for i := range f.Regions {
			share := "–"
			if i < len(shares) && shares[i] != nil {
				share = fmt.Sprintf("%.1f%%", 100**shares[i])
			}
			a, r := "0", "0"
			if i < len(adm) {
				a = perSecond(adm[i])
			}
			if i < len(rej) {
				r = perSecond(rej[i])
				if rej[i] > 0 {
					r = style(ansiRed, fmt.Sprintf("%*s", cellW, r))
				}
			}
			fmt.Fprintf(&b, "  %*s%*s%*s", cellW, share, cellW, a, cellW, r)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "%s\n", style(ansiDim, fmt.Sprintf("share: of the limit, in force in the region; limit{key}: that key's own share (a hot key)\n"+
		"ok/s, 429/s: admitted and rejected per second over the last %v", f.Interval)))
	if !ansi {
		b.WriteString("\n")
	}
	_, err := w.Write(b.Bytes())
	return err
}

// perSecond formats a rate: whole numbers from 10 up, one decimal below.
func perSecond(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.1f", v)
	}
}

// clock formats d as m:ss.
func clock(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

// wrap breaks text into lines of at most width runes, at spaces.
func wrap(text string, width int) []string {
	var lines []string
	var cur []string
	n := 0
	for _, w := range strings.Fields(text) {
		l := len([]rune(w))
		if n > 0 && n+1+l > width {
			lines = append(lines, strings.Join(cur, " "))
			cur, n = nil, 0
		}
		if n > 0 {
			n++
		}
		cur, n = append(cur, w), n+l
	}
	if len(cur) > 0 {
		lines = append(lines, strings.Join(cur, " "))
	}
	return lines
}
