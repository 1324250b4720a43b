package tlsx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultInterval is how often, at most, a Source looks at its files.
const DefaultInterval = time.Second

// Errors of the package. Who returns them is said on each.
var (
	// ErrNoCert: NewSource, for a key without a certificate or a
	// certificate without a key; a server configuration, for a Source
	// without a certificate.
	ErrNoCert = errors.New("tlsx: a certificate and its key are needed")
	// ErrNoCA: a server configuration that verifies client certificates,
	// for a Source without a CA bundle.
	ErrNoCA = errors.New("tlsx: a CA bundle is needed to verify client certificates")
)

// Files names the PEM files of a TLS identity and of the CAs it trusts.
// Cert and Key go together (both or neither); CA alone makes a client
// that verifies servers but has no certificate of its own.
type Files struct {
	Cert string // the certificate, followed by its intermediates if any
	Key  string // the certificate's private key
	CA   string // the CA certificates that verify the other side
}

// Options configure a Source.
type Options struct {
	// Interval is how often, at most, the files' modification times are
	// compared with those loaded; 0 means DefaultInterval.
	Interval time.Duration
	// Logger receives reloads and refused files; nil discards.
	Logger *slog.Logger
	// Now is the clock of the checks; nil means time.Now.
	Now func() time.Time
}

// Source is a TLS identity and CA bundle read from files and reloaded
// when they change. Safe for concurrent use. A nil *Source means plain
// text: its methods that return options or configurations return those of
// plain text or nil.
type Source struct {
	files Files
	opts  Options

	mu      sync.Mutex
	checked time.Time // the last look at the files
	stamps  [3]stamp  // of Cert, Key and CA when cur was loaded
	cur     *material
}

// material is one loaded set of files.
type material struct {
	cert *tls.Certificate // nil without Files.Cert
	pool *x509.CertPool   // nil without Files.CA
}

// stamp is what tells a changed file: its modification time and size.
type stamp struct {
	mod  time.Time
	size int64
}

// NewSource loads files and returns a Source that reloads them. It fails
// when they do not load.
func NewSource(files Files, opts Options) (*Source, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, fmt.Errorf("%w: got certificate %q and key %q", ErrNoCert, files.Cert, files.Key)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Source{files: files, opts: opts}
	stamps := s.stat()
	m, err := load(files)
	if err != nil {
		return nil, err
	}
	s.cur, s.stamps, s.checked = m, stamps, opts.Now()
	return s, nil
}

// Files returns the files the Source reads.
func (s *Source) Files() Files { return s.files }

// material returns the material in force, reloading it first when the
// interval has passed since the last look and a file changed.
func (s *Source) material() *material {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	if now.Sub(s.checked) < s.opts.Interval {
		return s.cur
	}
	s.checked = now
	stamps := s.stat()
	if stamps == s.stamps {
		return s.cur
	}
	m, err := load(s.files)
	if err != nil {
		// Kept: the stamps stay those of the material in force, so the
		// files are tried again at the next look.
		s.opts.Logger.Warn("TLS files refused; the previous certificate stays in force", "cert", s.files.Cert, "ca", s.files.CA, "err", err)
		return s.cur
	}
	s.cur, s.stamps = m, stamps
	s.opts.Logger.Info("TLS files reloaded", "cert", s.files.Cert, "ca", s.files.CA, "not_after", notAfter(m))
	return s.cur
}

// Reload loads the files now, whatever their times, and returns why they
// were refused (the previous material then stays in force).
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	stamps := s.stat()
	m, err := load(s.files)
	if err != nil {
		return err
	}
	s.cur, s.stamps, s.checked = m, stamps, s.opts.Now()
	return nil
}

// Certificate returns the leaf certificate in force (nil without one).
func (s *Source) Certificate() *x509.Certificate {
	if s == nil {
		return nil
	}
	if c := s.material().cert; c != nil {
		return c.Leaf
	}
	return nil
}

// Identity is the identity of the certificate in force (ParseIdentity):
// who this process is to the servers it calls. ErrNoCert without one.
func (s *Source) Identity() (Identity, error) {
	c := s.Certificate()
	if c == nil {
		return Identity{}, ErrNoCert
	}
	return ParseIdentity(c)
}

func (s *Source) stat() [3]stamp {
	var out [3]stamp
	for i, p := range []string{s.files.Cert, s.files.Key, s.files.CA} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			out[i] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	return out
}

// load reads files: the key pair (which must match) and the CA bundle.
func load(files Files) (*material, error) {
	m := &material{}
	if files.Cert != "" {
		c, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			return nil, fmt.Errorf("tlsx: certificate %s, key %s: %w", files.Cert, files.Key, err)
		}
		m.cert = &c // Leaf is set by LoadX509KeyPair
	}
	if files.CA != "" {
		b, err := os.ReadFile(files.CA)
		if err != nil {
			return nil, fmt.Errorf("tlsx: CA bundle: %w", err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("tlsx: CA bundle %s: no PEM certificate in it", files.CA)
		}
	}
	return m, nil
}

func notAfter(m *material) string {
	if m.cert == nil || m.cert.Leaf == nil {
		return ""
	}
	return m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339)
}
