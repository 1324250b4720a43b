package allot

import (
	"fmt"
	"maps"
	"slices"
)

// Plan floors.
//
// A plan may promise a floor on some limits:
//
//	plans:
//	  pro: {multiplier: 10, floors: {per-tenant: 5000/1m}}
//
// reads "a tenant on pro gets at least 5000 per minute on per-tenant".
// The rate a plan sets on a limit is the limit's rate with its amount
// multiplied by the plan's multiplier, rounded as Effective rounds it.
// Validation (ParseConfig, Domain.Validate, and so every apply) refuses a
// configuration in which that rate is below a floor of the plan, compared
// per second (6000/1m equals 100/1s). So lowering a plan's multiplier,
// lowering a limit's rate, or promising more than a plan gives are all
// refused, naming the plan, the limit and both rates. A floor that names
// no limit of the domain, or an unlimited one, is refused too.
//
// Floors bind plans, not overrides: an override is a deliberate exception
// for one key (throttling an abusive tenant is its job) and may go below.

// rateOn is the rate plan p sets on limit l: l's rate with its amount
// multiplied by p's multiplier, clamped as Effective clamps it.
func (p Plan) rateOn(l *Limit) Rate {
	return Rate{Amount: scaleRate(l.Rate, p.Multiplier), Period: l.Rate.Period}
}

// checkPlanFloors reports each floor of each plan that names no limit, is
// not a valid rate, or is above the rate the plan sets on its limit.
func (d *Domain) checkPlanFloors(report func(field, msg string)) {
	for _, name := range slices.Sorted(maps.Keys(d.Plans)) {
		p := d.Plans[name]
		for _, limit := range slices.Sorted(maps.Keys(p.Floors)) {
			field := "plans." + name + ".floors." + limit
			floor := p.Floors[limit]
			l := d.Limit(limit)
			switch {
			case l == nil:
				report(field, fmt.Sprintf("unknown limit %q", limit))
			case l.Unlimited:
				report(field, fmt.Sprintf("limit %q is unlimited: a floor does not apply", limit))
			case floor.Validate() != nil:
				report(field, floor.Validate().Error())
			case l.Rate.Validate() != nil || !(p.Multiplier > 0):
				// reported on the limit's rate or the plan's multiplier
			default:
				if got := p.rateOn(l); got.PerSecond() < floor.PerSecond()*(1-1e-12) {
					report(field, fmt.Sprintf("plan %s sets %s to %v (%v × %g), below the plan's floor %v",
						name, limit, got, l.Rate, p.Multiplier, floor))
				}
			}
		}
	}
}
