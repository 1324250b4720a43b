// Package service is the coordinator's gRPC edge: it campaigns for the
// leadership of each domain in etcd, and while it leads one, drives that
// domain's coordinator.Coordinator: regions' demand reports and acks go in
// through allot.v1.Coordinator/Connect streams, every Ready is persisted to
// etcd (fenced by the leader's term) before its assignments are sent.
//
// A Server that does not lead a domain answers a region's Connect with
// UNAVAILABLE and names the leader's address; regions try the next
// address. When leadership is lost (the etcd session expires, or a fenced
// write fails), the Server stops driving the domain, closes its regions'
// streams and campaigns again.
//
// One goroutine per led domain owns the Coordinator (it is not safe for
// concurrent use); streams talk to it through channels.
package service
