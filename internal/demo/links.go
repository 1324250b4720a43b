package demo

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// Coordinator names the coordinator's end of a link.
const Coordinator = "coordinator"

// Links are the network links between the demo's regions and from each
// region to the coordinator: TCP relays on loopback that a story cuts
// and heals. Cutting a region off closes every connection of every relay
// it is an end of; a connection opened while it is cut is held, nothing
// passing, until it is healed, as a partition would delay a handshake.
// (Refusing it instead would push gRPC's reconnection backoff towards
// its two-minute maximum, so that a healed region could stay away for
// long.) The region's gateways (the demo's traffic) still reach it.
// Safe for concurrent use.
type Links struct {
	mu     sync.Mutex
	relays []*relay
	cut    map[string]chan struct{} // region → closed when it is healed
	done   chan struct{}            // closed by Close
	closed bool
}

// relay forwards one directed link, from a region to a peer region or
// to the coordinator.
type relay struct {
	from, to string
	ln       net.Listener
	wg       sync.WaitGroup

	mu     sync.Mutex
	target string                // "" until known: connections are refused
	conns  map[net.Conn]struct{} // both sides of every open connection
	shut   bool                  // closed: no connection may stay open
}

// NewLinks returns Links without relays.
func NewLinks() *Links {
	return &Links{cut: map[string]chan struct{}{}, done: make(chan struct{})}
}

// Add starts a relay from region from to to (a region or Coordinator)
// on a free loopback port and returns the address from must dial. target
// is the address the relay connects to; "" means not known yet
// (SetTarget).
func (l *Links) Add(from, to, target string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("demo: link %s → %s: %w", from, to, err)
	}
	r := &relay{from: from, to: to, ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		ln.Close()
		return "", errors.New("demo: links closed")
	}
	l.relays = append(l.relays, r)
	l.mu.Unlock()
	r.wg.Add(1)
	go l.accept(r)
	return ln.Addr().String(), nil
}

// SetTarget sets the address of to, for every relay that leads there.
func (l *Links) SetTarget(to, addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.relays {
		if r.to == to {
			r.mu.Lock()
			r.target = addr
			r.mu.Unlock()
		}
	}
}

// Cut cuts region off: the open connections of its links close, new
// ones are held until Heal.
func (l *Links) Cut(region string) {
	l.mu.Lock()
	if l.cut[region] == nil {
		l.cut[region] = make(chan struct{})
	}
	relays := slices.Clone(l.relays)
	l.mu.Unlock()
	for _, r := range relays {
		if r.from == region || r.to == region {
			r.closeConns()
		}
	}
}

// Heal ends region's cut: the connections held go through, and new
// ones too.
func (l *Links) Heal(region string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch := l.cut[region]; ch != nil {
		close(ch)
		delete(l.cut, region)
	}
}

// IsCut reports whether region is cut off.
func (l *Links) IsCut(region string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut[region] != nil
}

// Close stops every relay and closes their connections.
func (l *Links) Close() {
	l.mu.Lock()
	if !l.closed {
		close(l.done)
	}
	l.closed = true
	relays := l.relays
	l.relays = nil
	l.mu.Unlock()
	for _, r := range relays {
		r.ln.Close()
		r.mu.Lock()
		r.shut = true
		r.mu.Unlock()
		r.closeConns()
		r.wg.Wait()
	}
}

func (l *Links) isCut(r *relay) bool {
	return l.healed(r) != nil
}

// healed returns a channel closed when one end of r that is cut off is
// healed, or nil when neither is.
func (l *Links) healed(r *relay) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch := l.cut[r.from]; ch != nil {
		return ch
	}
	return l.cut[r.to]
}

func (l *Links) accept(r *relay) {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			// Held while an end is cut off (or until Close).
			for ch := l.healed(r); ch != nil; ch = l.healed(r) {
				select {
				case <-ch:
				case <-l.done:
					c.Close()
					return
				}
			}
			r.mu.Lock()
			target := r.target
			r.mu.Unlock()
			if target == "" {
				c.Close()
				return
			}
			r.forward(c, target, func() bool { return l.isCut(r) })
		}()
	}
}

// forward relays c to target until either side closes. cut is checked
// once both connections are tracked, so that a Cut racing with the dial
// closes them either way.
func (r *relay) forward(c net.Conn, target string, cut func() bool) {
	up, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	r.conns[c], r.conns[up] = struct{}{}, struct{}{}
	shut := r.shut
	r.mu.Unlock()
	if shut || cut() {
		c.Close()
		up.Close()
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

func (r *relay) closeConns() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
	}
}
