package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/allot-dev/allot/coordinator/etcdstore"
)

// runEtcd serves allot's embedded etcd as a process of its own: the etcd
// of a local cluster (allot cluster up) on a machine without etcd.
func runEtcd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot etcd", "usage: allot etcd [flags]\n\nServes a single-member etcd (allot's embedded one) on loopback until SIGINT/SIGTERM.\n"+
		"For local clusters and tests; production fleets run a real etcd cluster.", stderr)
	var (
		dataDir = fs.String("data-dir", "allot-etcd", "data folder; a folder with data from an earlier run is restarted with it")
		client  = fs.String("client-addr", "127.0.0.1:2379", "client address (loopback)")
		peer    = fs.String("peer-addr", "127.0.0.1:2380", "peer address (loopback)")
	)
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	e, err := etcdstore.StartEmbedded(*dataDir, "http://"+*client, "http://"+*peer)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer e.Close()
	fmt.Fprintf(stdout, "allot: etcd serving clients on http://%s (peers %s), data in %s\n", e.Clients[0].Addr(), *peer, *dataDir)
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		if err == nil {
			err = errors.New("stopped")
		}
		return fmt.Errorf("etcd: %w", err)
	}
}
