package client_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot"
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

// BenchmarkSDKRPCsUnderLoad: 8 gateways share 64 keys of a limit above
// their demand; the figure is calls to the enforcer per request.
func BenchmarkSDKRPCsUnderLoad(b *testing.B) {
	e := startEnforcer(&testing.T{}, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10000000/s}
`, nil)
	var cs []*client.Client
	for range 8 {
		c, err := client.New(client.Config{Addrs: []string{e.addr}})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs = append(cs, c)
	}
	keys := make([][]allot.Descriptor, 64)
	for i := range keys {
		keys[i] = one("user", fmt.Sprint("u", i))
	}
	var n atomic.Int64
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		i := int(n.Add(1))
		for pb.Next() {
			i++
			c := cs[i%len(cs)]
			c.Allow(context.Background(), "api", keys[(i/len(cs))%len(keys)], 1)
		}
	})
	var rpcs, decisions int64
	for _, c := range cs {
		st := c.Stats()
		rpcs += st.CheckRPCs + st.LeaseRPCs
		decisions += st.Decisions
	}
	b.ReportMetric(float64(rpcs)/float64(decisions), "rpcs/request")
}
