package tlsx

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// MinVersion is the oldest TLS version allot speaks.
const MinVersion = tls.VersionTLS12

// ServerConfig returns a server configuration that presents the current
// certificate and, with auth above tls.RequestClientCert, verifies client
// certificates against the current CA bundle. Every handshake reads the
// material in force (GetConfigForClient), so a rotation needs no restart.
// protos are the ALPN protocols offered (nil: none).
func (s *Source) ServerConfig(auth tls.ClientAuthType, protos ...string) (*tls.Config, error) {
	if s.material().cert == nil {
		return nil, fmt.Errorf("%w to serve TLS", ErrNoCert)
	}
	if auth >= tls.VerifyClientCertIfGiven && s.material().pool == nil {
		return nil, ErrNoCA
	}
	return &tls.Config{
		MinVersion: MinVersion,
		NextProtos: protos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.material()
			// No session resumption: a resumed session would skip the
			// verification of a client certificate against the CA bundle
			// in force now (a CA removed from it must stop admitting).
			return &tls.Config{MinVersion: MinVersion, NextProtos: protos, Certificates: []tls.Certificate{*m.cert},
				ClientAuth: auth, ClientCAs: m.pool, SessionTicketsDisabled: true}, nil
		},
	}, nil
}

// ClientConfig returns a client configuration that verifies the server
// against the CA bundle in force now (the system's roots without one) and
// presents the current certificate, if any, read at every handshake.
// serverName, when set, is the name the server's certificate must hold
// instead of the dialled host. A nil Source returns nil (plain text).
func (s *Source) ClientConfig(serverName string) *tls.Config {
	if s == nil {
		return nil
	}
	cfg := &tls.Config{MinVersion: MinVersion, ServerName: serverName, RootCAs: s.material().pool}
	if s.files.Cert != "" {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.material().cert, nil
		}
	}
	return cfg
}

// ServerOptions are the gRPC server options of TLS with auth (see
// ServerConfig); for a nil Source, none (plain text).
func (s *Source) ServerOptions(auth tls.ClientAuthType) ([]grpc.ServerOption, error) {
	if s == nil {
		return nil, nil
	}
	cfg, err := s.ServerConfig(auth)
	if err != nil {
		return nil, err
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg))}, nil // NewTLS adds h2 to ALPN
}

// ClientCredentials are gRPC transport credentials that verify servers
// against the CA bundle in force at each handshake and present the
// current certificate; for a nil Source, plain text.
func (s *Source) ClientCredentials(serverName string) credentials.TransportCredentials {
	if s == nil {
		return insecure.NewCredentials()
	}
	return &clientCreds{src: s, serverName: serverName, TransportCredentials: credentials.NewTLS(s.ClientConfig(serverName))}
}

// DialOption is grpc.WithTransportCredentials(s.ClientCredentials(serverName)).
func (s *Source) DialOption(serverName string) grpc.DialOption {
	return grpc.WithTransportCredentials(s.ClientCredentials(serverName))
}

// clientCreds make a TLS configuration from the material in force for
// every handshake. The embedded credentials answer Info and the rest.
type clientCreds struct {
	credentials.TransportCredentials
	src        *Source
	serverName string
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.src.ClientConfig(c.serverName)).ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{src: c.src, serverName: c.serverName, TransportCredentials: c.TransportCredentials.Clone()}
}

// ServeHTTP serves hs on l: TLS from s when s is set (client certificates
// verified when given, for RequestIdentity), else plain text. It returns
// what hs.Serve or hs.ServeTLS returns.
func (s *Source) ServeHTTP(hs *http.Server, l net.Listener) error {
	if s == nil {
		return hs.Serve(l)
	}
	auth := tls.VerifyClientCertIfGiven
	if s.material().pool == nil {
		auth = tls.NoClientCert
	}
	cfg, err := s.ServerConfig(auth, "h2", "http/1.1")
	if err != nil {
		l.Close()
		return err
	}
	hs.TLSConfig = cfg
	return hs.ServeTLS(l, "", "")
}

// HTTPClient returns an HTTP client that speaks TLS from s (plain HTTP
// for a nil Source), and the URL scheme to use with it.
func (s *Source) HTTPClient(serverName string) (*http.Client, string) {
	if s == nil {
		return &http.Client{}, "http"
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg := s.ClientConfig(serverName) // the CA bundle in force at this dial
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			cfg.ServerName = host
		}
		d := &tls.Dialer{Config: cfg}
		return d.DialContext(ctx, network, addr)
	}
	return &http.Client{Transport: t}, "https"
}
