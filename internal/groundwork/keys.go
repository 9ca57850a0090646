package groundwork

import "strings"

// DefaultKeyPrefix starts every key when a Config leaves KeyPrefix empty.
const DefaultKeyPrefix = "sluice"

// KeyBase is the common start of every key and channel of the limiter name
// under prefix: "<prefix>:{<escaped name>}:". All keys of one limiter share
// the hash tag, so on Redis Cluster they live in one slot and a script may
// touch them all, and an ACL pattern such as ~sluice:* covers them.
func KeyBase(prefix, name string) string {
	return prefix + ":{" + EscapeName(name) + "}:"
}

var nameEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// EscapeName percent-encodes '%', '{' and '}' in name, so that any byte
// string is a valid name, no name can end the hash tag early, and two
// different names never escape to the same string.
func EscapeName(name string) string {
	if !strings.ContainsAny(name, "%{}") {
		return name
	}
	return nameEscaper.Replace(name)
}

var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// GlobEscape escapes the glob characters of s for a SCAN MATCH pattern.
func GlobEscape(s string) string { return globEscaper.Replace(s) }
