package enterdetail

// Wire is a grant's detail as `sluice serve --detail` sends it in JSON (a
// grant reply's "detail") and cmd/bench reads it: the Detail's slot and
// counts, with the bucket.Report figures the bench judges a grant by.
// Its one home, for both sides of that wire.
type Wire struct {
	SlotUS    int64 `json:"slot_us"` // unix µs, Redis clock
	Position  int   `json:"position"`
	Polls     int   `json:"polls"`
	Retimes   int   `json:"retimes"`
	Reentries int   `json:"reentries"`
	LateNS    int64 `json:"late_ns"`
	Claims    int   `json:"claims"`
}
