// Package allot holds the vocabulary shared by every part of allot: limits,
// plans, overrides, descriptors, decisions, share assignments and demand
// reports, and the parsing and validation of limit configuration files.
//
// It is a core package: it imports no gRPC, Redis, etcd or Prometheus code
// (a test enforces it), and it never reads the clock. Functions that depend
// on time take `now time.Time`.
//
// A configuration is loaded once and then only read:
//
//	cfg, err := allot.LoadConfigFile("limits.yaml")
//	if err != nil {
//		return err // names the file, line, field and what was expected
//	}
//	d := cfg.Domain("api")
//	for _, l := range d.Limits {
//		if l.Match.Matches(desc) {
//			eff := d.Effective(l, desc, now) // plan multiplier, then overrides
//			_ = eff
//		}
//	}
//
// The root package imports the standard library and one YAML decoder
// (go.yaml.in/yaml/v3, for line numbers in errors); no I/O library.
package allot
