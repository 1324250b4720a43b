package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/regional/server"
)

// tlsFlags are the TLS flags of a command that serves, and those of its
// links to etcd and Redis (internal/tlsx's flag style).
type tlsFlags struct {
	tlsx.Flags
	etcd  tlsx.Flags // --etcd-tls-*
	redis tlsx.Flags // --redis-tls-*
	// redisUser and redisPasswordFile authenticate to Redis (AUTH); the
	// password is read from the file or from $ALLOT_REDIS_PASSWORD, never
	// from a flag's value (ps shows those).
	redisUser, redisPasswordFile string
}

// register adds the process's TLS flags.
func (f *tlsFlags) register(fs *flag.FlagSet) {
	f.Flags.Register(fs, "", "this process: its gRPC and HTTP listeners and its links to coordinators, peers and regions", false)
}

// registerEtcd adds the etcd client's TLS flags.
func (f *tlsFlags) registerEtcd(fs *flag.FlagSet) {
	f.etcd.Register(fs, "etcd-", "the etcd client", false)
}

// registerRedis adds the Redis client's TLS and AUTH flags.
func (f *tlsFlags) registerRedis(fs *flag.FlagSet) {
	f.redis.Register(fs, "redis-", "the Redis client", false)
	fs.StringVar(&f.redisUser, "redis-user", "", "Redis ACL user (AUTH user password); the password is $ALLOT_REDIS_PASSWORD or --redis-password-file")
	fs.StringVar(&f.redisPasswordFile, "redis-password-file", "", "file holding the Redis password (a trailing newline is dropped); default: $ALLOT_REDIS_PASSWORD")
}

// security is what a process's TLS flags make of its listeners and links.
type security struct {
	src      *tlsx.Source // nil: plain text
	insecure bool         // --insecure
	// serverName is the name peers' and coordinators' certificates must
	// hold when it is not the dialled host.
	serverName string
}

// load loads the process's files (a server: certificate, key and CA).
func (f *tlsFlags) load(log *slog.Logger) (security, error) {
	src, err := f.ServerSource(log)
	if err != nil {
		return security{}, err
	}
	return security{src: src, insecure: f.Insecure, serverName: f.ServerName}, nil
}

// etcdTLS is the etcd client's TLS configuration (nil: plain text) and
// the dial options that verify each connection against the CA bundle in
// force when it is made.
func (f *tlsFlags) etcdTLS(log *slog.Logger) (*tls.Config, []grpc.DialOption, error) {
	src, err := f.etcd.Source(log)
	if err != nil {
		return nil, nil, fmt.Errorf("etcd: %w", err)
	}
	if src == nil {
		return nil, nil, nil
	}
	return src.ClientConfig(f.etcd.ServerName), []grpc.DialOption{src.DialOption(f.etcd.ServerName)}, nil
}

// redisAuth are the Redis client's TLS configuration (nil: plain text),
// the function that gives each connection its configuration at dial time
// (nil: plain text), user and password.
func (f *tlsFlags) redisAuth(log *slog.Logger) (cfg *tls.Config, cfgFor func(host string) *tls.Config, user, password string, err error) {
	src, err := f.redis.Source(log)
	if err != nil {
		return nil, nil, "", "", fmt.Errorf("redis: %w", err)
	}
	password = os.Getenv("ALLOT_REDIS_PASSWORD")
	if f.redisPasswordFile != "" {
		b, err := os.ReadFile(f.redisPasswordFile)
		if err != nil {
			return nil, nil, "", "", fmt.Errorf("--redis-password-file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	if src != nil {
		cfgFor = func(string) *tls.Config { return src.ClientConfig(f.redis.ServerName) }
	}
	return src.ClientConfig(f.redis.ServerName), cfgFor, f.redisUser, password, nil
}

// listen listens on addr for what ("grpc", "http", ...): TLS is served on
// any address, plain text as the rule says (tlsx.ListenRule, DialRule).
func (s security) listen(what, addr string) (net.Listener, error) {
	if err := s.plain(what, addr, tlsx.ListenRule); err != nil {
		return nil, err
	}
	return net.Listen("tcp", addr)
}

// plainLink checks the addresses of a link to etcd or Redis that has no
// TLS of its own: a process without TLS follows the rule of its other
// links (--insecure, loopback only); a process with TLS needs no flag for
// it but reaches only loopback addresses in plain text (tlsx.LinkRule).
func (s security) plainLink(what string, addrs ...string) error {
	if s.src == nil {
		return s.dial(what, addrs...)
	}
	for _, a := range addrs {
		if err := tlsx.LinkRule(what, a); err != nil {
			return err
		}
	}
	return nil
}

// dial checks the plain-text rule for the addresses of a link.
func (s security) dial(what string, addrs ...string) error {
	for _, a := range addrs {
		if err := s.plain(what, a, tlsx.DialRule); err != nil {
			return err
		}
	}
	return nil
}

func (s security) plain(what, addr string, rule func(what, addr string, insecure bool) error) error {
	if s.src != nil {
		return nil
	}
	return rule(what, addr, s.insecure)
}

// grpcServer returns a gRPC server with allot's recovery and, with TLS,
// client certificates verified when given and required for Peer,
// Coordinator and Admin (tlsx.RequireClientCert). mutualOnly (a
// coordinator: every service it serves needs them) requires them in the
// handshake already.
func (s security) grpcServer(log *slog.Logger, mutualOnly bool) (*grpc.Server, error) {
	opts := server.Recovery(log)
	if s.src != nil {
		auth := tls.VerifyClientCertIfGiven
		if mutualOnly {
			auth = tls.RequireAndVerifyClientCert
		}
		creds, err := s.src.ServerOptions(auth)
		if err != nil {
			return nil, err
		}
		opts = append(append(opts, creds...), tlsx.RequireClientCert(tlsx.MutualServices...)...)
	}
	return grpc.NewServer(opts...), nil
}

// serveHTTP serves hs on l: TLS when the process has it.
func (s security) serveHTTP(hs *http.Server, l net.Listener) error { return s.src.ServeHTTP(hs, l) }

// creds are the transport credentials of the process's gRPC links
// (coordinators, peers, regions): TLS with its certificate, or plain text.
func (s security) creds() credentials.TransportCredentials {
	return s.src.ClientCredentials(s.serverName)
}

// scheme is the URL scheme of the process's HTTP listeners.
func (s security) scheme() string {
	if s.src != nil {
		return "https"
	}
	return "http"
}

// banner is what startup lines say about the transport.
func (s security) banner() string {
	switch {
	case s.src != nil:
		return "TLS (mutual for Peer, Coordinator and Admin)"
	case s.insecure:
		return "plain text (--insecure: loopback only)"
	}
	return "plain text"
}

// linkSecurity is a process's security and that of its etcd and Redis clients.
type linkSecurity struct {
	security
	etcd                     *tls.Config // nil: plain text
	redis                    *tls.Config // nil: plain text
	redisUser, redisPassword string
	// etcdDial and redisFor give each connection to etcd or Redis the CA
	// bundle and certificate in force when it is made (nil: plain text),
	// so that a rotated CA reaches the long-lived clients.
	etcdDial []grpc.DialOption
	redisFor func(host string) *tls.Config
}

// regionLinks loads the TLS of allot regional and its links, and checks
// the plain-text rule for the addresses it dials.
func (f *regionFlags) regionLinks(log *slog.Logger, peers map[string]string) (linkSecurity, error) {
	var l linkSecurity
	var err error
	if l.security, err = f.tls.load(log); err != nil {
		return l, fmt.Errorf("regional: %w", err)
	}
	if l.etcd, l.etcdDial, err = f.tls.etcdTLS(log); err != nil {
		return l, fmt.Errorf("regional: %w", err)
	}
	if l.redis, l.redisFor, l.redisUser, l.redisPassword, err = f.tls.redisAuth(log); err != nil {
		return l, fmt.Errorf("regional: %w", err)
	}
	// The links in plain text: a process without TLS reaches loopback
	// addresses only (tlsx.DialRule).
	plain := map[string][]string{"--coordinator": splitList(f.coordinators)}
	for _, p := range peers {
		plain["--peers"] = append(plain["--peers"], p)
	}
	for what, addrs := range plain {
		if err := l.dial(what, addrs...); err != nil {
			return l, fmt.Errorf("regional: %w", err)
		}
	}
	// etcd and Redis without their own TLS flags: loopback only.
	side := map[string][]string{}
	if l.etcd == nil {
		side["--etcd"] = splitList(f.etcd)
	}
	if l.redis == nil {
		side["--redis"] = splitList(f.redis)
	}
	for what, addrs := range side {
		if err := l.plainLink(what, addrs...); err != nil {
			return l, fmt.Errorf("regional: %w", err)
		}
	}
	return l, nil
}
