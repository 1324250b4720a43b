package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/client"
)

// BenchmarkSDKAllowLeased is a decision inside the gateway with a lease in
// hand: no call leaves the process.
func BenchmarkSDKAllowLeased(b *testing.B) {
	e := startEnforcer(&testing.T{}, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 100000000/s}
`, nil)
	c, err := client.New(client.Config{Addrs: []string{e.addr}, SyncInterval: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	ds := one("user", "bench")
	for deadline := time.Now().Add(10 * time.Second); c.Allow(ctx, "api", ds, 1).Source != client.SourceLease; {
		if time.Now().After(deadline) {
			b.Fatal("no lease")
		}
		time.Sleep(time.Millisecond)
	}
	b.ReportAllocs()
	var denied int
	for b.Loop() {
		if !c.Allow(ctx, "api", ds, 1).Allowed {
			denied++
		}
	}
	st := c.Stats()
	b.ReportMetric(float64(st.CheckRPCs+st.LeaseRPCs)/float64(st.Decisions), "rpcs/decision")
	b.ReportMetric(float64(st.Decisions-st.LocalDecided)/float64(st.Decisions), "remote/decision")
	if denied > 0 {
		b.Logf("%d denied", denied)
	}
}
