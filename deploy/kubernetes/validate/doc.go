// Package validate holds the tests of allot's Kubernetes manifests
// (deploy/kubernetes) and of the repository's Dockerfile, run where no
// cluster and no Docker engine are at hand:
//
//   - every overlay renders with kustomize (the library kubectl apply -k
//     uses) and every object decodes strictly into the Kubernetes API
//     types, or the Prometheus Operator's for ServiceMonitor and
//     PrometheusRule: an unknown or misspelt field fails;
//   - the objects fit together: selectors, ports, probes, references to
//     ConfigMaps and environment variables, the HorizontalPodAutoscaler's
//     target, etcd's --initial-cluster, the Redis Cluster's size, and the
//     addresses regions give each other;
//   - allot's arguments are flags that `allot regional`, `allot
//     coordinator` and `allotctl` declare (read from cmd/ with go/ast);
//   - alert expressions parse as PromQL, name metrics that allot's code
//     exports, and pass `promtool check rules` when promtool is installed;
//   - the Dockerfile is multi-stage, builds static binaries and runs them
//     as a non-root user, and .dockerignore keeps what the build reads.
//
// It is a module of its own so that kustomize, the Kubernetes API and
// Prometheus stay out of allot's go.mod:
//
//	cd deploy/kubernetes/validate && go test -count=1 ./...
//
// -count=1, because Go's test cache does not watch files outside this
// module's folder, and everything it reads is outside it: a cached "ok"
// could hide a changed manifest.
package validate
