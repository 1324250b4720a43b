package regional

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot"
)

// Borrowing. A region that rejected a split-mode key (local enforcement)
// in the current window asks a peer for part of the peer's unused
// allowance of that key. The lender deducts the grant from its own
// bucket, as if it had admitted that much, and only then answers; the
// borrower adds the grant to its bucket (never above full) if the
// window is still the one the loan was for. So a loan moves allowance
// from one region to another and never creates it: a lost request
// creates nothing, a lost answer strands the grant at the lender until
// the window ends, a repeated request gets the recorded answer without
// a second deduction, and a repeated, late or reordered answer is
// credited at most once (loans are numbered) and only in its window.
// Σ over regions of allowance in force ≤ L holds, as Σ shares ≤ 1 does.
//
// Bounds: a loan asks for 1%–10% of the key's limit (twice what was
// rejected since the last ask, within those bounds); a lender gives at
// most half of what it holds; one ask per key is in flight at a time,
// and a key asks at most every askGap; only peers heard within
// stale_after are asked, so nothing is borrowed across a partition; a
// peer that refused a key is not asked again for it in that window.
//
// A token bucket or GCRA borrower adds the grant to its tokens; a
// sliding_window borrower adds it to the window's amount (the lender's
// count holds it), so that every fixed window admits at most
// Σ shares × L + Σ borrowed − Σ lent ≤ L over all regions.
const (
	loanMin      = 0.01 // of the key's limit
	loanMax      = 0.10
	lendFraction = 0.5
)

// askGap is the least time between two asks of one key: a twentieth of
// the limit's period, at least 10ms.
func (ss *limitSync) askGap() int64 { return max(ss.period/20, int64(10*time.Millisecond)) }

// needyKey is a split-mode key rejected here: it may borrow. The lock of
// its table shard guards it.
type needyKey struct {
	ss     *limitSync
	key    uint64
	name   string
	wanted float64 // cost rejected since the last ask
	noted  bool    // rejected since the last LoanAsks
	window uint64  // the window it borrows for
	loan   uint64  // the ask in flight; 0 if none
	peer   string  // whom it was sent to
	next   int64   // no new ask before (unix ns)
	// rejected is the cost rejected in its window, and amount its
	// amount in it before loans (-1: not a sliding window of the limit's
	// period), for ahead.
	rejected, amount float64
	// own is the cost rejected since its window began: rejected less
	// what a new window took over from the one before (see lacks).
	own     float64
	refused []string
	turn    int // round robin over the fresh peers
	// credit is what sliding_window loans added to the key's allowance
	// in window creditWin.
	credit    float64
	creditWin uint64
}

// lentKey is what a split-mode sliding-window key lent of window win.
// A loan is counted in the lender's window, as spent there; once that
// window is the one before, which a sliding window weighs, it is taken
// out of its count again (unweigh): the borrower's count holds what it
// admitted of the loan, and counted at both, a loan weighed on both
// regions' next window (a region that lent most of its window could lend
// or admit little of the next until that weight had decayed). The lock
// of its table shard guards it.
type lentKey struct {
	ss   *limitSync
	win  uint64
	lent float64
	done bool // taken out of the window before's count
}

// unweigh takes what key h lent of the window before out of slot s's
// count of it, once, where s holds that window as the one before. The
// caller holds the key's shard lock.
func (ss *limitSync) unweigh(h uint64, s *slot, p params, now int64) {
	side := &ss.ps.side[shardOf(h)]
	if len(side.lent) == 0 || p.alg != allot.SlidingWindow || p.period != ss.period {
		return
	}
	lk := side.lent[h]
	if lk == nil || lk.done || lk.win+1 != ss.window(now) {
		return
	}
	roll(s, now, p)
	if s.t == int64(lk.win+1)*ss.period {
		s.b = max(0, s.b-lk.lent)
	}
	lk.done = true
}

// borrowed raises a sliding_window work's amount by the loans its key
// was credited in the current window. The caller holds the key's shard
// lock.
func (ss *limitSync) borrowed(w *work, now int64) {
	side := &ss.ps.side[shardOf(w.key)]
	if len(side.needy) == 0 || w.p.alg != allot.SlidingWindow || w.p.period != ss.period {
		return
	}
	nk := side.needy[w.key]
	if nk == nil {
		return
	}
	nk.amount = w.p.amount // before loans (see ahead)
	if nk.credit > 0 && nk.creditWin == ss.window(now) {
		w.p.amount += nk.credit
		w.p.burst += nk.credit
	}
}

// noteRejected records a split-mode key that this region rejected: it
// may borrow. The caller holds the key's shard lock.
func (t *table) noteRejected(items []Item, w *work, st *allot.LimitStatus) {
	if st.Allowed || st.Shadow {
		return
	}
	if w.p.cap > 0 && float64(st.Remaining) >= w.cost {
		return // held at its persisted mark (persist.go), not out of allowance: a loan would not help
	}
	ss := w.ls.shares.sync.Load()
	if ss == nil || !ss.borrow || ss.ps.table != t || len(ss.expected) == 0 || w.item >= len(items) {
		return
	}
	side := &ss.ps.side[shardOf(w.key)]
	nk := side.needy[w.key]
	if nk == nil || nk.ss != ss {
		if len(side.needy) >= maxNeedyPerShard {
			return
		}
		if side.needy == nil {
			side.needy = make(map[uint64]*needyKey)
		}
		nk = &needyKey{ss: ss, key: w.key, name: KeyString(w.ls.l, items[w.item].Descriptor)}
		side.needy[w.key] = nk
	}
	nk.wanted += w.cost
	nk.rejected += w.cost
	nk.own += w.cost
	nk.noted = true
	if w.p.alg != allot.SlidingWindow || w.p.period != ss.period {
		nk.amount = -1
	} else if nk.amount == 0 {
		nk.amount = w.p.amount // a new needy key: nothing credited yet (then see borrowed)
	}
}

// ahead is what sliding-window key nk lacks of its window at now, at the
// rate it was asked for (admitted and rejected) since the window began:
// its count (cur, admitted in the window) and what that rate brings
// until the window's end, less its amount and what it was credited. 0
// when it lacks nothing, or when it is not a sliding window of the
// limit's period. The caller holds the key's shard lock.
func (nk *needyKey) ahead(cur float64, now int64) float64 {
	return nk.aheadAt(cur, nk.rejected, now)
}

// aheadAt is ahead with rejected, the cost taken as rejected in the
// window.
func (nk *needyKey) aheadAt(cur, rejected float64, now int64) float64 {
	if nk.amount < 0 {
		return 0
	}
	p := nk.ss.period
	ws := now - now%p
	el, left := float64(now-ws), float64(ws+p-now)
	if el <= 0 {
		return 0
	}
	rate := (cur + rejected) / el // per ns
	credit := 0.0
	if nk.creditWin == nk.ss.window(now) {
		credit = nk.credit
	}
	return max(0, cur+rate*left-nk.amount-credit)
}

// lentOf records that key h lent n of window win (see lentKey); beyond
// maxNeedyPerShard keys a shard records nothing: the loan then weighs on
// the lender's next window too, as it did before. The caller holds the
// key's shard lock.
func (ss *limitSync) lentOf(h uint64, win uint64, n float64) {
	if ss.period <= 0 {
		return
	}
	side := &ss.ps.side[shardOf(h)]
	lk := side.lent[h]
	if lk == nil {
		if len(side.lent) >= maxNeedyPerShard {
			return
		}
		if side.lent == nil {
			side.lent = map[uint64]*lentKey{}
		}
		lk = &lentKey{ss: ss, win: win}
		side.lent[h] = lk
	}
	if lk.win != win {
		lk.win, lk.lent, lk.done = win, 0, false
	}
	lk.lent += n
}

// lentIn is what key h lent of window win (0: nothing recorded), which
// its count holds but its own pace does not (ahead). The caller holds the
// key's shard lock.
func (ss *limitSync) lentIn(h uint64, win uint64) float64 {
	if lk := ss.ps.side[shardOf(h)].lent[h]; lk != nil && lk.win == win {
		return lk.lent
	}
	return 0
}

// lacks reports whether key nk, with an ask in flight, will lack
// allowance by its window's end at its own pace in the window (aheadAt,
// without what the window before was refused): a key that asks for what
// it was refused at the end of the window before, a burst's tail, and
// has no such need in this one may lend. In bursts-peers eu, asking so
// after its first burst with three quarters of the limit idle, refused
// us as needy for the rest of that window (us admitted 222 of its 500).
// The caller holds the key's shard lock.
func (nk *needyKey) lacks(sh *shard, now int64) bool {
	idx := sh.find(nk.key)
	if idx < 0 || nk.amount < 0 {
		return true
	}
	return nk.aheadAt(nk.ownCount(&sh.slots[idx], now), nk.own, now) >= 0.5
}

// ownCount is key nk's count in the window that holds now (slot s, rolled
// to it), less what it lent of that window: its count holds its loans,
// its own pace (ahead) does not. The caller holds the key's shard lock.
func (nk *needyKey) ownCount(s *slot, now int64) float64 {
	roll(s, now, params{period: nk.ss.period})
	return s.a - nk.ss.lentIn(nk.key, nk.ss.window(now))
}

// LoanAsk is a loan this region asks a peer for.
type LoanAsk struct {
	Peer          string
	Domain, Limit string
	Key           string // as KeyString names it
	Window        uint64
	Amount        int64
	ID            uint64 // unique in this region (each instance starts at random): retries are not deducted twice
}

// LoanRequest is a peer's ask, as the lender receives it.
type LoanRequest struct {
	From          string // the borrowing region
	Domain, Limit string
	Key           string
	Window        uint64
	Amount        int64
	ID            uint64
}

// LoanGrant is the lender's answer.
type LoanGrant struct {
	Granted   int64  // deducted at the lender; 0 when refused
	Remaining int64  // what the lender could still lend
	Refused   string // why nothing was granted: no_spare, window, needy
}

// LoanAsks returns the loans to ask for now: one per key rejected here
// in the current window with no ask in flight and none in the last
// askGap, each to a peer heard within stale_after that has not refused
// the key in this window, in turn. The driver sends each (Lend on the
// peer) and gives the answer, or the failure, to Credit.
func (e *Engine) LoanAsks(now time.Time) []LoanAsk {
	ps := e.peer.Load()
	if ps == nil {
		return nil
	}
	t := now.UnixNano()
	fresh := map[*limitSync][]string{}
	for _, ss := range e.syncs() {
		if ss.borrow {
			fresh[ss] = ss.fresh(t)
		}
	}
	type pick struct {
		ask LoanAsk
		ss  *limitSync
	}
	var picks []pick
	for i := range ps.side {
		side, sh := &ps.side[i], &e.table.shards[i]
		sh.mu.Lock()
		for _, nk := range side.needy {
			win := nk.ss.window(t)
			if nk.window != win {
				if !nk.noted {
					continue
				}
				// A new window: an answer still to come is for a past one
				// and will not be credited.
				nk.window, nk.refused, nk.loan, nk.next, nk.rejected, nk.own = win, nil, 0, 0, nk.wanted, 0
			}
			if nk.loan != 0 || t < nk.next {
				continue
			}
			// Once rejected in its window, a key asks for what it will lack
			// by the window's end at the rate it is asked for, not only
			// after each rejection: an answer takes a round trip, and one
			// asked once it runs short at the end comes too late.
			want := nk.wanted // doubled below
			if idx := sh.find(nk.key); idx >= 0 && nk.amount >= 0 {
				want = max(want, nk.ahead(nk.ownCount(&sh.slots[idx], t), t)/2)
			}
			if !nk.noted && want < 0.5 {
				continue
			}
			peers := fresh[nk.ss]
			var to string
			for range peers {
				p := peers[nk.turn%len(peers)]
				nk.turn++
				if !slices.Contains(nk.refused, p) {
					to = p
					break
				}
			}
			if to == "" {
				nk.noted = false
				continue
			}
			nk.loan, nk.peer, nk.next, nk.noted = ps.loanSeq.Add(1), to, t+nk.ss.askGap(), false
			picks = append(picks, pick{LoanAsk{Peer: to, Domain: nk.ss.domain, Limit: nk.ss.limit, Key: nk.name,
				Window: win, Amount: int64(math.Ceil(want)), ID: nk.loan}, nk.ss})
			nk.wanted = 0
		}
		sh.mu.Unlock()
	}
	out := make([]LoanAsk, 0, len(picks))
	for _, p := range picks {
		l := e.limitOf(p.ask.Domain, p.ask.Limit)
		eff, ok := e.keyEffective(now, p.ask.Domain, p.ask.Limit, p.ask.Key)
		if l == nil || !ok {
			continue
		}
		amount := float64(eff.Rate.Amount) * float64(p.ss.period) / float64(eff.Rate.Period)
		want := min(max(2*float64(p.ask.Amount), loanMin*amount), loanMax*amount)
		p.ask.Amount = max(1, int64(math.Ceil(want)))
		p.ss.mu.Lock()
		p.ss.stats.LoansAsked++
		p.ss.mu.Unlock()
		out = append(out, p.ask)
	}
	return out
}

// limitOf returns a limit of the configuration in force, or nil.
func (e *Engine) limitOf(domain, limit string) *allot.Limit {
	ls, err := e.limitFor(domain, limit, 0)
	if err != nil {
		return nil
	}
	return ls.l
}

// keyEffective is the effective limit of a key named as KeyString names
// it: the limit after the plan and overrides that the key's own values
// select.
func (e *Engine) keyEffective(now time.Time, domain, limit, key string) (allot.Effective, bool) {
	ds := e.cfg.Load().domain(domain)
	if ds == nil {
		return allot.Effective{}, false
	}
	ls := ds.byName[limit]
	if ls == nil {
		return allot.Effective{}, false
	}
	_, d, err := ParseKeyString(key)
	if err != nil {
		return allot.Effective{}, false
	}
	eff := ds.d.Effective(ls.l, d, now)
	return eff, eff.Rate.Period > 0
}

// Credit takes the answer to a loan ask (or err, when there was none).
// A grant is added to the key's bucket if the ask is the key's one in
// flight and its window is the current one; otherwise it is lost, and
// Credit reports false. A refusal keeps the key from asking that peer
// again in the window.
func (e *Engine) Credit(now time.Time, ask LoanAsk, g LoanGrant, err error) bool {
	ls, ss, serr := e.syncOf(ask.Domain, ask.Limit)
	if serr != nil || ss == nil || !ss.borrow {
		return false
	}
	h, kerr := e.keyOf(ls, ask.Key)
	eff, ok := e.keyEffective(now, ask.Domain, ask.Limit, ask.Key)
	if kerr != nil || !ok {
		return false
	}
	t := now.UnixNano()
	base := baseParams(ls.l, eff)
	hist := ls.shares.hist(h)
	credited, outcome := false, &ss.stats.LoansFailed
	sh, side := &e.table.shards[shardOf(h)], &ss.ps.side[shardOf(h)]
	sh.mu.Lock()
	nk := side.needy[h]
	switch {
	case nk == nil || nk.loan != ask.ID:
		outcome = nil // late or repeated: not this key's ask in flight
	case err != nil:
		nk.loan = 0
	case g.Granted <= 0:
		nk.loan, outcome = 0, &ss.stats.LoansRefused
		nk.refused = append(nk.refused, ask.Peer)
	case ask.Window != ss.window(t):
		nk.loan, outcome = 0, &ss.stats.LoansExpired
	case base.alg == allot.SlidingWindow:
		// The window's allowance grows by the grant (borrowed): its count
		// is not touched, so the next window owes nothing.
		nk.loan, outcome, credited = 0, &ss.stats.LoansGranted, true
		if nk.creditWin != ask.Window {
			nk.credit, nk.creditWin = 0, ask.Window
		}
		nk.credit += float64(g.Granted)
	default:
		nk.loan, outcome = 0, &ss.stats.LoansGranted
		if idx := sh.find(h); idx >= 0 {
			s := &sh.slots[idx]
			hist.catchUp(s, base, ls.changeFor(base))
			refund(s, t, base.scaled(hist.current()), float64(g.Granted))
			credited = true
		}
	}
	sh.mu.Unlock()
	if outcome != nil {
		ss.mu.Lock()
		*outcome++
		if credited {
			ss.stats.Borrowed += uint64(g.Granted)
		}
		ss.mu.Unlock()
	}
	return credited
}

// Lend answers a peer's loan ask: it deducts up to half of what this
// region holds of the key, at most the amount asked, and returns the
// grant. It refuses (Granted 0, no error) an ask for another window
// than the current one, and one for a key this region rejected in the
// window itself. A repeated ask (same peer and ID) in the window gets
// the recorded answer and is not deducted again. Errors: ErrNoPeers,
// ErrUnknownPeer, ErrUnknownDomain, ErrUnknownLimit, ErrNotLendable,
// ErrBadDescriptor, ErrBadCost.
func (e *Engine) Lend(now time.Time, req LoanRequest) (LoanGrant, error) {
	ps := e.peer.Load()
	if ps == nil {
		return LoanGrant{}, ErrNoPeers
	}
	if !ps.isPeer(req.From) {
		return LoanGrant{}, fmt.Errorf("%w %q", ErrUnknownPeer, req.From)
	}
	ls, ss, err := e.syncOf(req.Domain, req.Limit)
	if err != nil {
		return LoanGrant{}, err
	}
	if ss == nil || !ss.borrow {
		return LoanGrant{}, fmt.Errorf("%w: %s/%s", ErrNotLendable, req.Domain, req.Limit)
	}
	h, err := e.keyOf(ls, req.Key)
	if err != nil {
		return LoanGrant{}, err
	}
	if req.Amount <= 0 || req.Amount > allot.MaxAmount {
		return LoanGrant{}, fmt.Errorf("%w: loan of %d", ErrBadCost, req.Amount)
	}
	eff, ok := e.keyEffective(now, req.Domain, req.Limit, req.Key)
	if !ok {
		return LoanGrant{}, fmt.Errorf("%w: key %q", ErrBadDescriptor, req.Key)
	}
	t := now.UnixNano()
	win := ss.window(t)
	if req.Window != win {
		return LoanGrant{Refused: "window"}, nil
	}
	base := baseParams(ls.l, eff)
	hist := ls.shares.hist(h)
	p := base.scaled(hist.forCheck(base, t)) // what it may spend in this window, not its current share

	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.loanWin != win {
		ss.loans, ss.loanWin = map[loanKey]LoanGrant{}, win
	}
	id := loanKey{req.From, req.ID}
	if g, ok := ss.loans[id]; ok {
		return g, nil
	}
	g := LoanGrant{}
	sh, side := &e.table.shards[shardOf(h)], &ps.side[shardOf(h)]
	sh.mu.Lock()
	if nk := side.needy[h]; nk != nil && nk.window == win && (nk.noted || nk.loan != 0 && nk.lacks(sh, t)) {
		g.Refused = "needy"
	} else {
		idx := sh.find(h)
		if idx < 0 {
			sh.makeRoom(t)
			idx = sh.insert(h)
			sh.remake(&sh.slots[idx], t, hist, base, p, ls.changeFor(base))
			sh.noteWindow(ls, base, &sh.slots[idx])
		} else {
			hist.catchUp(&sh.slots[idx], base, ls.changeFor(base))
		}
		s := &sh.slots[idx]
		ss.unweigh(h, s, p, t)
		if n := math.Floor(min(float64(req.Amount), available(s, t, p)*lendFraction)); n >= 1 && take(s, t, p, n, false).allowed {
			g.Granted = int64(n)
			sh.noteWindow(ls, base, s)
			ss.lentOf(h, win, n)
		} else {
			g.Refused = "no_spare"
		}
		g.Remaining = int64(math.Floor(available(s, t, p) * lendFraction))
	}
	sh.mu.Unlock()
	ss.loans[id] = g
	if g.Granted > 0 {
		ss.stats.LoansMade++
		ss.stats.Lent += uint64(g.Granted)
	} else {
		ss.stats.LendRefused++
	}
	return g, nil
}
