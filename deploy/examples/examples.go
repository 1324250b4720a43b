// Package examples ships allot's example configuration inside the binary,
// so that `allot check` (and later `allot dev`) run with no file at hand.
package examples

import _ "embed"

// LimitsYAML is deploy/examples/limits.yaml.
//
//go:embed limits.yaml
var LimitsYAML []byte

// LimitsName is the name errors give for LimitsYAML.
const LimitsName = "deploy/examples/limits.yaml"
