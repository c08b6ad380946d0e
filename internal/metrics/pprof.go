package metrics

import (
	"net/http"
	"net/http/pprof"
	"strings"
)

// WithProfiling serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/ and everything else with next. It is for the admin
// address only, behind QUILL_PPROF: a CPU profile of a loaded process is
// how its cost per request is found (bench/README.md), and the profiles
// show the program's internals, so they are off unless asked for.
func WithProfiling(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/debug/pprof/") {
			mux.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
