package server

import (
	"context"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Recovery returns server options that turn a panic in a gRPC handler
// into an INTERNAL error for that call, logged with its stack, instead of
// a crash of the whole enforcer. A panic is a bug; this keeps it from
// taking every other request down with it.
func Recovery(log *slog.Logger) []grpc.ServerOption {
	recovered := func(method string, err *error) {
		if r := recover(); r != nil {
			log.Error("panic in a gRPC handler", "method", method, "panic", r, "stack", string(debug.Stack()))
			*err = status.Errorf(codes.Internal, "internal error in %s", method)
		}
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer recovered(info.FullMethod, &err)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer recovered(info.FullMethod, &err)
			return h(srv, ss)
		}),
	}
}
