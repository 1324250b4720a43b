package admin

import (
	"errors"
	"strings"
	"testing"

	"github.com/allot-dev/allot"
)

const base = `domain: api
regions: [a, b]
plans:
  pro: {multiplier: 10}
limits:
  - name: per-user       # keep this comment
    match: {user: "*"}
    rate: 10/1s
    limits:
      - name: chat
        match: {route: /chat}
        rate: 1/1s
---
domain: llm
limits:
  - name: chat
    rate: 5/1s
`

func mustParse(t *testing.T, yaml string) *allot.Config {
	t.Helper()
	cfg, err := allot.ParseConfig("t.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestDiff(t *testing.T) {
	next := strings.NewReplacer(
		"pro: {multiplier: 10}", "pro: {multiplier: 20, floors: {per-user: 50/1s}}",
		"rate: 10/1s", "rate: 20/1s\n    shadow: true",
		"---\ndomain: llm\nlimits:\n  - name: chat\n    rate: 5/1s\n", "---\ndomain: web\nlimits:\n  - name: x\n    rate: 1/s\n",
	).Replace(base) + "overrides:\n  - {limit: x, match: {ip: 1.2.3.4}, multiplier: 2}\n"
	var got []string
	for _, c := range Diff(mustParse(t, base), mustParse(t, next)) {
		got = append(got, formatChange(c))
	}
	want := []string{
		"~ api plans/pro.multiplier: 10 → 20",
		"+ api plans/pro.floors.per-user 50/s",
		"~ api limits/per-user.rate: 10/s → 20/s",
		"~ api limits/per-user.burst: 10 → 20",
		"~ api limits/per-user.shadow: false → true",
		"+ web added, 1 limit",
		"- llm removed, had 1 limit",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	all := Diff(nil, mustParse(t, base))
	if len(all) != 2 || all[0].New != "added, 2 limits" {
		t.Errorf("Diff from nothing: %+v", all)
	}
	added := Diff(mustParse(t, base), mustParse(t, strings.Replace(base, "limits:\n  - name: per-user", "limits:\n  - name: new\n    rate: 3/1m\n  - name: per-user", 1)))
	if len(added) != 1 || formatChange(added[0]) != "+ api limits/new unit=requests rate=3/m burst=3 algorithm=token_bucket mode=split enforcement=local on_failure=local sync_interval=250ms stale_after=750ms" {
		t.Errorf("Diff of an added limit: %+v", added)
	}
}

func TestSetLimitField(t *testing.T) {
	out, domain, err := setLimitField([]byte(base), "api", "chat", "shadow", "true", "!!bool")
	if err != nil || domain != "api" {
		t.Fatal(domain, err)
	}
	cfg := mustParse(t, string(out))
	if !cfg.Domain("api").Limit("chat").Shadow || cfg.Domain("llm").Limit("chat").Shadow || cfg.Domain("api").Limit("per-user").Shadow {
		t.Errorf("shadow set on the wrong limits:\n%s", out)
	}
	if !strings.Contains(string(out), "# keep this comment") {
		t.Errorf("comment lost:\n%s", out)
	}
	out, _, err = setLimitField(out, "", "per-user", "mode", "shared", "!!str")
	if err != nil || mustParse(t, string(out)).Domain("api").Limit("per-user").Mode != allot.Shared {
		t.Errorf("mode: %v\n%s", err, out)
	}
	if _, _, err := setLimitField([]byte(base), "", "chat", "shadow", "true", "!!bool"); !errors.Is(err, ErrBadRequest) ||
		!strings.Contains(err.Error(), `limit "chat" is in domains api, llm: name one with --domain`) {
		t.Errorf("ambiguous limit: %v", err)
	}
	if _, _, err := setLimitField([]byte(base), "web", "chat", "shadow", "true", "!!bool"); !errors.Is(err, ErrNotFound) {
		t.Errorf("limit of an unknown domain: %v", err)
	}
}
