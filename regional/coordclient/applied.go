package coordclient

// Applied returns the term and version of the latest assignment the
// region applied for domain (those of the persisted snapshot it started
// from until one arrives), or zeros for a domain it does not link.
func (c *Client) Applied(domain string) (term int64, version uint64) {
	c.mu.Lock()
	l := c.domains[domain]
	c.mu.Unlock()
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applier.Applied()
}
