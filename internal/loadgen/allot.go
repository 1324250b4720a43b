package loadgen

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// NewAllot returns a Target that calls allot.v1.RateLimiter/Check on conn
// with one item per key: domain, descriptor user=<key>, one hit.
func NewAllot(conn grpc.ClientConnInterface, domain string) Target {
	return allotTarget{client: allotv1.NewRateLimiterClient(conn), domain: domain}
}

type allotTarget struct {
	client allotv1.RateLimiterClient
	domain string
}

func (a allotTarget) Check(ctx context.Context, keys []int) (int, error) {
	req := &allotv1.CheckRequest{Items: make([]*allotv1.CheckItem, len(keys))}
	for i, k := range keys {
		req.Items[i] = &allotv1.CheckItem{
			Domain: a.domain,
			Descriptors: []*allotv1.Descriptor{{
				Entries: []*allotv1.Entry{{Key: "user", Value: strconv.Itoa(k)}},
			}},
		}
	}
	resp, err := a.client.Check(ctx, req)
	if err != nil {
		return 0, err
	}
	if len(resp.GetResults()) != len(keys) {
		return 0, fmt.Errorf("allot: %d results for %d items", len(resp.GetResults()), len(keys))
	}
	allowed := 0
	for _, r := range resp.GetResults() {
		if r.GetAllowed() {
			allowed++
		}
	}
	return allowed, nil
}
