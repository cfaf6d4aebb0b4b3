package fiberx_test

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestMultipartForm: fasthttp parses a multipart/form-data body of known
// length as it reads it (Fiber's default, unless
// DisablePreParseMultipartForm) and keeps none of its bytes: the body it
// gives back is the form written again, fields and files in Go's map
// order, another body each time. The guard fingerprints the form in one
// order, so a retry of the same request is replayed (without it, most
// retries of a form of five fields got 422, "use a new key": the client
// that did made the effect twice), and another form under the key still
// gets 422. The same with DisablePreParseMultipartForm, where the body is
// kept as sent.
func TestMultipartForm(t *testing.T) {
	for _, cfg := range []fiber.Config{{}, {DisablePreParseMultipartForm: true}} {
		t.Run("DisablePreParseMultipartForm="+map[bool]string{true: "true", false: "false"}[cfg.DisablePreParseMultipartForm], func(t *testing.T) {
			g := guardenv.Guard(t, guard.Options{})
			var runs atomic.Int64
			app := fiber.New(cfg)
			app.Post("/payouts", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
				runs.Add(1)
				f, err := c.FormFile("receipt")
				if err != nil {
					return err
				}
				return c.Status(http.StatusCreated).SendString("paid " + c.FormValue("amount") + " with " + f.Filename)
			})
			base := listen(t, app)
			form := func(amount string) (*bytes.Buffer, string) {
				var body bytes.Buffer
				mw := multipart.NewWriter(&body)
				_ = mw.SetBoundary("retry-boundary") // the client sends the same bytes again
				for _, f := range []string{"account", "currency", "memo", "reference"} {
					_ = mw.WriteField(f, f+"-1")
				}
				_ = mw.WriteField("amount", amount)
				fw, _ := mw.CreateFormFile("receipt", "r.pdf")
				_, _ = fw.Write([]byte("%PDF receipt"))
				fw, _ = mw.CreateFormFile("extra", "x.txt")
				_, _ = fw.Write([]byte("extra"))
				_ = mw.Close()
				return &body, mw.FormDataContentType()
			}
			post := func(amount string) (int, string, bool) {
				t.Helper()
				body, typ := form(amount)
				req, _ := http.NewRequest(http.MethodPost, base+"/payouts", body)
				req.Header.Set("Content-Type", typ)
				req.Header.Set("Idempotency-Key", "payout-1")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(res.Body)
				return res.StatusCode, string(b), res.Header.Get(httpx.ReplayedHeader) == "true"
			}
			if code, body, _ := post("100"); code != http.StatusCreated || body != "paid 100 with r.pdf" {
				t.Fatalf("first: %d %q", code, body)
			}
			for i := range 10 {
				if code, body, replayed := post("100"); code != http.StatusCreated || body != "paid 100 with r.pdf" || !replayed {
					t.Fatalf("retry %d of the same form: %d %q replayed %v; want the replay", i+1, code, body, replayed)
				}
			}
			if code, _, _ := post("500"); code != http.StatusUnprocessableEntity {
				t.Fatalf("another form under the key: %d; want 422", code)
			}
			if runs.Load() != 1 {
				t.Fatalf("runs %d, want 1", runs.Load())
			}
		})
	}
}
