package peersync_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

func counter(t *testing.T, n *node, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestSyncBytes measures what shared mode costs on the wire: region a
// has 1,000 active keys, each decided 10 times a second; the encoded
// delta bytes a sends to b are reported per second and per 1,000 keys.
// A key below 1% of its limit per tick goes out once per sync interval;
// a hot one (each request 1% of its limit or more) at every tick.
func TestSyncBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two regions for seconds")
	}
	for _, c := range []struct{ name, rate string }{
		{"10000/1m per key (not hot)", "10000/1m"},
		{"100/1s per key (hot)", "100/1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := fmt.Sprintf("domain: api\nregions: [a, b]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: %s, mode: shared}\n", c.rate)
			cl := startCluster(t, cfg, []string{"a", "b"}, []float64{0.5, 0.5})
			a := cl.nodes[0]
			const keys = 1000
			descs := make([]allot.Descriptor, keys)
			for i := range descs {
				descs[i] = allot.Descriptor{{Key: "user", Value: fmt.Sprint(100000 + i)}}
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() { // every key 10 times a second, spread over the 100ms
				defer close(done)
				var dec allot.Decision
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					for j := range keys / 100 {
						a.engine.Check(time.Now(), "api", descs[(i%100)*(keys/100)+j], 1, &dec)
					}
				}
			}()
			time.Sleep(500 * time.Millisecond) // every key active
			labels := map[string]string{"peer": "b", "direction": "out"}
			b0, m0, start := counter(t, a, "allot_peer_delta_bytes_total", labels), counter(t, a, "allot_peer_messages_total", labels), time.Now()
			time.Sleep(2 * time.Second)
			b1, m1, took := counter(t, a, "allot_peer_delta_bytes_total", labels), counter(t, a, "allot_peer_messages_total", labels), time.Since(start)
			close(stop)
			<-done
			perSec := (b1 - b0) / took.Seconds()
			t.Logf("%s: %.0f delta bytes/s to one peer for %d active keys (%.1f bytes per key per second), %.0f messages/s",
				c.name, perSec, keys, perSec/keys, (m1-m0)/took.Seconds())
		})
	}
}
