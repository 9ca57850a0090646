package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// The --plot figure of the saturated run, drawn with gonum.org/v1/plot:
// four panels that let a person see that the limit held and waits were
// even.
//
//  1. cumulative grants (by slot and by start) against the envelope
//     Capacity + RefillAmount × (⌊t / RefillFrequency⌋ + 1) from the first slot;
//  2. grants per 100 ms against the limit's rate;
//  3. for each grant, the worst excess of the windows that end at it
//     (≤ 0: the guarantee held);
//  4. the histogram of the steady-state waits of queued callers.

var (
	colSlot  = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	colStart = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	colLimit = color.RGBA{R: 200, G: 30, B: 30, A: 255}
)

// writePlot draws the figure to path: .svg, or .png.
func writePlot(path string, grants []loadgen.Grant, l guarantee.Limit, s Saturation) error {
	var slots, starts []time.Time
	var begin int64 = math.MaxInt64
	for _, g := range grants {
		begin = min(begin, g.Start)
	}
	var waits plotter.Values
	for _, g := range grants {
		if !g.OK() {
			continue
		}
		slots = append(slots, g.SlotTime())
		starts = append(starts, g.Time())
		if (g.Polls > 0 || g.Position > 0) && g.Start-begin >= int64(s.Warmup) {
			waits = append(waits, float64(g.Wait())/float64(time.Millisecond))
		}
	}
	if len(slots) < 2 {
		return fmt.Errorf("plot: %d grants, too few to draw", len(slots))
	}
	slices.SortFunc(slots, time.Time.Compare)
	slices.SortFunc(starts, time.Time.Compare)
	t0 := slots[0]
	sec := func(t time.Time) float64 { return t.Sub(t0).Seconds() }

	cum, err := cumulativePlot(slots, starts, l, sec)
	if err != nil {
		return err
	}
	rate, err := ratePlot(slots, starts, l, sec)
	if err != nil {
		return err
	}
	exc, err := excessPlot(slots, starts, l, sec)
	if err != nil {
		return err
	}
	hist, err := waitPlot(waits, s)
	if err != nil {
		return err
	}

	return saveTiles(path, [][]*plot.Plot{{cum, rate}, {exc, hist}}, 30*vg.Centimeter, 22*vg.Centimeter)
}

// saveTiles draws plots, rows of panels, on a w × h figure to path: .svg,
// or .png.
func saveTiles(path string, plots [][]*plot.Plot, w, h vg.Length) error {
	var c interface {
		vg.CanvasSizer
		io.WriterTo
	}
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg":
		c = vgsvg.New(w, h)
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))}
	default:
		return fmt.Errorf("plot: %q: want a .svg or .png file", path)
	}
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Centimeter / 2, PadBottom: vg.Centimeter / 2, PadLeft: vg.Centimeter / 2, PadRight: vg.Centimeter / 2}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// addLine adds a line to p, 1.2 points wide unless width says otherwise.
func addLine(p *plot.Plot, xys plotter.XYs, col color.Color, dashed bool, legend string, width ...vg.Length) error {
	ln, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	ln.Color = col
	ln.Width = vg.Points(1.2)
	if len(width) > 0 {
		ln.Width = width[0]
	}
	if dashed {
		ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(ln)
	if legend != "" {
		p.Legend.Add(legend, ln)
	}
	return nil
}

func cumulativePlot(slots, starts []time.Time, l guarantee.Limit, sec func(time.Time) float64) (*plot.Plot, error) {
	one := func(ts []time.Time) []guarantee.Grant {
		gs := make([]guarantee.Grant, len(ts))
		for i, t := range ts {
			gs[i] = guarantee.Grant{At: t, Cost: 1}
		}
		return gs
	}
	return envelopePlot("Cumulative grants under the allowed envelope", "grants", one(slots), one(starts), l, sec)
}

// envelopePlot draws the units of sorted slots and starts, cumulated,
// against the most l allows from the first slot:
// Capacity + RefillAmount × (⌊t / RefillFrequency⌋ + 1).
func envelopePlot(title, units string, slots, starts []guarantee.Grant, l guarantee.Limit, sec func(time.Time) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "s since the first grant time"
	p.Y.Label.Text = units
	p.Legend.Top, p.Legend.Left = true, true
	cumXY := func(gs []guarantee.Grant) plotter.XYs {
		xys := make(plotter.XYs, len(gs))
		sum := 0
		for i, g := range gs {
			sum += g.Cost
			xys[i] = plotter.XY{X: sec(g.At), Y: float64(sum)}
		}
		return xys
	}
	end := max(sec(slots[len(slots)-1].At), sec(starts[len(starts)-1].At))
	var env plotter.XYs
	for k := 0; ; k++ {
		x := float64(k) * l.RefillFrequency.Seconds()
		env = append(env, plotter.XY{X: x, Y: float64(l.Allowed(time.Duration(k) * l.RefillFrequency))})
		if x > end || len(env) > 20000 {
			break
		}
	}
	if len(env) > 20000 { // a step line too fine to see: draw the slope
		env = plotter.XYs{{X: 0, Y: float64(l.Allowed(0))}, {X: end, Y: float64(l.Allowed(time.Duration(end * float64(time.Second))))}}
	}
	// Wide and pale, under the grants: at this scale the lines meet.
	if err := addLine(p, env, color.RGBA{R: 240, G: 150, B: 150, A: 255}, false, "allowed since the first grant time: capacity + refills", vg.Points(5)); err != nil {
		return nil, err
	}
	if err := addLine(p, cumXY(slots), colSlot, false, units+" by grant time (Redis's clock)"); err != nil {
		return nil, err
	}
	if err := addLine(p, cumXY(starts), colStart, false, units+" by start time (Enter returned)"); err != nil {
		return nil, err
	}
	return p, nil
}

// writeQuotaPlot draws the quota run to path (.svg or .png): a panel per
// policy, its units granted by slot and by start against its envelope.
func writeQuotaPlot(path string, grants []loadgen.Grant, ps []QuotaPolicy) error {
	var row []*plot.Plot
	for _, pol := range ps {
		var slots, starts []guarantee.Grant
		for _, g := range grants {
			if g.OK() {
				slots = append(slots, guarantee.Grant{At: g.SlotTime(), Cost: pol.cost(g)})
				starts = append(starts, guarantee.Grant{At: g.Time(), Cost: pol.cost(g)})
			}
		}
		if len(slots) < 2 {
			return fmt.Errorf("plot: %d grants, too few to draw", len(slots))
		}
		byAt := func(a, b guarantee.Grant) int { return a.At.Compare(b.At) }
		slices.SortFunc(slots, byAt)
		slices.SortFunc(starts, byAt)
		t0 := slots[0].At
		units := "PU"
		if pol.Unit == "" {
			units = "requests"
		}
		p, err := envelopePlot(fmt.Sprintf("%s: capacity %s, %d every %v", pol.Name, commas(pol.Capacity), pol.RefillAmount, pol.RefillFrequency),
			units, slots, starts, pol.limit(), func(t time.Time) float64 { return t.Sub(t0).Seconds() })
		if err != nil {
			return err
		}
		// From 0, with room above the envelope for the legend (the month's
		// envelope is flat and high).
		p.Y.Min, p.Y.Max = 0, 1.3*p.Y.Max
		row = append(row, p)
	}
	return saveTiles(path, [][]*plot.Plot{row}, 42*vg.Centimeter, 14*vg.Centimeter)
}

func ratePlot(slots, starts []time.Time, l guarantee.Limit, sec func(time.Time) float64) (*plot.Plot, error) {
	const bin = 100 * time.Millisecond
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Grants per %v", bin)
	p.X.Label.Text = "s since the first grant time"
	p.Y.Label.Text = "grants"
	binned := func(ts []time.Time) plotter.XYs { return binCounts(ts, sec, bin, sec(ts[len(ts)-1]), 1) }
	perBin := float64(l.RefillAmount) * float64(bin) / float64(l.RefillFrequency)
	end := sec(slots[len(slots)-1])
	if err := addLine(p, plotter.XYs{{X: 0, Y: perBin}, {X: end, Y: perBin}}, colLimit, true, fmt.Sprintf("limit: %.0f per %v", perBin, bin)); err != nil {
		return nil, err
	}
	if err := addLine(p, binned(slots), colSlot, false, "by grant time"); err != nil {
		return nil, err
	}
	if err := addLine(p, binned(starts), colStart, false, "by start time"); err != nil {
		return nil, err
	}
	p.Y.Min = 0
	return p, nil
}

// binCounts counts ts in bins of width bin from sec's origin to end: one
// point per bin, at its middle, of its count divided by per (1: counts;
// the bin's seconds: a rate).
func binCounts(ts []time.Time, sec func(time.Time) float64, bin time.Duration, end, per float64) plotter.XYs {
	n := int(end/bin.Seconds()) + 1
	counts := make([]int, n)
	for _, t := range ts {
		if k := int(sec(t) / bin.Seconds()); k >= 0 && k < n {
			counts[k]++
		}
	}
	xys := make(plotter.XYs, n)
	for k, c := range counts {
		xys[k] = plotter.XY{X: (float64(k) + 0.5) * bin.Seconds(), Y: float64(c) / per}
	}
	return xys
}

// maxPlotWork bounds the windows windowExcess examines: beyond it only
// windows of at most a second are.
const maxPlotWork = 200_000_000

// windowExcess is, for each grant of sorted ts, the worst excess over the
// windows of at most w that end at it (w ≤ 0: every window).
func windowExcess(ts []time.Time, l guarantee.Limit, w time.Duration) []int {
	out := make([]int, len(ts))
	i := 0
	for j := range ts {
		for w > 0 && ts[j].Sub(ts[i]) > w {
			i++
		}
		worst := math.MinInt
		for k := i; k <= j; k++ {
			worst = max(worst, (j-k+1)-l.Allowed(ts[j].Sub(ts[k])))
		}
		out[j] = worst
	}
	return out
}

func excessPlot(slots, starts []time.Time, l guarantee.Limit, sec func(time.Time) float64) (*plot.Plot, error) {
	p := plot.New()
	var w time.Duration // every window, unless that is too much work
	p.Title.Text = "Worst window ending at each grant: grants − allowed"
	if n := len(slots); n*n/2 > maxPlotWork {
		w = time.Second
		p.Title.Text = "Worst window ≤ 1 s ending at each grant: grants − allowed"
	}
	p.X.Label.Text = "s since the first grant time"
	p.Y.Label.Text = "excess (≤ 0: the limit held)"
	p.Legend.Top, p.Legend.Left = false, true
	xy := func(ts []time.Time) plotter.XYs {
		ex := windowExcess(ts, l, w)
		xys := make(plotter.XYs, len(ts))
		for i, t := range ts {
			xys[i] = plotter.XY{X: sec(t), Y: float64(ex[i])}
		}
		return xys
	}
	end := max(sec(slots[len(slots)-1]), sec(starts[len(starts)-1]))
	if err := addLine(p, plotter.XYs{{X: 0, Y: 0}, {X: end, Y: 0}}, colLimit, true, "limit (excess 0)"); err != nil {
		return nil, err
	}
	if err := addLine(p, xy(slots), colSlot, false, "by grant time"); err != nil {
		return nil, err
	}
	if err := addLine(p, xy(starts), colStart, false, "by start time"); err != nil {
		return nil, err
	}
	// The first grants' windows are far below the allowance (a window of
	// one grant is 1 − Capacity − RefillAmount): show the band near 0,
	// where a broken limit would show.
	p.Y.Max = math.Max(p.Y.Max, 3)
	p.Y.Min = -10
	return p, nil
}

func waitPlot(waits plotter.Values, s Saturation) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Waits, steady state (%d; max/median %.3f)", len(waits), s.MaxOverMedian)
	p.X.Label.Text = "wait, ms"
	p.Y.Label.Text = "Enters"
	if len(waits) == 0 {
		return p, nil
	}
	h, err := plotter.NewHist(waits, 40)
	if err != nil {
		return nil, err
	}
	h.FillColor = colSlot
	h.LineStyle.Color = color.White
	p.Add(h)
	return p, nil
}
