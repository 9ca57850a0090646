package sluice_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeSnippetsCompile builds every ```go block of README.md, as a
// user who copies it would, in a scratch module outside this one that
// requires it (a replace directive). A snippet is a function body: its
// "..." error handling becomes a panic, and the names it leaves to the
// reader (rdb, ctx, jobs, call, do, work) are declared around it. A
// snippet that starts with "func " is a declaration of its own (a test
// function), beside the body.
func TestReadmeSnippetsCompile(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the README's snippets: %v", err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) < 3 {
		t.Fatalf("found %d go blocks in README.md; the pattern is broken", len(blocks))
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gosum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module readme\n\ngo 1.26\n\nrequire github.com/sluicehq/sluice v0.0.0\n\nreplace github.com/sluicehq/sluice => "+root+"\n")
	write("go.sum", string(gosum))
	write("names.go", `package readme

import (
	"context"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
)

// The names README's snippets leave to the reader.
var (
	ctx  = context.Background()
	rdb  = redis.NewClient(&redis.Options{ContextTimeoutEnabled: true})
	jobs = make(chan int)
	work int
	b    *bucket.Bucket // the bucket of the first snippet
)

func call(...any) error { return nil }
func do(any)            {}

func promptOf(*http.Request) int { return 0 } // the prompt's tokens, counted high
`)
	for i, b := range blocks {
		body := strings.ReplaceAll(string(b[1]), "{ ... }", "{ panic(err) }")
		decl := ""
		if strings.HasPrefix(body, "func ") {
			decl, body = body, ""
		}
		src := fmt.Sprintf(`package readme

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/semaphore"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/upstream"
)

var (
	_ = errors.As
	_ = fmt.Sprint
	_ = http.NewRequest
	_ = upstream.Parse
	_ = transport.New
	_ = context.Background
	_ = time.Second
	_ = redis.NewClient
	_ sluice.Limiter
	_ = bucket.New
	_ = local.NewRate
	_ = semaphore.New
	_ = miniredis.RunT
	_ testing.TB
)

func snippet%d() {
%s
}

%s
`, i, body, decl)
		src, err := useDeclared(src)
		if err != nil {
			t.Fatalf("README's go block %d does not parse: %v\n%s", i+1, err, b[1])
		}
		write(fmt.Sprintf("snippet%d.go", i), src)
	}
	cmd := exec.Command(goBin, "build", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README's snippets do not build: %v\n%s", err, out)
	}
}

// useDeclared adds "_ = x" after each statement of the snippet that
// declares x, as a reader would go on to use it.
func useDeclared(src string) (string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "snippet.go", src, 0)
	if err != nil {
		return "", err
	}
	uses := func(names []ast.Expr) []ast.Stmt {
		var out []ast.Stmt
		for _, e := range names {
			if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
				out = append(out, &ast.AssignStmt{Lhs: []ast.Expr{ast.NewIdent("_")}, Tok: token.ASSIGN, Rhs: []ast.Expr{ast.NewIdent(id.Name)}})
			}
		}
		return out
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BlockStmt:
			var list []ast.Stmt
			for _, st := range n.List {
				list = append(list, st)
				switch st := st.(type) {
				case *ast.AssignStmt:
					if st.Tok == token.DEFINE {
						list = append(list, uses(st.Lhs)...)
					}
				case *ast.DeclStmt:
					if g, ok := st.Decl.(*ast.GenDecl); ok {
						for _, sp := range g.Specs {
							if v, ok := sp.(*ast.ValueSpec); ok {
								for _, id := range v.Names {
									list = append(list, uses([]ast.Expr{id})...)
								}
							}
						}
					}
				}
			}
			n.List = list
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				n.Body.List = append(uses([]ast.Expr{n.Key, n.Value}), n.Body.List...)
			}
		}
		return true
	})
	var buf bytes.Buffer
	if err := format.Node(&buf, fset, f); err != nil {
		return "", err
	}
	return buf.String(), nil
}
