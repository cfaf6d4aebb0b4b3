// Package proof holds idemguard's proof-under-faults tests and the tooling
// they run on: an in-process Toxiproxy between the guard and Redis with a
// seeded nemesis that injects latency, resets, dropped replies and bandwidth
// limits; a recording Store that keeps every call's invocation, return and
// outcome; and a porcupine model of the per-key state machine of
// docs/design.md ("The state machine"), so a history can be checked for linearizability.
//
// The tests race goroutines and OS processes over real Redis and
// PostgreSQL and count business rows. Run the long soak with
//
//	go test -race ./proof -run Soak -soak
package proof
