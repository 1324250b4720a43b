// Package tlsx is allot's one place for TLS: it loads a process's
// certificate, key and CA bundle from PEM files and reloads them when the
// files change (no restart), builds server and client configurations and
// gRPC credentials from them, holds the rule for plain text (ListenRule,
// DialRule: only with --insecure, and --insecure only on loopback
// addresses), refuses the Peer, Coordinator and Admin services to callers
// without a verified client certificate (RequireClientCert), and names the
// caller from its certificate (Identity).
//
// A command does, for every listener and client:
//
//	src, err := flags.ServerSource(log) // nil: plain text
//	if src == nil {
//		err = tlsx.ListenRule("grpc", addr, flags.Insecure)
//	}
//	opts, err := src.ServerOptions(tls.VerifyClientCertIfGiven) // none for a nil src
//	if src != nil {
//		opts = append(opts, tlsx.RequireClientCert(tlsx.MutualServices...)...)
//	}
//	gs := grpc.NewServer(opts...)
//	go src.ServeHTTP(hs, httpListener)
//	cc, err := grpc.NewClient(peer, src.DialOption(flags.ServerName))
//
// and a server reads its caller's identity with PeerIdentity (gRPC) or
// RequestIdentity (HTTP). docs/security.md states the conventions.
//
// Reloading: every handshake asks the Source for its material; at most
// once per Options.Interval (default 1s) the Source compares the files'
// modification times and sizes with those it loaded and, when one
// changed, loads all of them again. A new set that does not load (a
// half-written file, a key that does not match its certificate, an
// unreadable CA) is logged and the previous material stays in force; it
// is tried again at the next check. Connections already established keep
// the certificate they were made with; new handshakes use the new one.
//
// A client configuration's CA pool (RootCAs) is the one in force when the
// configuration is made, except for gRPC clients made with
// ClientCredentials, which read the current pool at every handshake.
// Client certificates are always read at handshake time.
package tlsx
