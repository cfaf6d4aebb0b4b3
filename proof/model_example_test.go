package proof_test

import (
	"fmt"
	"os"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/proof"
)

// A late complete that succeeds after another holder recovered the key
// (the Powertools TS 5714 bug) is not linearizable; the checker says so
// and writes a visualisation.
func ExampleCheck() {
	key := guard.Key{Scope: "orders", ID: "42"}
	op := func(client int, call, ret int64, in proof.Input, out proof.Output) porcupine.Operation {
		in.Key = key
		return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	}
	history := []porcupine.Operation{
		op(0, 0, 1, proof.Input{Op: proof.OpClaim, Token: "A", Fingerprint: "fp"}, proof.Output{Status: guard.Acquired, Fence: 1, Attempt: 1}),
		op(1, 2, 3, proof.Input{Op: proof.OpClaim, Token: "B", Fingerprint: "fp"}, proof.Output{Status: guard.Acquired, Fence: 2, Attempt: 2, Recovered: true}),
		op(0, 4, 5, proof.Input{Op: proof.OpComplete, Token: "A", Value: "late"}, proof.Output{OK: true}),
	}
	res, path, err := proof.Check(history, 10*time.Second)
	fmt.Println(res, path != "", err)
	_ = os.Remove(path)
	// Output: Illegal true <nil>
}

// The nemesis schedule is a function of the seed alone.
func ExampleSchedule() {
	a := proof.Schedule(proof.NemesisOptions{Seed: 7}, 20)
	b := proof.Schedule(proof.NemesisOptions{Seed: 7}, 20)
	same := true
	for i := range a {
		same = same && fmt.Sprint(a[i]) == fmt.Sprint(b[i])
	}
	fmt.Println(len(a), same)
	// Output: 20 true
}
