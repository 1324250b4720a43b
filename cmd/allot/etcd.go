package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/internal/tlsx"
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
		tlsf    tlsx.Flags
	)
	tlsf.Register(fs, "", "etcd's client listener (client certificates are then required; etcd reads the files at every handshake)", false)
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	// Only to check the files and the flags: etcd loads them itself.
	src, err := tlsf.ServerSource(nil)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	sec := security{src: src, insecure: tlsf.Insecure}
	if err := sec.plain("client", *client, tlsx.ListenRule); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	// The peer listener is plain text whatever the flags: a single member
	// has no peer, and it listens on loopback only.
	if !tlsx.IsLoopback(*peer) {
		return fmt.Errorf("etcd: --peer-addr %s: the peer listener serves plain text, on loopback only", *peer)
	}
	files := etcdstore.EmbeddedTLS{CertFile: tlsf.Cert, KeyFile: tlsf.Key, CAFile: tlsf.CA}
	e, err := etcdstore.StartEmbeddedTLS(*dataDir, sec.scheme()+"://"+*client, "http://"+*peer, files)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer e.Close()
	banner := sec.banner()
	if src != nil {
		banner = "TLS, client certificates required"
	}
	fmt.Fprintf(stdout, "allot: etcd serving clients on %s://%s (peers %s), data in %s; %s\n", sec.scheme(), e.Clients[0].Addr(), *peer, *dataDir, banner)
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
