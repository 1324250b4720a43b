package report

import (
	"bytes"
	"testing"
	"time"

	"github.com/allot-dev/allot/sim"
)

func TestPlots(t *testing.T) {
	sc, cfg, err := sim.Load("../scenarios/coordinator-failover.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration = 6 * time.Second
	res, err := sim.Run(sc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	files, err := Plots(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"shares.png", "admitted.png"} {
		if !bytes.HasPrefix(files[name], []byte("\x89PNG")) {
			t.Errorf("%s is not a PNG (%d bytes)", name, len(files[name]))
		}
	}
}
