package chiwalk_test

import (
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
)

// TestUseAfterRoutesPanics pins what chiwalk relies on: chi refuses Use
// after a route, on a router and in a Group, so a route's middleware are
// those the walk reads (a guard Used later would guard routes registered
// before it without the walk knowing, or not guard them while listed).
func TestUseAfterRoutesPanics(t *testing.T) {
	mw := func(h http.Handler) http.Handler { return h }
	for name, register := range map[string]func(){
		"router": func() { r := chi.NewRouter(); r.Post("/x", ok); r.Use(mw) },
		"group":  func() { chi.NewRouter().Group(func(g chi.Router) { g.Post("/x", ok); g.Use(mw) }) },
		"route":  func() { chi.NewRouter().Route("/v", func(g chi.Router) { g.Post("/x", ok); g.Use(mw) }) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: chi took Use after a route", name)
				}
			}()
			register()
		}()
	}
}
