package main

import (
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allot-dev/allot/coordinator/etcdstore"
)

// TestRegionalAdvertise: an enforcer listening on one address registers
// the one other processes reach it at.
func TestRegionalAdvertise(t *testing.T) {
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	client := "http://" + free()
	etcd, err := etcdstore.StartEmbedded(t.TempDir(), client, "http://"+free())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	store := etcdstore.New(cli, "")
	if _, err := store.ApplyConfig(t.Context(), 0, etcdstore.ConfigVersion{Time: time.Now().UTC(), Author: "test", Summary: "initial",
		YAML: "domain: api\nregions: [test]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"}); err != nil {
		t.Fatal(err)
	}
	startAllot(t, buildAllot(t), "regional", "--insecure", "--etcd", client, "--region", "test", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--advertise", "10.1.2.3:8081", "--advertise-http", "10.1.2.3:8080")
	for deadline := time.Now().Add(20 * time.Second); ; {
		rs, err := store.Regions(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 1 {
			if rs[0].Addr != "10.1.2.3:8081" || rs[0].HTTP != "10.1.2.3:8080" {
				t.Fatalf("registered %+v, want the advertised addresses", rs[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("registered regions %+v after 20s", rs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
