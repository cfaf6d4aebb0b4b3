//go:build !race

package httpx_test

// raceEnabled: the race detector adds allocations of its own.
const raceEnabled = false
