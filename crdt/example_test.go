package crdt_test

import (
	"fmt"

	"github.com/allot-dev/allot/crdt"
)

// Two regions share a key: each counts in its own slot and ships deltas;
// eu-west loses one batch, sees the gap and resyncs.
func Example() {
	const key, window = "tenant=acme", 29000000
	east, west := crdt.NewStore("us-east", crdt.DefaultRetention), crdt.NewStore("eu-west", crdt.DefaultRetention)
	var westPeers crdt.Tracker
	var eastVersion uint64

	sync := func(lost bool) {
		var ds []crdt.Delta
		ds, eastVersion = east.DeltasSince(eastVersion)
		b := crdt.AppendBatch(nil, ds)
		if lost {
			return
		}
		ds, _ = crdt.DecodeBatch(b)
		for _, d := range ds {
			fmt.Printf("seq %d: %v\n", d.Seq, westPeers.Observe(d.Origin, d.Seq))
			west.Apply(d)
		}
	}

	east.Inc(key, window, 3)
	west.Inc(key, window, 2)
	sync(false)
	east.Inc(key, window, 4)
	sync(true)
	east.Inc("tenant=globex", window, 1)
	sync(false)

	full, seq := east.FullState()
	for _, d := range full {
		west.Apply(d)
	}
	westPeers.Reset("us-east", seq)
	fmt.Println("eu-west sees", west.Value(key, window), "for", key)
	// Output:
	// seq 1: Next
	// seq 3: Gap
	// eu-west sees 9 for tenant=acme
}
