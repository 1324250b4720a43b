package main

import (
	"context"
	"io"

	"github.com/allot-dev/allot/internal/loadgen"
)

// runBench is `allot bench`: a load generator for allot's gRPC Check. The
// same command line with gubernator as a --system is built from
// deploy/bench/gubernator-target, which keeps gubernator's dependencies out
// of this module.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return loadgen.Main(ctx, "allot bench", map[string]loadgen.System{"allot": loadgen.NewAllot}, args, stdout, stderr)
}
