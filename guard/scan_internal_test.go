package guard

import "testing"

// OnScanPass has f called before each pass of a Cluster's ScanRecords
// until the test ends, for the external tests.
func OnScanPass(t testing.TB, f func(pass int)) {
	scanPassHook = f
	t.Cleanup(func() { scanPassHook = nil })
}
