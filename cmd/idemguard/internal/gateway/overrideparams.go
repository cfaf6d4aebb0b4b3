package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Method-override parameters. Besides header fields, frameworks take a
// POST's method from a _method parameter: in its form body (Rails, whose
// default middleware Rack::MethodOverride reads it, Laravel's and Symfony's
// forms, urlencoded or multipart; Rack reads a POST without a Content-Type
// as a form too) or its query (Laravel, Symfony). PHP decodes the name
// first, drops its leading blanks and turns '.', ' ' and '[' in it into
// '_', so %5Fmethod, .method and +_method are _method there. Such a request
// that no route guards as it is would run a guarded method unguarded: its
// names are read here, for methodVariants to refuse. A body is read only
// when a route guards another method for the request, up to max_body (the
// largest of the routes'); one larger cannot be read whole and is refused
// (413). Other bodies (JSON) are not looked into.

// errFormTooLarge is a form body over the limit the gateway reads.
var errFormTooLarge = errors.New("gateway: the form body is larger than max_body; its method-override parameter cannot be read")

// isOverrideParam reports whether a parameter's decoded name is _method as
// the frameworks above read it.
func isOverrideParam(name string) bool {
	name = strings.TrimLeft(name, " ")
	if len(name) != len("_method") || name[1:] != "method" {
		return false
	}
	switch name[0] {
	case '_', '.', ' ', '[':
		return true
	}
	return false
}

// queryOverrides returns the values of r's _method query parameters.
func queryOverrides(r *http.Request) []string {
	q := r.URL.RawQuery
	if !strings.Contains(q, "method") && !strings.Contains(q, "%") {
		return nil
	}
	return formPairs(q)
}

// formPairs returns the values of the _method parameters of an
// urlencoded string, its pairs split at '&' and ';' (either, as parsers
// differ), undecodable pairs skipped.
func formPairs(s string) []string {
	var vs []string
	for s != "" {
		var pair string
		if i := strings.IndexAny(s, "&;"); i >= 0 {
			pair, s = s[:i], s[i+1:]
		} else {
			pair, s = s, ""
		}
		name, value, _ := strings.Cut(pair, "=")
		if !strings.Contains(name, "method") && !strings.Contains(name, "%") {
			continue
		}
		n, err := url.QueryUnescape(name)
		if err != nil || !isOverrideParam(n) {
			continue
		}
		if v, err := url.QueryUnescape(value); err == nil {
			vs = append(vs, v)
		}
	}
	return vs
}

// formBody reports whether r's body may be a form a framework reads a
// _method parameter from, and its multipart boundary if it is multipart.
// The media type is read as Rack (Rack::MediaType) and PHP read it: the
// text before the first ';', ',' or blank, in any case, whatever follows.
// mime.ParseMediaType refuses parameters those frameworks skip ("; charset",
// a second type after a comma, a parameter given twice): by its reading
// such a form was no form, and passed through unguarded while the
// upstream ran its _method.
func formBody(r *http.Request) (form bool, boundary string) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return false, ""
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return true, ""
	}
	mt := strings.TrimLeft(ct, " \t")
	if i := strings.IndexAny(mt, ";, \t"); i >= 0 {
		mt = mt[:i]
	}
	mt = strings.ToLower(mt)
	switch {
	case mt == "application/x-www-form-urlencoded":
		return true, ""
	case strings.HasPrefix(mt, "multipart/"):
		if _, params, err := mime.ParseMediaType(ct); err == nil && params["boundary"] != "" {
			return true, params["boundary"]
		}
		if m := looseBoundary.FindStringSubmatch(ct); m != nil {
			return true, m[1] // as Rack's multipart parser finds it
		}
	}
	return false, ""
}

// looseBoundary finds a multipart boundary in a Content-Type whose
// parameters mime.ParseMediaType refuses, as Rack's multipart parser does.
var looseBoundary = regexp.MustCompile(`(?i)boundary="?([^";,]+)"?`)

// bodyOverrides reads r's form body, up to limit bytes, puts it back for
// the upstream, and returns the values of its _method fields.
func bodyOverrides(r *http.Request, boundary string, limit int64) ([]string, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("gateway: reading the form body: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, errFormTooLarge
	}
	if boundary == "" {
		return formPairs(string(body)), nil
	}
	// The parts as mime/multipart reads them (which decodes a
	// quoted-printable part), and as Rack's parser does (raw).
	vs := rawPartOverrides(body, boundary)
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := mr.NextPart()
		if err != nil {
			return vs, nil // the end, or what does not parse
		}
		var head strings.Builder
		for k, fvs := range p.Header {
			for _, v := range fvs {
				head.WriteString(k + ": " + v + "\r\n")
			}
		}
		if slices.ContainsFunc(partNames(p.FormName(), head.String()), isOverrideParam) {
			v, _ := io.ReadAll(io.LimitReader(p, 64))
			vs = append(vs, string(v))
		}
	}
}

// partNames returns every name a form parser may give a multipart part
// whose header fields are head: formName (mime/multipart's, which answers
// "" unless the disposition type is form-data and its parameters parse),
// and, with head's backslash escapes undone (Rack dequotes a name so),
// each name parameter in head, in any field and whatever the disposition
// type (Rack's pattern for Content-Disposition is not anchored to a
// field's start, and takes an "attachment" part's name, and the last of
// a name given twice), and each Content-ID (Rack's name for a part whose
// disposition gives none). More names than a framework reads only refuse
// more requests.
func partNames(formName, head string) []string {
	head = backslashEscape.ReplaceAllString(head, "$1")
	names := []string{formName}
	for _, m := range nameParam.FindAllStringSubmatch(head, -1) {
		names = append(names, m[1])
	}
	for _, m := range contentID.FindAllStringSubmatch(head, -1) {
		names = append(names, strings.TrimSpace(m[1]))
	}
	return names
}

var (
	// nameParam finds a name parameter, quoted or not (not filename; an
	// RFC 2231 name* is FormName's).
	nameParam = regexp.MustCompile(`(?i)(?:^|[\s;])name\s*=\s*"?([^";\r\n]*)"?`)
	// contentID finds a Content-ID field's value, in a field of any name
	// that ends so, as Rack's pattern does.
	contentID = regexp.MustCompile(`(?i)Content-ID:\s*([^\r\n]*)`)
	// backslashEscape is a quoted-pair: \x stands for x.
	backslashEscape = regexp.MustCompile(`\\(.)`)
)

// rawPartOverrides returns the values of the _method parts of a multipart
// body read as Rack reads one: the parts between the boundary's lines,
// each a head up to its first empty line and a value after it, named as
// partNames says, whether or not mime/multipart parses the body.
func rawPartOverrides(body []byte, boundary string) []string {
	var vs []string
	for _, part := range bytes.Split(body, []byte("--"+boundary)) {
		head, value, ok := bytes.Cut(part, []byte("\r\n\r\n"))
		if ok && slices.ContainsFunc(partNames("", string(head)), isOverrideParam) {
			value = bytes.TrimSuffix(value, []byte("\r\n"))
			vs = append(vs, string(value[:min(len(value), 64)]))
		}
	}
	return vs
}
