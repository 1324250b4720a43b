package redisstore_test

import (
	"testing"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/regional/redisstore"
	"github.com/allot-dev/allot/regional/storetest"
)

func newStore(t *testing.T, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreContract(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, newStore(t, redisstore.Options{Addrs: []string{srv.Addr}}))
}

func TestStoreContractCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	storetest.Run(t, newStore(t, redisstore.Options{Addrs: c.Addrs(), Cluster: true}))
}
