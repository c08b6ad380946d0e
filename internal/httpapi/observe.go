package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/problem"
)

type ctxKey struct{}

// reqInfo collects what a request's log line reports; handlers fill it in.
type reqInfo struct {
	id       string
	route    string // set when routed outside the mux
	tenant   string
	action   string
	keyHash  string
	category string
	replayed bool
	err      error
	// headers backs the response's X-Request-Id, Location and ETag
	// values (in that order), which would each be a slice of their own
	// (issue 29). Each header gets a slice of one, its length equal to its
	// capacity, so an Add copies rather than writes over the next.
	headers [3]string
}

func info(r *http.Request) *reqInfo {
	ri, _ := r.Context().Value(ctxKey{}).(*reqInfo)
	if ri == nil {
		return &reqInfo{}
	}
	return ri
}

// validRequestID reports whether a client's X-Request-Id may be kept: 1 to
// 128 of A-Z, a-z, 0-9, '.', '_' and '-' (a loop: the regular expression
// it replaced was 2 % of a create's CPU).
func validRequestID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
	// body is the request's body, nil when it has none, and
	// contentLength its announced length (-1: unknown, chunked).
	body          *bodyTracker
	contentLength int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.closeOnUnreadBody()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
		w.closeOnUnreadBody()
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// unreadBodyWait is how long what is left of a request's body may take to
// arrive once the answer was decided without it (a 401, a 429, a 415…).
const unreadBodyWait = 100 * time.Millisecond

// maxUnreadBody is the most of a body left unread that the connection is
// kept for: net/http reads up to that much (its maxPostHandlerReadBytes)
// to reuse the connection, and closes it past that.
const maxUnreadBody = 256 << 10

// closeOnUnreadBody runs when a response starts before the request's body
// was read to its end. net/http then reads what is left of the body — to
// reuse the connection, or before closing it — under the connection's read
// deadline, QUILL_READ_TIMEOUT from the request's start: from a client that
// announced a body and never sends it (slowloris) the answer, or the
// close, would wait that long. The deadline is cut to unreadBodyWait: a
// small body on its way (a flood's next create, an agent's request refused
// with 429) arrives within it and the connection is reused, instead of
// every refusal costing both sides a new connection; one that never comes
// ends the connection then. A body too large to be worth reading asks for
// Connection: close at once.
func (w *statusWriter) closeOnUnreadBody() {
	if w.body == nil || w.body.eof {
		return
	}
	err := http.NewResponseController(w.ResponseWriter).SetReadDeadline(time.Now().Add(unreadBodyWait))
	if err != nil || w.contentLength < 0 || w.contentLength > maxUnreadBody {
		w.Header().Set("Connection", "close")
	}
}

// bodyTracker is a request body that notes when it was read to its end.
type bodyTracker struct {
	io.ReadCloser
	eof bool
}

func (b *bodyTracker) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

// requestState is what observe keeps of a request, in one allocation.
type requestState struct {
	ri   reqInfo
	sw   statusWriter
	body bodyTracker
}

// observe assigns the request id, recovers panics as 500 problems, counts
// the request and logs one line without titles, bodies, keys or tokens.
func (s *server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		st := &requestState{ri: reqInfo{id: r.Header.Get("X-Request-Id")}}
		ri := &st.ri
		if !validRequestID(ri.id) {
			ri.id = problem.NewRequestID()
		}
		ri.headers[0] = ri.id
		w.Header()["X-Request-Id"] = ri.headers[0:1:1]
		ctx, span := s.startSpan(context.WithValue(r.Context(), ctxKey{}, ri), r)
		r = r.WithContext(ctx)
		sw := &st.sw
		sw.ResponseWriter = w
		if r.Body != nil && r.Body != http.NoBody && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
			st.body.ReadCloser = r.Body
			sw.body, sw.contentLength = &st.body, r.ContentLength
			r.Body = sw.body
		}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.Log.Error().Ctx(r.Context()).Str("request_id", ri.id).Interface("panic", v).Msg("handler panicked")
				if sw.status == 0 {
					ri.category = contract.CodeInternal
					problem.New(http.StatusInternalServerError, contract.CodeInternal,
						"an unexpected error occurred; a retry with the same key is safe").Write(sw)
				}
			}
			route := r.Pattern
			if ri.route != "" {
				route = ri.route
			}
			if route == "" || route == "/" {
				route = "unmatched"
			}
			method := s.methodLabel(r)
			took := time.Since(start)
			if s.Metrics != nil {
				s.Metrics.HTTPRequest(route, method, sw.status, took)
			}
			endSpan(span, r, method, route, sw.status, ri)
			ev := s.Log.Info()
			if sw.status >= 500 {
				ev = s.Log.Error()
			}
			var ms [24]byte
			ev = ev.Ctx(r.Context()).Str("request_id", ri.id).Str("method", method).Str("route", route).
				Int("status", sw.status).RawJSON("duration_ms", appendMillis(ms[:0], took.Microseconds())).Int("bytes", sw.bytes)
			if ri.tenant != "" {
				ev = ev.Str("tenant", ri.tenant)
			}
			if ri.action != "" {
				ev = ev.Str("action", ri.action)
			}
			if ri.keyHash != "" {
				ev = ev.Str("key_hash", ri.keyHash)
			}
			if ri.category != "" {
				ev = ev.Str("error_category", ri.category)
			}
			if ri.replayed {
				ev = ev.Bool("replayed", true)
			}
			if ri.err != nil {
				ev = ev.Err(ri.err)
			}
			ev.Msg("request")
		}()
		next.ServeHTTP(sw, r)
	})
}
