package coordclient_test

import (
	"context"
	"testing"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/coordclient"
)

func TestApplied(t *testing.T) {
	cfg, err := allot.ParseConfig("t.yaml", []byte("domain: api\nregions: [a, b]\nlimits:\n  - {name: x, rate: 10/s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	snap := func(context.Context, string) (coordinator.Snapshot, error) {
		return coordinator.Snapshot{Term: 5, Version: 9, Records: []coordinator.Record{
			{Limit: "x", Cells: []coordinator.Cell{{Region: "a", Share: 0.5, Bound: 0.5}, {Region: "b", Share: 0.5, Bound: 0.5}}}}}, nil
	}
	c, err := coordclient.New(coordclient.Options{Region: "a", Engine: regional.New(cfg, regional.Options{}), Addrs: []string{"127.0.0.1:1"}, Snapshot: snap})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if term, version := c.Applied("api"); term != 0 || version != 0 {
		t.Errorf("Applied before Start = %d, %d", term, version)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if term, version := c.Applied("api"); term != 5 || version != 9 {
		t.Errorf("Applied = %d, %d; want the snapshot's 5, 9", term, version)
	}
	if term, version := c.Applied("nope"); term != 0 || version != 0 {
		t.Errorf("Applied of an unknown domain = %d, %d", term, version)
	}
}
