// Command gubernator-target is `allot bench` with one more --system:
// gubernator v2, driven through its own gRPC API (V1/GetRateLimits) with
// the same load shape, so that deploy/bench/compare.sh measures both
// servers with the same load generator. It is a module of its own so that
// gubernator's dependencies stay out of allot's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/allot-dev/allot/internal/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	systems := map[string]loadgen.System{"allot": loadgen.NewAllot, "gubernator": newGubernator}
	if err := loadgen.Main(ctx, "gubernator-target", systems, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gubernator-target:", err)
		}
		os.Exit(1)
	}
}
