package admin_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/fleettest"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Admin writes go through allot.ParseConfig and Config.WithDynamic, so the
// abuse bounds of docs/security.md (Bounds) hold on them: each is refused
// with INVALID_ARGUMENT, naming the field, and nothing is stored.
func TestBoundsRefused(t *testing.T) {
	f := fleettest.Start(t, limitsYAML, regions...)
	ctx := t.Context()
	refused := func(what, yaml, want string) {
		t.Helper()
		start := time.Now()
		_, err := f.Client.ApplyConfig(ctx, &allotv1.ApplyConfigRequest{Yaml: yaml, File: "bad.yaml"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT holding %q", what, err, want)
		}
		t.Logf("%s refused in %v", what, time.Since(start))
	}
	refused("2^50/1ms", strings.Replace(limitsYAML, "rate: 1000/1h", "rate: 1125899906842624/1ms", 1),
		`bad.yaml:13: limits[1].rate: bad rate "1125899906842624/1ms": rate must be at most 1125899906842624 per second, want an amount of at most 1125899906842 per 1ms`)
	var deep strings.Builder
	deep.WriteString("domain: api\nlimits: ")
	for i := range 3000 {
		fmt.Fprintf(&deep, "[{name: l%d, rate: 10/s, limits: ", i)
	}
	deep.WriteString("[]" + strings.Repeat("}]", 3000) + "\n")
	refused("3,000 levels of limits", deep.String(), "bad.yaml:2: [ and { nested more than 64 levels deep")

	var big []*allotv1.Entry
	for i := range 33 {
		big = append(big, &allotv1.Entry{Key: fmt.Sprint("k", i), Value: "v"})
	}
	for _, o := range []struct {
		what string
		o    *allotv1.Override
		want string
	}{
		{"an override of 2^50/1ms", &allotv1.Override{Domain: "api", Match: key("user", "1"), Rate: "1125899906842624/1ms"},
			"rate must be at most 1125899906842624 per second"},
		{"an override matching 33 entries", &allotv1.Override{Domain: "api", Match: big, Multiplier: 2},
			"match: 33 entries, want at most 32"},
		{"an override of a 1,025-byte value", &allotv1.Override{Domain: "api", Match: key("user", strings.Repeat("x", 1025)), Multiplier: 2},
			"value of 1025 bytes, want at most 1024"},
	} {
		_, err := f.Client.SetOverride(ctx, &allotv1.SetOverrideRequest{Ttl: durationpb.New(time.Minute), Override: o.o})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), o.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT holding %q", o.what, err, o.want)
		}
	}

	if h, err := f.Client.History(ctx, &allotv1.HistoryRequest{}); err != nil || len(h.GetVersions()) != 1 {
		t.Errorf("history %v, %v: want the first version only", h, err)
	}
	if l, err := f.Client.ListOverrides(ctx, &allotv1.ListOverridesRequest{}); err != nil || len(l.GetOverrides()) != 0 {
		t.Errorf("overrides %v, %v: want none stored", l, err)
	}
}
