package httpx_test

import (
	"testing"

	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/httpcore"
)

// TestSameAsCore: httpx spells out the constants its users read (the
// problem types, the defaults) and the shared core writes; they must be
// the same values.
func TestSameAsCore(t *testing.T) {
	same := map[string][2]any{
		"ProblemMissingKey":        {httpx.ProblemMissingKey, httpcore.ProblemMissingKey},
		"ProblemMalformedKey":      {httpx.ProblemMalformedKey, httpcore.ProblemMalformedKey},
		"ProblemBodyUnreadable":    {httpx.ProblemBodyUnreadable, httpcore.ProblemBodyUnreadable},
		"ProblemKeyMismatch":       {httpx.ProblemKeyMismatch, httpcore.ProblemKeyMismatch},
		"ProblemInFlight":          {httpx.ProblemInFlight, httpcore.ProblemInFlight},
		"ProblemBodyTooLarge":      {httpx.ProblemBodyTooLarge, httpcore.ProblemBodyTooLarge},
		"ProblemStoreUnavailable":  {httpx.ProblemStoreUnavailable, httpcore.ProblemStoreUnavailable},
		"ProblemStoreError":        {httpx.ProblemStoreError, httpcore.ProblemStoreError},
		"ProblemExhausted":         {httpx.ProblemExhausted, httpcore.ProblemExhausted},
		"ProblemHandlerPanic":      {httpx.ProblemHandlerPanic, httpcore.ProblemHandlerPanic},
		"ProblemResponseNotKept":   {httpx.ProblemResponseNotKept, httpcore.ProblemResponseNotKept},
		"ProblemCorruptResponse":   {httpx.ProblemCorruptResponse, httpcore.ProblemCorruptResponse},
		"ProblemCallerUnknown":     {httpx.ProblemCallerUnknown, httpcore.ProblemCallerUnknown},
		"ProblemContentType":       {httpx.ProblemContentType, httpcore.ProblemContentType},
		"DefaultHeader":            {httpx.DefaultHeader, httpcore.DefaultHeader},
		"DefaultMaxBody":           {int64(httpx.DefaultMaxBody), int64(httpcore.DefaultMaxBody)},
		"DefaultMaxStoredResponse": {int64(httpx.DefaultMaxStoredResponse), int64(httpcore.DefaultMaxStoredResponse)},
		"DefaultRetryAfter":        {httpx.DefaultRetryAfter, httpcore.DefaultRetryAfter},
		"ReplayedHeader":           {httpx.ReplayedHeader, httpcore.ReplayedHeader},
		"MaxKeyLen":                {httpx.MaxKeyLen, httpcore.MaxKeyLen},
	}
	for name, v := range same {
		if v[0] != v[1] {
			t.Errorf("%s: httpx %v, core %v", name, v[0], v[1])
		}
	}
}
