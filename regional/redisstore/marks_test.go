package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/redisstore"
	"github.com/allot-dev/allot/regional/storetest"
)

func TestMarksOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}})
	storetest.RunMarks(t, s)

	// A record expires at its window's end.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now := time.Now()
	m := regional.Marks{Domain: "api", Limit: "short", Period: 2 * time.Second, Window: now.UnixNano() / int64(2*time.Second), Low: 1, Floor: 1,
		Keys: []regional.KeyMark{{Key: "short:user=1", Mark: 3}}}
	if err := s.SaveMarks(ctx, now, "ttl", []regional.Marks{m}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadMarks(ctx, "ttl", []regional.Marks{m}); err != nil || len(got) != 1 {
		t.Fatalf("load at once: %+v, %v", got, err)
	}
	end := time.Unix(0, (m.Window+1)*int64(m.Period))
	deadline := end.Add(3 * time.Second)
	for {
		got, err := s.LoadMarks(ctx, "ttl", []regional.Marks{m})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			if time.Now().Before(end.Add(-50 * time.Millisecond)) {
				t.Fatalf("the record expired before its window's end")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record outlived its window by 3s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMarksOnRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	storetest.RunMarks(t, newStore(t, redisstore.Options{Addrs: c.Addrs(), Cluster: true}))
}
