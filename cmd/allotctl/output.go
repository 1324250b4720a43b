package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/wirejson"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// json prints m for scripts: the proto3 JSON mapping with the .proto
// field names, except that integers are JSON numbers and shares are
// rounded to 4 decimals (internal/wirejson).
func (c *cli) json(m proto.Message) error {
	b, err := wirejson.Marshal(m, wirejson.Options{Indent: "  ", Round: wirejson.Shares})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}

// table prints rows under header, aligned.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// printApply prints the outcome of a configuration write and its changes.
func (c *cli) printApply(resp *allotv1.ApplyConfigResponse, dryRun bool) error {
	if c.output == "json" {
		return c.json(resp)
	}
	v := resp.GetVersion()
	switch {
	case resp.GetApplied():
		fmt.Fprintf(c.stdout, "applied: version %d (%s)\n", v.GetVersion(), v.GetSummary())
	case dryRun && v.GetVersion() == 0:
		fmt.Fprintf(c.stdout, "no configuration stored yet; applying would add:\n")
	case dryRun:
		fmt.Fprintf(c.stdout, "changes from version %d (nothing applied):\n", v.GetVersion())
	default:
		fmt.Fprintf(c.stdout, "no change: version %d is the same file\n", v.GetVersion())
	}
	for _, ch := range resp.GetChanges() {
		fmt.Fprintln(c.stdout, "  "+formatChange(ch))
	}
	if len(resp.GetChanges()) == 0 && (dryRun || resp.GetApplied()) {
		fmt.Fprintln(c.stdout, "  (no change to limits)")
	}
	return nil
}

// formatChange is admin.FormatChange for the wire type.
func formatChange(ch *allotv1.ConfigChange) string {
	what := strings.TrimSpace(ch.GetDomain() + " " + ch.GetPath())
	switch {
	case ch.GetOld() == "":
		return "+ " + what + " " + ch.GetNew()
	case ch.GetNew() == "":
		return "- " + what + " " + ch.GetOld()
	}
	return fmt.Sprintf("~ %s: %s → %s", what, ch.GetOld(), ch.GetNew())
}

// parseKey parses "k1=v1,k2=v2".
func parseKey(s string) ([]*allotv1.Entry, error) {
	var out []*allotv1.Entry
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("key %q: want attribute=value[,attribute=value...] such as tenant=acme", s)
		}
		out = append(out, &allotv1.Entry{Key: k, Value: v})
	}
	return out, nil
}

// keyText formats entries as "k1=v1,k2=v2".
func keyText(es []*allotv1.Entry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.GetKey() + "=" + e.GetValue()
	}
	return strings.Join(parts, ",")
}

// ago formats how long before now t is, or "-".
func ago(t time.Time, now time.Time) string {
	if t.IsZero() || t.Unix() == 0 {
		return "-"
	}
	return round(now.Sub(t)).String() + " ago"
}

// round keeps a duration readable: whole seconds past 10s, else ms.
func round(d time.Duration) time.Duration {
	if d > 10*time.Second || d < -10*time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// orDash is s, or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
