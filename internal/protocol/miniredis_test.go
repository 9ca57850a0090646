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
// cmsgpack libraries; errors raised as tables (error({err = ...}),
// which miniredis replies as "table: 0x..."), where scripts raise strings
// at level 0, which scriptreply.Raised reads on both servers; and
// string.match's result passed on or returned as it is: finding nothing,
// gopher-lua's returns no value at all rather than one nil, so
// tonumber(string.match(...)) fails ("bad argument #1 to tonumber (value
// expected)"); (string.match(...)) is one value on both. The tests of
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
		{regexp.MustCompile(`([\w\]]\(|\{)\s*string\.match\s*\(|\breturn\s+string\.match\s*\(.*\)\s*$`), "string.match's result passed on as it is (finding nothing, no value on miniredis: wrap it in parentheses)"},
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
