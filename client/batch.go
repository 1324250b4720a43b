package client

import (
	"context"
	"sync"
)

// batcher sends concurrent requests together (group commit): a caller
// that finds no call in flight sends at once with whatever is queued;
// callers arriving while a call is in flight queue up and go in the next
// one. One call carries at most max requests.
type batcher[Req, Res any] struct {
	max  int
	send func([]Req) ([]Res, error)

	mu       sync.Mutex
	pending  []*pending[Req, Res]
	inflight bool
}

type pending[Req, Res any] struct {
	req  Req
	res  Res
	err  error
	done chan struct{}
}

func newBatcher[Req, Res any](max int, send func([]Req) ([]Res, error)) *batcher[Req, Res] {
	return &batcher[Req, Res]{max: max, send: send}
}

// do queues req and waits for its answer or ctx's end. A caller that
// gives up leaves its request in the batch: it may still be charged.
func (b *batcher[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	p := &pending[Req, Res]{req: req, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, p)
	lead := !b.inflight
	b.inflight = true
	b.mu.Unlock()
	if lead {
		b.flush()
	}
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		var zero Res
		return zero, ctx.Err()
	}
}

// flush sends one batch; if more requests queued meanwhile, another
// goroutine carries on so that the leader returns to its own caller.
func (b *batcher[Req, Res]) flush() {
	b.mu.Lock()
	batch := b.pending
	if len(batch) > b.max {
		batch = batch[:b.max]
	}
	b.pending = b.pending[len(batch):]
	if len(batch) == 0 {
		b.inflight = false
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()

	reqs := make([]Req, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	res, err := b.send(reqs)
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.res = res[i]
		}
		close(p.done)
	}

	b.mu.Lock()
	more := len(b.pending) > 0
	if !more {
		b.inflight = false
	}
	b.mu.Unlock()
	if more {
		go b.flush()
	}
}
