package tlsx

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// Errors of the plain-text rule (ListenRule, DialRule).
var (
	// ErrPlaintext: an address would be served or reached in plain text
	// without --insecure.
	ErrPlaintext = errors.New("plain text needs --insecure (or --tls-cert, --tls-key and --tls-ca)")
	// ErrNotLoopback: --insecure was given for an address that is not a
	// loopback one.
	ErrNotLoopback = errors.New("--insecure is only allowed on loopback addresses (127.0.0.0/8, ::1, localhost); use TLS")
	// ErrPlainLink: a process with TLS would reach etcd or Redis in plain
	// text at an address that is not a loopback one (LinkRule).
	ErrPlainLink = errors.New("a link without TLS is only allowed to a loopback address (a sidecar on this host); give the link's --etcd-tls-* or --redis-tls-* flags")
)

// ListenRule is the rule for a listener without TLS: plain text only with
// --insecure (insecure), and --insecure only on a loopback address. what
// names the listener in the error ("grpc", "http", ...). Every command
// calls it for each address it would listen on in plain text.
func ListenRule(what, addr string, insecure bool) error {
	switch {
	case !insecure:
		return fmt.Errorf("%s listen address %s: %w", what, addr, ErrPlaintext)
	case !IsLoopback(addr):
		return fmt.Errorf("%s listen address %s: %w", what, addr, ErrNotLoopback)
	}
	return nil
}

// DialRule is the same rule for a client without TLS: a process without
// TLS reaches only loopback addresses, and only with --insecure. (A
// client-only tool such as allotctl has no listener; its --insecure says
// that plain text to a loopback address is meant.)
func DialRule(what, addr string, insecure bool) error {
	switch {
	case !insecure:
		return fmt.Errorf("%s %s: %w", what, addr, ErrPlaintext)
	case !IsLoopback(addr):
		return fmt.Errorf("%s %s: %w", what, addr, ErrNotLoopback)
	}
	return nil
}

// LinkRule is the rule for a link to etcd or Redis without its own TLS
// flags (--etcd-tls-*, --redis-tls-*) in a process that has TLS: it needs
// no --insecure (which TLS excludes) but reaches only a loopback address
// in plain text, such as a sidecar on the same host or the embedded etcd
// of allot dev. A process without TLS follows DialRule for those links,
// as for any other.
func LinkRule(what, addr string) error {
	if !IsLoopback(addr) {
		return fmt.Errorf("%s %s: %w", what, addr, ErrPlainLink)
	}
	return nil
}

// IsLoopback reports whether addr (host:port, a bare host, or a gRPC
// target such as dns:///host:port or an http:// URL) names a loopback
// address: an IP in 127.0.0.0/8 or ::1, or "localhost". An empty host
// (":8080", every interface) is not loopback; neither is any other name,
// whatever it resolves to.
func IsLoopback(addr string) bool {
	if _, rest, ok := strings.Cut(addr, "://"); ok {
		addr = strings.TrimPrefix(rest, "/")
		addr, _, _ = strings.Cut(addr, "/")
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	host, _, _ = strings.Cut(host, "%") // a zone
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
