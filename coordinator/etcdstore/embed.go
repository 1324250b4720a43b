package etcdstore

import (
	"fmt"
	"net"
	"net/url"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// StartEmbedded starts a single-member etcd with its data in dir, serving
// clients on clientURL and peers on peerURL (both http:// on a loopback
// address, e.g. http://127.0.0.1:2379), and returns once it serves. It is
// for `allot dev` and tests: logs only errors (to stderr), a 256 MiB quota, frequent
// snapshots and hourly compaction. A dir that holds data from an earlier
// run is restarted with it. The caller calls Close on the result.
func StartEmbedded(dir, clientURL, peerURL string) (*embed.Etcd, error) {
	return StartEmbeddedTLS(dir, clientURL, peerURL, EmbeddedTLS{})
}

// EmbeddedTLS are the PEM files of an embedded etcd that serves its
// clients TLS: its certificate and key, and the CA bundle that verifies
// client certificates, which it then requires. etcd reads the
// certificate at every handshake, so a rotated one needs no restart.
type EmbeddedTLS struct {
	CertFile, KeyFile, CAFile string
}

// StartEmbeddedTLS is StartEmbedded with TLS for clients (clientURL is
// then https://) when tls names files. Peers (there are none: one member)
// stay plain text on loopback.
func StartEmbeddedTLS(dir, clientURL, peerURL string, tls EmbeddedTLS) (*embed.Etcd, error) {
	var urls [2]url.URL
	for i, s := range []string{clientURL, peerURL} {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("embedded etcd: %w", err)
		}
		ip := net.ParseIP(u.Hostname())
		scheme := "http"
		if i == 0 && tls.CertFile != "" {
			scheme = "https"
		}
		if u.Scheme != scheme || !(u.Hostname() == "localhost" || ip != nil && ip.IsLoopback()) || u.Port() == "" {
			return nil, fmt.Errorf("embedded etcd: url %q: want %s://<loopback address>:<port>", s, scheme)
		}
		urls[i] = *u
	}
	cfg := embed.NewConfig()
	cfg.Name = "allot-dev"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = urls[:1], urls[:1]
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = urls[1:], urls[1:]
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if tls.CertFile != "" {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: tls.CertFile, KeyFile: tls.KeyFile, TrustedCAFile: tls.CAFile, ClientCertAuth: true}
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	lg, err := zc.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return quiet{c} }))
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: logger: %w", err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.QuotaBackendBytes = 256 << 20
	cfg.SnapshotCount = 5000
	cfg.SnapshotCatchUpEntries = 1000
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = embed.CompactorModePeriodic, "1h"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: not ready after a minute", dir)
	}
}

// quiet drops the error etcd logs for each listener that Close closes.
// A listener that fails while etcd runs is reported on Etcd.Err too.
type quiet struct{ zapcore.Core }

func (q quiet) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "setting up serving from embedded etcd failed." {
		return ce
	}
	return q.Core.Check(e, ce)
}

func (q quiet) With(f []zapcore.Field) zapcore.Core { return quiet{q.Core.With(f)} }
