package client

// Crash stops c as a dying process would: no last sync, nothing returned.
func Crash(c *Client) {
	if c.closed.Swap(true) {
		return
	}
	close(c.stop)
	<-c.done
	c.closeConns()
}
