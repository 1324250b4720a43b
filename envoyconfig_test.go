package allot

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// limitLine formats a limit read from an Envoy file as "name match rate"
// and its flags.
func limitLine(l *Limit) string {
	s := l.Name + " " + l.Match.String()
	if !l.Unlimited {
		s += " " + l.Rate.String()
	}
	if l.Shadow {
		s += " shadow"
	}
	if l.Unlimited {
		s += " unlimited"
	}
	if len(l.Replaces) > 0 {
		s += " replaces=" + strings.Join(l.Replaces, ",")
	}
	return s
}

// envoyGood are files written for Envoy's rate limit service, most of them
// the examples of its README, with the limits they give.
var envoyGood = []struct {
	name, yaml string
	want       []string
}{
	{"mongo_cps", `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`, []string{"database_users database=users 500/s", "database_default database=default 500/s"}},
	{"messaging: nested descriptors", `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`, []string{"message_type_marketing.to_number message_type=marketing,to_number=* 5/d", "to_number to_number=* 100/d"}},
	{"deeper nesting", `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`, []string{"key_value.subkey key=value,subkey=* 300/s"}},
	{"unlimited", `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`, []string{"ldap ldap=* unlimited", "azure azure=* 100/m"}},
	{"shadow_mode", `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`, []string{"service.user_user-a service=*,user=user-a 10/s shadow", "service.user_user-b service=*,user=user-b 20/s"}},
	{"replaces", `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`, []string{"specific_limit key_1=value_1,user=bkthomps 5/s",
		"key_2_value_2.user_bkthomps key_2=value_2,user=bkthomps 10/s replaces=specific_limit"}},
	{"detailed_metric is ignored", `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`, []string{"key1 key1=* 10/m", "key1_value1 key1=value1 20/m"}},
	{"wildcard value", `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1}
`, []string{"key1_value-2316eb7f key1=value* 20/m", "path-3c4c19a1 path=* 1/s"}},
	{"units and unit_multiplier", `
domain: units
descriptors:
  - {key: a, rate_limit: {unit: SECOND, requests_per_unit: 1, unit_multiplier: 30}}
  - {key: b, rate_limit: {unit: Hour, requests_per_unit: 4294967295}}
  - {key: c, rate_limit: {unit: week, requests_per_unit: 3}}
  - {key: d, rate_limit: {unit: month, requests_per_unit: 4}}
  - {key: e, rate_limit: {unit: year, requests_per_unit: 5}}
  - {key: f, rate_limit: {unit: day, requests_per_unit: 6, unit_multiplier: 366}}
`, []string{"a a=* 1/30s", "b b=* 4294967295/h", "c c=* 3/7d", "d d=* 4/30d", "e e=* 5/365d", "f f=* 6/366d"}},
	{"a listed value without rate_limit is not limited", `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 10.0.0.1
  - key: remote_address
    value: 10.1.*
  - key: other
    value: x
`, []string{"remote_address remote_address=* 10/s", "remote_address_10.0.0.1 remote_address=10.0.0.1 unlimited",
		"remote_address_10.1-a7fb0c13 remote_address=10.1.* unlimited"}},
	{"derived names that must change", `
domain: names
descriptors:
  - key: To_Number
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: to_number
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: x
    rate_limit: {name: to_number.y, unit: second, requests_per_unit: 3}
    descriptors:
      - key: "y"
        rate_limit: {unit: second, requests_per_unit: 4}
  - key: _hidden
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: k
    value: ` + strings.Repeat("v", 70) + `
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: "%"
    rate_limit: {unit: second, requests_per_unit: 7}
`, []string{"to_number-5ad007eb To_Number=* 1/s", "to_number to_number=* 2/s", "to_number.y x=* 3/s",
		"x.y x=*,y=* 4/s", "hidden-eed3d5b1 _hidden=* 5/s",
		"k_" + strings.Repeat("v", 53) + "-be92e1ad k=" + strings.Repeat("v", 70) + " 6/s", "60fe4877 %=* 7/s"}},
	{"an empty domain", "domain: empty\ndescriptors: []\n", nil},
}

func TestParseEnvoyConfig(t *testing.T) {
	for _, tc := range envoyGood {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("envoy.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			d := cfg.Domains[0]
			var got []string
			for _, l := range d.Limits {
				got = append(got, limitLine(l))
				checkEnvoyDefaults(t, l)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("limits\n got: %q\nwant: %q", got, tc.want)
			}
			if !d.EnvoyPaths || len(d.Regions) > 0 || d.Plans != nil || d.Overrides != nil {
				t.Errorf("domain %+v, want EnvoyPaths and nothing but limits", d)
			}
			if err := d.Validate(); err != nil {
				t.Errorf("Validate of a loaded domain: %v", err)
			}
		})
	}
}

// checkEnvoyDefaults checks what every limit read from an Envoy file has.
func checkEnvoyDefaults(t *testing.T, l *Limit) {
	t.Helper()
	if !validName(l.Name) || l.Algorithm != SlidingWindow || l.Burst != l.Rate.Amount || l.Mode != Split ||
		l.Enforcement != Local || l.SyncInterval != DefaultSyncInterval || l.StaleAfter != 3*DefaultSyncInterval {
		t.Errorf("limit %+v: want a valid name, sliding_window, burst = amount and the loader's defaults", l)
	}
	if err := l.Rate.Validate(); (err == nil) == l.Unlimited {
		t.Errorf("limit %+v: rate error %v", l, err)
	}
}

func TestParseConfigMixesFormats(t *testing.T) {
	cfg, err := ParseConfig("both.yaml", []byte(`
domain: api
limits: [{name: a, rate: 1/s}]
---
domain: edge
descriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 2}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if api, edge := cfg.Domain("api"), cfg.Domain("edge"); api == nil || api.EnvoyPaths || edge == nil || !edge.EnvoyPaths ||
		limitLine(edge.Limits[0]) != "ip ip=* 2/s" {
		t.Errorf("domains %+v", cfg.Domains)
	}
}

func TestLoadEnvoyDeployExample(t *testing.T) {
	cfg, err := LoadConfigFile("deploy/envoy/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Domain("api")
	if d == nil || !d.EnvoyPaths {
		t.Fatalf("domains %+v, want api with Envoy paths", cfg.Domains)
	}
	var got []string
	for _, l := range d.Limits {
		got = append(got, limitLine(l))
		checkEnvoyDefaults(t, l)
	}
	want := []string{
		"user user=* 10/s",
		"user_svc-30a562e6 user=svc-* unlimited",
		"tenant tenant=* 1000/m shadow",
		"per-tenant-user tenant=*,user=* 10/s",
		"per-tenant-user-chat tenant=*,user=*,route=/v1/chat 60/m",
		"login-attempts route=/login,ip=* 5/10m",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("limits\n got: %q\nwant: %q", got, want)
	}
}

// envoyHead is a valid start of an Envoy document; descriptors follow
// from line 3.
const envoyHead = "domain: edge\ndescriptors:\n"

var envoyBad = []struct {
	name, yaml, want string
}{
	{"limit of 0 (the README's example 3)", envoyHead + `  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`, "bad.yaml:13: descriptors[1].rate_limit.requests_per_unit: want an integer in [1, 4294967295], got 0 " +
		"(allot has no limit of 0: deny such requests in Envoy instead)"},
	{"unknown top field", "domain: edge\nregions: [a]\ndescriptors: []\n",
		"bad.yaml:2: regions: unknown field, want one of domain, descriptors"},
	{"missing domain", "descriptors: []\n", "bad.yaml:1: domain: missing, want a name such as api"},
	{"descriptors not a list", envoyHead + "  key: a\n", "bad.yaml:3: descriptors: want a list, got a mapping"},
	{"descriptor not a mapping", envoyHead + "  - a\n", `bad.yaml:3: descriptors[0]: want a mapping, got "a"`},
	{"unknown descriptor field", envoyHead + "  - key: a\n    rate-limit: {unit: second}\n",
		"bad.yaml:4: descriptors[0].rate-limit: unknown field, want one of key, value, rate_limit, shadow_mode, detailed_metric, descriptors"},
	{"missing key", envoyHead + "  - value: a\n", "bad.yaml:3: descriptors[0].key: missing, want the descriptor's key such as remote_address"},
	{"empty key", envoyHead + "  - key: \"\"\n", "bad.yaml:3: descriptors[0].key: empty key"},
	{"duplicate descriptor", envoyHead + "  - key: a\n  - key: b\n  - key: a\n    value: \"\"\n",
		"bad.yaml:5: descriptors[2]: same key and value as the descriptor at line 3"},
	{"nested key repeats", envoyHead + "  - key: a\n    descriptors:\n      - key: a\n        value: x\n",
		`bad.yaml:5: descriptors[0].descriptors[0].key: repeats key "a" of an enclosing descriptor, which allot does not support`},
	{"bad shadow_mode", envoyHead + "  - key: a\n    shadow_mode: yes please\n",
		`bad.yaml:4: descriptors[0].shadow_mode: want true or false, got "yes please"`},
	{"rate_limit not a mapping", envoyHead + "  - key: a\n    rate_limit: 5/s\n",
		`bad.yaml:4: descriptors[0].rate_limit: want a mapping, got "5/s"`},
	{"unknown rate_limit field", envoyHead + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n",
		"bad.yaml:4: descriptors[0].rate_limit.burst: unknown field, want one of unit, requests_per_unit, unit_multiplier, name, unlimited, replaces"},
	{"unknown unit", envoyHead + "  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		`bad.yaml:4: descriptors[0].rate_limit.unit: unknown value "fortnight", want one of second, minute, hour, day, week, month, year`},
	{"missing unit", envoyHead + "  - key: a\n    rate_limit:\n      requests_per_unit: 1\n",
		"bad.yaml:4: descriptors[0].rate_limit.unit: missing, want one of second, minute, hour, day, week, month, year"},
	{"missing requests_per_unit", envoyHead + "  - key: a\n    rate_limit:\n      unit: second\n",
		"bad.yaml:4: descriptors[0].rate_limit.requests_per_unit: missing, want an integer in [1, 4294967295]"},
	{"requests_per_unit above uint32", envoyHead + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
		"bad.yaml:4: descriptors[0].rate_limit.requests_per_unit: want an integer in [1, 4294967295], got 4294967296 " +
			"(allot has no limit of 0: deny such requests in Envoy instead)"},
	{"requests_per_unit not an integer", envoyHead + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: many}\n",
		`bad.yaml:4: descriptors[0].rate_limit.requests_per_unit: want an integer, got "many"`},
	{"zero unit_multiplier", envoyHead + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n",
		"bad.yaml:4: descriptors[0].rate_limit.unit_multiplier: want an integer in [1, 31622400] (a period of at most 366 days), got 0"},
	{"period above 366 days", envoyHead + "  - key: a\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 2}\n",
		"bad.yaml:4: descriptors[0].rate_limit.unit_multiplier: want an integer in [1, 1] (a period of at most 366 days), got 2"},
	{"unit with unlimited", envoyHead + "  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n",
		"bad.yaml:6: descriptors[0].rate_limit.unit: does not apply with unlimited: true, remove it"},
	{"invalid name", envoyHead + "  - key: a\n    rate_limit: {name: Specific Limit, unit: second, requests_per_unit: 1}\n",
		`bad.yaml:4: descriptors[0].rate_limit.name: invalid name "Specific Limit", want [a-z0-9][a-z0-9_.-]* of at most 64 characters`},
	{"duplicate name", envoyHead + "  - key: a\n    rate_limit: {name: x, unit: second, requests_per_unit: 1}\n" +
		"  - key: b\n    rate_limit:\n      name: x\n      unit: second\n      requests_per_unit: 1\n",
		`bad.yaml:7: descriptors[1].rate_limit.name: duplicate limit name "x", first used by descriptors[0].rate_limit`},
	{"replaces an unknown limit", envoyHead + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: nope\n",
		`bad.yaml:8: descriptors[0].rate_limit.replaces[0].name: unknown limit "nope"`},
	{"replaces itself", envoyHead + "  - key: a\n    rate_limit:\n      name: x\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: x}]\n",
		"bad.yaml:8: descriptors[0].rate_limit.replaces[0].name: names its own limit"},
	{"replaces without a name", envoyHead + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{}]\n",
		"bad.yaml:7: descriptors[0].rate_limit.replaces[0].name: missing, want the name of a limit to replace"},
	{"several errors, one each", envoyHead + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0}\n" +
		"    descriptors:\n      - key: b\n        rate_limit: {unit: minute}\n  - value: c\n",
		"bad.yaml:4: descriptors[0].rate_limit.requests_per_unit: want an integer in [1, 4294967295], got 0 " +
			"(allot has no limit of 0: deny such requests in Envoy instead)\n" +
			"bad.yaml:7: descriptors[0].descriptors[0].rate_limit.requests_per_unit: missing, want an integer in [1, 4294967295]\n" +
			"bad.yaml:8: descriptors[1].key: missing, want the descriptor's key such as remote_address"},
}

func TestParseEnvoyConfigErrors(t *testing.T) {
	for _, tc := range envoyBad {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error, want %q (config %+v)", tc.want, cfg)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("error\n got: %s\nwant: %s", got, tc.want)
			}
			if cfg != nil || !errors.Is(err, ErrConfig) {
				t.Errorf("got config %v, errors.Is(ErrConfig) = %v", cfg, errors.Is(err, ErrConfig))
			}
		})
	}
}

// FuzzParseEnvoyConfig checks that any input gives an error or domains
// whose limits Validate accepts, with the properties of the conversion.
func FuzzParseEnvoyConfig(f *testing.F) {
	example, err := os.ReadFile("deploy/envoy/ratelimit-config.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(example))
	for _, tc := range envoyGood {
		f.Add(tc.yaml)
	}
	for _, tc := range envoyBad {
		f.Add(tc.yaml)
	}
	for _, src := range boundsSeeds() {
		f.Add(src)
	}
	f.Fuzz(func(t *testing.T, data string) {
		cfg, err := ParseConfig("fuzz.yaml", []byte(data))
		if err != nil {
			var es ConfigErrors
			if cfg != nil || !errors.Is(err, ErrConfig) || !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("got config %v and error %v", cfg, err)
			}
			return
		}
		for _, d := range cfg.Domains {
			names := map[string]bool{}
			for _, l := range d.Limits {
				if d.EnvoyPaths {
					checkEnvoyDefaults(t, l)
				}
				if names[l.Name] {
					t.Fatalf("duplicate name %q", l.Name)
				}
				names[l.Name] = true
				checkBounds(t, l.Match)
			}
			if err := d.Validate(); err != nil {
				t.Fatalf("Validate of a loaded domain %+v: %v", d, err)
			}
		}
	})
}

func ExampleParseConfig_envoy() {
	cfg, err := ParseConfig("config.yaml", []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
`))
	if err != nil {
		panic(err)
	}
	l := cfg.Domains[0].Limits[0]
	fmt.Println(l.Name, l.Match, l.Rate, l.Algorithm, l.Burst, l.Rate.Period == 24*time.Hour)
	// Output: message_type_marketing.to_number message_type=marketing,to_number=* 5/d sliding_window 5 true
}
