package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/node"
	"github.com/allot-dev/allot/regional/peersync"
	"github.com/allot-dev/allot/regional/redisstore"
)

// parsePeers reads --peers: NAME=ADDR,NAME=ADDR... (the other regions and
// the gRPC address of their enforcers).
func parsePeers(s, region string) (map[string]string, error) {
	peers := map[string]string{}
	for _, p := range splitList(s) {
		name, addr, ok := strings.Cut(p, "=")
		name, addr = strings.TrimSpace(name), strings.TrimSpace(addr)
		switch {
		case !ok || name == "" || addr == "":
			return nil, fmt.Errorf("--peers: want NAME=ADDR, got %q", p)
		case name == region:
			return nil, fmt.Errorf("--peers: %q is this region", name)
		case peers[name] != "":
			return nil, fmt.Errorf("--peers: region %q given twice", name)
		}
		peers[name] = addr
	}
	return peers, nil
}

// peerCounts is the CountStore a region's instances share their counts
// in, with peers and --redis (a connection of its own, without metrics:
// the enforcer's store exports them), and its close; nil otherwise.
func peerCounts(spec regionSpec, log *slog.Logger) (regional.CountStore, func(), error) {
	if len(spec.peers) == 0 || len(spec.redis) == 0 {
		return nil, func() {}, nil
	}
	rs, err := redisstore.New(redisstore.Options{Addrs: spec.redis, Cluster: spec.redisCluster,
		TLS: spec.sec.redis, TLSFor: spec.sec.redisFor, Username: spec.sec.redisUser, Password: spec.sec.redisPassword,
		Prefix: redisstore.DefaultPrefix + spec.name + ":counts:", Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return rs, func() { rs.Close() }, nil
}

// startPeers links a region to its peers (spec.peers): it serves
// allot.v1.Peer on the node's gRPC server and syncs shared-mode counters
// and loans until the node stops.
// log does not name the region: the peer syncer adds it.
func startPeers(spec regionSpec, inode *node.Node, n *regionNode, reg prometheus.Registerer, log *slog.Logger) error {
	if len(spec.peers) == 0 {
		return nil
	}
	opts := peersync.Options{Node: inode, Peers: spec.peers, Registry: reg, Logger: log, Credentials: spec.sec.creds(), Now: inode.Clock()}
	s, err := peersync.New(opts)
	if err != nil {
		return err
	}
	s.Register(n.gs)
	n.stopPeers = s.Shutdown
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); s.Close(); close(done) }()
	stopRS := n.stopRS
	n.stopRS = func() { cancel(); <-done; stopRS() }
	log.Info("linked to peer regions", "region", spec.name, "peers", fmt.Sprint(spec.peers))
	return nil
}

// devPeers are the peers of region i of allot dev: the other regions, at
// the first region's gRPC port + 10·j. None when the port is 0 (chosen
// by the system, so unknown in advance).
func devPeers(names []string, grpcAddr string, i int) map[string]string {
	peers := map[string]string{}
	for j, name := range names {
		addr, err := offsetAddr(grpcAddr, 10*j)
		if err != nil || addr == grpcAddr && j > 0 {
			return nil
		}
		if j != i {
			peers[name] = addr
		}
	}
	return peers
}
