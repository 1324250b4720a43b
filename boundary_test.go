package allot_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// corePackages must stay free of I/O libraries and generated code
// (docs/design.md section 11), so that the simulator can run them on a virtual
// clock.
var corePackages = []string{".", "./crdt", "./regional", "./regional/node", "./coordinator", "./sim"}

var forbidden = []string{
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
	"github.com/redis/",
	"go.etcd.io/",
	"github.com/prometheus/",
	"github.com/allot-dev/allot/proto",
}

func TestCorePackagesImportNoIO(t *testing.T) {
	for _, pkg := range corePackages {
		if _, err := os.Stat(pkg); err != nil {
			continue // not written yet
		}
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("core package %s depends on %s", pkg, dep)
				}
			}
		}
	}
}
