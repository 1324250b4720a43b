package main

import (
	"context"
	"fmt"
	"strconv"

	guber "github.com/gubernator-io/gubernator/v2"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot/internal/loadgen"
)

// The limit of every key: allot's per-user limit in
// deploy/examples/limits.yaml, 10/1s with a burst of 5, which is
// gubernator's leaky bucket of limit 10 per 1000 ms and burst 5.
const (
	limit      = 10
	durationMs = 1000
	burst      = 5
)

func newGubernator(conn grpc.ClientConnInterface, name string) loadgen.Target {
	return gubernator{client: guber.NewV1Client(conn), name: name}
}

// gubernator checks one rate limit per key, unique key user_<key>.
type gubernator struct {
	client guber.V1Client
	name   string
}

func (g gubernator) Check(ctx context.Context, keys []int) (int, error) {
	req := &guber.GetRateLimitsReq{Requests: make([]*guber.RateLimitReq, len(keys))}
	for i, k := range keys {
		req.Requests[i] = &guber.RateLimitReq{
			Name:      g.name,
			UniqueKey: "user_" + strconv.Itoa(k),
			Hits:      1,
			Limit:     limit,
			Duration:  durationMs,
			Burst:     burst,
			Algorithm: guber.Algorithm_LEAKY_BUCKET,
		}
	}
	resp, err := g.client.GetRateLimits(ctx, req)
	if err != nil {
		return 0, err
	}
	if len(resp.GetResponses()) != len(keys) {
		return 0, fmt.Errorf("gubernator: %d responses for %d requests", len(resp.GetResponses()), len(keys))
	}
	allowed := 0
	for _, r := range resp.GetResponses() {
		if r.GetError() != "" {
			return 0, fmt.Errorf("gubernator: %s", r.GetError())
		}
		if r.GetStatus() == guber.Status_UNDER_LIMIT {
			allowed++
		}
	}
	return allowed, nil
}
