package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/internal/fleettest"
)

const limitsYAML = `domain: api
regions: [us-east, eu-west, ap-south]
plans:
  free: {multiplier: 1}
  pro: {multiplier: 10}
limits:
  - name: per-user
    match: {user: "*"}
    rate: 60/1h
    burst: 5
  - name: per-tenant
    match: {tenant: "*"}
    rate: 1000/1h
`

// badYAML has two problems, on lines 4 and 7.
const badYAML = `domain: api
limits:
  - name: per-user
    rate: 10/1y
  - name: per-tenant
    rate: 1/s
    burst: 0
`

// ctl runs allotctl with args and returns what it printed.
func ctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(t.Context(), args, &out, &errb)
	return out.String(), err
}

// mustCtl runs allotctl and fails t unless it succeeds printing every want.
func mustCtl(t *testing.T, args []string, want ...string) string {
	t.Helper()
	out, err := ctl(t, args...)
	if err != nil {
		t.Fatalf("allotctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("allotctl %s: output\n%s\nwant it to hold %q", strings.Join(args, " "), out, w)
		}
	}
	return out
}

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLimitsValidate(t *testing.T) {
	good, bad := writeFile(t, "limits.yaml", limitsYAML), writeFile(t, "bad.yaml", badYAML)
	mustCtl(t, []string{"limits", "validate", good}, good+": ok")
	out, err := ctl(t, "limits", "validate", good, bad)
	if err == nil || err.Error() != "1 of 2 file(s) invalid" {
		t.Fatalf("validate of a bad file: %v, want 1 of 2 invalid", err)
	}
	want := good + ": ok\n" +
		bad + `:4: limits[0].rate: bad rate "10/1y": period: want a unit ms, s, m, h or d, got "1y"` + "\n" +
		bad + ":7: limits[1].burst: want an integer in [1, 1125899906842624], got 0\n"
	if out != want {
		t.Errorf("output\n%s\nwant\n%s", out, want)
	}
	out, _ = ctl(t, "limits", "validate", bad, "-o", "json")
	var res []struct {
		File   string
		OK     bool
		Errors []struct {
			File, Field, Message string
			Line                 int
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res) != 1 || len(res[0].Errors) != 2 || res[0].Errors[1].Line != 7 ||
		res[0].Errors[1].Field != "limits[1].burst" || res[0].Errors[1].File != bad {
		t.Errorf("json: %v, %+v", err, res)
	}
}

func TestCommands(t *testing.T) {
	t.Setenv("ALLOT_INSECURE", "1") // its servers are plain text, on loopback
	f := fleettest.Start(t, limitsYAML, "us-east", "eu-west", "ap-south")
	addr := []string{"--addr", f.Admin}
	cmd := func(args ...string) []string { return append(args, addr...) }
	next := writeFile(t, "limits.yaml", strings.Replace(limitsYAML, "burst: 5", "burst: 7", 1))
	waitVersion := func(v int64) {
		for _, r := range f.Regions {
			fleettest.Poll(t, 5*time.Second, fmt.Sprintf("%s on version %d", r.Name, v), func() bool { return r.Follower.State().Version == v })
		}
	}

	mustCtl(t, cmd("limits", "diff", next), "changes from version 1 (nothing applied)", "~ api limits/per-user.burst: 5 → 7")
	mustCtl(t, cmd("limits", "apply", next, "--summary", "more burst"), "applied: version 2 (more burst)", "~ api limits/per-user.burst: 5 → 7")
	mustCtl(t, cmd("limits", "apply", next), "no change: version 2 is the same file")
	mustCtl(t, cmd("limits", "history"), "VERSION", "2 (current)", "more burst", "initial")
	if out := mustCtl(t, cmd("limits", "show", "1")); out != limitsYAML {
		t.Errorf("limits show 1:\n%s\nwant version 1's file", out)
	}
	mustCtl(t, cmd("limits", "rollback", "--dry-run"), "changes from version 2", "~ api limits/per-user.burst: 7 → 5")
	mustCtl(t, cmd("limits", "rollback"), "applied: version 3 (rollback to version 1)")
	mustCtl(t, cmd("limits", "shadow", "per-user", "on"), "applied: version 4 (limits shadow per-user on)", "~ api limits/per-user.shadow: false → true")
	mustCtl(t, cmd("limits", "mode", "per-tenant", "shared", "--domain", "api"), "applied: version 5 (limits mode per-tenant shared)")
	waitVersion(5)
	if l := f.Regions[1].Engine.Config().Domain("api").Limit("per-user"); !l.Shadow {
		t.Errorf("per-user not in shadow mode in %s", f.Regions[1].Name)
	}
	if _, err := ctl(t, cmd("limits", "shadow", "per-user", "maybe")...); err == nil || !strings.Contains(err.Error(), "want on or off") {
		t.Errorf("shadow maybe: %v", err)
	}
	bad := writeFile(t, "bad.yaml", badYAML)
	if _, err := ctl(t, cmd("limits", "apply", bad)...); err == nil || !strings.Contains(err.Error(), bad+":7: limits[1].burst") {
		t.Errorf("apply of a bad file: %v", err)
	}

	mustCtl(t, cmd("override", "set", "--domain", "api", "--key", "user=42", "--multiplier", "5", "--ttl", "1h", "--on", "per-user", "--reason", "vip"),
		"override set: api user=42 on per-user ×5 until")
	mustCtl(t, cmd("override", "set", "--domain", "api", "--key", "tenant=acme", "--limit", "50/1s", "--ttl", "10m"), "tenant=acme (every limit) rate 50/s")
	out := mustCtl(t, cmd("override", "list", "-o", "json"))
	var list struct{ Overrides []map[string]any }
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Overrides) != 2 {
		t.Fatalf("override list -o json: %v\n%s", err, out)
	}
	mustCtl(t, cmd("override", "list", "--domain", "api"), "DOMAIN", "user=42", "×5", "vip", "etcd")
	mustCtl(t, cmd("override", "delete", "--domain", "api", "--key", "user=42", "--on", "per-user"), "override deleted")
	if _, err := ctl(t, cmd("override", "delete", "--domain", "api", "--key", "user=42", "--on", "per-user")...); err == nil || !strings.Contains(err.Error(), "no override") {
		t.Errorf("second delete: %v", err)
	}
	if _, err := ctl(t, cmd("override", "set", "--domain", "api", "--key", "user=1", "--multiplier", "2")...); err == nil {
		t.Errorf("override set without --ttl succeeded")
	}

	mustCtl(t, cmd("plan", "assign", "--domain", "api", "tenant=acme", "pro"), "plan assigned: api tenant=acme → pro")
	mustCtl(t, cmd("plan", "list"), "MULTIPLIER", "×10", "tenant=acme", "etcd")
	if _, err := ctl(t, cmd("plan", "assign", "--domain", "api", "tenant=x", "gold")...); err == nil || !strings.Contains(err.Error(), `unknown plan "gold"`) {
		t.Errorf("assign to an unknown plan: %v", err)
	}
	mustCtl(t, cmd("plan", "unassign", "--domain", "api", "tenant=acme"), "plan assignment deleted")

	mustCtl(t, cmd("usage", "--domain", "api", "--key", "user=7"), "per-user:user=7", "us-east", "all regions", "SHADOW")
	mustCtl(t, cmd("status"), "configuration: version 5", "domain api", "per-user", "REGION", "us-east", "v5", "n/a")
	out = mustCtl(t, cmd("status", "-o", "json"))
	var st struct{ Regions []map[string]any }
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Regions) != 3 {
		t.Errorf("status -o json: %v\n%s", err, out)
	}

	// A region answers usage and status for itself; writes go to the coordinator.
	mustCtl(t, []string{"status", "--addr", f.Regions[0].Addr}, "us-east", "v5")
	if _, err := ctl(t, "limits", "history", "--addr", f.Regions[0].Addr); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("history from a region: %v", err)
	}
}

// TestStatusHotKeys measures `allotctl status` with 10,000 hot keys: that
// many share records in etcd, and keys near their limit in every engine.
func TestStatusHotKeys(t *testing.T) {
	t.Setenv("ALLOT_INSECURE", "1") // its servers are plain text, on loopback
	const hot = 10_000
	f := fleettest.Start(t, limitsYAML, "us-east", "eu-west", "ap-south")
	ctx := t.Context()
	l, err := f.Store.Campaign(ctx, "api", "test")
	if err != nil {
		t.Fatal(err)
	}
	cells := []coordinator.Cell{{Region: "us-east", Share: 0.5, Bound: 0.5}, {Region: "eu-west", Share: 0.3, Bound: 0.3}, {Region: "ap-south", Share: 0.2, Bound: 0.2}}
	recs := []coordinator.Record{{Limit: "per-user", Cells: cells}}
	for i := range hot {
		recs = append(recs, coordinator.Record{Limit: "per-user", Key: "user=" + strconv.Itoa(i), Cells: cells})
	}
	if err := f.Store.Persist(ctx, l, "api", coordinator.Ready{Term: l.Term, Version: 1, Persist: recs}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var dec allot.Decision
	for i, r := range f.Regions {
		if err := r.Engine.SetShare(now, "api", "per-user", cells[i].Share); err != nil {
			t.Fatal(err)
		}
		for i := range hot {
			if err := r.Engine.Check(now, "api", allot.Descriptor{{Key: "user", Value: strconv.Itoa(i)}}, 1, &dec); err != nil {
				t.Fatal(err)
			}
		}
	}
	var took []time.Duration
	for range 100 {
		start := time.Now()
		out := mustCtl(t, []string{"status", "--addr", f.Admin}, "10000", "ap-south 0.200, eu-west 0.300, us-east 0.500")
		took = append(took, time.Since(start))
		if t.Failed() {
			t.Fatal(out)
		}
	}
	slices.Sort(took)
	t.Logf("allotctl status with %d hot keys (etcd records and engine keys), 3 regions, %d runs: p50 %v, p99 %v, max %v",
		hot, len(took), took[49], took[98], took[99])
}

// TestBinary runs allotctl built as a binary once.
func TestBinary(t *testing.T) {
	t.Setenv("ALLOT_INSECURE", "1") // its servers are plain text, on loopback
	bin := filepath.Join(t.TempDir(), "allotctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bad := writeFile(t, "bad.yaml", badYAML)
	out, err := exec.Command(bin, "limits", "validate", bad).Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), bad+":7: limits[1].burst") {
		t.Errorf("validate of a bad file: %v, output %q", err, out)
	}
	// Help exits 0 with the usage on stdout; a usage error exits 1.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--help"}, 0, "usage: allotctl [global flags] COMMAND"},
		{[]string{"status", "--help"}, 0, "usage: allotctl status"},
		{[]string{"limits", "apply", "-h"}, 0, "usage: allotctl limits apply FILE"},
		{[]string{"--addr", deadAddr(t), "--timeout", "2s", "status"}, 1, " unreachable"},
		{[]string{"nope"}, 1, `unknown command "nope"`},
	} {
		cmd := exec.Command(bin, c.args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		got := stdout.String()
		if c.code != 0 {
			got = stderr.String()
		}
		if code != c.code || !strings.Contains(got, c.want) {
			t.Errorf("allotctl %s: exit %d, want %d; stdout %q, stderr %q: want %q", strings.Join(c.args, " "), code, c.code, stdout.String(), stderr.String(), c.want)
		}
	}
	f := fleettest.Start(t, limitsYAML, "us-east")
	cmd := exec.Command(bin, "status")
	cmd.Env = append(os.Environ(), "ALLOT_ADDR="+f.Admin)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "domain api") {
		t.Errorf("allotctl status: %v\n%s", err, out)
	}
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// helpCommands are allotctl's commands and subcommands, each with the
// first line of its usage (a group's is allotctl's).
var helpCommands = []struct {
	args  []string
	usage string
}{
	{nil, "usage: allotctl [global flags] COMMAND"},
	{[]string{"limits"}, "usage: allotctl [global flags] COMMAND"},
	{[]string{"limits", "validate"}, "usage: allotctl limits validate FILE..."},
	{[]string{"limits", "diff"}, "usage: allotctl limits diff FILE"},
	{[]string{"limits", "apply"}, "usage: allotctl limits apply FILE"},
	{[]string{"limits", "history"}, "usage: allotctl limits history\n"},
	{[]string{"limits", "show"}, "usage: allotctl limits show [VERSION]"},
	{[]string{"limits", "rollback"}, "usage: allotctl limits rollback [VERSION]"},
	{[]string{"limits", "shadow"}, "usage: allotctl limits shadow LIMIT on|off"},
	{[]string{"limits", "mode"}, "usage: allotctl limits mode LIMIT split|shared"},
	{[]string{"override"}, "usage: allotctl [global flags] COMMAND"},
	{[]string{"override", "set"}, "usage: allotctl override set --domain D --key user=42"},
	{[]string{"override", "list"}, "usage: allotctl override list [--domain D]"},
	{[]string{"override", "delete"}, "usage: allotctl override delete --domain D --key user=42"},
	{[]string{"plan"}, "usage: allotctl [global flags] COMMAND"},
	{[]string{"plan", "assign"}, "usage: allotctl plan assign --domain D KEY PLAN"},
	{[]string{"plan", "unassign"}, "usage: allotctl plan unassign --domain D KEY"},
	{[]string{"plan", "list"}, "usage: allotctl plan list [--domain D]"},
	{[]string{"usage"}, "usage: allotctl usage --domain D --key tenant=acme"},
	{[]string{"status"}, "usage: allotctl status\n"},
}

// TestHelp: -h, --help and help COMMAND print the command's usage to
// stdout and succeed, for every command, without calling the Admin API
// (the default address has no coordinator in the tests).
func TestHelp(t *testing.T) {
	t.Setenv("ALLOT_ADDR", deadAddr(t))
	for _, c := range helpCommands {
		for _, args := range [][]string{
			append(slices.Clone(c.args), "--help"),
			append(slices.Clone(c.args), "-h"),
			append([]string{"help"}, c.args...),
			append([]string{"--addr", "127.0.0.1:1", "-o", "json"}, append(slices.Clone(c.args), "--help")...),
		} {
			var out, errb bytes.Buffer
			if err := run(t.Context(), args, &out, &errb); err != nil {
				t.Errorf("allotctl %s: %v, want success", strings.Join(args, " "), err)
			}
			if !strings.HasPrefix(out.String(), c.usage) {
				t.Errorf("allotctl %s: stdout\n%s\nwant the usage, %q...", strings.Join(args, " "), out.String(), c.usage)
			}
			if len(c.args) == 2 && !strings.Contains(out.String(), "-addr string") {
				t.Errorf("allotctl %s: usage\n%s\nwant the global flags in it", strings.Join(args, " "), out.String())
			}
			if errb.Len() > 0 {
				t.Errorf("allotctl %s: stderr %q, want nothing", strings.Join(args, " "), errb.String())
			}
		}
	}
	// The table has every command.
	listed := map[string]bool{}
	for _, c := range helpCommands {
		listed[strings.Join(c.args, " ")] = true
	}
	groups, leaves := (&cli{}).commands()
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		for _, sub := range slices.Sorted(maps.Keys(groups[g])) {
			if !listed[g+" "+sub] {
				t.Errorf("command %s %s: not in helpCommands", g, sub)
			}
		}
	}
	for name := range leaves {
		if !listed[name] {
			t.Errorf("command %s: not in helpCommands", name)
		}
	}
}

// TestGlobalFlags: the global flags come before the command, after it,
// between a command and its subcommand, as --addr X or --addr=X; the
// later one wins. Against an address where nothing listens, the error is
// a connection error naming it.
func TestGlobalFlags(t *testing.T) {
	t.Setenv("ALLOT_INSECURE", "1") // its servers are plain text, on loopback
	addr, other := deadAddr(t), deadAddr(t)
	t.Setenv("ALLOT_ADDR", other)
	for _, args := range [][]string{
		{"--addr", addr, "status"},
		{"--addr=" + addr, "status"},
		{"status", "--addr", addr},
		{"status", "--addr=" + addr},
		{"--addr", other, "status", "--addr", addr},
		{"--addr", addr, "--timeout=2s", "-o", "json", "limits", "history", "--limit", "3"},
		{"limits", "--addr", addr, "history"},
		{"--addr", addr, "override", "list", "--domain", "api"},
		{"-o", "json", "usage", "--domain", "api", "--key=user=1", "--addr", addr},
		{"--addr", addr, "--author", "me", "limits", "shadow", "per-user", "on"},
	} {
		args = append([]string{"--timeout", "5s"}, args...)
		out, err := ctl(t, args...)
		if err == nil || !strings.Contains(err.Error(), addr+" unreachable") {
			t.Errorf("allotctl %s: %v, want %s unreachable", strings.Join(args, " "), err, addr)
		}
		if out != "" {
			t.Errorf("allotctl %s: stdout %q", strings.Join(args, " "), out)
		}
	}
	// The output flag in front of an offline command.
	good := writeFile(t, "limits.yaml", limitsYAML)
	out := mustCtl(t, []string{"-o", "json", "limits", "validate", good})
	var res []struct{ OK bool }
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res) != 1 || !res[0].OK {
		t.Errorf("-o json limits validate: %v\n%s", err, out)
	}
	if _, err := ctl(t, "-o", "yaml", "limits", "validate", good); err == nil || err.Error() != `-o "yaml": want table or json` {
		t.Errorf("-o yaml: %v", err)
	}
}

// TestUsageErrors: unknown commands and flags and wrong arguments fail
// with a message naming them; the usage goes to stderr, nothing to stdout.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"--addr", "127.0.0.1:1"}, "no command"},
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"help", "nope"}, `unknown command "nope"`},
		{[]string{"--nope", "status"}, "flag provided but not defined: -nope"},
		{[]string{"--addr"}, "flag needs an argument: -addr"},
		{[]string{"status", "--nope"}, "status: flag provided but not defined: -nope"},
		{[]string{"status", "--timeout", "soon"}, `status: invalid value "soon" for flag -timeout: parse error`},
		{[]string{"limits"}, "limits: missing subcommand"},
		{[]string{"limits", "nope"}, `limits: unknown subcommand "nope"`},
		{[]string{"limits", "--nope", "history"}, "flag provided but not defined: -nope"},
		{[]string{"status", "extra"}, `status: unexpected argument "extra"`},
		{[]string{"limits", "validate"}, "limits validate: want at least 1 argument, got 0"},
		{[]string{"limits", "shadow", "per-user"}, "limits shadow: want 2 arguments, got 1"},
		{[]string{"limits", "show", "1", "2"}, "limits show: want 0 to 1 arguments, got 2"},
	} {
		var out, errb bytes.Buffer
		err := run(t.Context(), c.args, &out, &errb)
		if err == nil || err.Error() != c.want {
			t.Errorf("allotctl %s: %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
		if out.Len() > 0 || !strings.Contains(errb.String(), "usage: allotctl") {
			t.Errorf("allotctl %s: stdout %q, stderr %q: want the usage on stderr only", strings.Join(c.args, " "), out.String(), errb.String())
		}
	}
}
