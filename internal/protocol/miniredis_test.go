package protocol_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLuaRunsOnMiniredis: no script of the module uses what the Lua of
// miniredis (gopher-lua, which users' unit tests and the bench without
// redis-server run on) lacks or reads otherwise: the bit, struct and
// cmsgpack libraries, and errors raised as tables (error({err = ...}),
// which miniredis replies as "table: 0x..."); scripts raise strings at
// level 0, which scriptreply.Raised reads on both servers. The tests of
// bucket and semaphore on miniredis run the scripts themselves; this
// catches what they do not reach.
func TestLuaRunsOnMiniredis(t *testing.T) {
	var files []string
	for _, dir := range []string{".", "../../queue/lua", "../../scheduler/lua", "../../semaphore", "../presence"} {
		fs, err := filepath.Glob(filepath.Join(dir, "*.lua"))
		if err != nil || len(fs) == 0 {
			t.Fatalf("no Lua scripts found in %s: %v", dir, err)
		}
		files = append(files, fs...)
	}
	comment := regexp.MustCompile(`--.*`)
	banned := []struct {
		re  *regexp.Regexp
		why string
	}{
		{regexp.MustCompile(`\b(bit|struct|cmsgpack)\s*\.`), "a library miniredis lacks"},
		{regexp.MustCompile(`\berror\s*\(\s*\{`), "a table raised, which miniredis replies as \"table: 0x...\""},
		{regexp.MustCompile(`\berror\s*\(\s*redis\.error_reply`), "a table raised, which miniredis replies as \"table: 0x...\""},
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			code := comment.ReplaceAllString(line, "")
			for _, b := range banned {
				if m := b.re.FindString(code); m != "" {
					t.Errorf("%s:%d: %q is %s", f, i+1, m, b.why)
				}
			}
		}
	}
}
