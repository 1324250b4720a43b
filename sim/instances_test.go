package sim

import (
	"testing"
)

// With peers, the simulator runs every instance of a region through its
// own regional/node.Node, as allot regional does (it ran one engine per
// region before), and a region of several instances sums its
// shared-mode counts in a CountStore.
func TestPeersRunEveryInstance(t *testing.T) {
	for _, file := range []string{
		"scenarios/borrow.yaml", // split mode: each instance borrows for itself
		"scenarios/shared-instances.yaml",
	} {
		t.Run(file, func(t *testing.T) {
			sc, cfg, err := Load(file)
			if err != nil {
				t.Fatal(err)
			}
			sc.Shorten()
			w, err := build(sc, cfg, Allot, newKeySpace(sc, cfg.Domains[0].Limit(sc.Limit)))
			if err != nil {
				t.Fatal(err)
			}
			if !w.peers() {
				t.Fatal("the scenario has no peers")
			}
			for _, r := range w.region {
				want := sc.region(r.name).Instances
				engines := map[any]bool{}
				for _, in := range r.inst {
					if in.n == nil || in.n.Engine() != in.e {
						t.Fatalf("%s: instance without its own node", in.id)
					}
					engines[in.e] = true
				}
				if len(engines) != want || want < 2 {
					t.Fatalf("%s runs %d engines, want its %d instances", r.name, len(engines), want)
				}
				if r.counts == nil {
					t.Fatalf("%s: its instances share no CountStore (the regional Redis)", r.name)
				}
			}
		})
	}
}
