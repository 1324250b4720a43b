package validate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// flagMethods are the flag.FlagSet methods that declare a flag, and the
// index of the flag's name among their arguments.
var flagMethods = map[string]int{
	"StringVar": 1, "String": 0, "BoolVar": 1, "Bool": 0,
	"DurationVar": 1, "Duration": 0, "IntVar": 1, "Int": 0,
	"Int64Var": 1, "Int64": 0, "UintVar": 1, "Uint": 0, "Uint64Var": 1, "Uint64": 0,
	"Float64Var": 1, "Float64": 0, "Var": 1, "TextVar": 1, "Func": 0, "BoolFunc": 0,
}

// declaredFlags reads the flags that the named functions (or methods) of
// the Go files in dir declare: name → whether it is a boolean flag. It
// fails the test if one of the functions is missing, so that a renamed
// function is noticed rather than read as "no flags".
func declaredFlags(t *testing.T, dir string, funcs ...string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	flags := map[string]bool{}
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !slices.Contains(funcs, fd.Name.Name) {
				continue
			}
			seen[fd.Name.Name] = true
			ast.Inspect(fd, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				// tlsx.Flags.Register(fs, PREFIX, ...): the TLS flags of
				// internal/tlsx, named with PREFIX.
				if sel.Sel.Name == "Register" && len(call.Args) >= 2 {
					if lit, ok := call.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if prefix, err := strconv.Unquote(lit.Value); err == nil {
							for name, isBool := range tlsxFlags(t, prefix) {
								flags[name] = isBool
							}
						}
					}
					return true
				}
				i, ok := flagMethods[sel.Sel.Name]
				if !ok || len(call.Args) <= i {
					return true
				}
				lit, ok := call.Args[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				name, err := strconv.Unquote(lit.Value)
				if err == nil {
					flags[name] = sel.Sel.Name == "Bool" || sel.Sel.Name == "BoolVar" || sel.Sel.Name == "BoolFunc"
				}
				return true
			})
		}
	}
	for _, fn := range funcs {
		if !seen[fn] {
			t.Fatalf("%s: no function %s: the test reads the flags of the command from it; update cmdflags_test.go", dir, fn)
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%s: no flags found in %v", dir, funcs)
	}
	return flags
}

// tlsxFlags are the flags internal/tlsx's Flags.Register declares for
// prefix ("", "etcd-", "redis-"), read from its code: a name written
// prefix+"tls-cert" gets the prefix; a bare name ("insecure") is declared
// only without one (Register adds it under prefix == "").
func tlsxFlags(t *testing.T, prefix string) map[string]bool {
	t.Helper()
	path := filepath.Join(repoRoot, "internal/tlsx/flags.go")
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	for _, d := range file.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "Register" {
			continue
		}
		ast.Inspect(fd, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			i, ok := flagMethods[sel.Sel.Name]
			if !ok || len(call.Args) <= i {
				return true
			}
			isBool := sel.Sel.Name == "Bool" || sel.Sel.Name == "BoolVar"
			switch a := call.Args[i].(type) {
			case *ast.BinaryExpr: // prefix + "name"
				if lit, ok := a.Y.(*ast.BasicLit); ok && lit.Kind == token.STRING && a.Op == token.ADD {
					if name, err := strconv.Unquote(lit.Value); err == nil {
						flags[prefix+name] = isBool
					}
				}
			case *ast.BasicLit:
				if name, err := strconv.Unquote(a.Value); err == nil && a.Kind == token.STRING && prefix == "" {
					flags[name] = isBool
				}
			}
			return true
		})
	}
	if len(flags) == 0 {
		t.Fatalf("%s: no flags found in Flags.Register; update cmdflags_test.go", path)
	}
	return flags
}

// commandFlags are the flags of allot's subcommands and allotctl's, as
// their code declares them.
func commandFlags(t *testing.T) map[string]map[string]bool {
	return map[string]map[string]bool{
		"regional":       declaredFlags(t, "cmd/allot", "register", "runRegional", "registerEtcd", "registerRedis"),
		"coordinator":    declaredFlags(t, "cmd/allot", "runCoordinator", "register", "registerEtcd"),
		"allotctl apply": declaredFlags(t, "cmd/allotctl", "flags", "applyFile"),
	}
}

// parseFlags splits args (after the subcommand) into flag → value. A flag
// must be declared; a non-boolean flag must be written --name=value (so a
// value is never mistaken for a positional argument); positional
// arguments are returned apart.
func parseFlags(args []string, declared map[string]bool) (flags map[string]string, positional []string, errs []string) {
	flags = map[string]string{}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			positional = append(positional, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		isBool, ok := declared[name]
		switch {
		case !ok:
			errs = append(errs, "unknown flag "+a)
			continue
		case !isBool && !hasValue:
			errs = append(errs, "flag "+a+" without =VALUE")
			continue
		case isBool && !hasValue:
			value = "true"
		}
		if _, dup := flags[name]; dup {
			errs = append(errs, "flag --"+name+" given twice")
		}
		flags[name] = value
	}
	return flags, positional, errs
}

func TestFlagsAreReadFromTheCode(t *testing.T) {
	f := commandFlags(t)
	for cmd, want := range map[string][]string{
		"regional": {"region", "grpc-addr", "http-addr", "etcd", "coordinator", "redis", "redis-cluster", "peers", "config",
			"tls-cert", "tls-key", "tls-ca", "tls-server-name", "insecure", "etcd-tls-cert", "etcd-tls-ca", "redis-tls-cert", "redis-tls-server-name", "redis-user", "redis-password-file"},
		"coordinator":    {"etcd", "grpc-addr", "http-addr", "advertise", "tls-cert", "tls-ca", "insecure", "etcd-tls-cert", "etcd-tls-key", "etcd-tls-ca"},
		"allotctl apply": {"addr", "timeout", "author", "tls-cert", "tls-key", "tls-ca", "insecure"},
	} {
		for _, name := range want {
			if _, ok := f[cmd][name]; !ok {
				t.Errorf("%s: flag --%s not found in the code (found %v)", cmd, name, f[cmd])
			}
		}
	}
	if !f["regional"]["redis-cluster"] || f["regional"]["redis"] {
		t.Errorf("regional: --redis-cluster should be boolean and --redis not: %v", f["regional"])
	}
	if !f["coordinator"]["insecure"] || f["coordinator"]["tls-cert"] {
		t.Errorf("coordinator: --insecure should be boolean and --tls-cert not: %v", f["coordinator"])
	}
	if _, ok := f["coordinator"]["etcd-insecure"]; ok {
		t.Errorf("coordinator: --etcd-insecure declared: %v", f["coordinator"])
	}
}
