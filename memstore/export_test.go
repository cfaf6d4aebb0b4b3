package memstore

import "fmt"

// CheckInvariants reports the first broken rule of s's bookkeeping: every
// record is in the map under its own key and once in the expiry heap at
// its index, the heap is ordered, every released entry is in the list of
// releases and no other is, and Bytes is the sum of the records' estimates.
func CheckInvariants(s *Store) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.records) != len(s.expiry) {
		return fmt.Errorf("%d records, %d in the expiry heap", len(s.records), len(s.expiry))
	}
	var sum int64
	tombs := 0
	for k, e := range s.records {
		switch {
		case e.key != k:
			return fmt.Errorf("record %s filed under %s", e.key, k)
		case e.index < 0 || e.index >= len(s.expiry) || s.expiry[e.index] != e:
			return fmt.Errorf("record %s not at its heap index %d", k, e.index)
		case e.size != e.estimate():
			return fmt.Errorf("record %s counted as %d bytes, estimate %d", k, e.size, e.estimate())
		case (e.state == released) != (e.tomb != nil):
			return fmt.Errorf("record %s in state %d, in the release list: %v", k, e.state, e.tomb != nil)
		case e.state == released && e.tomb.Value.(*entry) != e:
			return fmt.Errorf("release list element of %s names another record", k)
		}
		if e.state == released {
			tombs++
		}
		sum += e.size
	}
	if tombs != s.tombs.Len() {
		return fmt.Errorf("%d released records, %d in the release list", tombs, s.tombs.Len())
	}
	if sum != s.bytes {
		return fmt.Errorf("bytes counted %d, sum of records %d", s.bytes, sum)
	}
	for i := 1; i < len(s.expiry); i++ {
		if s.expiry.Less(i, (i-1)/2) {
			return fmt.Errorf("expiry heap out of order at %d", i)
		}
	}
	return nil
}

// SweepBatch is sweepBatch, for the test of the amortised sweep.
const SweepBatch = sweepBatch
