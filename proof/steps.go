package proof

import (
	"strconv"
	"strings"

	"github.com/idemguard/idemguard/guard"
)

// stepsString is steps as Snapshot and Output keep them: one line per
// step, its name and result quoted (quoting leaves no newline inside).
func stepsString(steps []guard.StepResult) string {
	var b strings.Builder
	for _, s := range steps {
		b.WriteString(stepLine(s.Name, string(s.Result)))
	}
	return b.String()
}

func stepLine(name, result string) string {
	return strconv.Quote(name) + "=" + strconv.Quote(result) + "\n"
}

// stepLines splits what stepsString made into its lines.
func stepLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	return lines[:len(lines)-1] // the empty string after the last newline
}

// stepSteps is the model of guard.StepStore.SaveStep, as step.lua does
// it: only the holder of a pending record is answered OK, for a step the
// record holds at the index byte for byte (this call repeated) or one it
// appends right after the steps it holds.
func stepSteps(s Snapshot, in Input) []transition {
	line := stepLine(in.Name, in.Value)
	held := stepLines(s.Steps)
	switch {
	case s.State != guard.StatePending || s.Token != in.Token:
		return []transition{{Output{OK: false}, s}}
	case in.Index < len(held) && held[in.Index] == line:
		return []transition{{Output{OK: true}, s}}
	case in.Index != len(held):
		return []transition{{Output{Order: true}, s}}
	}
	n := s
	n.Steps += line
	return []transition{{Output{OK: true}, n}}
}

// describeSteps is steps for the visualisation: name=result, ...
func describeSteps(s string) string {
	return "[" + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", " ") + "]"
}
