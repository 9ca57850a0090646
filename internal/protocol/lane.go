package protocol

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// MaxLaneName is the longest lane name, in bytes: a lane's name is part
// of its list's key and of every one of its callers' IDs.
const MaxLaneName = 128

// CheckLaneName says what is wrong with lane name, or nil: a lane is
// named by 1 to MaxLaneName bytes of printable text without spaces or
// '|' (queue entries are "<id>|<estimate>", and wake messages separate
// them with spaces).
func CheckLaneName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("lane name is empty")
	case len(name) > MaxLaneName:
		return fmt.Errorf("lane name %.20q... is %d bytes, more than %d", name, len(name), MaxLaneName)
	case strings.ContainsRune(name, '|'):
		return fmt.Errorf("lane name %q holds '|'", name)
	case strings.IndexFunc(name, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("lane name %q holds a space or a character that does not print", name)
	}
	return nil
}

// LaneID is what a caller's ID ends with when it is in lane name of
// weight w and priority p (lanes.lua's lane_of reads it):
// "#<w>,<p>,<name>". The default lane's callers' IDs end with nothing.
func LaneID(name string, w, p int) string {
	if name == "" {
		return ""
	}
	return "#" + strconv.Itoa(w) + "," + strconv.Itoa(p) + "," + name
}

// IDLane is the lane of a caller's ID or entry ("" for the default one).
func IDLane(id string) string {
	if i := strings.IndexByte(id, '|'); i >= 0 {
		id = id[:i]
	}
	i := strings.IndexByte(id, '#')
	if i < 0 {
		return ""
	}
	parts := strings.SplitN(id[i+1:], ",", 3)
	if len(parts) != 3 || !digits(parts[0]) || !digits(parts[1]) {
		return ""
	}
	return parts[2]
}

// AnyLane reports whether any of ids is in a named lane.
func AnyLane(ids []string) bool {
	for _, id := range ids {
		if strings.IndexByte(id, '#') >= 0 && IDLane(id) != "" {
			return true
		}
	}
	return false
}
