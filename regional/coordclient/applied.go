package coordclient

// Applied returns the term and version of the latest assignment this
// instance applied for domain, or zeros for none or a domain it does not
// link.
func (c *Client) Applied(domain string) (term int64, version uint64) {
	c.mu.Lock()
	l := c.domains[domain]
	c.mu.Unlock()
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ack, _ := l.inst.Hello()
	return ack.Term, ack.Version
}
