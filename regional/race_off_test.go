//go:build !race

package regional

// raceEnabled says the race detector runs: long workloads shrink.
const raceEnabled = false
