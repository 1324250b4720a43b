package server

import (
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/regional"
)

// ErrBadRequest is returned for a request that is malformed before the
// engine sees it: empty descriptors, an oversized batch.
var ErrBadRequest = errors.New("server: bad request")

// ErrPermissionDenied is returned for a call its caller's roles do not
// allow, or that its domain does not allow (authz.go).
var ErrPermissionDenied = errors.New("server: permission denied")

// errorTable maps errors to gRPC codes and HTTP statuses, first match wins.
var errorTable = []struct {
	err  error
	code codes.Code
	http int
}{
	{regional.ErrUnknownDomain, codes.NotFound, http.StatusNotFound},
	{regional.ErrUnknownReservation, codes.NotFound, http.StatusNotFound},
	{regional.ErrBadReservation, codes.InvalidArgument, http.StatusBadRequest},
	{regional.ErrTooManyReservations, codes.ResourceExhausted, http.StatusServiceUnavailable},
	{regional.ErrBadCost, codes.InvalidArgument, http.StatusBadRequest},
	{regional.ErrBadDescriptor, codes.InvalidArgument, http.StatusBadRequest},
	{regional.ErrCostAboveBurst, codes.InvalidArgument, http.StatusBadRequest},
	{ErrBadRequest, codes.InvalidArgument, http.StatusBadRequest},
	{ErrPermissionDenied, codes.PermissionDenied, http.StatusForbidden},
}

func lookup(err error) (codes.Code, int) {
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			return e.code, e.http
		}
	}
	return codes.Internal, http.StatusInternalServerError
}

// grpcError converts err to a gRPC status error.
func grpcError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	code, _ := lookup(err)
	return status.Error(code, err.Error())
}

// httpStatus is err's HTTP status.
func httpStatus(err error) int {
	_, s := lookup(err)
	return s
}

// reason is a bounded label value for an error.
func reason(err error) string {
	if errors.Is(err, regional.ErrUnknownReservation) {
		return "unknown_reservation"
	}
	switch code, _ := lookup(err); code {
	case codes.NotFound:
		return "unknown_domain"
	case codes.InvalidArgument:
		return "invalid_argument"
	case codes.PermissionDenied:
		return "permission_denied"
	}
	return "internal"
}
