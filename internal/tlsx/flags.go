package tlsx

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// Flags are the TLS flags of a command, in one style for every command:
//
//	--tls-cert FILE  --tls-key FILE  --tls-ca FILE  --tls-server-name NAME  --insecure
//
// and, for the links a server makes to etcd or Redis, the same with a
// prefix (--etcd-tls-cert, ...; no --insecure of their own). Client-only
// tools (allotctl, allot bench) take their defaults from the environment:
// ALLOT_TLS_CERT, ALLOT_TLS_KEY, ALLOT_TLS_CA, ALLOT_TLS_SERVER_NAME,
// ALLOT_INSECURE (any strconv.ParseBool true).
type Flags struct {
	Files
	// ServerName is the name a server's certificate must hold when it
	// differs from the dialled host (an IP address, a load balancer).
	ServerName string
	// Insecure allows plain text, on loopback addresses only (ListenRule).
	Insecure bool
	prefix   string
}

// Register adds the flags to fs, named with prefix ("" or "etcd-", ...),
// their help about what ("this process", "the etcd client", ...). With env, the defaults come
// from the environment (ALLOT_ and the flag's name in capitals).
func (f *Flags) Register(fs *flag.FlagSet, prefix, what string, env bool) {
	f.prefix = prefix
	def := func(name string) string {
		if !env {
			return ""
		}
		return os.Getenv(EnvName(prefix + name))
	}
	// Every bundle is re-read: the etcd and Redis clients verify each new
	// connection against the one in force then, too.
	ca := "; re-read when the file changes (new connections verify against it)"
	fs.StringVar(&f.Cert, prefix+"tls-cert", def("tls-cert"), "TLS certificate (PEM) of "+what+"; re-read when the file changes")
	fs.StringVar(&f.Key, prefix+"tls-key", def("tls-key"), "private key (PEM) of --"+prefix+"tls-cert")
	fs.StringVar(&f.CA, prefix+"tls-ca", def("tls-ca"), "CA bundle (PEM) that verifies the other side for "+what+ca)
	fs.StringVar(&f.ServerName, prefix+"tls-server-name", def("tls-server-name"), "name the servers' certificates must hold, when not the dialled host")
	if prefix == "" {
		b, _ := strconv.ParseBool(def("insecure"))
		fs.BoolVar(&f.Insecure, "insecure", b, "plain text without TLS: only on loopback addresses")
	}
}

// EnvName is the environment variable of a flag: "tls-ca" → ALLOT_TLS_CA.
func EnvName(flagName string) string {
	return "ALLOT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Enabled reports whether TLS was asked for: a certificate or a CA.
func (f *Flags) Enabled() bool { return f.Cert != "" || f.CA != "" }

// Source loads the files for a client: nil (plain text) when TLS is not
// enabled. Certificate and key go together; --insecure with TLS flags is
// an error.
func (f *Flags) Source(log *slog.Logger) (*Source, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if f.Insecure {
		return nil, errors.New("--insecure and --tls-* flags are exclusive")
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("--%stls-cert and --%stls-key go together", f.prefix, f.prefix)
	}
	return NewSource(f.Files, Options{Logger: log})
}

// ServerSource loads the files of a process that serves: nil (plain
// text) when TLS is not enabled; else certificate, key and CA are all
// needed, since Peer, Coordinator and Admin then require client
// certificates and the process's own links present its certificate.
func (f *Flags) ServerSource(log *slog.Logger) (*Source, error) {
	if f.Enabled() && (f.Cert == "" || f.Key == "" || f.CA == "") {
		return nil, fmt.Errorf("--%stls-cert, --%stls-key and --%stls-ca go together on a server: Peer, Coordinator and Admin require client certificates", f.prefix, f.prefix, f.prefix)
	}
	return f.Source(log)
}
