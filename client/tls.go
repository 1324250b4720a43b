package client

import (
	"crypto/tls"
	"fmt"
	"os"

	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/internal/tlsx"
)

// TLSFromEnv returns the TLS configuration that allot's tools take from
// the environment, for Config.TLS: ALLOT_TLS_CA (the CA bundle that
// verifies the enforcers; default: the system's roots), ALLOT_TLS_CERT
// and ALLOT_TLS_KEY (this gateway's certificate, re-read when the files
// change, so a rotation needs no restart), ALLOT_TLS_SERVER_NAME (the
// name the enforcers' certificates hold, when not the dialled host). It
// returns nil, and no error, when neither ALLOT_TLS_CA nor
// ALLOT_TLS_CERT is set: plain text. The CA bundle is read once: a
// *tls.Config verifies against a fixed pool. CredentialsFromEnv follows
// a rotated CA bundle too.
func TLSFromEnv() (*tls.Config, error) {
	f, src, err := envSource()
	if err != nil {
		return nil, err
	}
	return src.ClientConfig(f.ServerName), nil
}

// CredentialsFromEnv returns the configuration of TLSFromEnv as gRPC
// transport credentials, for Config.DialOptions
// (grpc.WithTransportCredentials): every new connection verifies the
// enforcers against the CA bundle in force then and presents the
// certificate in force then, so rotating either the CA or the
// certificate needs no restart. nil, and no error, without the
// variables.
func CredentialsFromEnv() (credentials.TransportCredentials, error) {
	f, src, err := envSource()
	if err != nil || src == nil {
		return nil, err
	}
	return src.ClientCredentials(f.ServerName), nil
}

func envSource() (tlsx.Flags, *tlsx.Source, error) {
	f := tlsx.Flags{Files: tlsx.Files{Cert: os.Getenv("ALLOT_TLS_CERT"), Key: os.Getenv("ALLOT_TLS_KEY"), CA: os.Getenv("ALLOT_TLS_CA")},
		ServerName: os.Getenv("ALLOT_TLS_SERVER_NAME")}
	src, err := f.Source(nil)
	if err != nil {
		return f, nil, fmt.Errorf("client: TLS from the environment: %w", err)
	}
	return f, src, nil
}
