package httpapi

import "slices"

// Route is one routed path, for the OpenAPI coverage test.
type Route struct {
	Pattern string
	Methods []string // sorted
	Public  bool     // served without a token
}

// Routes returns the API's routing table.
func Routes() []Route {
	var out []Route
	for _, rt := range (&server{}).routes() {
		r := Route{Pattern: rt.pattern, Public: rt.public}
		for m := range rt.methods {
			r.Methods = append(r.Methods, m)
		}
		slices.Sort(r.Methods)
		out = append(out, r)
	}
	return out
}

// ParseIfMatch is parseIfMatch, for its table test.
var ParseIfMatch = parseIfMatch
