// Package redistest runs real redis-server processes for tests: a single
// server, or a Redis Cluster of three primaries with a replica each. They
// listen on free loopback ports, keep nothing on disk beyond a temporary
// directory, and stop when the test ends. Tests are skipped when
// redis-server (or, for a cluster, redis-cli) is not installed, and fail
// under CI=true (internal/testdep; .ci/run installs them).
package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/internal/testdep"
)

// startTimeout bounds the wait for a server, or a cluster, to be ready.
const startTimeout = 20 * time.Second

// Server is one redis-server process. Its methods are not safe for
// concurrent use.
type Server struct {
	Addr   string
	t      testing.TB
	dir    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
	ping   redis.Options // how Restart reaches it
}

// Secure is how StartSecure's server is reached: TLS (the server's
// certificate files, and the client configuration of the readiness
// check) and an ACL user.
type Secure struct {
	// CertFile, KeyFile and CAFile make the server serve TLS only (no
	// plain-text port), requiring client certificates signed by CAFile.
	// Empty: plain text.
	CertFile, KeyFile, CAFile string
	// Client is the TLS configuration of the readiness check.
	Client *tls.Config
	// Username and Password, when set, are the only user (the default
	// user is off), with every permission.
	Username, Password string
}

// StartSecure starts a redis-server as Start does, with TLS and an ACL
// user as sec says. Debian's redis-server is built with TLS.
func StartSecure(t testing.TB, sec Secure, extra ...string) *Server {
	t.Helper()
	var args []string
	if sec.CertFile != "" {
		args = append(args, "--tls-port", "PORT", "--port", "0", "--tls-cert-file", sec.CertFile, "--tls-key-file", sec.KeyFile,
			"--tls-ca-cert-file", sec.CAFile, "--tls-auth-clients", "yes")
	}
	if sec.Username != "" {
		args = append(args, "--user", sec.Username, "on", ">"+sec.Password, "~*", "&*", "+@all", "--user", "default", "off")
	}
	return start(t, redis.Options{TLSConfig: sec.Client, Username: sec.Username, Password: sec.Password}, append(args, extra...)...)
}

// Start starts a redis-server on a free loopback port, with extra
// arguments, and stops it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, redis.Options{}, extra...)
}

// start starts a server reached as ping says; "PORT" in extra is its
// port, "FREEPORT" another free port. A port taken between its choice
// and the server's bind (by a test running beside this one) is chosen
// again, up to five times.
func start(t testing.TB, ping redis.Options, extra ...string) *Server {
	t.Helper()
	testdep.LookPath(t, "redis-server", "apt-get install redis-server; .ci/run installs it")
	for try := 1; ; try++ {
		s := &Server{t: t, dir: t.TempDir(), Addr: "127.0.0.1:" + strconv.Itoa(freePort(t)), ping: ping}
		_, port, _ := net.SplitHostPort(s.Addr)
		s.args = []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", s.dir, "--logfile", "redis.log", "--protected-mode", "no"}
		for _, a := range extra {
			switch a {
			case "PORT":
				a = port
			case "FREEPORT":
				a = strconv.Itoa(freePort(t))
			}
			s.args = append(s.args, a)
		}
		s.ping.Addr, s.ping.MaxRetries = s.Addr, -1
		if err := s.launch(); err != nil {
			if strings.Contains(s.log(), "Address already in use") && try < 5 {
				continue
			}
			t.Fatalf("redistest: redis-server at %s: %v\n%s", s.Addr, err, s.log())
		}
		t.Cleanup(s.Kill)
		return s
	}
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Pause stops the server's process (SIGSTOP, to its PID) as a long
// stall would (a VM paused, a fork on a huge dataset): connections stay
// open, and what clients send waits in the sockets, to run at Resume.
// Kill works on a paused server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again (SIGCONT): it then runs what
// clients sent meanwhile.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatalf("redistest: %v to a server that is not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %v to redis-server (pid %d): %v", sig, s.cmd.Process.Pid, err)
	}
}

// Restart starts the server again on its port, with its directory (a
// cluster node keeps its identity), and waits until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatalf("redistest: redis-server at %s: %v\n%s", s.Addr, err, s.log())
	}
}

// launch starts the server process and waits until it answers, until it
// exits (an error), or until startTimeout.
func (s *Server) launch() error {
	s.Kill()
	s.cmd = exec.Command("redis-server", s.args...)
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited, cmd := make(chan struct{}), s.cmd
	s.exited = exited
	go func() { cmd.Wait(); close(exited) }()
	ping := s.ping
	c := redis.NewClient(&ping)
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("exited before it answered (%v)", err)
		default:
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", startTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// Cluster is a Redis Cluster of three primaries with one replica each.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts a six-node cluster with a short node timeout (1s),
// so that a replica takes over a dead primary within a few seconds.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	testdep.LookPath(t, "redis-cli", "apt-get install redis-tools; .ci/run installs it")
	c := &Cluster{}
	for range 6 {
		c.Nodes = append(c.Nodes, Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", "FREEPORT", // the default, port+10000, may not be free
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0"))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	out, err := exec.Command("redis-cli", append(args, "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1})
	defer cc.Close()
	waitFor(t, "cluster state ok on every node", func(ctx context.Context) error {
		return cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			info, err := n.ClusterInfo(ctx).Result()
			if err == nil && !strings.Contains(info, "cluster_state:ok") {
				err = fmt.Errorf("%s: cluster_state not ok", n.Options().Addr)
			}
			return err
		})
	}, nil)
	return c
}

// Addrs are the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// PrimaryOf returns the node that serves key's slot as a primary.
func (c *Cluster) PrimaryOf(t testing.TB, key string) *Server {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	n, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatalf("redistest: primary of %q: %v", key, err)
	}
	for _, s := range c.Nodes {
		if s.Addr == n.Options().Addr {
			return s
		}
	}
	t.Fatalf("redistest: primary of %q is %s, not a node of the cluster", key, n.Options().Addr)
	return nil
}

// waitFor polls ready until it succeeds or startTimeout passes.
func waitFor(t testing.TB, what string, ready func(context.Context) error, log func() string) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := ready(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			msg := ""
			if log != nil {
				msg = "\n" + log()
			}
			t.Fatalf("redistest: %s: not ready after %v: %v%s", what, startTimeout, err, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
