package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/redisstore"
)

// TestCounts checks regional.CountStore on a real Redis, and that the
// memory version agrees: fields only rise, the region's count is the sum
// over its instances, peer slots are shared.
func TestCounts(t *testing.T) {
	srv := redistest.Start(t)
	stores := map[string]regional.CountStore{
		"redis":  newStore(t, redisstore.Options{Addrs: []string{srv.Addr}}),
		"memory": new(regional.MemoryCounts),
	}
	for name, s := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c := regional.Count{Domain: "api", Limit: "global", Key: "user=1", Window: uint64(time.Now().UnixMilli() / 1000), Period: time.Second}
			merge := func(instance string, value uint64, peers ...regional.PeerCount) regional.RegionCount {
				t.Helper()
				op := regional.CountOp{Count: c, Peers: peers}
				op.Value = value
				res := make([]regional.RegionCount, 1)
				if err := s.MergeCounts(ctx, instance, []regional.CountOp{op}, res); err != nil {
					t.Fatal(err)
				}
				return res[0]
			}
			merge("i1", 10)
			merge("i2", 5, regional.PeerCount{Region: "b", Value: 7})
			r := merge("i1", 8) // lower: no change
			if r.Value != 10 || r.Region != 15 || len(r.Peers) != 1 || r.Peers[0] != (regional.PeerCount{Region: "b", Value: 7}) {
				t.Fatalf("got %+v", r)
			}
			r = merge("", 0, regional.PeerCount{Region: "b", Value: 6}, regional.PeerCount{Region: "c", Value: 2})
			if r.Value != 0 || r.Region != 15 || len(r.Peers) != 2 {
				t.Fatalf("got %+v", r)
			}
			for _, p := range r.Peers {
				if want := map[string]uint64{"b": 7, "c": 2}[p.Region]; p.Value != want {
					t.Fatalf("peer %s: %d, want %d", p.Region, p.Value, want)
				}
			}
		})
	}
}
