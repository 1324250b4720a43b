package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// ErrUnknownReservation: Settle or Release named a reservation this
// Client did not make, or one already forgotten.
var ErrUnknownReservation = errors.New("client: unknown reservation")

// Reserve holds an LLM call's tokens (see allot.v1.RateLimiter/Reserve).
// Token budgets are always decided by an enforcer: the reservation lives
// in the enforcer that made it, and Settle and Release go back to it.
// When no enforcer answers it returns an error wrapping ErrUnavailable and
// the caller decides (the reservation's size is not known locally).
func (c *Client) Reserve(ctx context.Context, req *allotv1.ReserveRequest) (*allotv1.ReserveResponse, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	var resp *allotv1.ReserveResponse
	ep, err := c.call(ctx, func(ctx context.Context, ep *endpoint) error {
		var err error
		resp, err = ep.rl.Reserve(ctx, req)
		return err
	})
	if err != nil {
		return nil, requestError(err)
	}
	if id := resp.GetReservationId(); id != "" {
		// Forgotten after the enforcer's own grace for late settles.
		c.sticky.Store(id, owner{ep: ep, until: time.Now().Add(resp.GetTtl().AsDuration() + reservationGrace)})
	}
	return resp, nil
}

// Settle charges a reservation's real usage at the enforcer that made it.
func (c *Client) Settle(ctx context.Context, req *allotv1.SettleRequest) (*allotv1.SettleResponse, error) {
	var resp *allotv1.SettleResponse
	err := c.toOwner(ctx, req.GetReservationId(), func(ctx context.Context, ep *endpoint) error {
		var err error
		resp, err = ep.rl.Settle(ctx, req)
		return err
	})
	return resp, err
}

// Release ends a cancelled stream's reservation at the enforcer that
// made it.
func (c *Client) Release(ctx context.Context, req *allotv1.ReleaseRequest) (*allotv1.ReleaseResponse, error) {
	var resp *allotv1.ReleaseResponse
	err := c.toOwner(ctx, req.GetReservationId(), func(ctx context.Context, ep *endpoint) error {
		var err error
		resp, err = ep.rl.Release(ctx, req)
		return err
	})
	return resp, err
}

// reservationGrace is how long after its TTL a reservation's enforcer is
// remembered (the enforcer's grace for late settles).
const reservationGrace = 5 * time.Minute

// owner is the enforcer that made a reservation.
type owner struct {
	ep    *endpoint
	until time.Time
}

// forgetReservations drops owners past their grace.
func (c *Client) forgetReservations(now time.Time) {
	c.sticky.Range(func(k, v any) bool {
		if now.After(v.(owner).until) {
			c.sticky.Delete(k)
		}
		return true
	})
}

// toOwner calls f on the enforcer that made reservation id. If it does
// not answer the reservation expires there at its TTL, settled at its
// reserved amount; the error wraps ErrUnavailable.
func (c *Client) toOwner(ctx context.Context, id string, f func(context.Context, *endpoint) error) error {
	v, ok := c.sticky.Load(id)
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownReservation, id)
	}
	ep := v.(owner).ep
	cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	err := f(cctx, ep)
	if err == nil || status.Code(err) == codes.NotFound {
		c.sticky.Delete(id)
	}
	if err != nil {
		return requestError(err)
	}
	return nil
}

// requestError wraps err with ErrUnavailable or ErrBadRequest.
func requestError(err error) error {
	if isUnavailable(err) {
		return err
	}
	if unreachable(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrBadRequest, err)
}
