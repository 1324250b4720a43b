package coordclient

// Applied returns the term and version of the latest assignment this
// instance applied for domain, or zeros for none or a domain it does not
// link.
func (c *Client) Applied(domain string) (term int64, version uint64) {
	return c.node.Applied(domain)
}
