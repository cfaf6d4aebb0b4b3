package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// RunAll measures every scenario at every concurrency on t, one row at a
// time. Each guard row runs right after a run of its baseline (the same
// transport mode, see Baseline), its pair: the two see the same machine
// load, and the guard row's Ratio is taken between them. A baseline asked
// for that is also a partner runs only as the partner. For each
// concurrency the rows follow Plan(scenarios). progress, if set, hears
// each row as it ends.
func (t *Target) RunAll(ctx context.Context, scenarios []string, concurrency []int, opts Options, progress func(Result)) ([]Result, error) {
	if len(scenarios) == 0 {
		return nil, fmt.Errorf("bench: no scenario given")
	}
	if len(concurrency) == 0 {
		concurrency = []int{opts.withDefaults().Concurrency}
	}
	for _, s := range scenarios {
		if _, ok := lookup(s); !ok {
			return nil, fmt.Errorf("bench: unknown scenario %q (have %s)", s, names())
		}
	}
	for _, c := range concurrency {
		if c <= 0 {
			return nil, fmt.Errorf("bench: concurrency %d must be positive", c)
		}
	}
	plan := plan(scenarios)
	var out []Result
	for _, c := range concurrency {
		for _, row := range plan {
			o := opts
			o.Concurrency = c
			r, err := t.Run(ctx, row.scenario, o)
			if err != nil {
				return out, err
			}
			r.Partner = row.partner
			if base := Baseline(r.Scenario); base != "" {
				if n := len(out); n > 0 && out[n-1].Scenario == base && out[n-1].Partner == r.Scenario && out[n-1].OpsPerSec() > 0 {
					r.Ratio = r.OpsPerSec() / out[n-1].OpsPerSec()
				}
			}
			out = append(out, r)
			if progress != nil {
				progress(r)
			}
		}
	}
	return out, nil
}

type planned struct{ scenario, partner string }

// Plan lists the rows RunAll runs for scenarios, in order: each guard row
// after its baseline, each other baseline alone where it was asked for.
func Plan(scenarios []string) []string {
	var out []string
	for _, p := range plan(scenarios) {
		out = append(out, p.scenario)
	}
	return out
}

func plan(scenarios []string) []planned {
	partners := map[string]bool{}
	for _, s := range scenarios {
		if b := Baseline(s); b != "" {
			partners[b] = true
		}
	}
	var out []planned
	for _, s := range scenarios {
		switch b := Baseline(s); {
		case b != "":
			out = append(out, planned{b, s}, planned{scenario: s})
		case !partners[s]:
			out = append(out, planned{scenario: s})
		}
	}
	return out
}

// Ratio returns r's throughput over its baseline's: r.Ratio when RunAll
// paired them, else from its baseline's row in results (same target, same
// concurrency), or NaN when there is none.
func Ratio(r Result, results []Result) float64 {
	if r.Ratio > 0 {
		return r.Ratio
	}
	base := Baseline(r.Scenario)
	if base == "" {
		return math.NaN()
	}
	for _, b := range results {
		if b.Scenario == base && b.Concurrency == r.Concurrency && b.Target == r.Target && b.OpsPerSec() > 0 {
			return r.OpsPerSec() / b.OpsPerSec()
		}
	}
	return math.NaN()
}

// WriteTable writes results as a Markdown table.
func WriteTable(w io.Writer, results []Result) error {
	var b strings.Builder
	b.WriteString("| scenario | target | workers | ops/s | × baseline | p50 | p99 | p99.9 | round trips/op | redis cmds/op | client CPU/op | redis CPU/op | allocs/op | keys | effects | duplicate effects | replays | in progress |\n")
	b.WriteString("|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		ratio := "—"
		if x := Ratio(r, results); !math.IsNaN(x) {
			ratio = fmt.Sprintf("%.2f× %s%s", x, Baseline(r.Scenario), ratioRange(r))
		} else if r.Partner != "" {
			ratio = "(baseline of " + r.Partner + ")"
		}
		cmds := "n/a"
		if !math.IsNaN(r.CommandsPerOp) {
			cmds = fmt.Sprintf("%.2f", r.CommandsPerOp)
		}
		keys, effects, dups := "—", "—", "—"
		if IsStorm(r.Scenario) {
			keys, effects, dups = fmt.Sprint(r.Keys), fmt.Sprint(r.Effects), fmt.Sprint(r.DuplicateEffects)
		}
		srv := "n/a"
		if r.ServerCPUPerOp >= 0 {
			srv = dur(r.ServerCPUPerOp)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %s | %s | %s | %s | %.2f | %s | %s | %s | %.1f | %s | %s | %s | %d | %d |\n",
			r.Scenario, r.Target, r.Concurrency, r.OpsPerSec(), ratio,
			dur(r.Latency.Quantile(0.50)), dur(r.Latency.Quantile(0.99)), dur(r.Latency.Quantile(0.999)),
			r.RoundTripsPerOp, cmds, dur(r.ClientCPUPerOp), srv, r.AllocsPerOp, keys, effects, dups, r.Replays, r.Conflicts)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteText writes results as an aligned plain-text table, for terminals.
func WriteText(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tworkers\tops/s\t×base\tp50\tp99\tp99.9\ttrips/op\tallocs/op\teffects\tdup\t")
	for _, r := range results {
		ratio := "-"
		if x := Ratio(r, results); !math.IsNaN(x) {
			ratio = fmt.Sprintf("%.2f%s", x, ratioRange(r))
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.2f\t%.1f\t%d\t%d\t\n", r.Scenario, r.Concurrency, r.OpsPerSec(), ratio,
			dur(r.Latency.Quantile(0.5)), dur(r.Latency.Quantile(0.99)), dur(r.Latency.Quantile(0.999)),
			r.RoundTripsPerOp, r.AllocsPerOp, r.Effects, r.DuplicateEffects)
	}
	return tw.Flush()
}

// ratioRange formats the lowest and highest round's ratio of r, when it
// is the median of several rounds.
func ratioRange(r Result) string {
	if r.RatioHigh == 0 {
		return ""
	}
	return fmt.Sprintf(" (%.2f–%.2f)", r.RatioLow, r.RatioHigh)
}

// dur formats a latency with three significant digits, never with an
// exponent: a value that rounds to 1000 of a unit is given in the next
// (999.6ms is 1s, not %.3g's 1e+03ms).
func dur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case d >= time.Second && d.Seconds() >= 999.5:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d >= time.Second || ms >= 999.5:
		return fmt.Sprintf("%.3gs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3gms", ms)
	case d >= 10*time.Microsecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.3gµs", float64(d)/float64(time.Microsecond))
	}
}

// WriteChart draws throughput and p99 latency by concurrency, one line
// per scenario, into path: SVG when it ends in .svg, PNG when .png.
func WriteChart(path string, results []Result) error {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".svg" && ext != ".png" {
		return fmt.Errorf("bench: chart %q: the name must end in .svg or .png", path)
	}
	if len(results) == 0 {
		return fmt.Errorf("bench: chart: no results")
	}
	var order []string
	for _, r := range results {
		if !slices.Contains(order, r.Scenario) {
			order = append(order, r.Scenario)
		}
	}
	tput, p99 := plot.New(), plot.New()
	tput.Title.Text, tput.X.Label.Text, tput.Y.Label.Text = "throughput", "workers", "ops/s"
	p99.Title.Text, p99.X.Label.Text, p99.Y.Label.Text = "p99 latency", "workers", "ms"
	var tLines, pLines []any
	for _, s := range order {
		var a, b plotter.XYs
		for _, r := range results {
			if r.Scenario == s {
				a = append(a, plotter.XY{X: float64(r.Concurrency), Y: r.OpsPerSec()})
				b = append(b, plotter.XY{X: float64(r.Concurrency), Y: float64(r.Latency.Quantile(0.99)) / 1e6})
			}
		}
		tLines = append(tLines, s, a)
		pLines = append(pLines, s, b)
	}
	if err := plotutil.AddLinePoints(tput, tLines...); err != nil {
		return fmt.Errorf("bench: chart: %w", err)
	}
	if err := plotutil.AddLinePoints(p99, pLines...); err != nil {
		return fmt.Errorf("bench: chart: %w", err)
	}
	// Workers on a log scale, a tick at each concurrency measured.
	var ticks plot.ConstantTicks
	var conc []int
	for _, r := range results {
		if !slices.Contains(conc, r.Concurrency) {
			conc = append(conc, r.Concurrency)
		}
	}
	slices.Sort(conc)
	for _, c := range conc {
		ticks = append(ticks, plot.Tick{Value: float64(c), Label: strconv.Itoa(c)})
	}
	for _, p := range []*plot.Plot{tput, p99} {
		p.Legend.Top, p.Legend.Left = true, true
		p.Y.Min = 0
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = ticks
		p.X.Min, p.X.Max = float64(conc[0])/1.5, float64(conc[len(conc)-1])*1.5
	}
	width, height := 12*vg.Inch, 5*vg.Inch
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if ext == ".svg" {
		canvas = vgsvg.New(width, height)
	} else {
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	}
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	plots := [][]*plot.Plot{{tput, p99}}
	cs := plot.Align(plots, tiles, dc)
	tput.Draw(cs[0][0])
	p99.Draw(cs[0][1])
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: chart: %w", err)
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: chart %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: chart %s: %w", path, err)
	}
	return nil
}

// Median merges the rows of several rounds of the same matrix: for each
// row, the round of median throughput (the lower middle one for an even
// count), with Ratio the median of the rounds' ratios (for an even count,
// the mean of the two middle ones), each taken between
// a guard row and the baseline run right before it in the same round.
// Ratios between rows run back to back are steadier than throughput on a
// busy machine.
func Median(rounds [][]Result) []Result {
	if len(rounds) == 0 {
		return nil
	}
	var out []Result
	for i, r := range rounds[0] {
		rows := []Result{r}
		for _, other := range rounds[1:] {
			if i < len(other) && other[i].Scenario == r.Scenario && other[i].Concurrency == r.Concurrency {
				rows = append(rows, other[i])
			}
		}
		var ratios []float64
		for _, row := range rows {
			if row.Ratio > 0 {
				ratios = append(ratios, row.Ratio)
			}
		}
		slices.Sort(ratios)
		slices.SortFunc(rows, func(a, b Result) int {
			switch x, y := a.OpsPerSec(), b.OpsPerSec(); {
			case x < y:
				return -1
			case x > y:
				return 1
			}
			return 0
		})
		m := rows[(len(rows)-1)/2]
		m.Ratio, m.RatioLow, m.RatioHigh = 0, 0, 0
		if n := len(ratios); n > 0 {
			m.Ratio = ratios[(n-1)/2]
			if n%2 == 0 { // the mean of the two middle ones
				m.Ratio = (ratios[n/2-1] + ratios[n/2]) / 2
			}
		}
		if len(ratios) > 1 {
			m.RatioLow, m.RatioHigh = ratios[0], ratios[len(ratios)-1]
		}
		out = append(out, m)
	}
	return out
}

// LoadAverage returns the machine's load average over 1, 5 and 15
// minutes as /proc/loadavg gives it, or "unknown".
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
