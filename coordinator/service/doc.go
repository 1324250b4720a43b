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
// Over TLS a stream speaks for the enforcer instance its client
// certificate names (internal/tlsx): the Hello must name its region and
// instance, and every later message its region (a report or an ack of
// another region, or a Hello of another instance, ends the stream), so that
// one instance cannot report or ack for another. A refusal is
// PERMISSION_DENIED, counted in allot_coordinator_rejections_total with
// reason "identity". In plain text (loopback only) nothing is checked.
//
// One goroutine per led domain owns the Coordinator (it is not safe for
// concurrent use); streams talk to it through channels.
package service
