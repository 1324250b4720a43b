package demo

import (
	"bufio"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer answers every line with itself until the test ends.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// echo sends a line on c and waits up to wait for it to come back.
func echo(c net.Conn, r *bufio.Reader, wait time.Duration) error {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(wait))
	line, err := r.ReadString('\n')
	if err == nil && line != "ping\n" {
		return errors.New("echo: " + line)
	}
	return err
}

func TestLinksCutAndHeal(t *testing.T) {
	links := NewLinks()
	defer links.Close()
	addr, err := links.Add("ap-south", Coordinator, "")
	if err != nil {
		t.Fatal(err)
	}
	other, err := links.Add("us-east", "eu-west", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(a string) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}

	// Without a target, a connection is closed.
	c, r := dial(addr)
	if err := echo(c, r, 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("no target yet: %v, want the connection closed", err)
	}
	links.SetTarget(Coordinator, echoServer(t))
	c, r = dial(addr)
	if err := echo(c, r, 5*time.Second); err != nil {
		t.Fatalf("linked: %v", err)
	}

	links.Cut("ap-south")
	if !links.IsCut("ap-south") || links.IsCut("us-east") {
		t.Fatal("IsCut: want ap-south only")
	}
	if err := echo(c, r, 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("open connection after the cut: %v, want it closed", err)
	}
	held, hr := dial(addr)
	if err := echo(held, hr, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection during the cut: %v, want it held (a read timeout)", err)
	}
	oc, or := dial(other)
	if err := echo(oc, or, 5*time.Second); err != nil {
		t.Fatalf("a link between other regions during the cut: %v", err)
	}

	links.Heal("ap-south")
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := hr.ReadString('\n'); err != nil || line != "ping\n" { // what was sent while held
		t.Fatalf("held connection after the heal: %q, %v", line, err)
	}
	if err := echo(held, hr, 5*time.Second); err != nil {
		t.Fatalf("held connection after the heal: %v", err)
	}

	links.Cut("ap-south")
	late, lr := dial(addr)
	late.Write([]byte("x\n"))
	links.Close() // closes the held one too
	late.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := lr.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("held connection after Close: %v, want it closed", err)
	}
	if _, err := links.Add("x", "y", ""); err == nil {
		t.Error("Add after Close: want an error")
	}
}
