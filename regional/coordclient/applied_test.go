package coordclient_test

import (
	"testing"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/coordclient"
)

func TestApplied(t *testing.T) {
	cfg, err := allot.ParseConfig("t.yaml", []byte("domain: api\nregions: [a, b]\nlimits:\n  - {name: x, rate: 10/s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := coordclient.New(coordclient.Options{Region: "a", Engine: regional.New(cfg, regional.Options{}), Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Instance() == "" {
		t.Error("no instance id made up")
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if term, version := c.Applied("api"); term != 0 || version != 0 {
		t.Errorf("Applied before any assignment = %d, %d", term, version)
	}
	if term, version := c.Applied("nope"); term != 0 || version != 0 {
		t.Errorf("Applied of an unknown domain = %d, %d", term, version)
	}
}
