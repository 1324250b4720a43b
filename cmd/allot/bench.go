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
//
// Its flags are parsed by loadgen.Main, which prints its usage to the
// writer of errors: on -h or --help that writer is stdout, as for every
// command (cli.go).
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if helpWanted(args) {
		args, stderr = []string{"-h"}, stdout
	}
	return loadgen.Main(ctx, "allot bench", map[string]loadgen.System{"allot": loadgen.NewAllot}, args, stdout, stderr)
}
